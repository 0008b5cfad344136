import Foundation

/// A station's sign of life in the ledger (docs/LINE.md, "Heartbeat"): `otaflash station` writes its
/// row every `interval` seconds, and once more when its shift ends; `otaflash dashboard` reads
/// them (it never writes) to show each station alive or dead.
///
/// Kept in the table `heartbeats`, one row per station and run, made by the first station that
/// beats: it is outside the versioned schema (`Ledger.schemaVersion`), so stations of an older
/// otaflash keep sharing a ledger that has it.
public struct StationHeartbeat: Sendable, Hashable, Codable {
    public var station: String
    public var run: String
    /// When the run started (ledger timestamp).
    public var startedAt: String
    /// Seconds between beats: the station is dead once its last beat is three of them old.
    public var interval: Double
    public var adapters: [String]
    public var inProgress: Int
    public var claimsHeld: Int
    /// The shift ended (a last beat as it ends): dead at once, not after three intervals.
    public var ended: Bool
    /// When it last beat, by the ledger's clock (the server's for PostgreSQL); set by the store.
    public var beatAt: String
    /// Seconds since then, by the ledger's clock; set when read.
    public var age: Double

    public init(station: String, run: String, startedAt: String, interval: Double, adapters: [String], inProgress: Int, claimsHeld: Int,
                ended: Bool = false, beatAt: String = "", age: Double = 0) {
        self.station = station
        self.run = run
        self.startedAt = startedAt
        self.interval = interval
        self.adapters = adapters
        self.inProgress = inProgress
        self.claimsHeld = claimsHeld
        self.ended = ended
        self.beatAt = beatAt
        self.age = age
    }

    /// Beating: not ended, and the last beat less than three intervals old.
    public var alive: Bool { !ended && age < 3 * interval }

    /// The table, as both stores make it (`CREATE TABLE IF NOT EXISTS` before the first beat).
    static let table = """
        CREATE TABLE IF NOT EXISTS heartbeats (
            station text NOT NULL, run_id text NOT NULL, started_at text NOT NULL, beat_at text NOT NULL,
            interval_seconds double precision NOT NULL, adapters text NOT NULL, in_progress integer NOT NULL,
            claims_held integer NOT NULL, ended integer NOT NULL, PRIMARY KEY (station, run_id))
        """
}

extension LedgerStore {
    /// A store without heartbeats (a test's): beats go nowhere, and none is read.
    public func beat(_ heartbeat: StationHeartbeat) async throws(LedgerError) {}
    public func heartbeats() async throws(LedgerError) -> [StationHeartbeat] { [] }
}
