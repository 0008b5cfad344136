import Foundation
import GRDB

/// The embedded ledger: one SQLite file (WAL, `synchronous = FULL`: a committed record survives a
/// power loss), shared safely by several otaflash processes on one station.
public final class SQLiteLedger: LedgerStore {
    public let location: String
    let queue: DatabaseQueue

    /// How long a write waits for another process's lock before it fails as `locked`.
    public static let busyTimeout: TimeInterval = 5

    /// Opens (creating it and its folder when missing) and migrates the ledger at `path`. A file
    /// that holds another program's tables is refused (`foreign`) unless `initialize` is true:
    /// then the ledger's tables are added beside them.
    public init(path: String, initialize: Bool = false) throws(LedgerError) {
        location = path
        let folder = (path as NSString).deletingLastPathComponent
        if !folder.isEmpty, !FileManager.default.fileExists(atPath: folder) {
            do {
                try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
            } catch {
                throw LedgerError(.cannotOpen, "cannot create the ledger's folder \(folder): \(Self.reason(error)); choose another with --ledger PATH, or --no-ledger")
            }
        }
        var configuration = Configuration()
        configuration.busyMode = .timeout(Self.busyTimeout)
        configuration.label = "otaflash.ledger"
        configuration.prepareDatabase { db in
            try db.execute(sql: "PRAGMA synchronous = FULL")
        }
        do {
            queue = try DatabaseQueue(path: path, configuration: configuration)
            // Before anything is written (its journal mode included): another program's file is left as it is.
            try queue.read { db in
                if !initialize, let tables = try Self.foreignTables(db) {
                    throw LedgerError(.foreign, "\(path) is another program's SQLite database (tables \(tables.prefix(3).joined(separator: ", "))\(tables.count > 3 ? ", …" : "")), not an otaflash ledger; nothing was written to it. Name another --ledger, or add --ledger-init to add the ledger's tables to this file")
                }
            }
            try queue.writeWithoutTransaction { db in
                if try String.fetchOne(db, sql: "PRAGMA journal_mode") != "wal" {
                    try db.execute(sql: "PRAGMA journal_mode = WAL")
                }
            }
            let migrator = Self.migrator
            try queue.read { db in
                if try migrator.hasBeenSuperseded(db) {
                    throw LedgerError(.newerSchema, "the ledger \(path) was written by a newer otaflash (a schema newer than version \(Ledger.schemaVersion)); use that version, or another --ledger")
                }
            }
            try migrator.migrate(queue)
        } catch let error as LedgerError {
            throw error
        } catch {
            throw Self.failure(error, path: path, doing: "opening")
        }
    }

    /// The tables of a file that is not a ledger, or nil: a ledger is a file with no tables yet,
    /// or one with `attempts` and the migrations table (tables beside them are left alone).
    static func foreignTables(_ db: Database) throws -> [String]? {
        let tables = try String.fetchAll(db, sql: "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name")
        if tables.isEmpty || (tables.contains("attempts") && tables.contains("grdb_migrations")) { return nil }
        return tables
    }

