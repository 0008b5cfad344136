import ArgumentParser
import Foundation
import Ledger
import LineView
import OTACommandLine

/// `otaflash ledger`: the records of past runs, filtered, exported, or summarised as a shift.
struct LedgerCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "ledger",
        abstract: "Show, export or summarise the ledger: one record per device attempt (docs/LEDGER.md).",
        usage: "otaflash ledger [--ledger <path>] [--summary | --check] [<options>]",
        discussion: """
            Times are UTC, ISO 8601 (2026-11-26, 2026-11-26T06:00, 2026-11-26T06:00:00Z) or an age (30m, 8h, 7d).

            Examples:
              otaflash ledger --since 8h
              otaflash ledger --since 8h --summary
              otaflash ledger --result error --format csv > failures.csv
              otaflash ledger --serial SN0042 --format json
              otaflash ledger --since 8h --html shift.html
              otaflash ledger --since 8h --format junit > shift.xml
            """
    )

    enum Format: String, ExpressibleByArgument, CaseIterable {
        case table, csv, json, junit
    }

    @Option(name: .customLong("ledger"), help: ArgumentHelp("The ledger to read (default: $XDG_STATE_HOME/otaflash/ledger.sqlite).", valueName: "path"),
            completion: .file(extensions: ["sqlite"]))
    var ledger: String?

    @Option(help: ArgumentHelp("Only attempts that started at or after this time.", valueName: "time"))
    var since: String?

    @Option(help: ArgumentHelp("Only attempts that started at or before this time.", valueName: "time"))
    var until: String?

    @Option(help: ArgumentHelp("Only this device address.", valueName: "address"))
    var device: String?

    @Option(help: ArgumentHelp("Only this serial number (as the device's Device Information Service reports it).", valueName: "serial"))
    var serial: String?

    @Option(help: ArgumentHelp("Only attempts with this result.", valueName: "result"))
    var result: LedgerResult?

    @Option(help: ArgumentHelp("Only this image: its file name, or the first 8 or more hex digits of its SHA-256.", valueName: "name|sha256"))
    var image: String?

    @Option(help: ArgumentHelp("Only this station.", valueName: "name"))
    var station: String?

    @Option(parsing: .unconditional, help: Ranges.ledgerLimit.help("Only the newest this many records", valueName: "n"))
    var limit: Int?

    @Option(help: ArgumentHelp("How to print the records (or the summary); json: JSON Lines, one object for --summary; junit: JUnit XML, a test case per attempt (docs/LINE.md).", valueName: "format"))
    var format: Format = .table

    @Option(help: ArgumentHelp("Write the selected attempts as a one-file shift report instead: counts, plots, last failures; HTML with nothing external (docs/LINE.md).", valueName: "file"),
            completion: .file(extensions: ["html"]))
    var html: String?

    @Flag(help: "Print a summary of the selected attempts instead: devices, first-pass and final yield, median and p95 time, failures by error code, per station and adapter.")
    var summary = false

    @Flag(help: "Check the books instead: every ok device has one ok record per image, every done claim its record, no claim left held by a station that stopped, each station's counts add up; exit 22 with a line per finding when not. Also says how many records --post-results has not delivered yet.")
    var check = false

    @Option(name: .customLong("post-outbox"), help: ArgumentHelp("With --check: the --post-results outbox to look at (default: beside the ledger file, LEDGER.results; else $XDG_STATE_HOME/otaflash/results).", valueName: "dir"),
            completion: .directory)
    var postOutbox: String?

    mutating func validate() throws {
        try Ranges.ledgerLimit.check(limit)
        if let ledger {
            do { try Ledger.check(ledger) } catch { throw ValidationError(error.message) }
        }
        if check, summary { throw ValidationError("--check and --summary are two reports: give one") }
        if check, limit != nil { throw ValidationError("--check checks every selected record: drop --limit") }
        if postOutbox != nil, !check { throw ValidationError("--post-outbox names the outbox --check looks at: add --check, or drop it") }
        if let image, image.isEmpty { throw ValidationError("--image must not be empty") }
        if format == .junit, summary || check { throw ValidationError("--format junit writes the attempts: drop \(summary ? "--summary" : "--check")") }
        if let html {
            if summary || check { throw ValidationError("--html writes a report of its own: drop \(summary ? "--summary" : "--check")") }
            if format != .table { throw ValidationError("--html writes HTML: drop --format") }
            try Self.checkReportPath(html)
        }
        for (option, value) in [("--since", since), ("--until", until)] {
            if let value, Self.time(value, now: Date()) == nil {
                throw ValidationError("\(option) must be a UTC time like 2026-11-26 or 2026-11-26T06:00:00Z, or an age like 30m, 8h or 7d; got '\(value)'")
            }
        }
    }

    func run() async throws {
        let path = ledger ?? Ledger.defaultPath()
        guard Ledger.isServer(path) || FileManager.default.fileExists(atPath: path) else {
            throw CLIFailure(.ledgerFailed, "no ledger at \(path): nothing was recorded there yet (flashing real devices records to it; --ledger PATH names another)")
        }
        let records: [LedgerRecord]
        do throws(LedgerError) {
            records = try await Self.read(path, LedgerQuery(since: since.flatMap { Self.time($0, now: Date()) },
                                                            until: until.flatMap { Self.time($0, now: Date()) },
                                                            device: device, serialNumber: serial, result: result, image: image,
                                                            station: station, limit: limit))
        } catch {
            throw CLIFailure(error)
        }
        let out = CLIContext.output
        if check {
            try await runCheck(path, records: records)
            return
        }
        if let html {
            let model = LineModel(records: records)
            let filters = [("since", since), ("until", until), ("device", device), ("serial", serial), ("result", result?.rawValue),
                           ("image", image), ("station", station), ("limit", limit.map(String.init))]
                .compactMap { name, value in value.map { "--\(name) \($0)" } }
            let subtitle = "\(path.redactingPassword)" + (filters.isEmpty ? "" : " · " + filters.joined(separator: " "))
                + " · written \(LedgerRecord.timestamp(Date())) by otaflash \(OtaflashVersion.number)"
            let text = LineHTML.document(model, title: "otaflash shift report", subtitle: subtitle)
            do {
                try Data(text.utf8).write(to: URL(fileURLWithPath: html), options: .atomic)
            } catch {
                throw CLIFailure(.outputFailed, "the report \(html) could not be written: \(error.localizedDescription)")
            }
            out.err("wrote \(html): \(model.counts.attempts) attempts, \(model.counts.devices) devices\n")
        } else if summary {
            out.out(Self.render(LedgerSummary(records), format: format))
        } else {
            out.out(Self.render(records, format: format))
        }
    }

    /// `--check`: the selected records against each other, the claims against the whole ledger.
    private func runCheck(_ path: String, records: [LedgerRecord]) async throws {
        let result: LedgerCheck
        do throws(LedgerError) {
            let store = try Ledger.open(path)
            let all = try await store.records(LedgerQuery())
            let claims = try await store.claims()
            await store.close()
            // The claims' times are the ledger's clock; this machine's stands in for it (a lease
            // that ended within the clocks' skew of now may be taken for a running one).
            result = LedgerCheck(records: records, allRecords: all, claims: claims, now: LedgerRecord.timestamp(Date()))
        } catch {
            throw CLIFailure(error)
        }
        let out = CLIContext.output
        let outbox = postOutbox ?? ResultsOutbox.defaultDirectory(ledger: path)
        let depth = FileManager.default.fileExists(atPath: outbox) ? ResultsOutbox.depth(outbox) : nil
        switch format {
        case .json:
            for finding in result.findings {
                out.out(Self.json(["finding": finding.kind.rawValue, "device": finding.device ?? "", "message": finding.line]) + "\n")
            }
            if let depth {
                out.out(Self.json(ResultsDepth(resultsOutbox: outbox, pending: depth.pending, refused: depth.refused, oldestDevice: depth.oldest?.device,
                                               oldestEndedAt: depth.oldest?.endedAt, oldestAttemptId: depth.oldest?.attemptID)) + "\n")
            }
            out.out(Self.json(CheckSummary(records: result.records, claims: result.claims, findings: result.findings.count, passed: result.passed)) + "\n")
        case .csv, .table, .junit:
            for note in result.notes { out.err("note: \(note)\n") }
            for finding in result.findings { out.out("\(finding.kind.rawValue): \(finding.line)\n") }
            if let depth { out.out(Self.line(depth, outbox)) }
            out.out(result.passed ? "the books check out: \(result.records) records, \(result.claims) claims\n"
                                  : "\(result.findings.count) findings in \(result.records) records and \(result.claims) claims\n")
        }
        if !result.passed {
            throw CLIFailure(.ledgerInconsistent, "the books of \(path.redactingPassword) do not check out: \(result.findings.count) findings (above)").markedReported()
        }
    }

    /// The `--post-results` outbox's line: records not yet delivered (not a finding: they are sent
    /// by the next run that posts), and those the server refused.
    static func line(_ depth: ResultsOutbox.Depth, _ outbox: String) -> String {
        var text = depth.pending == 0 ? "results outbox \(outbox): every record delivered"
            : "results outbox \(outbox): \(depth.pending) record\(depth.pending == 1 ? "" : "s") not yet delivered, the oldest \(depth.oldest.map { "\($0.device)'s, ended \($0.endedAt)" } ?? "unreadable"); the next run with --post-results sends them"
        if depth.refused > 0 { text += "; \(depth.refused) refused by the server, kept in \(outbox)/refused" }
        return text + "\n"
    }

    private struct ResultsDepth: Encodable {
        var resultsOutbox: String
        var pending: Int
        var refused: Int
        var oldestDevice: String?
        var oldestEndedAt: String?
        var oldestAttemptId: String?

        private enum Keys: CodingKey {
            case resultsOutbox, pending, refused, oldestDevice, oldestEndedAt, oldestAttemptId
        }

        /// Every key on every line, `null` where there is no oldest.
        func encode(to encoder: any Encoder) throws {
            var c = encoder.container(keyedBy: Keys.self)
            try c.encode(resultsOutbox, forKey: .resultsOutbox)
            try c.encode(pending, forKey: .pending)
            try c.encode(refused, forKey: .refused)
            try c.encode(oldestDevice, forKey: .oldestDevice)
            try c.encode(oldestEndedAt, forKey: .oldestEndedAt)
            try c.encode(oldestAttemptId, forKey: .oldestAttemptId)
        }
    }

    private struct CheckSummary: Encodable {
        var records: Int
        var claims: Int
        var findings: Int
        var passed: Bool
    }

    static func read(_ path: String, _ query: LedgerQuery) async throws(LedgerError) -> [LedgerRecord] {
        let store = try Ledger.open(path)
        let records = try await store.records(query)
        await store.close()
        return records
    }

    /// A `--since`/`--until` value as a ledger timestamp: a UTC date or time, or an age before `now`.
    static func time(_ text: String, now: Date) -> String? {
        if let match = text.wholeMatch(of: /([0-9]{1,6})([smhd])/), let n = Double(match.1) {
            let unit: Double = switch match.2 { case "s": 1; case "m": 60; case "h": 3600; default: 86_400 }
            return LedgerRecord.timestamp(now.addingTimeInterval(-n * unit))
        }
        // A date, a time to the minute or second (fractions allowed), UTC ("Z" optional): each
        // field in its range and the day in its month, so 25:00 or 02-30 is refused, not rolled over.
        guard let m = text.wholeMatch(of: /([0-9]{4})-([0-9]{2})-([0-9]{2})(?:T([0-9]{2}):([0-9]{2})(?::([0-9]{2})(\.[0-9]{1,9})?)?)?(Z|\+00:00)?/),
              m.8 == nil || m.4 != nil else { return nil }
        var utc = Calendar(identifier: .gregorian)
        utc.timeZone = TimeZone(identifier: "UTC")!
        let parts = DateComponents(calendar: utc, timeZone: utc.timeZone, year: Int(m.1), month: Int(m.2), day: Int(m.3),
                                   hour: m.4.flatMap { Int($0) } ?? 0, minute: m.5.flatMap { Int($0) } ?? 0,
                                   second: m.6.flatMap { Int($0) } ?? 0)
        guard (1...12).contains(parts.month!), (0...23).contains(parts.hour!), (0...59).contains(parts.minute!),
              (0...59).contains(parts.second!), parts.isValidDate(in: utc), let date = utc.date(from: parts) else { return nil }
        return LedgerRecord.timestamp(date.addingTimeInterval(m.7.flatMap { Double("0" + $0) } ?? 0))
    }

    static func json<T: Encodable>(_ value: T) -> String {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        encoder.keyEncodingStrategy = .convertToSnakeCase
        return (try? encoder.encode(value)).map { String(decoding: $0, as: UTF8.self) } ?? "{}"
    }

    static func render(_ records: [LedgerRecord], format: Format) -> String {
        switch format {
        case .csv:
            return ([LedgerRecord.columns.joined(separator: ",")] + records.map { $0.texts.map(csvField).joined(separator: ",") })
                .joined(separator: "\n") + "\n"
        case .json:
            return records.map { json($0) + "\n" }.joined()
        case .junit:
            return JUnitReport.xml(records)
        case .table:
            let rows = [["started (UTC)", "station", "device", "serial", "result", "error", "attempts", "time", "image", "before", "after"]]
                + records.map { r in
                    [String(r.startedAt.prefix(19)), r.station, r.device, r.serialNumber ?? "-", r.result.rawValue, r.errorCode ?? "-",
                     "\(r.attempts)", String(format: "%.1f s", r.seconds), r.imageName, r.firmwareBefore ?? "-", r.firmwareAfter ?? "-"]
                }
            return table(rows) + (records.isEmpty ? "(no records)\n" : "")
        }
    }

    static func render(_ s: LedgerSummary, format: Format) -> String {
        func percent(_ x: Double) -> String { String(format: "%.1f %%", x * 100) }
        func seconds(_ x: Double?) -> String { x.map { String(format: "%.1f s", $0) } ?? "-" }
        switch format {
        case .json:
            return json(s) + "\n"
        case .csv, .junit:
            var lines = ["metric,value", "attempts,\(s.attempts)", "devices,\(s.devices)",
                         "first_pass_yield,\(String(format: "%.4f", s.firstPassYield))", "final_yield,\(String(format: "%.4f", s.finalYield))",
                         "median_seconds,\(s.medianSeconds.map { String(format: "%.3f", $0) } ?? "")",
                         "p95_seconds,\(s.p95Seconds.map { String(format: "%.3f", $0) } ?? "")"]
            lines += s.failuresByErrorCode.map { "failures_\($0.errorCode),\($0.count)" }
            lines += s.stations.map { "station_\(csvField($0.name))_ok,\($0.ok)" } + s.stations.map { "station_\(csvField($0.name))_failed,\($0.failed)" }
            lines += s.adapters.map { "adapter_\(csvField($0.name))_ok,\($0.ok)" } + s.adapters.map { "adapter_\(csvField($0.name))_failed,\($0.failed)" }
            return lines.joined(separator: "\n") + "\n"
        case .table:
            var text = table([
                ["attempts", "\(s.attempts)"], ["devices", "\(s.devices)"],
                ["first-pass yield", percent(s.firstPassYield)], ["final yield", percent(s.finalYield)],
                ["median time (ok)", seconds(s.medianSeconds)], ["p95 time (ok)", seconds(s.p95Seconds)],
            ])
            if !s.failuresByErrorCode.isEmpty {
                text += "\nfailures by error code\n" + table(s.failuresByErrorCode.map { ["  " + $0.errorCode, "\($0.count)"] })
            }
            for (title, groups) in [("station", s.stations), ("adapter", s.adapters)] {
                text += "\n" + table([[title, "attempts", "devices", "ok", "failed"]]
                                     + groups.map { [$0.name, "\($0.attempts)", "\($0.devices)", "\($0.ok)", "\($0.failed)"] })
            }
            return text
        }
    }

    /// A report file's place: its folder must exist (a typo is a command-line error, exit 2).
    static func checkReportPath(_ path: String) throws(ValidationError) {
        if path.isEmpty { throw ValidationError("--html needs a file name") }
        let folder = (path as NSString).deletingLastPathComponent
        var isFolder: ObjCBool = false
        if FileManager.default.fileExists(atPath: path, isDirectory: &isFolder), isFolder.boolValue {
            throw ValidationError("--html \(path) is a folder: name a file")
        }
        if !folder.isEmpty, !(FileManager.default.fileExists(atPath: folder, isDirectory: &isFolder) && isFolder.boolValue) {
            throw ValidationError("--html \(path): the folder \(folder) does not exist")
        }
    }

    /// Columns padded to their widest cell, two spaces apart.
    static func table(_ rows: [[String]]) -> String {
        guard let first = rows.first else { return "" }
        let widths = (0..<first.count).map { column in rows.map { $0.indices.contains(column) ? $0[column].count : 0 }.max() ?? 0 }
        return rows.map { row in
            row.enumerated().map { i, cell in i == row.count - 1 ? cell : cell.padding(toLength: widths[i], withPad: " ", startingAt: 0) }
                .joined(separator: "  ")
        }.joined(separator: "\n") + "\n"
    }
}
