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

public enum Ledger {
    /// The current schema version (docs/LEDGER.md): a store migrates an older ledger up to it.
    public static let schemaVersion = 1

    /// The default ledger: `$XDG_STATE_HOME/otaflash/ledger.sqlite`, or `~/.local/state/...`
    /// when `XDG_STATE_HOME` is unset or not absolute (XDG Base Directory Specification).
    public static func defaultPath(environment: [String: String] = ProcessInfo.processInfo.environment) -> String {
        let state = environment["XDG_STATE_HOME"].flatMap { $0.hasPrefix("/") ? $0 : nil }
            ?? ((environment["HOME"].flatMap { $0.isEmpty ? nil : $0 } ?? NSHomeDirectory()) + "/.local/state")
        return state + "/otaflash/ledger.sqlite"
    }

    /// Opens the ledger `location` names: a path (SQLite), or a `postgres://` / `postgresql://` URL.
    public static func open(_ location: String) throws(LedgerError) -> any LedgerStore {
        if location.hasPrefix("postgres://") || location.hasPrefix("postgresql://") {
            throw LedgerError(.badLocation, "--ledger \(location): a PostgreSQL ledger is not available in this build; give a file path for an SQLite ledger")
        }
        if location.contains("://") {
            throw LedgerError(.badLocation, "--ledger \(location): not a path or a postgres:// URL")
        }
        return try SQLiteLedger(path: location)
    }
}
