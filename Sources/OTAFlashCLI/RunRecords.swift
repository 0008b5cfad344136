import ArgumentParser
import Crypto
import Foundation
import GATT
import Ledger
import OTA
import OTACommandLine
import Synchronization

/// Where a flash keeps its books (docs/LEDGER.md): the ledger, and who and where is flashing.
public struct LedgerOptions: ParsableArguments {
    @Option(name: .customLong("ledger"), help: ArgumentHelp("Record every device attempt in this SQLite file (default for real devices: $XDG_STATE_HOME/otaflash/ledger.sqlite; simulated devices are recorded only when this is given).", valueName: "path"),
            completion: .file(extensions: ["sqlite"]))
    public var ledger: String?

    @Flag(name: .customLong("no-ledger"), help: "Keep no ledger record of this run.")
    public var noLedger = false

    @Option(name: .customLong("station"), help: ArgumentHelp("This station's name in the ledger (1–64 printable characters; default: the host name).", valueName: "name"))
    public var station: String?

    @Option(name: .customLong("operator"), help: ArgumentHelp("Who runs the station, for the ledger (1–64 printable characters).", valueName: "name"))
    public var `operator`: String?

    @Flag(name: .customLong("ledger-init"), help: "Add the ledger's tables to a --ledger file that is another program's SQLite database (refused without it).")
    public var ledgerInit = false

    @Option(name: .customLong("claim-lease"), parsing: .unconditional, help: Ranges.claimLease.help("Seconds a device's claim in the ledger outlives this station if it dies (renewed while the device is flashed)", valueName: "seconds"))
    public var claimLease: Double = 30

    public init() {}

    public func validate() throws {
        if noLedger, ledger != nil { throw ValidationError("--ledger and --no-ledger cannot be used together") }
        if noLedger, ledgerInit { throw ValidationError("--ledger-init adds the ledger's tables to a --ledger file; drop it with --no-ledger") }
        if let ledger {
            do { try Ledger.check(ledger) } catch { throw ValidationError(error.message) }
        }
        for (option, value) in [("--station", station), ("--operator", `operator`)] {
            guard let value else { continue }
            guard (1...64).contains(value.count), value.unicodeScalars.allSatisfy({ $0.properties.generalCategory != .control }) else {
                throw ValidationError("\(option) must be 1 to 64 printable characters, got '\(value)'")
            }
        }
        try Ranges.claimLease.check(claimLease)
        if noLedger, station != nil || `operator` != nil {
            throw ValidationError("--station and --operator name the ledger's records; drop them with --no-ledger")
        }
    }

    /// The ledger this run writes, opened and migrated; nil with `--no-ledger`, and for simulated
    /// devices unless `--ledger` names one.
    func open(simulator: Bool) throws(CLIFailure) -> (any LedgerStore)? {
        if noLedger || (simulator && ledger == nil) { return nil }
        do {
            return try Ledger.open(ledger ?? Ledger.defaultPath(), initialize: ledgerInit)
        } catch {
            throw CLIFailure(error)
        }
    }

    var stationName: String { station ?? ProcessInfo.processInfo.hostName }
}

extension CLIFailure {
    /// A ledger's failure as the run ends with it: a malformed `--ledger` is a usage error (2),
    /// anything else a ledger that cannot be used (18).
    init(_ error: LedgerError) {
        self.init(error.kind == .badLocation ? .usage : .ledgerFailed, error.message)
    }
}

extension Ranges {
    static let claimLease = Bounds("--claim-lease", Ledger.leaseRange.lowerBound.seconds...Ledger.leaseRange.upperBound.seconds, unit: " seconds")
}

/// What a run keeps of each device as soon as the device is done: its ledger record (committed
/// first), its `done` line, its `--log-dir` log closed, its `--report` row. Single runs and
/// batches alike go through here, so no record waits for the end of the run.
final class RunRecords: Sendable {
    struct Image: Sendable {
        var name: String
        var size: Int64
        var sha256: String
        var version: String?
    }

