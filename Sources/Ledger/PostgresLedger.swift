import Foundation
import Logging
import PostgresNIO
import Synchronization

/// The ledger of several stations: one PostgreSQL database (docs/LEDGER.md), with the same
/// records and the same versioned schema as the SQLite ledger, and claims that keep two stations
/// from flashing one device.
///
/// One connection, opened on first use and again after it is lost. Every operation is one SQL
/// statement (autocommit: committed when it returns), so operations of concurrent devices share
/// the connection without interleaving transactions. Every wait is bounded: connecting by
/// `connectTimeout`, each statement by `queryTimeout` (and the server's `statement_timeout`).
public actor PostgresLedger: LedgerStore {
    /// The URL without its password: what lines name.
    public nonisolated let location: String
    public nonisolated let connectTimeout: Duration
    public nonisolated let queryTimeout: Duration
    private let configuration: PostgresConnection.Configuration
    private let user: String
    private let database: String
    private var connection: PostgresConnection?
    private var connecting: Task<PostgresConnection, any Error>?
    /// Since when this process has had the server without a break: every operation answered,
    /// none more than `quiet` after the one before (nil after a failure). A claim whose lease
    /// lapsed before then is given its holder again rather than taken (`claim`).
    private var healthySince: ContinuousClock.Instant?
    private var lastAnswer: ContinuousClock.Instant?
    /// A third of the lease last asked for: a longer silence is a break (a station renews every
    /// third, and asks again for a held device every quarter).
    private var quiet: Duration = .seconds(15)
    private static let logger = Logger(label: "otaflash.ledger.postgres", factory: { _ in SwiftLogNoOpLogHandler() })
    private static let ids = Atomic<Int>(0)

    /// Parses `url` (docs/LEDGER.md: `postgres://user:password@host:port/database?sslmode=…`);
    /// nothing is sent until the first operation.
    public init(url: String, connectTimeout: Duration = .seconds(10), queryTimeout: Duration = .seconds(10),
                environment: [String: String] = ProcessInfo.processInfo.environment) throws(LedgerError) {
        let target = try PostgresTarget(url, environment: environment)
        location = target.redacted
        user = target.user
        database = target.database
        self.connectTimeout = target.connectTimeout ?? connectTimeout
        self.queryTimeout = target.statementTimeout ?? queryTimeout
        var configuration = PostgresConnection.Configuration(host: target.host, port: target.port, username: target.user,
                                                             password: target.password, database: target.database, tls: .disable)
        do {
            configuration.tls = try target.tls()
        } catch {
            throw LedgerError(.badLocation, "--ledger \(target.redacted): TLS cannot be set up (\(error)); try another sslmode")
        }
        configuration.options.connectTimeout = Self.timeAmount(self.connectTimeout)
        // The server gives up a statement that waits longer than the client would (a lock held
        // by a stuck session), so nothing waits for an answer nobody reads.
        configuration.options.additionalStartupParameters = [
            ("statement_timeout", "\(Int(self.queryTimeout.seconds * 1000))"),
            ("application_name", target.applicationName),
        ]
        self.configuration = configuration
    }

    // MARK: - LedgerStore

    public func prepare(station: String) async throws(LedgerError) {
        try await run("writing to") { c in
            try await c.query("""
                INSERT INTO stations (name, last_seen) VALUES (\(station), \(LedgerRecord.timestamp(Date())))
                ON CONFLICT (name) DO UPDATE SET last_seen = excluded.last_seen
                """, logger: Self.logger).drain()
        }
    }

    @discardableResult
    public func append(_ record: LedgerRecord) async throws(LedgerError) -> Int64 {
        try await insert(record, once: false)
    }

    @discardableResult
    public func appendOnce(_ record: LedgerRecord) async throws(LedgerError) -> Int64 {
        try await insert(record, once: true)
    }

    /// The record and the end of its holder's claim, in one statement: one transaction. `once`:
    /// not when a row with its idempotent key (run, device, start, attempt) is there already,
    /// whose id is returned then.
    private func insert(_ record: LedgerRecord, once: Bool) async throws(LedgerError) -> Int64 {
        var binds = PostgresBindings(capacity: 34)
        for value in Self.values(record) { value.bind(&binds) }
        binds.append((record.result.succeeded ? Claim.State.done : .released).rawValue)
        binds.append(record.device.uppercased())
        let columns = LedgerRecord.columns.dropFirst()
        let n = columns.count
        func p(_ column: String) -> String { "$\(Self.index(column))" }
        let existing = once ? """
            SELECT id FROM attempts WHERE upper(device) = $\(n + 2) AND image_sha256 = \(p("image_sha256")) AND run_id = \(p("run_id"))
                AND started_at = \(p("started_at")) AND attempts = \(p("attempts"))
            """ : "SELECT NULL::bigint AS id WHERE false"
        let sql = """
            WITH existing AS (\(existing)), ended AS (
                UPDATE claims SET state = $\(n + 1), image_sha256 = \(p("image_sha256")), expires_at = \(Self.now)
                WHERE device = $\(n + 2) AND station = \(p("station")) AND run_id = \(p("run_id")) AND state = 'held'
                    AND NOT EXISTS (SELECT 1 FROM existing)
            ), inserted AS (
                INSERT INTO attempts (\(columns.joined(separator: ", ")))
                SELECT \((1...n).map { "$\($0)" }.joined(separator: ", ")) WHERE NOT EXISTS (SELECT 1 FROM existing)
                RETURNING id
            )
            SELECT id FROM inserted UNION ALL SELECT id FROM existing
            """
        return try await run("writing to") { [binds] c in
            let rows = try await c.query(PostgresQuery(unsafeSQL: sql, binds: binds), logger: Self.logger).collect()
            guard let id = try rows.first?.decode(Int64.self) else { throw PostgresLedgerError("the insert returned no id") }
            return id
        }
    }

    public func records(_ query: LedgerQuery) async throws(LedgerError) -> [LedgerRecord] {
        var clauses: [String] = []
        var binds = PostgresBindings()
        func add(_ clause: (String) -> String, _ value: String?) {
            guard let value else { return }
            binds.append(value)
            clauses.append(clause("$\(binds.count)"))
        }
        add({ "started_at >= \($0)" }, query.since)
        add({ "started_at <= \($0)" }, query.until)
        add({ "upper(device) = upper(\($0))" }, query.device)
        add({ "serial_number = \($0)" }, query.serialNumber)
        add({ "result = \($0)" }, query.result?.rawValue)
        add({ "station = \($0)" }, query.station)
        if let image = query.image {
            if image.count >= 8, image.allSatisfy(\.isHexDigit) {
                binds.append(image)
                binds.append(image.lowercased() + "%")
                clauses.append("(image_name = $\(binds.count - 1) OR image_sha256 LIKE $\(binds.count))")
            } else {
                add({ "image_name = \($0)" }, image)
            }
        }
        let sql = query.select(where: clauses)
        return try await run("reading") { [sql, binds] c in
            try await c.query(PostgresQuery(unsafeSQL: sql, binds: binds), logger: Self.logger).collect().map(Self.record)
        }
    }

    /// One statement (docs/LEDGER.md, "Claims"): INSERT … ON CONFLICT DO UPDATE locks the device's
    /// row, inserted or not, and evaluates the rule on its latest committed version, so of
    /// stations claiming one device at once exactly one is granted; the update always happens
    /// (keeping the values when the claim is not free), so RETURNING shows who holds it now.
    /// A record that shows the device done with the image (one written without a claim) is
    /// looked up first.
    public func claim(_ device: String, image: String, by holder: ClaimHolder, lease: Duration) async throws(LedgerError) -> ClaimResult {
        // A held claim whose lease lapsed is taken when it lapsed while this process had the
        // server without a break ($6: for so many seconds). One that lapsed before (in an outage
        // every station may have had: the server stopped, the network to it down) is given its
        // holder again for a lease from now, to come back and send its outbox first; taken after
        // that, as one that lapsed while this process had the server. A statement held up on
        // the way only makes $6 count from later: never a claim taken too soon.
        // Lapsed: past its lease by half a lease more (this claim's), the time a holder cut off
        // for a moment has to send the record of a device it finished (its outbox retries every
        // quarter lease) before another station may take the device.
        let lapsed = "(c.state = 'held' AND c.expires_at <= \(Self.time("now() - make_interval(secs => $5 / 2)")))"
        let seen = "c.expires_at > \(Self.time("now() - make_interval(secs => $6)"))"
        let free = """
            (NOT (c.state = 'done' AND c.image_sha256 = excluded.image_sha256)
             AND ((c.state <> 'held' AND c.expires_at <= \(Self.now)) OR (\(lapsed) AND \(seen))
                  OR (c.station = excluded.station AND c.run_id = excluded.run_id)))
            """
        let rearm = "(\(lapsed) AND NOT \(seen))"
        func take(_ column: String) -> String {
            let keep = column == "expires_at" ? "CASE WHEN \(rearm) THEN excluded.expires_at ELSE c.expires_at END" : "c.\(column)"
            return "\(column) = CASE WHEN \(free) THEN excluded.\(column) ELSE \(keep) END"
        }
        let sql = """
            WITH done AS (
                SELECT station, ended_at FROM attempts
                WHERE upper(device) = $1 AND image_sha256 = $2 AND result IN ('ok', 'skipped')
                ORDER BY id DESC LIMIT 1
            ), claimed AS (
                INSERT INTO claims AS c (device, image_sha256, station, run_id, state, claimed_at, expires_at)
                SELECT $1, $2, $3, $4, 'held', \(Self.now), \(Self.time("now() + make_interval(secs => $5)"))
                WHERE NOT EXISTS (SELECT 1 FROM done)
                ON CONFLICT (device) DO UPDATE SET
                    \(["image_sha256", "station", "run_id", "state", "claimed_at", "expires_at"].map(take).joined(separator: ",\n        "))
                RETURNING c.station, c.run_id, c.state, c.expires_at
            )
            SELECT station, run_id, state, expires_at FROM claimed
            UNION ALL SELECT station, NULL, 'done', ended_at FROM done
            """
        var binds = PostgresBindings()
        binds.append(device.uppercased())
        binds.append(image)
        binds.append(holder.station)
        binds.append(holder.run)
        binds.append(lease.seconds)
        quiet = lease / 3
        binds.append(healthySince.map { (ContinuousClock.now - $0).seconds } ?? 0)
        return try await run("writing to") { [binds] c in
            let rows = try await c.query(PostgresQuery(unsafeSQL: sql, binds: binds), logger: Self.logger).collect()
            guard let row = rows.first else { throw PostgresLedgerError("a claim returned no row") }
            let (station, run, state, time) = try row.decode((String, String?, String, String).self)
            switch Claim.State(rawValue: state) {
            case .done: return .done(by: station, at: time)
            case .held where station == holder.station && run == holder.run: return .granted(until: time)
            default: return .held(by: station, until: time)
            }
        }
    }

    public func renew(_ device: String, by holder: ClaimHolder, lease: Duration) async throws(LedgerError) -> Bool {
        quiet = lease / 3
        var binds = PostgresBindings()
        binds.append(lease.seconds)
        binds.append(device.uppercased())
        binds.append(holder.station)
        binds.append(holder.run)
        let sql = """
            UPDATE claims SET expires_at = \(Self.time("now() + make_interval(secs => $1)"))
            WHERE device = $2 AND station = $3 AND run_id = $4 AND state = 'held'
            RETURNING device
            """
        return try await run("writing to") { [binds] c in
            try await c.query(PostgresQuery(unsafeSQL: sql, binds: binds), logger: Self.logger).collect().count == 1
        }
    }

    public func release(_ device: String, by holder: ClaimHolder) async throws(LedgerError) {
        try await run("writing to") { c in
            try await c.query("""
                UPDATE claims SET state = 'released', expires_at = \(unescaped: Self.now)
                WHERE device = \(device.uppercased()) AND station = \(holder.station) AND run_id = \(holder.run) AND state = 'held'
                """, logger: Self.logger).drain()
        }
    }

    public func takeOver(_ device: String, image: String, from previous: ClaimHolder, by holder: ClaimHolder, lease: Duration) async throws(LedgerError) -> Bool {
        guard previous.station == holder.station else { return false }
        var binds = PostgresBindings()
        binds.append(lease.seconds)
        binds.append(image)
        binds.append(holder.run)
        binds.append(device.uppercased())
        binds.append(previous.station)
        binds.append(previous.run)
        let sql = """
            UPDATE claims SET image_sha256 = $2, run_id = $3, claimed_at = \(Self.now),
                expires_at = \(Self.time("now() + make_interval(secs => $1)"))
            WHERE device = $4 AND station = $5 AND run_id = $6 AND state = 'held'
            RETURNING device
            """
        return try await run("writing to") { [binds] c in
            try await c.query(PostgresQuery(unsafeSQL: sql, binds: binds), logger: Self.logger).collect().count == 1
        }
    }

    public func beat(_ heartbeat: StationHeartbeat) async throws(LedgerError) {
        var binds = PostgresBindings()
        binds.append(heartbeat.station)
        binds.append(heartbeat.run)
        binds.append(heartbeat.startedAt)
        binds.append(heartbeat.interval)
        binds.append(heartbeat.adapters.joined(separator: ","))
        binds.append(heartbeat.inProgress)
        binds.append(heartbeat.claimsHeld)
        binds.append(heartbeat.ended ? 1 : 0)
        let sql = """
            INSERT INTO heartbeats (station, run_id, started_at, beat_at, interval_seconds, adapters, in_progress, claims_held, ended)
            VALUES ($1, $2, $3, \(Self.now), $4, $5, $6, $7, $8)
            ON CONFLICT (station, run_id) DO UPDATE SET beat_at = excluded.beat_at, interval_seconds = excluded.interval_seconds,
                adapters = excluded.adapters, in_progress = excluded.in_progress, claims_held = excluded.claims_held, ended = excluded.ended
            """
        let made = heartbeatTable
        try await run("writing to") { [binds] c in
            // The table is made before this process's first beat (IF NOT EXISTS: other stations may have).
            if !made { try await c.query(PostgresQuery(unsafeSQL: StationHeartbeat.table), logger: Self.logger).drain() }
            try await c.query(PostgresQuery(unsafeSQL: sql, binds: binds), logger: Self.logger).drain()
        }
        heartbeatTable = true
    }

    /// Whether this process has made sure of the heartbeats table.
    private var heartbeatTable = false

    public func heartbeats() async throws(LedgerError) -> [StationHeartbeat] {
        try await run("reading") { c in
            let exists = try await c.query("SELECT to_regclass('heartbeats') IS NOT NULL", logger: Self.logger).collect()
            guard try exists.first?.decode(Bool.self) == true else { return [] }
            let sql = """
                SELECT DISTINCT ON (station) station, run_id, started_at, beat_at, interval_seconds, adapters, in_progress, claims_held, ended,
                    EXTRACT(EPOCH FROM (now() - beat_at::timestamptz))::double precision
                FROM heartbeats ORDER BY station, beat_at DESC
                """
            return try await c.query(PostgresQuery(unsafeSQL: sql), logger: Self.logger).collect().map { row in
                let (station, run, started, beat, interval, adapters, inProgress, claims, ended, age) =
                    try row.decode((String, String, String, String, Double, String, Int, Int, Int, Double).self)
                return StationHeartbeat(station: station, run: run, startedAt: started, interval: interval,
                                        adapters: adapters.split(separator: ",").map(String.init), inProgress: inProgress, claimsHeld: claims,
                                        ended: ended != 0, beatAt: beat, age: max(0, age))
            }
        }
    }

    public func claims() async throws(LedgerError) -> [Claim] {
        try await run("reading") { c in
            try await c.query("SELECT device, image_sha256, station, run_id, state, claimed_at, expires_at FROM claims ORDER BY device",
                              logger: Self.logger).collect().map { row in
                let (device, image, station, run, state, claimed, expires) = try row.decode((String, String, String, String, String, String, String).self)
                return Claim(device: device, imageSHA256: image, station: station, run: run, state: Claim.State(rawValue: state) ?? .released,
                             claimedAt: claimed, expiresAt: expires)
            }
        }
    }

    public func close() async {
        connecting?.cancel()
        connecting = nil
        if let connection {
            self.connection = nil
            try? await (connection.close() as EventLoopFuture<Void>).get()
        }
    }

    /// A connection must be closed before it is released (PostgresNIO asserts it): a ledger
    /// dropped without `close()` hands its connection to a task that closes it.
    deinit {
        let open = connection
        let pending = connecting
        if open != nil || pending != nil {
            Task {
                try? await (open?.close() as EventLoopFuture<Void>?)?.get()
                if let c = try? await pending?.value { try? await (c.close() as EventLoopFuture<Void>).get() }
            }
        }
    }

    // MARK: - Schema

    /// The schema's migrations, in order, as the SQLite ledger's (same names, tables, columns and
    /// indexes; PostgreSQL's types); never changed once released.
    static let migrations: [(String, [String])] = [
        ("v1", [
            """
            CREATE TABLE attempts (
                id bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
                run_id text NOT NULL, started_at text NOT NULL, ended_at text NOT NULL, station text NOT NULL,
                operator text, adapter text, device text NOT NULL, bootloader_address text, manufacturer text, model text,
                serial_number text, hardware_revision text, firmware_before text, protocol text NOT NULL,
                image_name text NOT NULL, image_size bigint NOT NULL, image_sha256 text NOT NULL, image_version text,
                firmware_after text, bytes_sent bigint NOT NULL, bytes_resent bigint NOT NULL,
                seconds double precision NOT NULL, rate double precision NOT NULL, attempts integer NOT NULL,
                result text NOT NULL, exit_code integer NOT NULL, error_code text, message text,
                otaflash_version text NOT NULL, otaflash_commit text NOT NULL)
            """,
            "CREATE INDEX attempts_device ON attempts (device, image_sha256)",
            "CREATE INDEX attempts_started_at ON attempts (started_at)",
            "CREATE INDEX attempts_serial_number ON attempts (serial_number)",
            "CREATE TABLE stations (name text PRIMARY KEY, last_seen text NOT NULL)",
        ]),
        ("v2", [
            """
            CREATE TABLE claims (
                device text PRIMARY KEY, image_sha256 text NOT NULL, station text NOT NULL, run_id text NOT NULL,
                state text NOT NULL, claimed_at text NOT NULL, expires_at text NOT NULL)
            """,
            "CREATE INDEX attempts_device_nocase ON attempts (upper(device), image_sha256)",
        ]),
    ]

    /// Applies the migrations this ledger lacks, in one transaction under an advisory lock, so
    /// stations that start together migrate once; refuses a ledger with a migration it does not know.
    /// A ledger already at this schema is only read: stations that start together on it wait for no lock.
    private static func migrate(_ c: PostgresConnection, location: String) async throws {
        func applied() async throws -> Set<String> {
            Set(try await c.query("SELECT identifier FROM grdb_migrations", logger: Self.logger).collect().map { try $0.decode(String.self) })
        }
        func refuseNewer(_ applied: Set<String>) throws {
            guard applied.isSubset(of: Set(Self.migrations.map(\.0))) else {
                throw LedgerError(.newerSchema, "the PostgreSQL ledger \(location) was written by a newer otaflash (a schema newer than version \(Ledger.schemaVersion)); use that version, or another --ledger")
            }
        }
        let exists = try await c.query("SELECT to_regclass('grdb_migrations') IS NOT NULL", logger: Self.logger).collect()
            .first?.decode(Bool.self) ?? false
        if exists {
            let now = try await applied()
            try refuseNewer(now)
            if now.count == Self.migrations.count { return }
        }
        try await c.query("BEGIN", logger: Self.logger).drain()
        do {
            // pg_advisory_xact_lock: held until COMMIT or ROLLBACK; the key is otaflash's own.
            try await c.query("SELECT pg_advisory_xact_lock(746102)", logger: Self.logger).drain()
            try await c.query("CREATE TABLE IF NOT EXISTS grdb_migrations (identifier text NOT NULL PRIMARY KEY)", logger: Self.logger).drain()
            let done = try await applied()
            try refuseNewer(done)
            for (name, statements) in Self.migrations where !done.contains(name) {
                for statement in statements { try await c.query(PostgresQuery(unsafeSQL: statement), logger: Self.logger).drain() }
                try await c.query("INSERT INTO grdb_migrations (identifier) VALUES (\(name))", logger: Self.logger).drain()
            }
            try await c.query("COMMIT", logger: Self.logger).drain()
        } catch {
            // A connection the deadline closed takes no statement (the server rolls back itself).
            if !c.isClosed { _ = try? await c.query("ROLLBACK", logger: Self.logger).drain() }
            throw error
        }
    }

    // MARK: - Connection, deadlines, failures

    /// How long this process waits for an operation's answers: twice the server's
    /// `statement_timeout`, so a server that is there gives up first and says why (a lock another
    /// session holds), even when its answers queue behind a loaded host's other work; the deadline
    /// ends the wait on a server that is not there.
    nonisolated var clientDeadline: Duration { queryTimeout * 2 }

    /// Runs `body` on the connection (opened, and migrated, when there is none) within `queryTimeout`;
    /// a connection that times out or fails is closed, and the next operation opens another.
    @discardableResult
    private func run<T: Sendable>(_ doing: String, _ body: @escaping @Sendable (PostgresConnection) async throws -> T) async throws(LedgerError) -> T {
        let c: PostgresConnection
        do {
            c = try await connected()
        } catch {
            healthySince = nil
            throw failure(error, doing: "connecting to")
        }
        let limit = clientDeadline
        let began = ContinuousClock.now
        do {
            let result = try await Self.bounded(c, by: limit) { try await body(c) }
            let now = ContinuousClock.now
            // A first answer, or one after a silence (this process idle, or the answer held up):
            // the server is known to be there from now.
            if healthySince == nil || lastAnswer.map({ now - $0 > quiet }) ?? true { healthySince = now }
            lastAnswer = now
            return result
        } catch is DeadlinePassed {
            healthySince = nil
            if connection === c { connection = nil }
            // Awaited, as after a failed migration: PostgresNIO asserts a connection is closed before it is released.
            try? await (c.close() as EventLoopFuture<Void>).get()
            throw LedgerError(.unreachable, "the PostgreSQL ledger \(location) did not answer within \(Self.format(limit)) (\(doing) it); check the server and the network, or choose another --ledger")
        } catch {
            if c.isClosed, connection === c { connection = nil }
            let failure = failure(error, doing: doing)
            if failure.kind == .unreachable { healthySince = nil }
            throw failure
        }
    }

    private func connected() async throws -> PostgresConnection {
        if let connection, !connection.isClosed { return connection }
        if let connecting { return try await connecting.value }
        let configuration = configuration
        let queryLimit = clientDeadline
        let location = location
        let task = Task { () throws -> PostgresConnection in
            // PostgresNIO bounds the whole connect, TLS and authentication included, by
            // `options.connectTimeout` on its event loop: a refusal and a timeout are told apart
            // there, never by which of two tasks this process happened to run first.
            let c = try await PostgresConnection.connect(configuration: configuration, id: Self.ids.add(1, ordering: .relaxed).newValue,
                                                         logger: Self.logger)
            // Migrating is statements too: bounded as each operation is.
            do {
                try await Self.bounded(c, by: queryLimit) { try await Self.migrate(c, location: location) }
            } catch {
                // Awaited: PostgresNIO asserts that a connection is closed before it is released.
                try? await (c.close() as EventLoopFuture<Void>).get()
                if error is DeadlinePassed {
                    throw LedgerError(.unreachable, "the PostgreSQL ledger \(location) did not answer within \(Self.format(queryLimit)) (migrating its schema); check the server, or choose another --ledger")
                }
                throw error
            }
            return c
        }
        connecting = task
        defer { connecting = nil }
        let c = try await task.value
        connection = c
        return c
    }

    /// `limit` passed before the statements on a connection ended; the connection is closed.
    struct DeadlinePassed: Error {}

    /// `body`'s result, or `DeadlinePassed` once `limit` has passed, whichever comes first; the
    /// connection is closed then. The caller never waits on `body` past the limit: a statement
    /// written to a connection already closed is dropped by PostgresNIO without failing its
    /// promise, so `body` may wait for ever; it is left to end with the connection. The timer is a
    /// task, not a timer on the event loop: on a process whose tasks queue for a thread (a test
    /// run of hundreds), the time a statement's answer waits in that queue is not the server's.
    static func bounded<T: Sendable>(_ c: PostgresConnection, by limit: Duration,
                                     _ body: @escaping @Sendable () async throws -> T) async throws -> T {
        let outcome = Mutex<CheckedContinuation<T, any Error>?>(nil)
        let resume: @Sendable (Result<T, any Error>) -> Bool = { result in
            guard let continuation = outcome.withLock({ pending in defer { pending = nil }; return pending }) else { return false }
            continuation.resume(with: result)
            return true
        }
        let work = Mutex<Task<Void, Never>?>(nil)
        return try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<T, any Error>) in
                outcome.withLock { $0 = continuation }
                let timer = Task {
                    guard (try? await Task.sleep(for: limit)) != nil else { return }
                    if resume(.failure(DeadlinePassed())) { _ = c.close() as EventLoopFuture<Void> }
                }
                let task = Task {
                    let result: Result<T, any Error>
                    do { result = .success(try await body()) } catch { result = .failure(error) }
                    timer.cancel()
                    _ = resume(result)
                }
                work.withLock { $0 = task }
                // Cancelled before `task` was there for the handler below.
                if Task.isCancelled { task.cancel() }
            }
        } onCancel: {
            work.withLock { $0?.cancel() }
        }
    }

    static func timeAmount(_ d: Duration) -> TimeAmount {
        .nanoseconds(Int64(d.seconds * 1e9))
    }

    /// A PostgreSQL or network failure as one line, by its SQLSTATE or connection error.
    private func failure(_ error: any Error, doing: String) -> LedgerError {
        if let error = error as? LedgerError { return error }
        let ledger = "the PostgreSQL ledger \(location)"
        if let error = error as? PostgresLedgerError { return LedgerError(.failed, "\(doing) \(ledger) failed: \(error.message)") }
        guard let psql = error as? PSQLError else {
            if error is CancellationError { return LedgerError(.interrupted, "\(doing) \(ledger) was interrupted: the run is being stopped") }
            return LedgerError(.unreachable, "cannot reach \(ledger): \(Self.reason(error)); check that the server runs and the URL's host and port, or choose another --ledger")
        }
        switch psql.code {
        case .server:
            let state = psql.serverInfo?[.sqlState] ?? ""
            let message = Self.oneLine(psql.serverInfo?[.message] ?? "an error")
            switch state {
            case "28P01", "28000":
                return LedgerError(.authentication, "\(ledger) refused user \(user) (\(message)); check the user and password in the URL (or PGPASSWORD)")
            case "3D000":
                return LedgerError(.cannotOpen, "\(ledger): \(message); create it (createdb \(database)) or name another database in the URL")
            case "42501":
                return LedgerError(.readOnly, "\(ledger) refused a write (\(message)); grant user \(user) INSERT and UPDATE on the ledger's tables")
            case "25006":
                return LedgerError(.readOnly, "\(ledger) is read-only (\(message)); point --ledger at the primary server")
            case "53100":
                return LedgerError(.full, "\(ledger) cannot take the record: the server's disk is full; free space on the server")
            case "57014":
                return LedgerError(.locked, "\(doing) \(ledger) waited over \(Self.format(queryTimeout)) for another session's lock; let it finish, or check the server")
            case "53300", "57P01", "57P02", "57P03":
                return LedgerError(.unreachable, "\(ledger) cannot take a session now (\(message)); check the server")
            default:
                return LedgerError(.failed, "\(doing) \(ledger) failed: \(message) (SQLSTATE \(state))")
            }
        case .connectionError:
            if let timeout = psql.underlying as? ChannelError, case .connectTimeout = timeout {
                return LedgerError(.unreachable, "the PostgreSQL ledger \(location) did not answer within \(Self.format(connectTimeout)) (connecting to it); check the server and the network, or choose another --ledger")
            }
            let why = psql.underlying.map(Self.reason) ?? "connection failed"
            return LedgerError(.unreachable, "cannot reach \(ledger): \(why); check that the server runs and the URL's host and port, or choose another --ledger")
        case .serverClosedConnection, .clientClosedConnection, .uncleanShutdown:
            return LedgerError(.unreachable, "the connection to \(ledger) was lost (\(doing) it); check the server, then run again")
        case .authMechanismRequiresPassword:
            return LedgerError(.authentication, "\(ledger) asks user \(user) for a password; give it in the URL or in PGPASSWORD")
        case .unsupportedAuthMechanism, .saslError:
            return LedgerError(.authentication, "\(ledger) refused user \(user)'s authentication (\(psql.code)); check the user and password, and the server's pg_hba.conf")
        case .sslUnsupported:
            return LedgerError(.cannotOpen, "\(ledger) does not offer TLS, which sslmode asks for; enable TLS on the server, or use sslmode=disable on a trusted network")
        default:
            return LedgerError(.failed, "\(doing) \(ledger) failed: \(psql.code)")
        }
    }

    // MARK: - Helpers

    /// The server's clock as a ledger timestamp (UTC, ISO 8601 with milliseconds): claims are
    /// timed by one clock, whichever station's clock is off.
    static let now = time("now()")

    static func time(_ expression: String) -> String {
        "to_char((\(expression)) AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"')"
    }

    /// The placeholder number of `column` in an insert of every column but `id`.
    static func index(_ column: String) -> Int {
        (LedgerRecord.columns.dropFirst().firstIndex(of: column) ?? 0)
    }

    static func format(_ d: Duration) -> String {
        let s = d.seconds
        return s == s.rounded() ? "\(Int(s)) s" : String(format: "%.1f s", s)
    }

    /// Why a connection failed, as the system says it ("Connection refused"), in one line.
    static func reason(_ error: any Error) -> String {
        if let error = error as? NIOConnectionError {
            if let io = error.connectionErrors.lazy.compactMap({ $0.error as? IOError }).first {
                return String(cString: strerror(io.errnoCode))
            }
            if error.connectionErrors.isEmpty, error.dnsAError != nil || error.dnsAAAAError != nil {
                return "the host name \(error.host) does not resolve"
            }
        }
        if let io = error as? IOError { return String(cString: strerror(io.errnoCode)) }
        return oneLine("\(error)")
    }

    static func oneLine(_ text: String) -> String {
        text.split(whereSeparator: \.isNewline).joined(separator: " ")
    }

    /// A record's values in `LedgerRecord.columns` order, without `id`.
    static func values(_ r: LedgerRecord) -> [Bindable] {
        [.text(r.runID), .text(r.startedAt), .text(r.endedAt), .text(r.station), .text(r.operator), .text(r.adapter), .text(r.device),
         .text(r.bootloaderAddress), .text(r.manufacturer), .text(r.model), .text(r.serialNumber), .text(r.hardwareRevision),
         .text(r.firmwareBefore), .text(r.protocolName), .text(r.imageName), .integer(r.imageSize), .text(r.imageSHA256),
         .text(r.imageVersion), .text(r.firmwareAfter), .integer(r.bytesSent), .integer(r.bytesResent), .real(r.seconds), .real(r.rate),
         .int32(r.attempts), .text(r.result.rawValue), .int32(r.exitCode), .text(r.errorCode), .text(r.message), .text(r.otaflashVersion),
         .text(r.otaflashCommit)]
    }

    enum Bindable {
        case text(String?), integer(Int64), int32(Int), real(Double)

        func bind(_ binds: inout PostgresBindings) {
            switch self {
            case .text(let v): binds.append(v)
            case .integer(let v): binds.append(v)
            case .int32(let v): binds.append(Int32(clamping: v))
            case .real(let v): binds.append(v)
            }
        }
    }

    static func record(_ row: PostgresRow) throws -> LedgerRecord {
        let r = row.makeRandomAccess()
        func text(_ name: String) throws -> String { try r[name].decode(String.self) }
        func optional(_ name: String) throws -> String? { try r[name].decode(String?.self) }
        return LedgerRecord(
            id: try r["id"].decode(Int64.self), runID: try text("run_id"), startedAt: try text("started_at"), endedAt: try text("ended_at"),
            station: try text("station"), operator: try optional("operator"), adapter: try optional("adapter"), device: try text("device"),
            bootloaderAddress: try optional("bootloader_address"), manufacturer: try optional("manufacturer"), model: try optional("model"),
            serialNumber: try optional("serial_number"), hardwareRevision: try optional("hardware_revision"),
            firmwareBefore: try optional("firmware_before"), protocolName: try text("protocol"), imageName: try text("image_name"),
            imageSize: try r["image_size"].decode(Int64.self), imageSHA256: try text("image_sha256"), imageVersion: try optional("image_version"),
            firmwareAfter: try optional("firmware_after"), bytesSent: try r["bytes_sent"].decode(Int64.self),
            bytesResent: try r["bytes_resent"].decode(Int64.self), seconds: try r["seconds"].decode(Double.self),
            rate: try r["rate"].decode(Double.self), attempts: Int(try r["attempts"].decode(Int32.self)), result: LedgerResult(rawValue: try text("result")),
            exitCode: Int(try r["exit_code"].decode(Int32.self)), errorCode: try optional("error_code"), message: try optional("message"),
            otaflashVersion: try text("otaflash_version"), otaflashCommit: try text("otaflash_commit"))
    }
}