    /// The schema's migrations, in order; never changed once released (docs/LEDGER.md).
    static var migrator: DatabaseMigrator {
        var migrator = DatabaseMigrator()
        migrator.registerMigration("v1") { db in
            try db.create(table: "attempts") { t in
                t.autoIncrementedPrimaryKey("id")
                t.column("run_id", .text).notNull()
                t.column("started_at", .text).notNull()
                t.column("ended_at", .text).notNull()
                t.column("station", .text).notNull()
                t.column("operator", .text)
                t.column("adapter", .text)
                t.column("device", .text).notNull()
                t.column("bootloader_address", .text)
                t.column("manufacturer", .text)
                t.column("model", .text)
                t.column("serial_number", .text)
                t.column("hardware_revision", .text)
                t.column("firmware_before", .text)
                t.column("protocol", .text).notNull()
                t.column("image_name", .text).notNull()
                t.column("image_size", .integer).notNull()
                t.column("image_sha256", .text).notNull()
                t.column("image_version", .text)
                t.column("firmware_after", .text)
                t.column("bytes_sent", .integer).notNull()
                t.column("bytes_resent", .integer).notNull()
                t.column("seconds", .double).notNull()
                t.column("rate", .double).notNull()
                t.column("attempts", .integer).notNull()
                t.column("result", .text).notNull()
                t.column("exit_code", .integer).notNull()
                t.column("error_code", .text)
                t.column("message", .text)
                t.column("otaflash_version", .text).notNull()
                t.column("otaflash_commit", .text).notNull()
            }
            try db.create(index: "attempts_device", on: "attempts", columns: ["device", "image_sha256"])
            try db.create(index: "attempts_started_at", on: "attempts", columns: ["started_at"])
            try db.create(index: "attempts_serial_number", on: "attempts", columns: ["serial_number"])
            try db.create(table: "stations") { t in
                t.primaryKey("name", .text)
                t.column("last_seen", .text).notNull()
            }
        }
        migrator.registerMigration("v2") { db in
            try db.create(table: "claims") { t in
                t.primaryKey("device", .text)
                t.column("image_sha256", .text).notNull()
                t.column("station", .text).notNull()
                t.column("run_id", .text).notNull()
                t.column("state", .text).notNull()
                t.column("claimed_at", .text).notNull()
                t.column("expires_at", .text).notNull()
            }
            // A claim asks whether the device is done with the image: by address, in any case.
            try db.execute(sql: "CREATE INDEX attempts_device_nocase ON attempts (device COLLATE NOCASE, image_sha256)")
        }
        return migrator
    }

    public func beat(_ heartbeat: StationHeartbeat) async throws(LedgerError) {
        let now = LedgerRecord.timestamp(Date())
        do {
            try await queue.write { db in
                try db.execute(sql: StationHeartbeat.table)
                try db.execute(sql: """
                    INSERT INTO heartbeats (station, run_id, started_at, beat_at, interval_seconds, adapters, in_progress, claims_held, ended)
                    VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
                    ON CONFLICT (station, run_id) DO UPDATE SET beat_at = excluded.beat_at, interval_seconds = excluded.interval_seconds,
                        adapters = excluded.adapters, in_progress = excluded.in_progress, claims_held = excluded.claims_held, ended = excluded.ended
                    """, arguments: [heartbeat.station, heartbeat.run, heartbeat.startedAt, now, heartbeat.interval,
                                     heartbeat.adapters.joined(separator: ","), heartbeat.inProgress, heartbeat.claimsHeld, heartbeat.ended ? 1 : 0])
            }
        } catch {
            throw Self.failure(error, path: location, doing: "writing to")
        }
    }

    public func heartbeats() async throws(LedgerError) -> [StationHeartbeat] {
        do {
            let rows = try await queue.read { db -> [Row] in
                guard try db.tableExists("heartbeats") else { return [] }
                // The newest row of each station (SQLite takes the bare columns from the max row).
                return try Row.fetchAll(db, sql: """
                    SELECT station, run_id, started_at, max(beat_at) AS beat_at, interval_seconds, adapters, in_progress, claims_held, ended,
                        (julianday('now') - julianday(max(beat_at))) * 86400.0 AS age
                    FROM heartbeats GROUP BY station ORDER BY station
                    """)
            }
            return rows.map { row in
                let beat: String = row["beat_at"]
                let adapters: String = row["adapters"]
                return StationHeartbeat(station: row["station"], run: row["run_id"], startedAt: row["started_at"], interval: row["interval_seconds"],
                                        adapters: adapters.split(separator: ",").map(String.init), inProgress: row["in_progress"],
                                        claimsHeld: row["claims_held"], ended: (row["ended"] as Int) != 0, beatAt: beat,
                                        age: max(0, row["age"] as Double))
            }
        } catch {
            throw Self.failure(error, path: location, doing: "reading")
        }
    }