    private struct Notes: Sendable {
        var started = Date()
        var identity: DeviceIdentity?
        var firmwareBefore: String?
        var bytesSent = 0
    }

    let ledger: (any LedgerStore)?
    let image: Image
    let protocolName: String
    let runID: String
    /// Who claims devices in the ledger: this station and this run.
    var holder: ClaimHolder { ClaimHolder(station: station, run: runID) }
    private let lease: Duration
    /// Per device being flashed: the task that renews its claim.
    private let renewals = Mutex<[String: Task<Void, Never>]>([:])
    private let prepared = Mutex(false)
    let station: String
    private let `operator`: String?
    private let report: ReportFile?
    /// `--post-results`: each record, once written, kept for the server and sent in the background.
    let results: ResultsPoster?
    private let logs: DeviceLogs?
    private let printer: EventPrinter
    private let notes = Mutex<[String: Notes]>([:])
    /// Devices `begin` settled without an attempt (held by another holder, done already, or the run
    /// stopped before their turn): a station event, not a record (docs/LEDGER.md, "Claims").
    private let settled = Mutex<Set<String>>([])
    /// The first record or report row that could not be written: the run ends with its exit code.
    let failure = Mutex<CLIFailure?>(nil)
    /// A device the ledger shows done with this image is skipped (a station's shift); a flash or
    /// batch the user starts flashes it again, as asked.
    let skipsDone: Bool
    /// This run's lock on the machine: how a later run of this station knows it is gone (`RunLock`).
    private let runLock: RunLock?
    /// A station's answer to a ledger that cannot be reached (`--when-ledger-down`); nil: a device
    /// whose claim cannot be made fails with `ledger_failed`.
    let whenDown: WhenLedgerDown?
    /// Devices not started because the ledger could not be reached: no record, no `done` line.
    private let unstarted = Mutex<Set<String>>([])
    /// Devices in flight whose claim could not be renewed, still allowed to go on within their lease.
    private let unconfirmed = Mutex<Set<String>>([])
    private let hooks = Mutex(Hooks())

    /// What a station does when the ledger goes away.
    struct WhenLedgerDown: Sendable {
        /// Keep running (records kept in the outbox, no device started until the ledger answers),
        /// or stop taking devices and end the shift.
        var spool: Bool
        /// Devices in flight that may go on, each within its claim's lease, while their claims
        /// cannot be renewed; the others stop after their current write.
        var maxUnconfirmed: Int
    }

    /// The station's answers to what the ledger does to devices in flight.
    struct Hooks: Sendable {
        /// The ledger could not be reached (the line says why): no device is started until it answers.
        var ledgerDown: @Sendable (String) -> Void = { _ in }
        /// This device's claim may end before it is flashed: stop it after its current write.
        var stopDevice: @Sendable (String) -> Void = { _ in }
    }

    /// Claims this run holds now (each renewed until its device's record).
    var claimsHeld: Int { renewals.withLock { $0.count } }

    func setHooks(_ hooks: Hooks) { self.hooks.withLock { $0 = hooks } }

    init(ledger: (any LedgerStore)?, options: LedgerOptions, image: Image, protocolName: String,
         report: ReportFile?, results: ResultsPoster? = nil, logs: DeviceLogs?, printer: EventPrinter, skipsDone: Bool = false,
         whenDown: WhenLedgerDown? = nil) {
        self.skipsDone = skipsDone
        self.whenDown = whenDown
        let run = UUID().uuidString
        runID = run
        runLock = ledger == nil ? nil : RunLock(run: run)
        self.ledger = ledger
        self.image = image
        self.protocolName = protocolName
        self.station = options.stationName
        self.operator = options.operator
        self.lease = .milliseconds(Int64((options.claimLease * 1000).rounded()))
        self.report = report
        self.results = results
        self.logs = logs
        self.printer = printer
    }

