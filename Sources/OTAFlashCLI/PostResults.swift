import ArgumentParser
import AsyncHTTPClient
import Crypto
import Foundation
import Ledger
import NIOCore
import OTACommandLine
import Synchronization

/// `--post-results URL` (docs/EVENTS.md, "Results to a server"): each device's record, as JSON,
/// POSTed to an MES or test-data server from a durable outbox on this station's disk.
public struct PostResultsOptions: ParsableArguments {
    @Option(name: .customLong("post-results"), help: ArgumentHelp("POST each device's record as JSON to this http(s) URL, from an outbox on disk, in the background (docs/EVENTS.md, \"Results to a server\").", valueName: "url"))
    public var url: String?

    @Option(name: .customLong("post-secret"), help: ArgumentHelp("Sign each body with the key in this file (its bytes less a final line end, 1–4096): header X-Otaflash-Signature: sha256=HMAC-SHA256 in hex.", valueName: "file"),
            completion: .file())
    public var secretFile: String?

    @Option(name: .customLong("post-timeout"), parsing: .unconditional, help: Ranges.postTimeout.help("Seconds one POST may take, connecting included; also how long the run waits at its end for records not yet delivered", valueName: "seconds"))
    public var timeout: Double = 10

    @Option(name: .customLong("post-outbox"), help: ArgumentHelp("The outbox's folder (default: beside the ledger file, LEDGER.results; else $XDG_STATE_HOME/otaflash/results).", valueName: "dir"),
            completion: .directory)
    public var outbox: String?

    public init() {}

    public func validate() throws {
        try Ranges.postTimeout.check(timeout)
        guard let url else {
            for (given, option) in [(secretFile != nil, "--post-secret"), (outbox != nil, "--post-outbox")] where given {
                throw ValidationError("\(option) goes with --post-results URL: add it, or drop \(option)")
            }
            return
        }
        if let problem = Self.problem(url) { throw ValidationError(problem) }
        if let outbox, outbox.isEmpty { throw ValidationError("--post-outbox needs a folder, got an empty value") }
    }

    /// Why `url` cannot take results, or nil: an http or https URL with a host.
    static func problem(_ url: String) -> String? {
        guard let parts = URLComponents(string: url), let scheme = parts.scheme?.lowercased() else {
            return "--post-results \(url): not a URL; give an http:// or https:// URL, e.g. https://mes.example/otaflash/results"
        }
        guard scheme == "http" || scheme == "https" else {
            return "--post-results \(url): \(scheme):// is not taken; give an http:// or https:// URL"
        }
        guard let host = parts.host, !host.isEmpty else {
            return "--post-results \(url): no host; give an http:// or https:// URL with one"
        }
        return nil
    }

    /// The key of `--post-secret`: the file's bytes less a final line end; nil without it.
    func secret() throws(CLIFailure) -> SymmetricKey? {
        guard let secretFile else { return nil }
        guard let data = FileManager.default.contents(atPath: secretFile) else {
            throw CLIFailure(.usage, "--post-secret \(secretFile): cannot read it (\(FileManager.default.fileExists(atPath: secretFile) ? "permission denied, or not a file" : "no such file")); give the file that holds the server's signing key")
        }
        var bytes = [UInt8](data)
        if bytes.last == UInt8(ascii: "\n") { bytes.removeLast() }
        if bytes.last == UInt8(ascii: "\r") { bytes.removeLast() }
        guard (1...4096).contains(bytes.count) else {
            throw CLIFailure(.usage, "--post-secret \(secretFile): \(bytes.isEmpty ? "the file is empty" : "\(bytes.count) bytes, more than 4096"); put the server's signing key in it (1 to 4096 bytes)")
        }
        return SymmetricKey(data: bytes)
    }

    /// The outbox this run writes to, made and checked before any radio time; nil without `--post-results`.
    func open(ledger: String?, printer: EventPrinter) throws(CLIFailure) -> ResultsPoster? {
        guard let url else { return nil }
        let key = try secret()
        let folder = try ResultsOutbox(directory: outbox ?? ResultsOutbox.defaultDirectory(ledger: ledger))
        return ResultsPoster(outbox: folder, url: url, key: key, timeout: Ranges.postTimeout.duration(timeout), printer: printer)
    }
}

extension Ranges {
    static let postTimeout = Bounds("--post-timeout", 1...300.0, unit: " seconds")
}

