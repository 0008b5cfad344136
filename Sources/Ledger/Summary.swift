/// A shift at a glance, from its records: what a quality engineer asks first.
public struct LedgerSummary: Sendable, Hashable, Codable {
    public struct Group: Sendable, Hashable, Codable {
        public var name: String
        public var attempts: Int
        public var devices: Int
        public var ok: Int
        public var failed: Int
    }

    /// Records summarised.
    public var attempts: Int
    /// Distinct devices (by address).
    public var devices: Int
    /// Devices whose first attempt in the records ended ok (or skipped: already up to date), over `devices`.
    public var firstPassYield: Double
    /// Devices whose last attempt ended ok (or skipped), over `devices`.
    public var finalYield: Double
    /// Seconds of the attempts that ended ok: median and 95th percentile (nearest rank); nil with none.
    public var medianSeconds: Double?
    public var p95Seconds: Double?
    /// Failed attempts by error code, most frequent first.
    public var failuresByErrorCode: [Count]
    public var stations: [Group]
    public var adapters: [Group]

    public struct Count: Sendable, Hashable, Codable {
        public var errorCode: String
        public var count: Int
    }

    /// Summarises the attempts among `records`: a row an older otaflash wrote for a device it found
    /// held by another station (`held_elsewhere`, nothing sent) is an encounter, and left out.
    public init(_ records: [LedgerRecord]) {
        // Indices and flags rather than copies of the records: a dashboard draws this every second.
        let records = records.filter { !$0.isEncounter }
        let succeeded: (LedgerRecord) -> Bool = { $0.result.succeeded }
        attempts = records.count
        var first: [String: Bool] = [:]
        var last: [String: Bool] = [:]
        for i in records.indices.sorted(by: { Self.chronological(records[$0], records[$1]) }) {
            let key = records[i].device.uppercased()
            let ok = succeeded(records[i])
            if first[key] == nil { first[key] = ok }
            last[key] = ok
        }
        devices = first.count
        firstPassYield = devices == 0 ? 0 : Double(first.values.filter { $0 }.count) / Double(devices)
        finalYield = devices == 0 ? 0 : Double(last.values.filter { $0 }.count) / Double(devices)
        let times = records.compactMap { $0.result == .ok ? $0.seconds : nil }.sorted()
        medianSeconds = Self.percentile(times, 0.5)
        p95Seconds = Self.percentile(times, 0.95)
        var failures: [String: Int] = [:]
        for record in records where !succeeded(record) { failures[record.errorCode ?? "unknown", default: 0] += 1 }
        failuresByErrorCode = failures.map { Count(errorCode: $0.key, count: $0.value) }
            .sorted { $0.count != $1.count ? $0.count > $1.count : $0.errorCode < $1.errorCode }
        stations = Self.groups(records, by: \.station, succeeded: succeeded)
        adapters = Self.groups(records, by: { $0.adapter ?? "-" }, succeeded: succeeded)
    }

    /// Start time, then id: the order attempts happened in.
    public static func chronological(_ a: LedgerRecord, _ b: LedgerRecord) -> Bool {
        a.startedAt != b.startedAt ? a.startedAt < b.startedAt : (a.id ?? 0) < (b.id ?? 0)
    }

    /// The nearest-rank percentile of sorted `values`; nil when empty.
    static func percentile(_ sorted: [Double], _ p: Double) -> Double? {
        guard !sorted.isEmpty else { return nil }
        let rank = Int((p * Double(sorted.count)).rounded(.up))
        return sorted[min(max(rank, 1), sorted.count) - 1]
    }

    static func groups(_ records: [LedgerRecord], by key: (LedgerRecord) -> String,
                       succeeded: (LedgerRecord) -> Bool) -> [Group] {
        var groups: [String: (attempts: Int, devices: Set<String>, ok: Int)] = [:]
        for record in records {
            let name = key(record)
            groups[name, default: (0, [], 0)].attempts += 1
            groups[name]!.devices.insert(record.device.uppercased())
            if succeeded(record) { groups[name]!.ok += 1 }
        }
        return groups.map { name, g in
            Group(name: name, attempts: g.attempts, devices: g.devices.count, ok: g.ok, failed: g.attempts - g.ok)
        }.sorted { $0.name < $1.name }
    }
}