    /// The image file as the ledger names it: file name, size and SHA-256 of its bytes.
    static func describe(imageAt path: String, version: String?) throws(CLIFailure) -> Image {
        guard let data = FileManager.default.contents(atPath: path) else {
            throw CLIFailure(.imageFile, "cannot read \(path) again to record its SHA-256")
        }
        let digest = SHA256.hash(data: data).map { ($0 < 16 ? "0" : "") + String($0, radix: 16) }.joined()
        return Image(name: (path as NSString).lastPathComponent, size: Int64(data.count), sha256: digest, version: version)
    }

    /// Proves the ledger takes a write before any device is touched (a locked, read-only or
    /// unreachable ledger ends the run once, with 18, not device by device); notes the station.
    func prepare() async throws(CLIFailure) {
        guard let ledger, !prepared.withLock({ $0 }) else { return }
        do {
            try await ledger.prepare(station: station)
        } catch {
            throw CLIFailure(error)
        }
        prepared.withLock { $0 = true }
    }

    /// Before anything is sent to `device`: its record must be writable, and the device claimed
    /// (docs/LEDGER.md, "Claims"), or it is not flashed. Returns nil to flash it, or its outcome:
    /// failed (no record possible, or another station holds it) or skipped (the ledger shows it
    /// done with this image). A granted claim is renewed until `finish`.
    func begin(_ device: String) async -> BatchOutcome.Result? {
        notes.withLock { $0[device] = Notes() }
        guard let ledger else { return nil }
        // Stopped before its turn: nothing was sent, and nothing happened to record.
        if Task.isCancelled { return notStarted(device) }
        var claim: ClaimResult
        // The lease is counted from before the claim was asked: the server's runs out no sooner.
        let asked = ContinuousClock.now
        do {
            // The station is noted once a run; the claim, a write of its own, proves the ledger takes one.
            if !prepared.withLock({ $0 }) {
                try await ledger.prepare(station: station)
                prepared.withLock { $0 = true }
            }
            claim = try await ledger.claim(device, image: image.sha256, by: holder, lease: lease)
            if case .held(let other, _) = claim, other == station, let taken = try await takeOverFromEndedRun(device, in: ledger) {
                claim = taken
            }
        } catch {
            // A write cut short by Ctrl-C is not a ledger that cannot be written.
            if Task.isCancelled || error.kind == .interrupted { return notStarted(device) }
            if let whenDown, error.kind == .unreachable || error.kind == .locked {
                // Not started: a device is flashed only under a claim the shared ledger granted.
                unstarted.withLock { _ = $0.insert(device) }
                hooks.withLock { $0 }.ledgerDown(error.message)
                return .failed(OTAError(.ledgerFailed, "\(device) was not started: the ledger cannot be reached (\(error.message))\(whenDown.spool ? "; it waits for the ledger" : "")"))
            }
            return .failed(OTAError(.ledgerFailed, "\(device) was not flashed: its record cannot be written: \(error.message)"))
        }
        switch claim {
        case .granted:
            if Task.isCancelled {
                // Stopped between its claim and its first write: given back, so it is free at once.
                try? await Task { try await ledger.release(device, by: holder) }.value
                return notStarted(device)
            }
            renew(device, in: ledger, confirmedUntil: asked + lease)
            return nil
        case .held(let other, let until):
            settled.withLock { _ = $0.insert(device) }
            printer.json(FlashEvents.Held(device: device, station: other, until: until))
            if other == station, let live = sameStationHolder.withLock({ $0.removeValue(forKey: device) }) {
                return .failed(OTAError(.heldElsewhere, "\(device) was not flashed: another otaflash run on this station\(live.map { " (process \($0))" } ?? "") holds its claim (until \(until)) and is flashing it; let that run finish, or stop it"))
            }
            return .failed(OTAError(.heldElsewhere, "\(device) was not flashed: station \(other) holds its claim (until \(until)) and is flashing it"))
        case .done where !skipsDone:
            return nil
        case .done(let other, let at):
            let line = "\(device): skipped, the ledger shows it done with this image (station \(other), \(at)); nothing sent"
            printer.note(line)
            printer.json(FlashEvents.Note(device: device, message: line))
            settled.withLock { _ = $0.insert(device) }
            return .skipped(nil)
        }
    }