    public func prepare(station: String) async throws(LedgerError) {
        let now = LedgerRecord.timestamp(Date())
        do {
            try await queue.write { db in
                try db.execute(sql: "INSERT INTO stations (name, last_seen) VALUES (?, ?) ON CONFLICT(name) DO UPDATE SET last_seen = excluded.last_seen",
                               arguments: [station, now])
            }
        } catch {
            throw Self.failure(error, path: location, doing: "writing to")
        }
    }

    @discardableResult
    public func append(_ record: LedgerRecord) async throws(LedgerError) -> Int64 {
        do {
            return try await queue.write { db in try Self.insert(record, db) }
        } catch {
            throw Self.failure(error, path: location, doing: "writing to")
        }
    }

    /// Inserts `record` and ends its holder's claim, in the caller's transaction.
    private static func insert(_ record: LedgerRecord, _ db: Database) throws -> Int64 {
        var row = record
        row.id = nil
        try row.insert(db)
        // The record ends its holder's claim, in the same transaction.
        try db.execute(sql: """
            UPDATE claims SET state = ?, image_sha256 = ?, expires_at = ?
            WHERE device = ? AND station = ? AND run_id = ? AND state = 'held'
            """, arguments: [(record.result.succeeded ? Claim.State.done : .released).rawValue, record.imageSHA256,
                             LedgerRecord.timestamp(Date()), record.device.uppercased(), record.station, record.runID])
        return db.lastInsertedRowID
    }

    public func records(_ query: LedgerQuery) async throws(LedgerError) -> [LedgerRecord] {
        var clauses: [String] = []
        var arguments: StatementArguments = []
        func add(_ clause: String, _ value: (any DatabaseValueConvertible)?) {
            guard let value else { return }
            clauses.append(clause)
            arguments += [value]
        }
        add("started_at >= ?", query.since)
        add("started_at <= ?", query.until)
        add("device = ? COLLATE NOCASE", query.device)
        add("serial_number = ?", query.serialNumber)
        add("result = ?", query.result)
        add("station = ?", query.station)
        if let image = query.image {
            if image.count >= 8, image.allSatisfy(\.isHexDigit) {
                clauses.append("(image_name = ? OR image_sha256 LIKE ?)")
                arguments += [image, image.lowercased() + "%"]
            } else {
                add("image_name = ?", image)
            }
        }
        let sql = query.select(where: clauses)
        do {
            return try await queue.read { [sql, arguments] db in try LedgerRecord.fetchAll(db, sql: sql, arguments: arguments) }
        } catch {
            throw Self.failure(error, path: location, doing: "reading")
        }
    }

    public func claim(_ device: String, image: String, by holder: ClaimHolder, lease: Duration) async throws(LedgerError) -> ClaimResult {
        let key = device.uppercased()
        do {
            // One write transaction: SQLite's write lock makes it atomic among processes.
            return try await queue.write { db in
                let now = LedgerRecord.timestamp(Date())
                if let row = try Row.fetchOne(db, sql: """
                    SELECT station, ended_at FROM attempts WHERE device = ? COLLATE NOCASE AND image_sha256 = ? AND result IN ('ok', 'skipped')
                    ORDER BY id DESC LIMIT 1
                    """, arguments: [key, image]) {
                    return .done(by: row["station"], at: row["ended_at"])
                }
                let existing = try Self.claim(db, key)
                if let existing, !existing.free(for: holder, image: image, now: now) {
                    return existing.state == .done ? .done(by: existing.station, at: existing.expiresAt)
                        : .held(by: existing.station, until: existing.expiresAt)
                }
                let until = LedgerRecord.timestamp(Date().addingTimeInterval(lease.seconds))
                try db.execute(sql: """
                    INSERT INTO claims (device, image_sha256, station, run_id, state, claimed_at, expires_at) VALUES (?, ?, ?, ?, 'held', ?, ?)
                    ON CONFLICT(device) DO UPDATE SET image_sha256 = excluded.image_sha256, station = excluded.station, run_id = excluded.run_id,
                        state = 'held', claimed_at = excluded.claimed_at, expires_at = excluded.expires_at
                    """, arguments: [key, image, holder.station, holder.run, now, until])
                return .granted(until: until)
            }
        } catch {
            throw Self.failure(error, path: location, doing: "writing to")
        }
    }

