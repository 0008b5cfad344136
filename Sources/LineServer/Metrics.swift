import Foundation
import Synchronization

/// A station's metrics in Prometheus' text exposition format (version 0.0.4), written here rather
/// than by swift-prometheus: a station has five metrics, and this writer (a hundred lines, no
/// dependency) says exactly what it prints. Names follow Prometheus' conventions: `otaflash_`,
/// base units (seconds, bytes), `_total` on counters (docs/LINE.md).
public final class StationMetrics: Sendable {
    /// The seconds buckets of a device's attempt (ok): a simulated device takes under a second, a
    /// real one 10 s to a few minutes.
    public static let secondsBuckets: [Double] = [0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600]
    /// Bytes per second of transfer: BLE from a few hundred bytes to about 100 KiB per second.
    public static let rateBuckets: [Double] = [500, 1000, 2000, 5000, 10_000, 20_000, 50_000, 100_000, 200_000]

    /// What the station reads at each scrape.
    public struct Gauges: Sendable {
        public var inProgress: Int
        public var claimsHeld: Int
        public var adaptersUp: Int
        /// Records and releases the outbox keeps for the ledger; nil without an outbox.
        public var outboxDepth: Int?

        public init(inProgress: Int, claimsHeld: Int, adaptersUp: Int, outboxDepth: Int?) {
            self.inProgress = inProgress
            self.claimsHeld = claimsHeld
            self.adaptersUp = adaptersUp
            self.outboxDepth = outboxDepth
        }
    }

    struct Histogram: Sendable {
        let bounds: [Double]
        var counts: [Int]
        var sum = 0.0
        var count = 0

        init(_ bounds: [Double]) {
            self.bounds = bounds
            counts = Array(repeating: 0, count: bounds.count)
        }

        mutating func observe(_ value: Double) {
            guard value.isFinite, value >= 0 else { return }
            for (i, bound) in bounds.enumerated() where value <= bound { counts[i] += 1 }
            sum += value
            count += 1
        }
    }

    private struct State: Sendable {
        /// By (result, error class).
        var attempts: [Pair: Int] = [Pair(result: "ok", error: "none"): 0]
        var seconds = Histogram(StationMetrics.secondsBuckets)
        var rate = Histogram(StationMetrics.rateBuckets)
    }

    struct Pair: Hashable, Sendable {
        var result: String
        var error: String
    }

    private let state = Mutex(State())
    private let gauges: @Sendable () async -> Gauges

    /// `gauges` is asked at each scrape.
    public init(gauges: @escaping @Sendable () async -> Gauges) {
        self.gauges = gauges
    }

    /// An attempt ended with a record: its `result` (`ok`, `skipped`, `error`, `bond_left`), its
    /// error class (the exit code's name; nil when it succeeded), its seconds and the bytes it sent.
    public func attemptEnded(result: String, error: String?, seconds: Double, bytes: Int) {
        state.withLock { s in
            s.attempts[Pair(result: result, error: error ?? "none"), default: 0] += 1
            if result == "ok" { s.seconds.observe(seconds) }
            if bytes > 0, seconds > 0 { s.rate.observe(Double(bytes) / seconds) }
        }
    }

    /// The exposition: every metric with its HELP and TYPE, in a fixed order.
    public func exposition() async -> String {
        let g = await gauges()
        let s = state.withLock { $0 }
        var w = ExpositionWriter()
        w.header("otaflash_attempts_total", "Device attempts that ended with a record, by result and error class (the exit code's name).", type: "counter")
        for (pair, n) in s.attempts.sorted(by: { ($0.key.result, $0.key.error) < ($1.key.result, $1.key.error) }) {
            w.sample("otaflash_attempts_total", labels: [("result", pair.result), ("error", pair.error)], n)
        }
        w.histogram("otaflash_device_duration_seconds", "Seconds per device: attempts that ended ok.", s.seconds)
        w.histogram("otaflash_transfer_rate_bytes_per_second", "Image bytes sent per second of an attempt.", s.rate)
        w.header("otaflash_devices_in_progress", "Devices being flashed now.", type: "gauge")
        w.sample("otaflash_devices_in_progress", g.inProgress)
        w.header("otaflash_claims_held", "Claims this station holds in the ledger now.", type: "gauge")
        w.sample("otaflash_claims_held", g.claimsHeld)
        w.header("otaflash_adapters_up", "Adapters whose last scan worked.", type: "gauge")
        w.sample("otaflash_adapters_up", g.adaptersUp)
        if let depth = g.outboxDepth {
            w.header("otaflash_outbox_depth", "Records and claim releases the station's outbox keeps for the ledger.", type: "gauge")
            w.sample("otaflash_outbox_depth", depth)
        }
        return w.text
    }
}

/// Prometheus' text format, version 0.0.4: `# HELP`, `# TYPE`, then samples; label values with
/// `\`, `"` and newlines escaped, HELP text with `\` and newlines escaped.
struct ExpositionWriter {
    var text = ""

    mutating func header(_ name: String, _ help: String, type: String) {
        text += "# HELP \(name) \(help.replacingOccurrences(of: "\\", with: "\\\\").replacingOccurrences(of: "\n", with: "\\n"))\n"
        text += "# TYPE \(name) \(type)\n"
    }

    mutating func sample(_ name: String, labels: [(String, String)] = [], _ value: Int) {
        sample(name, labels: labels, text: String(value))
    }

    mutating func sample(_ name: String, labels: [(String, String)] = [], _ value: Double) {
        sample(name, labels: labels, text: Self.number(value))
    }

    private mutating func sample(_ name: String, labels: [(String, String)], text value: String) {
        text += name
        if !labels.isEmpty {
            text += "{" + labels.map { "\($0.0)=\"\(Self.escape($0.1))\"" }.joined(separator: ",") + "}"
        }
        text += " " + value + "\n"
    }

    mutating func histogram(_ name: String, _ help: String, _ h: StationMetrics.Histogram) {
        header(name, help, type: "histogram")
        for (bound, n) in zip(h.bounds, h.counts) { sample(name + "_bucket", labels: [("le", Self.number(bound))], n) }
        sample(name + "_bucket", labels: [("le", "+Inf")], h.count)
        sample(name + "_sum", h.sum)
        sample(name + "_count", h.count)
    }

    static func escape(_ value: String) -> String {
        value.replacingOccurrences(of: "\\", with: "\\\\").replacingOccurrences(of: "\"", with: "\\\"").replacingOccurrences(of: "\n", with: "\\n")
    }

    /// A float as Go's strconv writes it for Prometheus: integers without a fraction, `+Inf`, `NaN`.
    static func number(_ x: Double) -> String {
        if x.isNaN { return "NaN" }
        if x.isInfinite { return x > 0 ? "+Inf" : "-Inf" }
        if x == x.rounded(), abs(x) < 1e15 { return String(Int64(x)) }
        return "\(x)"
    }
}