    /// A device the run was stopped before: it gets no record (nothing was sent to it).
    private func notStarted(_ device: String) -> BatchOutcome.Result {
        settled.withLock { _ = $0.insert(device) }
        return .failed(OTAError(.interrupted, "stopped before \(device) was flashed", resumable: true))
    }

    /// The pid of a live run of this station that holds a device's claim, as `begin` found it.
    private let sameStationHolder = Mutex<[String: Int32?]>([:])

    /// A claim this station holds under another run: taken over at once when that run's process
    /// has ended (its lock is free), with a note; a live run's is left to it (said by `begin`);
    /// a run this machine does not know (another machine with the same station name) waits for
    /// its lease. Returns the new claim, or nil to keep the answer `held`.
    private func takeOverFromEndedRun(_ device: String, in ledger: any LedgerStore) async throws(LedgerError) -> ClaimResult? {
        guard let held = try await ledger.claims().first(where: { $0.device == device.uppercased() }),
              held.station == station, held.state == .held, held.run != runID else { return nil }
        switch RunLock.holder(of: held.run) {
        case .live(let pid):
            sameStationHolder.withLock { $0[device] = .some(pid) }
            return nil
        case .unknown:
            return nil
        case .gone:
            let previous = ClaimHolder(station: station, run: held.run)
            guard try await ledger.takeOver(device, image: image.sha256, from: previous, by: holder, lease: lease) else { return nil }
            let line = "\(device): took over its claim from an earlier run on this station (\(held.run)) whose process has ended"
            printer.note(line)
            printer.json(FlashEvents.Note(device: device, message: line))
            return .granted(until: held.expiresAt)
        }
    }

    /// Renews `device`'s claim every third of its lease until `finish` cancels it. A claim lost
    /// meanwhile (this station stalled past its lease) stops the device. While the ledger cannot
    /// be reached, the device goes on (one of `--max-unconfirmed`) only until a third of its
    /// lease is left, counted from before the last renewal that succeeded: then it is stopped,
    /// so that no device is flashed here after another station may have taken its claim.
    private func renew(_ device: String, in ledger: any LedgerStore, confirmedUntil: ContinuousClock.Instant) {
        let (holder, lease, printer, whenDown) = (holder, lease, printer, whenDown)
        let deadline = ClaimDeadline(confirmedUntil)
        let margin = lease / 3
        let task = Task { [self] in
            // A station stops a device whose claim may lapse; a flash or batch goes on, as before.
            let watchdog = whenDown == nil ? nil : Task {
                while !Task.isCancelled {
                    let due = deadline.value.withLock { $0 } - margin
                    if ContinuousClock.now >= due {
                        printer.warning("\(device): its claim could not be renewed in time (the ledger does not answer); stopping it before another station may take it")
                        hooks.withLock { $0 }.stopDevice(device)
                        return
                    }
                    do { try await Task.sleep(until: due, clock: .continuous) } catch { return }
                }
            }
            defer { watchdog?.cancel() }
            while !Task.isCancelled {
                do { try await Task.sleep(for: lease / 3) } catch { return }
                let asked = ContinuousClock.now
                let kept: Bool
                do {
                    kept = try await ledger.renew(device, by: holder, lease: lease)
                } catch {
                    guard let whenDown else { continue }
                    let allowed = unconfirmed.withLock { set -> Bool in
                        if set.contains(device) { return true }
                        guard whenDown.spool, set.count < whenDown.maxUnconfirmed else { return false }
                        set.insert(device)
                        return true
                    }
                    if !allowed {
                        printer.warning("\(device): its claim cannot be renewed (\((error as? LedgerError)?.message ?? "\(error)")); stopping it after its current write")
                        hooks.withLock { $0 }.stopDevice(device)
                        return
                    }
                    continue
                }
                if !kept {
                    if !Task.isCancelled {
                        printer.warning("\(device): its claim in the ledger lapsed (renewals came too late); \(whenDown == nil ? "another station may take it" : "stopping it, another station may take it")")
                        hooks.withLock { $0 }.stopDevice(device)
                    }
                    return
                }
                deadline.value.withLock { $0 = asked + lease }
                unconfirmed.withLock { _ = $0.remove(device) }
            }
        }
        renewals.withLock { $0[device]?.cancel(); $0[device] = task }
    }