/// One device's record as the server receives it (docs/EVENTS.md, "Results to a server"): the
/// ledger record's fields, with `schema` and `attempt_id`, the `Idempotency-Key` of its POST.
struct ResultDocument: Encodable {
    static let schema = 1

    let record: LedgerRecord

    /// The attempt's id: the first 128 bits of the SHA-256 of the ledger's idempotent key (run,
    /// device in upper case, image SHA-256, start, attempt number), in hex. The same attempt has
    /// the same id however often it is sent.
    var attemptID: String {
        let key = [record.runID, record.device.uppercased(), record.imageSHA256, record.startedAt, "\(record.attempts)"].joined(separator: "\n")
        return SHA256.hash(data: Data(key.utf8)).prefix(16).map { ($0 < 16 ? "0" : "") + String($0, radix: 16) }.joined()
    }

    private enum Keys: String, CodingKey {
        case schema, attemptID = "attempt_id"
    }

    func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: Keys.self)
        try c.encode(Self.schema, forKey: .schema)
        try c.encode(attemptID, forKey: .attemptID)
        // The record's own keys, in the same object.
        try record.encode(to: encoder)
    }

    var body: Data {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        return (try? encoder.encode(self)) ?? Data()
    }
}

/// The outbox of `--post-results`: a folder with one file per record not yet delivered, named so
/// that names sort in the order records were kept (`<nanoseconds>-<attempt id>.json`, the body to
/// POST). A file is written beside its name, flushed to disk and renamed into place (then the
/// folder flushed), so a file present is whole and on disk; it is removed once the server took it.
/// Files, not a database: nothing to lock between the station's writers and its sender, every
/// process of the station (or the next run) sends what it finds, and `ls` shows what waits.
final class ResultsOutbox: Sendable {
    let directory: String
    /// Records the server refused outright (a 4xx other than 408, 409, 425, 429): kept, not sent again.
    var refusedDirectory: String { directory + "/refused" }

    /// `LEDGER.results` beside a ledger file; `$XDG_STATE_HOME/otaflash/results` otherwise.
    static func defaultDirectory(ledger: String?) -> String {
        if let ledger, !Ledger.isServer(ledger) { return ledger + ".results" }
        return (Ledger.defaultPath() as NSString).deletingLastPathComponent + "/results"
    }

    init(directory: String) throws(CLIFailure) {
        self.directory = directory
        do {
            try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        } catch {
            throw CLIFailure(.outputFailed, "--post-outbox \(directory): cannot make the folder (\((error as NSError).localizedDescription)); give a folder this user can write")
        }
        let probe = directory + "/.probe-\(getpid())"
        if let problem = ReportFile.appendBytes(probe, "") {
            throw CLIFailure(.outputFailed, "--post-outbox \(directory): cannot write in it (\(problem)); give a folder this user can write")
        }
        unlink(probe)
    }

    /// Keeps `document`'s body until it is delivered: on disk when this returns nil, else why not.
    func keep(_ document: ResultDocument) -> String? {
        let name = String(format: "%020llu", UInt64(Date().timeIntervalSince1970 * 1e9)) + "-" + document.attemptID + ".json"
        let temporary = directory + "/.tmp-" + name
        let fd = open(temporary, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o644)
        guard fd >= 0 else { return String(cString: strerror(errno)) }
        var problem = writeAll(fd, Array(document.body)[...])
        if problem == nil, fsync(fd) != 0 { problem = String(cString: strerror(errno)) }
        if close(fd) != 0, problem == nil { problem = String(cString: strerror(errno)) }
        if problem == nil, rename(temporary, directory + "/" + name) != 0 { problem = String(cString: strerror(errno)) }
        if let problem {
            unlink(temporary)
            return problem
        }
        syncDirectory()
        return nil
    }

