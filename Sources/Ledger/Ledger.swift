import Foundation

/// Where attempts are recorded: one record per device attempt, committed when the attempt ends.
public protocol LedgerStore: Sendable {
    /// What the ledger is, for lines: "/var/lib/otaflash/ledger.sqlite".
    var location: String { get }

    /// Proves the ledger can take a record now (a small write in its own transaction), so that a
    /// flash never starts when its record could not be written. `station` is noted as seen.
    func prepare(station: String) async throws(LedgerError)

    /// Writes `record` in a transaction of its own and returns its id once it is committed.
    @discardableResult
    func append(_ record: LedgerRecord) async throws(LedgerError) -> Int64

    /// The records `query` selects, oldest first (with a limit: the newest that many, oldest first).
    func records(_ query: LedgerQuery) async throws(LedgerError) -> [LedgerRecord]

    /// Claims `device` for `holder` to flash it with the image of SHA-256 `image`, for `lease`
    /// (docs/LEDGER.md, "Claims"): granted when nobody holds it or the holder's lease has expired;
    /// held while another holder's lease runs; done when a record shows it `ok` (or `skipped`)
    /// with this image. Atomic: of holders claiming one device at once, one is granted.
    func claim(_ device: String, image: String, by holder: ClaimHolder, lease: Duration) async throws(LedgerError) -> ClaimResult

    /// Extends `holder`'s claim on `device` to `lease` from now; false when the claim is no longer
    /// `holder`'s (its lease expired and another holder took it, or it was released).
    func renew(_ device: String, by holder: ClaimHolder, lease: Duration) async throws(LedgerError) -> Bool

    /// Gives up `holder`'s claim on `device` without a record; another holder may take it at once.
    func release(_ device: String, by holder: ClaimHolder) async throws(LedgerError)

    /// Hands `previous`'s held claim on `device` to `holder`, with `image` and a new lease, whatever
    /// its lease: for a run of the same station whose process has ended (docs/LEDGER.md, "Claims").
    /// False when the claim is no longer `previous`'s held one.
    func takeOver(_ device: String, image: String, from previous: ClaimHolder, by holder: ClaimHolder, lease: Duration) async throws(LedgerError) -> Bool

    /// Writes `record` unless the ledger holds it already (the same run, device, start and
    /// attempt: its idempotent key), ending its holder's claim as `append` does; returns its id.
    /// An outbox replays records with it, so a record written before a lost answer is not written twice.
    @discardableResult
    func appendOnce(_ record: LedgerRecord) async throws(LedgerError) -> Int64

    /// Every claim the ledger holds (held, released and done), by device.
    func claims() async throws(LedgerError) -> [Claim]

    /// Writes `heartbeat` as its station's and run's row, stamped with the ledger's time
    /// (`StationHeartbeat`); the table is made on the first beat.
    func beat(_ heartbeat: StationHeartbeat) async throws(LedgerError)

    /// The newest heartbeat of each station (none when no station has beaten), with its age by
    /// the ledger's clock.
    func heartbeats() async throws(LedgerError) -> [StationHeartbeat]

    /// Releases the store's resources; nothing is lost by not calling it.
    func close() async
}

/// A ledger that cannot be opened, read or written: one line that says what and what to do.
public struct LedgerError: Error, Sendable, Hashable, CustomStringConvertible {
    public enum Kind: String, Sendable, Hashable {
        /// Another process holds the ledger's write lock past the wait.
        case locked
        /// The file or its folder cannot be written.
        case readOnly
        /// The file is not a ledger, or is damaged.
        case corrupt
        /// No space left for the record.
        case full
        /// Written by a newer otaflash (a schema version this one does not know).
        case newerSchema
        /// The file cannot be opened or created (a missing folder that cannot be made, permissions).
        case cannotOpen
        /// A ledger server cannot be reached.
        case unreachable
        /// A ledger server refused the credentials.
        case authentication
        /// A `--ledger` value that is neither a path nor a known URL.
        case badLocation
        /// The operation was cut short because the run is being stopped (Ctrl-C, SIGTERM, SIGHUP):
        /// not a ledger that cannot be written.
        case interrupted
        /// A file that is another program's SQLite database, not a ledger (`--ledger-init` adds the tables).
        case foreign
        /// Any other failure of the database.
        case failed
    }

    public let kind: Kind
    public let message: String

    public init(_ kind: Kind, _ message: String) {
        self.kind = kind
        self.message = message
    }

    public var description: String { message }
}

/// Who claims a device: a station, and the run on it (two runs on one station are two holders,
/// so a second otaflash started by mistake does not flash what the first is flashing).
public struct ClaimHolder: Sendable, Hashable {
    public var station: String
    public var run: String

    public init(station: String, run: String) {
        self.station = station
        self.run = run
    }
}

/// What a claim came to.
public enum ClaimResult: Sendable, Hashable {
    /// Flash it: the claim is the holder's until this time (renew before then).
    case granted(until: String)
    /// Another holder flashes it: leave it until its lease ends (or its record releases it).
    case held(by: String, until: String)
    /// A record shows it updated with this image already (by that station, ended then).
    case done(by: String, at: String)
}