    /// Whether `device` ended without being started because the ledger could not be reached
    /// (forgotten once asked): it waits for the ledger, with no record.
    func wasUnstarted(_ device: String) -> Bool {
        unstarted.withLock { $0.remove(device) != nil }
    }

    /// What the device's events tell the record: what it is, what it ran, how much was sent.
    func observe(_ event: DeviceUpdater.Event) {
        switch event {
        case .identity(let device, let identity):
            notes.withLock { $0[device, default: Notes()].identity = identity }
        case .session(let session):
            logs?.record(session)
            switch session {
            case .deviceInfo(let device, let info):
                if let version = info.firmwareVersion {
                    notes.withLock { $0[device, default: Notes()].firmwareBefore = version.description }
                }
            case .progress(let p):
                notes.withLock { $0[p.device, default: Notes()].bytesSent = max($0[p.device, default: Notes()].bytesSent, p.bytes) }
            default:
                break
            }
        default:
            break
        }
    }

    /// The device is done: its record is committed, its report row appended and its log closed,
    /// then its `done` line printed, in that order.
    func finish(_ outcome: BatchOutcome) async {
        var done = FlashEvents.Done(outcome)
        let note = notes.withLock { $0.removeValue(forKey: outcome.device) } ?? Notes()
        let ended = Date()
        let record = self.record(outcome, note, ended: ended)
        renewals.withLock { $0.removeValue(forKey: outcome.device) }?.cancel()
        unconfirmed.withLock { _ = $0.remove(outcome.device) }
        // Not started for want of a ledger: nothing happened to it, so nothing is recorded.
        if unstarted.withLock({ $0.contains(outcome.device) }) { return }
        // A device not attempted because the ledger settled it (done already, another station's)
        // or the run stopped first gets no record of its own: the books count attempts.
        let attempted = settled.withLock { $0.remove(outcome.device) } == nil
        var rowID: Int64?
        if let ledger, attempted {
            do {
                // Written even when the run is being stopped: a task of its own is not cancelled
                // with the device's (the store's async write refuses a cancelled task).
                let written = await Task { () async -> Result<Int64, LedgerError> in
                    do throws(LedgerError) { return .success(try await ledger.append(record)) } catch { return .failure(error) }
                }.value
                rowID = try written.get()
            } catch {
                fail(CLIFailure(.ledgerFailed, "the record of \(outcome.device) could not be written: \(error.message)"))
                // No `done ok` without its record: the line says the device was flashed, unrecorded.
                if case .ok = outcome.result {
                    done = FlashEvents.Done(BatchOutcome(device: outcome.device, updateModeAddress: outcome.updateModeAddress, adapter: outcome.adapter,
                                                         result: .failed(OTAError(.ledgerFailed, "\(outcome.device) was updated, but its record could not be written: \(error.message)")),
                                                         attempts: outcome.attempts, seconds: outcome.seconds, firmwareBefore: outcome.firmwareBefore,
                                                         firmwareAfter: outcome.firmwareAfter))
                }
            }
        }
        if let report, let problem = report.append(record) {
            fail(CLIFailure(.outputFailed, "cannot write the report row of \(outcome.device) to \(report.path): \(problem)"))
        }
        if let results, attempted {
            var posted = record
            posted.id = rowID.flatMap { $0 > 0 ? $0 : nil }
            if let problem = results.keep(posted) {
                fail(CLIFailure(.outputFailed, "cannot keep the record of \(outcome.device) for --post-results in \(results.outbox.directory): \(problem)"))
            }
        }
        logs?.finish(outcome.device, done.line)
        // Last: a device reported done has its record, its report row and its log on disk.
        printer.json(done)
    }