    private func syncDirectory() {
        let fd = open(directory, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard fd >= 0 else { return }
        fsync(fd)
        close(fd)
    }

    /// The names of the records not yet delivered, oldest first.
    func pending() -> [String] {
        Self.names(in: directory)
    }

    static func names(in directory: String) -> [String] {
        ((try? FileManager.default.contentsOfDirectory(atPath: directory)) ?? [])
            .filter { !$0.hasPrefix(".") && $0.hasSuffix(".json") }.sorted()
    }

    func body(_ name: String) -> Data? { FileManager.default.contents(atPath: directory + "/" + name) }

    /// The server took it: it is not sent again.
    func delivered(_ name: String) {
        unlink(directory + "/" + name)
        syncDirectory()
    }

    /// The server refused it for good: moved aside, kept for people to look at.
    func refused(_ name: String) {
        try? FileManager.default.createDirectory(atPath: refusedDirectory, withIntermediateDirectories: true)
        rename(directory + "/" + name, refusedDirectory + "/" + name)
        syncDirectory()
    }

    /// What `otaflash ledger --check` says of an outbox: how many wait, and the oldest's device and end.
    struct Depth {
        var pending: Int
        var refused: Int
        var oldest: (device: String, endedAt: String, attemptID: String)?
    }

    static func depth(_ directory: String) -> Depth {
        let waiting = Self.names(in: directory)
        var depth = Depth(pending: waiting.count, refused: Self.names(in: directory + "/refused").count)
        if let first = waiting.first, let data = FileManager.default.contents(atPath: directory + "/" + first),
           let object = (try? JSONSerialization.jsonObject(with: data)) as? [String: Any] {
            depth.oldest = (object["device"] as? String ?? "?", object["ended_at"] as? String ?? "?", object["attempt_id"] as? String ?? "?")
        }
        return depth
    }
}

/// Sends what the outbox keeps, in the background, until the run ends: up to `concurrency` POSTs
/// at once, each bounded by `--post-timeout`; after a failure, waits a backoff that doubles from
/// one second up to a minute, each jittered to between half and all of it. Never in the way of
/// the line: a device's run only writes its file (`keep`).
final class ResultsPoster: Sendable {
    let outbox: ResultsOutbox
    let url: String
    private let key: SymmetricKey?
    let timeout: Duration
    private let printer: EventPrinter
    /// A record was kept: the sender, idle, looks again.
    private let kept = Wakeup()
    /// The sender found the outbox empty (or gave up): the end of the run stops waiting.
    private let emptied = Wakeup()
    /// The end of the run: the sender cuts its backoff short, once, and tries again.
    private let hurry = Wakeup()
    private let state = Mutex(State())
    static let concurrency = 4
    static let backoffCap: Double = 60

    private struct State {
        var sender: Task<Void, Never>?
        var client: HTTPClient?
        /// Since when the server fails (nil while it takes records), for one line per outage.
        var failingSince: Date?
        var delivered = 0
    }

    init(outbox: ResultsOutbox, url: String, key: SymmetricKey?, timeout: Duration, printer: EventPrinter) {
        self.outbox = outbox
        self.url = url
        self.key = key
        self.timeout = timeout
        self.printer = printer
    }

    /// Keeps the record (on disk when it returns nil, else why not) and wakes the sender.
    func keep(_ record: LedgerRecord) -> String? {
        let problem = outbox.keep(ResultDocument(record: record))
        kept.signal()
        return problem
    }

    /// Starts the sender: what earlier runs left is sent first.
    func start() {
        var configuration = HTTPClient.Configuration(redirectConfiguration: .disallow,
                                                     timeout: .init(connect: timeout.timeAmount, read: timeout.timeAmount))
        configuration.connectionPool.idleTimeout = .seconds(30)
        let client = HTTPClient(eventLoopGroupProvider: .singleton, configuration: configuration)
        let task = Task { [self] in await send(client) }
        state.withLock {
            $0.client = client
            $0.sender = task
        }
    }

    /// The end of the run: waits up to `--post-timeout` for the records not yet delivered (a signal
    /// ends the wait), stops the sender and says how many remain, and where.
    func finish() async {
        let (sender, client) = state.withLock { ($0.sender, $0.client) }
        guard let sender, let client else { return }
        if !outbox.pending().isEmpty {
            hurry.signal()
            let interrupts = InterruptHandler { [emptied] _ in emptied.signal() }
            let deadline = ContinuousClock.now + timeout
            while !outbox.pending().isEmpty, !interrupts.signalled, ContinuousClock.now < deadline {
                await emptied.wait(timeout: deadline - ContinuousClock.now)
            }
            interrupts.cancel()
        }
        sender.cancel()
        // Its waits are continuations, not cancelled with it: woken, it sees it is cancelled.
        kept.signal()
        hurry.signal()
        await sender.value
        try? await client.shutdown()
        state.withLock {
            $0.sender = nil
            $0.client = nil
        }
        let left = outbox.pending().count
        if left > 0 {
            printer.warning("\(left) record\(left == 1 ? "" : "s") not yet delivered to \(url) stay in \(outbox.directory): the next run with --post-results sends \(left == 1 ? "it" : "them") (otaflash ledger --check shows them)")
        }
    }

