import Foundation
import Ledger

/// What the line looks like, from its records (and, live, its stations' heartbeats): the shift's
/// counts, the stations, the series behind the plots and the plots as SVG, the last failures.
/// `otaflash ledger --html` and `otaflash dashboard` both draw it (docs/LINE.md).
public struct LineModel: Sendable {
    /// The shift's counts. Attempts, devices and both yields are `LedgerSummary`'s (the same rule as
    /// `otaflash ledger --summary`).
    public struct Counts: Sendable, Hashable, Codable {
        /// Attempts (records), held-elsewhere encounters left out.
        public var attempts: Int
        /// Distinct devices.
        public var devices: Int
        /// Devices done: an attempt ended ok, or found them up to date (skipped).
        public var done: Int
        /// Attempts that failed (a device retried counts once per attempt).
        public var failedAttempts: Int
        /// Devices never done whose failed attempts at one image are more than a station's
        /// retries (`retries`): a station leaves them alone.
        public var quarantined: Int
        public var firstPassYield: Double
        public var finalYield: Double
        /// Devices done per hour of the shift (from its first start to its last end).
        public var devicesPerHour: Double
        /// The shift's length in hours, from its first start to its last end.
        public var hours: Double
        /// Seconds of the attempts that ended ok: median and 95th percentile (nearest rank).
        public var medianSeconds: Double?
        public var p95Seconds: Double?
    }

    /// A station as the dashboard shows it: alive from its heartbeat (none in a report).
    public struct Station: Sendable, Hashable, Codable {
        public var name: String
        /// Nil when nothing says (a report: no heartbeat).
        public var alive: Bool?
        /// Seconds since its last heartbeat, by the ledger's clock.
        public var lastBeatSeconds: Double?
        public var adapters: [String]
        public var inProgress: Int?
        public var claimsHeld: Int?
        public var attempts: Int
        public var done: Int
        public var failed: Int

        public init(name: String, alive: Bool? = nil, lastBeatSeconds: Double? = nil, adapters: [String] = [], inProgress: Int? = nil,
                    claimsHeld: Int? = nil, attempts: Int = 0, done: Int = 0, failed: Int = 0) {
            self.name = name
            self.alive = alive
            self.lastBeatSeconds = lastBeatSeconds
            self.adapters = adapters
            self.inProgress = inProgress
            self.claimsHeld = claimsHeld
            self.attempts = attempts
            self.done = done
            self.failed = failed
        }
    }

    /// A failed attempt, with its full reason.
    public struct Failure: Sendable, Hashable, Codable {
        public var startedAt: String
        public var station: String
        public var device: String
        public var serialNumber: String?
        public var attempt: Int
        public var errorCode: String
        public var message: String
    }

    /// The four plots, each drawn once per page.
    public enum PlotKind: String, Sendable, CaseIterable, Codable {
        /// Devices done per bin (10 minutes) per station.
        case throughput
        /// First-pass and final yield of the devices seen so far, at the end of each bin.
        case yield
        /// Seconds per device (attempts that ended ok), with the median and p95.
        case durations
        /// Failed attempts per bin by error class.
        case failures
    }

    public struct Plot: Sendable, Hashable {
        public var kind: PlotKind
        public var title: String
        /// One `<svg>` element, drawn here: no script, no external reference.
        public var svg: String
    }

    public var counts: Counts
    public var summary: LedgerSummary
    public var stations: [Station]
    /// The newest failures first.
    public var failures: [Failure]
    public var plots: [Plot]
    /// The first start and the last end among the records (ledger timestamps); nil with none.
    public var from: String?
    public var to: String?

    /// The most failures a page lists.
    public static let failureLimit = 20

    /// The model of `records` (any order). `heartbeats` are the stations' live rows (the dashboard's);
    /// stations with records but no heartbeat are listed too. `retries` is the stations' `--retries`
    /// (for `quarantined`).
    public init(records: [LedgerRecord], stations live: [Station] = [], retries: Int = 1) {
        var attempts = records.filter { !$0.isEncounter }
        attempts.sort(by: LedgerSummary.chronological)
        summary = LedgerSummary(attempts)
        var succeeded: Set<String> = []
        var failedPerImage: [String: Int] = [:]
        for r in attempts {
            let device = r.device.uppercased()
            if r.result.succeeded { succeeded.insert(device) }
            if r.result == .error, r.errorCode != "interrupted" { failedPerImage[device + " " + r.imageSHA256, default: 0] += 1 }
        }
        var quarantined: Set<String> = []
        for (key, n) in failedPerImage where n > retries {
            let device = String(key.prefix { $0 != " " })
            if !succeeded.contains(device) { quarantined.insert(device) }
        }
        let start = attempts.compactMap { LineTime.seconds($0.startedAt) }.min()
        let end = attempts.compactMap { LineTime.seconds($0.endedAt) }.max()
        let hours = start.flatMap { s in end.map { max(0, $0 - s) / 3600 } } ?? 0
        counts = Counts(attempts: summary.attempts, devices: summary.devices, done: succeeded.count,
                        failedAttempts: attempts.filter { !$0.result.succeeded }.count, quarantined: quarantined.count,
                        firstPassYield: summary.firstPassYield, finalYield: summary.finalYield,
                        devicesPerHour: hours > 0 ? Double(succeeded.count) / hours : 0, hours: hours,
                        medianSeconds: summary.medianSeconds, p95Seconds: summary.p95Seconds)
        from = attempts.first?.startedAt
        to = attempts.map(\.endedAt).max()

        stations = Self.stations(live, summary: summary)

        failures = attempts.reversed().filter { !$0.result.succeeded }.prefix(Self.failureLimit).map { r in
            Failure(startedAt: r.startedAt, station: r.station, device: r.device, serialNumber: r.serialNumber, attempt: r.attempts,
                    errorCode: r.errorCode ?? r.result.rawValue, message: r.message ?? "")
        }
        plots = LinePlots(attempts, summary: summary, start: start, end: end).plots
    }

    /// The same model with other live stations (a newer heartbeat): nothing else is drawn again.
    public func with(stations live: [Station]) -> LineModel {
        var model = self
        model.stations = Self.stations(live, summary: summary)
        return model
    }

    /// The live stations, and those with records but no heartbeat, with their counts.
    static func stations(_ live: [Station], summary: LedgerSummary) -> [Station] {
        var rows = Dictionary(live.map { ($0.name, $0) }, uniquingKeysWith: { a, _ in a })
        for group in summary.stations {
            var row = rows[group.name] ?? Station(name: group.name)
            row.attempts = group.attempts
            row.done = group.ok
            row.failed = group.failed
            rows[group.name] = row
        }
        return rows.values.sorted { $0.name < $1.name }
    }
}