    /// Runs `body` with the `--post-results` sender running, then waits a little for what it has
    /// not delivered yet (`ResultsPoster.finish`), whether `body` ended or threw.
    func posting(_ body: () async throws -> Void) async throws {
        results?.start()
        do {
            try await body()
        } catch {
            await results?.finish()
            throw error
        }
        await results?.finish()
    }

    /// Ends the run with the first record or row that could not be written, if any.
    func throwFirstFailure() throws(CLIFailure) {
        if let failure = failure.withLock({ $0 }) { throw failure.markedReported() }
    }

    /// Ends the run with `failure`'s exit code (unless one came first), saying its line now.
    func noteFailure(_ failure: CLIFailure) { fail(failure) }

    private func fail(_ failure: CLIFailure) {
        self.failure.withLock { if $0 == nil { $0 = failure } }
        printer.warning(failure.message)
    }

    private func record(_ o: BatchOutcome, _ note: Notes, ended: Date) -> LedgerRecord {
        let (result, code, message): (LedgerResult, ExitCode, String?) = switch o.result {
        case .ok: (.ok, .success, nil)
        case .skipped: (.skipped, .success, nil)
        // A bond left behind is a result of its own: the image may well have gone through.
        case .failed(let e): (e.code == .bondLeft ? .bondLeft : .error, ExitCode(e.code), e.description)
        }
        var sent = Int64(note.bytesSent)
        var resent: Int64 = 0
        var rate = 0.0
        if case .ok(let r) = o.result {
            sent = Int64(r.stats.bytesSent)
            resent = Int64(r.stats.bytesResent)
            rate = r.throughput
        }
        return LedgerRecord(runID: runID, startedAt: LedgerRecord.timestamp(note.started), endedAt: LedgerRecord.timestamp(ended),
                            station: station, operator: `operator`, adapter: o.adapter, device: o.device,
                            bootloaderAddress: o.updateModeAddress, manufacturer: note.identity?.manufacturer,
                            model: note.identity?.model, serialNumber: note.identity?.serialNumber,
                            hardwareRevision: note.identity?.hardwareRevision,
                            firmwareBefore: o.firmwareBefore?.description ?? note.firmwareBefore ?? note.identity?.firmwareRevision,
                            protocolName: protocolName, imageName: image.name, imageSize: image.size, imageSHA256: image.sha256,
                            imageVersion: image.version, firmwareAfter: o.firmwareAfter?.description, bytesSent: sent,
                            bytesResent: resent, seconds: o.seconds, rate: rate, attempts: o.attempts, result: result,
                            exitCode: Int(code.rawValue), errorCode: code == .success ? nil : code.name, message: message,
                            otaflashVersion: OtaflashVersion.number, otaflashCommit: OtaflashVersion.commit ?? "unknown")
    }
}

/// Until when a claim is known to be held, on this station's clock: from before the last grant
/// or renewal the ledger answered, plus the lease.
final class ClaimDeadline: Sendable {
    let value: Mutex<ContinuousClock.Instant>
    init(_ instant: ContinuousClock.Instant) { value = Mutex(instant) }
}

/// `--report FILE`: a CSV row per device, appended (and flushed to disk) as each device ends. A
/// file that exists keeps its rows; one with other columns is refused before any radio time.
final class ReportFile: Sendable {
    let path: String
    static let columns = ["started_at", "ended_at", "station", "device", "bootloader", "adapter", "serial_number", "result",
                          "error_code", "error", "attempts", "seconds", "throughput_bytes_per_s", "bytes_sent", "bytes_resent",
                          "firmware_before", "firmware_after", "image", "image_sha256", "image_version", "protocol",
                          "otaflash_version", "otaflash_commit"]
    static var header: String { columns.joined(separator: ",") + "\n" }