    /// How a POST ended.
    private enum Answer {
        case delivered
        /// For good (a 4xx the same body will always get): moved aside.
        case refused(String)
        /// Try again later (unreachable, slow, a 5xx).
        case failed(String)
    }

    private func send(_ client: HTTPClient) async {
        var failures = 0
        while !Task.isCancelled {
            let batch = Array(outbox.pending().prefix(Self.concurrency))
            if batch.isEmpty {
                emptied.signal()
                await kept.wait(timeout: .seconds(60))
                continue
            }
            let answers = await withTaskGroup(of: (String, Answer).self) { group -> [(String, Answer)] in
                for name in batch { group.addTask { (name, await self.post(name, client)) } }
                var answers: [(String, Answer)] = []
                for await answer in group { answers.append(answer) }
                return answers
            }
            var failure: String?
            for (name, answer) in answers {
                switch answer {
                case .delivered:
                    outbox.delivered(name)
                case .refused(let why):
                    outbox.refused(name)
                    printer.warning("results to \(url): \(name) refused (\(why)); moved to \(outbox.refusedDirectory), not sent again")
                case .failed(let why):
                    failure = why
                }
            }
            if Task.isCancelled { break }
            guard let failure else {
                if failures > 0 { recovered() }
                failures = 0
                continue
            }
            failures += 1
            failing(failure)
            let ceiling = min(Self.backoffCap, pow(2, Double(failures - 1)))
            await hurry.wait(timeout: .milliseconds(Int64(ceiling * Double.random(in: 0.5...1) * 1000)))
        }
    }

    private func failing(_ why: String) {
        let first = state.withLock { s -> Bool in
            guard s.failingSince == nil else { return false }
            s.failingSince = Date()
            return true
        }
        if first {
            printer.warning("results to \(url) not delivered (\(why)); they stay in \(outbox.directory) and are sent again in the background; the line goes on")
        }
    }

    private func recovered() {
        guard let since = state.withLock({ s -> Date? in defer { s.failingSince = nil }; return s.failingSince }) else { return }
        printer.note("results to \(url) delivered again after \(formatSeconds(Date().timeIntervalSince(since)))")
    }

    private func post(_ name: String, _ client: HTTPClient) async -> Answer {
        guard let body = outbox.body(name) else { return .delivered }  // another process of the station sent it
        let document = (try? JSONSerialization.jsonObject(with: body)) as? [String: Any]
        var request = HTTPClientRequest(url: url)
        request.method = .POST
        request.headers.add(name: "Content-Type", value: "application/json")
        request.headers.add(name: "Idempotency-Key", value: document?["attempt_id"] as? String ?? String(name.dropLast(5)))
        request.headers.add(name: "User-Agent", value: "otaflash/\(OtaflashVersion.number)")
        if let key {
            let mac = HMAC<SHA256>.authenticationCode(for: body, using: key)
            request.headers.add(name: "X-Otaflash-Signature", value: "sha256=" + mac.map { ($0 < 16 ? "0" : "") + String($0, radix: 16) }.joined())
        }
        request.body = .bytes(ByteBuffer(bytes: body))
        do {
            let response = try await client.execute(request, timeout: timeout.timeAmount)
            let code = Int(response.status.code)
            _ = try? await response.body.collect(upTo: 64 * 1024)
            switch code {
            case 200..<300, 409: return .delivered
            case 408, 425, 429: return .failed("HTTP \(code)")
            case 400..<500: return .refused("HTTP \(code)")
            default: return .failed("HTTP \(code)")
            }
        } catch {
            return .failed(Self.describe(error))
        }
    }

    static func describe(_ error: any Error) -> String {
        if let error = error as? HTTPClientError {
            if error == .deadlineExceeded || error == .readTimeout || error == .connectTimeout { return "no answer within --post-timeout" }
            return "\(error)"
        }
        return "\(error)"
    }
}

extension Duration {
    var timeAmount: TimeAmount {
        let (seconds, attoseconds) = components
        return .nanoseconds(seconds * 1_000_000_000 + attoseconds / 1_000_000_000)
    }
}
