/// The books' consistency (`otaflash ledger --check`, docs/LEDGER.md "Checking the books"): what
/// must hold of the records and claims of stations that never flashed a device twice and never
/// lost a record. Pure: the records and claims in, the findings out.
public struct LedgerCheck: Sendable, Hashable {
    /// One thing that does not hold, as a line for people.
    public struct Finding: Sendable, Hashable {
        public enum Kind: String, Sendable, Hashable {
            /// A device with more than one `ok` record with one image: flashed twice.
            case flashedTwice = "flashed_twice"
            /// A claim `done` with no `ok` or `skipped` record for its device and image: a record lost.
            case recordMissing = "record_missing"
            /// A claim still `held` whose lease ended: its holder is not running (it stopped mid-flash).
            case heldByStoppedStation = "held_by_stopped_station"
            /// A station's counts that do not add up (results, exit codes).
            case countsDoNotAddUp = "counts_do_not_add_up"
        }

        public var kind: Kind
        public var device: String?
        public var line: String
    }

    /// The records checked (after any filter), and the claims.
    public var records: Int
    public var claims: Int
    public var findings: [Finding]
    /// Lines that are no failure: rows an older otaflash wrote for encounters (`held_elsewhere`).
    public var notes: [String]

    public var passed: Bool { findings.isEmpty }

    /// Checks `records` (those selected) against each other, and `claims` against `allRecords`
    /// (the whole ledger: a claim's record may be outside a selection), at ledger time `now`.
    ///
    /// A claim is held by a running station while its lease runs: a running holder renews it every
    /// third of the lease, so a `held` claim whose lease ended at `now` is one whose holder stopped
    /// (killed, powered off, its host lost) while the device was being flashed.
    public init(records: [LedgerRecord], allRecords: [LedgerRecord], claims: [Claim], now: String) {
        self.records = records.count
        self.claims = claims.count
        var findings: [Finding] = []
        var notes: [String] = []

        // Every ok device has exactly one ok record per image.
        let oks = Dictionary(grouping: records.filter { $0.result == .ok }) { "\($0.device.uppercased()) \($0.imageSHA256)" }
        for (_, rows) in oks.sorted(by: { $0.key < $1.key }) where rows.count > 1 {
            let r = rows[0]
            let where_ = rows.map { "\($0.station) \($0.startedAt)" }.joined(separator: "; ")
            findings.append(Finding(kind: .flashedTwice, device: r.device,
                                    line: "\(r.device) has \(rows.count) ok records with image \(r.imageName) (\(r.imageSHA256.prefix(12))): flashed more than once (\(where_))"))
        }

        // Every claim done has its record; none is left held by a station that stopped.
        var succeeded = Set<String>()
        for r in allRecords where r.result.succeeded { succeeded.insert("\(r.device.uppercased()) \(r.imageSHA256)") }
        for c in claims.sorted(by: { $0.device < $1.device }) {
            switch c.state {
            case .done where !succeeded.contains("\(c.device.uppercased()) \(c.imageSHA256)"):
                findings.append(Finding(kind: .recordMissing, device: c.device,
                                        line: "\(c.device): its claim is done (station \(c.station), \(c.expiresAt)) but no ok record with image \(c.imageSHA256.prefix(12)) exists: a record was lost"))
            case .held where c.expiresAt <= now:
                findings.append(Finding(kind: .heldByStoppedStation, device: c.device,
                                        line: "\(c.device): claimed by station \(c.station) (run \(c.run.prefix(8))) at \(c.claimedAt) and still held, its lease over since \(c.expiresAt): that station stopped while flashing it; flash it again to know its state"))
            default:
                break
            }
        }

        // Counts per station add up: every record is one attempt with one known result, whose exit
        // code says the same (the summary's ok and failed then add up to each station's attempts).
        let results = Set(LedgerResult.allCases)
        for (station, rows) in Dictionary(grouping: records, by: \.station).sorted(by: { $0.key < $1.key }) {
            let unknown = rows.filter { !results.contains($0.result) }
            let wrongCode = rows.filter { results.contains($0.result) && ($0.result.succeeded != ($0.exitCode == 0)) }
            let noCode = rows.filter { $0.result == .error && $0.errorCode == nil }
            if !unknown.isEmpty || !wrongCode.isEmpty || !noCode.isEmpty {
                var why: [String] = []
                if !unknown.isEmpty { why.append("\(unknown.count) with a result other than " + LedgerResult.allCases.map(\.rawValue).joined(separator: ", ")) }
                if !wrongCode.isEmpty { why.append("\(wrongCode.count) whose exit code disagrees with the result") }
                if !noCode.isEmpty { why.append("\(noCode.count) errors without an error code") }
                findings.append(Finding(kind: .countsDoNotAddUp, device: nil,
                                        line: "station \(station): of \(rows.count) records, " + why.joined(separator: ", ")))
            }
            let encounters = rows.filter(\.isEncounter).count
            if encounters > 0 {
                notes.append("station \(station): \(encounters) records are encounters, not attempts (\(LedgerRecord.encounterErrorCode): nothing was sent; an older otaflash wrote them); the summary leaves them out")
            }
        }
        self.findings = findings
        self.notes = notes
    }
}