    /// Checks `path` and writes the header when the file is new or empty; says so when it appends.
    init(path: String, printer: EventPrinter) throws(CLIFailure) {
        self.path = path
        try OutputPaths.checkFile(path, option: "--report")
        // Only a regular file has rows to keep (a device such as /dev/stdout is written as it is).
        var info = stat()
        let existing = stat(path, &info) == 0 && (info.st_mode & S_IFMT) == S_IFREG && info.st_size > 0
            ? (FileHandle(forReadingAtPath: path).flatMap { try? $0.read(upToCount: 4096) }).map { String(decoding: $0, as: UTF8.self) } ?? ""
            : ""
        if existing.isEmpty {
            if let problem = Self.appendBytes(path, Self.header) {
                throw CLIFailure(.outputFailed, "cannot write the report \(path): \(problem)")
            }
        } else {
            guard existing.split(separator: "\n", maxSplits: 1).first.map({ String($0) + "\n" }) == Self.header else {
                throw CLIFailure(.outputFailed, "--report \(path) holds a report with other columns (an older otaflash's?); give a new file, or move that one aside")
            }
            // A last line cut short of its newline (an editor, a copy) would take this run's first row.
            if Self.lastByte(path) != UInt8(ascii: "\n"), let problem = Self.appendBytes(path, "\n") {
                throw CLIFailure(.outputFailed, "cannot write the report \(path): \(problem)")
            }
            printer.note("--report \(path) exists: appending this run's rows to it")
        }
    }

    /// The file's last byte, or nil when it cannot be read.
    private static func lastByte(_ path: String) -> UInt8? {
        guard let handle = FileHandle(forReadingAtPath: path) else { return nil }
        defer { try? handle.close() }
        guard let end = try? handle.seekToEnd(), end > 0 else { return nil }
        try? handle.seek(toOffset: end - 1)
        return (try? handle.read(upToCount: 1))?.first
    }

    /// Appends `record`'s row; returns why it failed, or nil.
    func append(_ r: LedgerRecord) -> String? {
        let fields: [String?] = [r.startedAt, r.endedAt, r.station, r.device, r.bootloaderAddress, r.adapter, r.serialNumber, r.result.rawValue,
                                 r.errorCode, r.message, "\(r.attempts)", String(format: "%.3f", r.seconds),
                                 r.rate > 0 ? String(format: "%.0f", r.rate) : nil, "\(r.bytesSent)", "\(r.bytesResent)",
                                 r.firmwareBefore, r.firmwareAfter, r.imageName, r.imageSHA256, r.imageVersion, r.protocolName,
                                 r.otaflashVersion, r.otaflashCommit]
        return Self.appendBytes(path, fields.map(csvField).joined(separator: ",") + "\n")
    }

    /// One write(2) with O_APPEND, then fsync: rows of concurrent devices never interleave, and
    /// a row is on disk when its device is reported done.
    static func appendBytes(_ path: String, _ text: String) -> String? {
        let fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0o644)
        guard fd >= 0 else { return String(cString: strerror(errno)) }
        var problem = writeAll(fd, Array(text.utf8)[...])
        if problem == nil, fsync(fd) != 0, errno != EINVAL { problem = String(cString: strerror(errno)) }
        if close(fd) != 0, problem == nil { problem = String(cString: strerror(errno)) }
        return problem
    }
}

/// One CSV field (RFC 4180): quoted when it holds a comma, a quote or a line end; nil is empty.
func csvField(_ s: String?) -> String {
    guard let s else { return "" }
    return s.contains(where: { ",\"\n\r".contains($0) }) ? "\"" + s.replacingOccurrences(of: "\"", with: "\"\"") + "\"" : s
}

extension FlashEvents {
    /// A device another station holds the claim of in the shared ledger: it is not flashed here
    /// (its `done` follows: `held_elsewhere`).
    public struct Held: JSONEvent {
        public static let name = "held"
        public var device: String
        /// The station that holds the claim.
        public var station: String
        /// When its lease ends unless that station renews it (the ledger's clock, UTC).
        public var until: String
    }
}