    public func renew(_ device: String, by holder: ClaimHolder, lease: Duration) async throws(LedgerError) -> Bool {
        do {
            return try await queue.write { db in
                try db.execute(sql: "UPDATE claims SET expires_at = ? WHERE device = ? AND station = ? AND run_id = ? AND state = 'held'",
                               arguments: [LedgerRecord.timestamp(Date().addingTimeInterval(lease.seconds)), device.uppercased(),
                                           holder.station, holder.run])
                return db.changesCount == 1
            }
        } catch {
            throw Self.failure(error, path: location, doing: "writing to")
        }
    }

    public func release(_ device: String, by holder: ClaimHolder) async throws(LedgerError) {
        do {
            try await queue.write { db in
                try db.execute(sql: "UPDATE claims SET state = 'released', expires_at = ? WHERE device = ? AND station = ? AND run_id = ? AND state = 'held'",
                               arguments: [LedgerRecord.timestamp(Date()), device.uppercased(), holder.station, holder.run])
            }
        } catch {
            throw Self.failure(error, path: location, doing: "writing to")
        }
    }

    public func takeOver(_ device: String, image: String, from previous: ClaimHolder, by holder: ClaimHolder, lease: Duration) async throws(LedgerError) -> Bool {
        do {
            return try await queue.write { db in
                let now = Date()
                try db.execute(sql: """
                    UPDATE claims SET image_sha256 = ?, run_id = ?, claimed_at = ?, expires_at = ?
                    WHERE device = ? AND station = ? AND run_id = ? AND state = 'held' AND station = ?
                    """, arguments: [image, holder.run, LedgerRecord.timestamp(now), LedgerRecord.timestamp(now.addingTimeInterval(lease.seconds)),
                                     device.uppercased(), previous.station, previous.run, holder.station])
                return db.changesCount == 1
            }
        } catch {
            throw Self.failure(error, path: location, doing: "writing to")
        }
    }

    @discardableResult
    public func appendOnce(_ record: LedgerRecord) async throws(LedgerError) -> Int64 {
        do {
            return try await queue.write { db in
                if let id = try Int64.fetchOne(db, sql: """
                    SELECT id FROM attempts WHERE device = ? COLLATE NOCASE AND image_sha256 = ? AND run_id = ? AND started_at = ? AND attempts = ?
                    """, arguments: [record.device, record.imageSHA256, record.runID, record.startedAt, record.attempts]) {
                    return id
                }
                return try Self.insert(record, db)
            }
        } catch {
            throw Self.failure(error, path: location, doing: "writing to")
        }
    }

    public func claims() async throws(LedgerError) -> [Claim] {
        do {
            return try await queue.read { db in
                try String.fetchAll(db, sql: "SELECT device FROM claims ORDER BY device").compactMap { try Self.claim(db, $0) }
            }
        } catch {
            throw Self.failure(error, path: location, doing: "reading")
        }
    }

    private static func claim(_ db: Database, _ device: String) throws -> Claim? {
        guard let row = try Row.fetchOne(db, sql: "SELECT * FROM claims WHERE device = ?", arguments: [device]) else { return nil }
        return Claim(device: row["device"], imageSHA256: row["image_sha256"], station: row["station"], run: row["run_id"],
                     state: Claim.State(rawValue: row["state"]) ?? .released, claimedAt: row["claimed_at"], expiresAt: row["expires_at"])
    }

    public func close() async {
        try? queue.close()
    }

    /// The POSIX reason of a Foundation file error ("Permission denied"), else its description.
    static func reason(_ error: any Error) -> String {
        let ns = error as NSError
        if let underlying = ns.userInfo[NSUnderlyingErrorKey] as? NSError, underlying.domain == NSPOSIXErrorDomain {
            return String(cString: strerror(Int32(underlying.code)))
        }
        return error.localizedDescription
    }