/// A device's row in the claims table (docs/LEDGER.md). Times are ledger timestamps (UTC, ISO 8601)
/// of the ledger's clock: the server's for PostgreSQL, so stations' clocks do not matter.
public struct Claim: Sendable, Hashable, Codable {
    public enum State: String, Sendable, Hashable, Codable {
        /// Its holder is flashing it; until `expiresAt`, nobody else may.
        case held
        /// Its holder gave it up, or recorded an attempt that did not succeed.
        case released
        /// Its holder recorded an `ok` (or `skipped`) attempt with `imageSHA256`.
        case done
    }

    /// The address, upper-case.
    public var device: String
    public var imageSHA256: String
    public var station: String
    public var run: String
    public var state: State
    public var claimedAt: String
    /// When a held claim's lease ends; when it was released or done, the time it was.
    public var expiresAt: String

    public init(device: String, imageSHA256: String, station: String, run: String, state: State, claimedAt: String, expiresAt: String) {
        self.device = device
        self.imageSHA256 = imageSHA256
        self.station = station
        self.run = run
        self.state = state
        self.claimedAt = claimedAt
        self.expiresAt = expiresAt
    }

    /// Whether `holder` may take this claim for `image` at `now` (both stores' rule; docs/LEDGER.md):
    /// not when it is done with that image; otherwise when its lease is over, or it is the holder's own.
    public func free(for holder: ClaimHolder, image: String, now: String) -> Bool {
        if state == .done, imageSHA256 == image { return false }
        return expiresAt <= now || (station == holder.station && run == holder.run)
    }
}

public enum Ledger {
    /// The current schema version (docs/LEDGER.md): a store migrates an older ledger up to it.
    /// 1: attempts, stations. 2: claims.
    public static let schemaVersion = 2

    /// The longest lease a claim may ask for, and the shortest: a lease is renewed while the device
    /// is flashed, and ends that long after a station dies.
    public static let leaseRange: ClosedRange<Duration> = .milliseconds(100) ... .seconds(3600)

    /// The default ledger: `$XDG_STATE_HOME/otaflash/ledger.sqlite`, or `~/.local/state/...`
    /// when `XDG_STATE_HOME` is unset or not absolute (XDG Base Directory Specification).
    public static func defaultPath(environment: [String: String] = ProcessInfo.processInfo.environment) -> String {
        let state = environment["XDG_STATE_HOME"].flatMap { $0.hasPrefix("/") ? $0 : nil }
            ?? ((environment["HOME"].flatMap { $0.isEmpty ? nil : $0 } ?? NSHomeDirectory()) + "/.local/state")
        return state + "/otaflash/ledger.sqlite"
    }

    /// Whether `location` names a PostgreSQL server rather than a file.
    public static func isServer(_ location: String) -> Bool {
        location.hasPrefix("postgres://") || location.hasPrefix("postgresql://")
    }

    /// Opens the ledger `location` names: a path (SQLite), or a `postgres://` / `postgresql://` URL
    /// (nothing is sent until the first use: `prepare` connects, migrates and proves a write).
    /// A SQLite file that belongs to another program is refused unless `initialize` says to add
    /// the ledger's tables to it.
    public static func open(_ location: String, initialize: Bool = false) throws(LedgerError) -> any LedgerStore {
        try check(location)
        if isServer(location) {
            return try PostgresLedger(url: location)
        }
        return try SQLiteLedger(path: location, initialize: initialize)
    }

    /// Checks the form of a `--ledger` value without opening anything: not empty, and a path or a
    /// well-formed `postgres://` URL (a command-line mistake, `badLocation`).
    public static func check(_ location: String, environment: [String: String] = ProcessInfo.processInfo.environment) throws(LedgerError) {
        if location.isEmpty {
            throw LedgerError(.badLocation, "--ledger needs a path or a postgres:// URL, got an empty value; give one, or --no-ledger")
        }
        if isServer(location) {
            _ = try PostgresTarget(location, environment: environment)
        } else if location.contains("://") {
            throw LedgerError(.badLocation, "--ledger \(location): not a path or a postgres:// URL")
        }
    }
}

extension String {
    /// A ledger location as lines may show it: a URL without its password.
    public var redactingPassword: String {
        guard Ledger.isServer(self), var parts = URLComponents(string: self), parts.password != nil else { return self }
        parts.password = "***"
        return parts.string ?? self
    }
}

extension Duration {
    /// The duration in seconds, as a Double.
    var seconds: Double {
        let (s, attoseconds) = components
        return Double(s) + Double(attoseconds) / 1e18
    }
}

extension LedgerQuery {
    /// The statement both stores run for this query, given its filters as SQL conditions in the
    /// store's placeholder syntax: oldest first, or with a limit the newest that many, oldest first.
    func select(where clauses: [String]) -> String {
        var clauses = clauses
        if let afterID { clauses.append("id > \(afterID)") }
        var sql = "SELECT * FROM attempts"
        if !clauses.isEmpty { sql += " WHERE " + clauses.joined(separator: " AND ") }
        guard let limit else { return sql + " ORDER BY id" }
        return "SELECT * FROM (\(sql) ORDER BY id DESC LIMIT \(max(0, limit))) AS newest ORDER BY id"
    }
}