/// A reply the ledger did not expect from the server.
struct PostgresLedgerError: Error {
    let message: String
    init(_ message: String) { self.message = message }
}

/// What a `postgres://` URL names (docs/LEDGER.md), parsed and checked before anything is sent.
struct PostgresTarget {
    var host: String
    var port: Int
    var user: String
    var password: String?
    var database: String
    var sslmode: SSLMode
    var connectTimeout: Duration?
    var statementTimeout: Duration?
    var applicationName: String
    var redacted: String

    /// The URL's `sslmode`, as libpq names it.
    enum SSLMode: String, CaseIterable {
        case disable
        case prefer
        case require
        case verifyCA = "verify-ca"
        case verifyFull = "verify-full"
    }

    init(_ url: String, environment: [String: String]) throws(LedgerError) {
        func bad(_ why: String) -> LedgerError {
            LedgerError(.badLocation, "--ledger \(Self.redact(url)): \(why); the form is postgres://user:password@host:port/database?sslmode=disable")
        }
        guard let parts = URLComponents(string: url), let scheme = parts.scheme, ["postgres", "postgresql"].contains(scheme) else {
            throw bad("not a URL (a password with @, :, / or % must be percent-encoded)")
        }
        var host = parts.percentEncodedHost?.removingPercentEncoding ?? ""
        if host.hasPrefix("["), host.hasSuffix("]") { host = String(host.dropFirst().dropLast()) }
        self.host = host.isEmpty ? "localhost" : host
        if let port = parts.port, !(1...65535).contains(port) { throw bad("port \(port) is not 1 to 65535") }
        port = parts.port ?? 5432
        user = parts.percentEncodedUser?.removingPercentEncoding.flatMap { $0.isEmpty ? nil : $0 }
            ?? environment["PGUSER"] ?? environment["USER"] ?? "postgres"
        password = parts.percentEncodedPassword?.removingPercentEncoding ?? environment["PGPASSWORD"]
        let path = parts.percentEncodedPath.removingPercentEncoding ?? ""
        let name = path.hasPrefix("/") ? String(path.dropFirst()) : path
        if name.contains("/") { throw bad("'\(name)' is not a database name") }
        database = name.isEmpty ? user : name
        let loopback = self.host == "localhost" || self.host.hasPrefix("127.") || self.host == "::1"
        sslmode = loopback ? .disable : .prefer
        applicationName = "otaflash"
        for item in parts.queryItems ?? [] {
            switch item.name {
            case "sslmode":
                guard let value = item.value.flatMap(SSLMode.init(rawValue:)) else {
                    throw bad("sslmode must be one of \(SSLMode.allCases.map(\.rawValue).joined(separator: ", ")), got '\(item.value ?? "")'")
                }
                sslmode = value
            case "connect_timeout":
                guard let value = item.value.flatMap(Int.init), (1...600).contains(value) else {
                    throw bad("connect_timeout must be 1 to 600 seconds, got '\(item.value ?? "")'")
                }
                connectTimeout = .seconds(value)
            case "statement_timeout":
                guard let value = item.value.flatMap(Int.init), (1...600).contains(value) else {
                    throw bad("statement_timeout must be 1 to 600 seconds, got '\(item.value ?? "")'")
                }
                statementTimeout = .seconds(value)
            case "application_name":
                applicationName = item.value ?? applicationName
            default:
                throw bad("unknown parameter '\(item.name)' (known: sslmode, connect_timeout, statement_timeout, application_name)")
            }
        }
        redacted = "\(scheme)://\(user)@\(self.host.contains(":") ? "[\(self.host)]" : self.host):\(port)/\(database)"
    }

    /// `url` without its password, for lines about a URL that did not parse.
    static func redact(_ url: String) -> String {
        url.replacing(/:\/\/([^:@\/]*):[^@\/]*@/) { "://\($0.1):***@" }
    }

    /// sslmode as libpq reads it: prefer and require encrypt without checking the certificate,
    /// verify-ca checks it against the system's trust roots, verify-full the host name too.
    func tls() throws -> PostgresConnection.Configuration.TLS {
        var config = TLSConfiguration.makeClientConfiguration()
        switch sslmode {
        case .disable: return .disable
        case .prefer, .require: config.certificateVerification = .none
        case .verifyCA: config.certificateVerification = .noHostnameVerification
        case .verifyFull: config.certificateVerification = .fullVerification
        }
        let context = try NIOSSLContext(configuration: config)
        return sslmode == .prefer ? .prefer(context) : .require(context)
    }
}

extension PostgresRowSequence {
    /// Reads the answer to its end. `query` returns once the server has described the rows: a
    /// failure while the statement runs (a lock wait past `statement_timeout`) arrives with them,
    /// and unread it would surface only as the next statement's "transaction is aborted".
    func drain() async throws {
        for try await _ in self {}
    }
}