    /// A database failure as one line, by what SQLite said.
    static func failure(_ error: any Error, path: String, doing: String) -> LedgerError {
        if error is CancellationError {
            return LedgerError(.interrupted, "\(doing) the ledger \(path) was interrupted: the run is being stopped")
        }
        if let network = networkFilesystem(of: path) {
            return LedgerError(.failed, "\(doing) the ledger \(path) failed (\(reason(error))): it is on a network filesystem (\(network)), where SQLite's write-ahead log does not work; keep it on a local disk (--ledger PATH), or share records through a postgres:// ledger")
        }
        guard let db = error as? DatabaseError else {
            return LedgerError(.failed, "\(doing) the ledger \(path) failed: \(reason(error))")
        }
        let what = db.message ?? "\(db.resultCode)"
        switch db.resultCode.primaryResultCode {
        case .SQLITE_BUSY, .SQLITE_LOCKED:
            return LedgerError(.locked, "the ledger \(path) is locked by another process (waited \(Int(busyTimeout)) s); let it finish, or use another --ledger")
        case .SQLITE_READONLY:
            return LedgerError(.readOnly, "the ledger \(path) cannot be written (read-only: \(what)); fix its permissions, or choose another with --ledger PATH")
        case .SQLITE_CANTOPEN, .SQLITE_PERM, .SQLITE_AUTH:
            // SQLite says only "unable to open": the folder says why (a read-only filesystem, permissions).
            let folder = (path as NSString).deletingLastPathComponent
            if access(folder.isEmpty ? "." : folder, W_OK) != 0 {
                let why = String(cString: strerror(errno))
                return LedgerError(errno == EROFS ? .readOnly : .cannotOpen,
                                   "the ledger \(path) cannot be created or written (\(folder.isEmpty ? "." : folder): \(why)); choose another with --ledger PATH, or --no-ledger")
            }
            return LedgerError(.cannotOpen, "the ledger \(path) cannot be opened (\(what)); check the path and its permissions, or choose another with --ledger PATH")
        case .SQLITE_CORRUPT, .SQLITE_NOTADB:
            return LedgerError(.corrupt, "the ledger \(path) is not a usable ledger (\(what)); move it aside and run again (a new one is made), or choose another with --ledger PATH")
        case .SQLITE_FULL:
            return LedgerError(.full, "the ledger \(path) cannot take the record: the disk is full; free space, or choose another with --ledger PATH")
        case .SQLITE_IOERR:
            return LedgerError(.full, "\(doing) the ledger \(path) failed with an I/O error (\(what)): a full or failing disk; free space, or choose another with --ledger PATH")
        default:
            return LedgerError(.failed, "\(doing) the ledger \(path) failed: \(what)")
        }
    }
}

extension SQLiteLedger {
    /// The network filesystem `path` is on (the longest mount point of `/proc/self/mounts` above
    /// it), or nil for a local one.
    static func networkFilesystem(of path: String, mounts: String? = try? String(contentsOfFile: "/proc/self/mounts", encoding: .utf8)) -> String? {
        let absolute = URL(fileURLWithPath: path).standardizedFileURL.path
        guard let mounts else { return nil }
        var best: (point: String, type: String)?
        for line in mounts.split(separator: "\n") {
            let fields = line.split(separator: " ")
            guard fields.count >= 3 else { continue }
            let point = fields[1].replacingOccurrences(of: "\\040", with: " ")
            guard absolute == point || absolute.hasPrefix(point == "/" ? "/" : point + "/"),
                  point.count >= (best?.point.count ?? 0) else { continue }
            best = (point, String(fields[2]))
        }
        let network = ["nfs": "NFS", "nfs4": "NFS", "9p": "9p", "cifs": "SMB", "smb3": "SMB", "smbfs": "SMB",
                       "ceph": "Ceph", "afs": "AFS", "fuse.sshfs": "SSHFS"]
        return best.flatMap { network[$0.type] }
    }
}

extension LedgerRecord: FetchableRecord, PersistableRecord {
    public static let databaseTableName = "attempts"
}

/// The `result` column: its text.
extension LedgerResult: DatabaseValueConvertible {}
