import Foundation
import GRDB

/// A station's outbox (docs/LEDGER.md, "When the server goes away"): a SQLite ledger on the
/// station's own disk (the same schema, WAL, `synchronous = FULL`) that keeps what the shared
/// ledger could not take, in order, until it takes it. `otaflash ledger --ledger OUTBOX` reads it.
///
/// Besides the ledger's tables it has one of its own, `outbox`: one row per operation to send
/// (`record`: the attempt row `attempt_id`; `release`: a claim given up), `sent_at` set once the
/// shared ledger has it.
public final class Outbox: Sendable {
    public let path: String
    let store: SQLiteLedger
    /// Held while this process replays: one replay at a time on a station, whichever process.
    private let lockPath: String

    public enum Operation: Sendable, Hashable {
        case record(LedgerRecord)
        case release(device: String, holder: ClaimHolder)
    }

    /// The `kind` column: which operation a row holds.
    private enum Kind: String {
        case record
        case release
    }

    public init(path: String) throws(LedgerError) {
        self.path = path
        store = try SQLiteLedger(path: path)
        lockPath = path + ".replay-lock"
        do {
            try store.queue.write { db in
                try db.execute(sql: """
                    CREATE TABLE IF NOT EXISTS outbox (
                        seq INTEGER PRIMARY KEY AUTOINCREMENT, kind TEXT NOT NULL, attempt_id INTEGER,
                        device TEXT NOT NULL, station TEXT NOT NULL, run_id TEXT NOT NULL,
                        queued_at TEXT NOT NULL, sent_at TEXT)
                    """)
            }
        } catch {
            throw SQLiteLedger.failure(error, path: path, doing: "opening the outbox")
        }
    }

    /// Keeps `operation` until the shared ledger takes it: committed (and on disk) when it returns.
    public func keep(_ operation: Operation) async throws(LedgerError) {
        let now = LedgerRecord.timestamp(Date())
        do {
            try await store.queue.write { db in
                switch operation {
                case .record(let record):
                    var row = record
                    row.id = nil
                    try row.insert(db)
                    try db.execute(sql: "INSERT INTO outbox (kind, attempt_id, device, station, run_id, queued_at) VALUES (?, ?, ?, ?, ?, ?)",
                                   arguments: [Kind.record.rawValue, db.lastInsertedRowID, record.device, record.station, record.runID, now])
                case .release(let device, let holder):
                    try db.execute(sql: "INSERT INTO outbox (kind, device, station, run_id, queued_at) VALUES (?, ?, ?, ?, ?)",
                                   arguments: [Kind.release.rawValue, device, holder.station, holder.run, now])
                }
            }
        } catch {
            throw SQLiteLedger.failure(error, path: path, doing: "writing to the outbox")
        }
    }

    /// The operations not yet sent, oldest first, with their sequence numbers.
    public func pending() async throws(LedgerError) -> [(seq: Int64, operation: Operation)] {
        do {
            return try await store.queue.read { db in
                try Row.fetchAll(db, sql: "SELECT * FROM outbox WHERE sent_at IS NULL ORDER BY seq").map { row in
                    let seq: Int64 = row["seq"]
                    if (row["kind"] as String?).flatMap(Kind.init(rawValue:)) == .record, let id = row["attempt_id"] as Int64?,
                       let record = try LedgerRecord.fetchOne(db, sql: "SELECT * FROM attempts WHERE id = ?", arguments: [id]) {
                        var sent = record
                        sent.id = nil
                        return (seq, .record(sent))
                    }
                    return (seq, .release(device: row["device"], holder: ClaimHolder(station: row["station"], run: row["run_id"])))
                }
            }
        } catch {
            throw SQLiteLedger.failure(error, path: path, doing: "reading the outbox")
        }
    }

    /// How many operations are not yet sent.
    public func unsentCount() throws(LedgerError) -> Int {
        do {
            return try store.queue.read { db in try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM outbox WHERE sent_at IS NULL") ?? 0 }
        } catch {
            throw SQLiteLedger.failure(error, path: path, doing: "reading the outbox")
        }
    }

    /// Notes that the shared ledger has operation `seq`.
    public func sent(_ seq: Int64) async throws(LedgerError) {
        do {
            try await store.queue.write { db in
                try db.execute(sql: "UPDATE outbox SET sent_at = ? WHERE seq = ?", arguments: [LedgerRecord.timestamp(Date()), seq])
            }
        } catch {
            throw SQLiteLedger.failure(error, path: path, doing: "writing to the outbox")
        }
    }

    /// Runs `body` holding the station's replay lock (flock on a file beside the outbox); nil when
    /// another process of the station holds it (that one is replaying).
    func exclusively<T: Sendable>(_ body: () async throws(LedgerError) -> T) async throws(LedgerError) -> T? {
        try await withFileLock(lockPath, body)
    }

    public func close() async { await store.close() }
}

/// The shared ledger with an outbox (docs/LEDGER.md, "When the server goes away"): records and
/// claim releases the server cannot take now are kept in the outbox and sent, in order, exactly
/// once (`appendOnce`), before anything else is asked of the server. Claims and renewals go to
/// the server only: a claim the server did not grant is no claim.
public actor SpoolingLedger: LedgerStore {
    public nonisolated let location: String
    public nonisolated let shared: any LedgerStore
    public nonisolated let outbox: Outbox
    /// Operations in the outbox not yet sent, as last known (read from the file when it opens).
    private var waiting: Int
    /// Records neither the server nor the outbox took (its disk full): kept in memory, sent
    /// first when the server answers; lost if this process ends before.
    private var stranded: [LedgerRecord] = []

    public init(shared: any LedgerStore, outbox: Outbox) throws(LedgerError) {
        self.shared = shared
        self.outbox = outbox
        location = shared.location
        waiting = try outbox.unsentCount()
    }

    /// Operations kept in the outbox or in memory, not yet in the shared ledger.
    public var unsent: Int { waiting + stranded.count }

    /// Records only this process holds (`stranded`): their devices, for the line that says so.
    public var strandedDevices: [String] { stranded.map(\.device) }

    /// A replay in progress in this process, and the operations waiting for it.
    private var replaying = false
    private var replayWaiters: [CheckedContinuation<Void, Never>] = []

    /// Sends what the outbox keeps, in order; returns how many were sent. Throws as the server
    /// does (then the rest stay, in order); another process of the station replaying meanwhile is
    /// `locked`. One replay at a time in this process too: operations that meet one in progress
    /// (the outbox's retries beside a claim, devices ending at once) wait for it, rather than send
    /// its records again or find the outbox's lock held by themselves.
    @discardableResult
    public func replay() async throws(LedgerError) -> Int {
        while replaying { await withCheckedContinuation { replayWaiters.append($0) } }
        replaying = true
        defer {
            replaying = false
            if !replayWaiters.isEmpty { replayWaiters.removeFirst().resume() }
        }
        var delivered = 0
        while let record = stranded.first {
            try await shared.appendOnce(record)
            stranded.removeFirst()
            delivered += 1
        }
        guard waiting > 0 else { return delivered }
        let (shared, outbox) = (shared, outbox)
        let sent = try await outbox.exclusively { () async throws(LedgerError) -> Int in
            var sent = 0
            for (seq, operation) in try await outbox.pending() {
                switch operation {
                case .record(let record): try await shared.appendOnce(record)
                case .release(let device, let holder): try await shared.release(device, by: holder)
                }
                try await outbox.sent(seq)
                sent += 1
            }
            return sent
        }
        guard let sent else {
            throw LedgerError(.locked, "another otaflash of this station is replaying the outbox \(outbox.path); its records go first")
        }
        waiting = try outbox.unsentCount()
        return delivered + sent
    }

    public func prepare(station: String) async throws(LedgerError) {
        try await replay()
        try await shared.prepare(station: station)
    }

    /// To the server only: a beat the server does not take is a station it sees as silent.
    public func beat(_ heartbeat: StationHeartbeat) async throws(LedgerError) {
        try await shared.beat(heartbeat)
    }

    public func heartbeats() async throws(LedgerError) -> [StationHeartbeat] {
        try await shared.heartbeats()
    }

    @discardableResult
    public func append(_ record: LedgerRecord) async throws(LedgerError) -> Int64 {
        do {
            try await replay()
            return try await shared.appendOnce(record)
        } catch where error.kind == .unreachable || (error.kind == .locked && unsent > 0) {
            do {
                try await outbox.keep(.record(record))
            } catch {
                stranded.append(record)
                throw error
            }
            waiting += 1
            retryLater()
            return 0
        }
    }

    /// How often what the outbox keeps is offered to the server again while it keeps something:
    /// a quarter of the lease last asked for, so that a record of a device this station finished
    /// reaches the ledger before another station may take that device's lapsed claim.
    private var retryPeriod: Duration = .seconds(1)
    private var retrying: Task<Void, Never>?

    /// Offers the outbox to the server every `retryPeriod` until it is empty or this ledger closed.
    private func retryLater() {
        guard retrying == nil else { return }
        retrying = Task { [weak self] in
            while let self, await self.unsent > 0, !Task.isCancelled {
                do { try await Task.sleep(for: await self.retryPeriod) } catch { break }
                _ = try? await self.replay()
            }
            await self?.retried()
        }
    }

    private func retried() { retrying = nil }

    @discardableResult
    public func appendOnce(_ record: LedgerRecord) async throws(LedgerError) -> Int64 {
        try await append(record)
    }

    public func records(_ query: LedgerQuery) async throws(LedgerError) -> [LedgerRecord] {
        try await shared.records(query)
    }

    public func claim(_ device: String, image: String, by holder: ClaimHolder, lease: Duration) async throws(LedgerError) -> ClaimResult {
        retryPeriod = max(.milliseconds(100), lease / 4)
        // Nothing is claimed while the outbox holds a record the server has not seen: it may
        // show this very device done.
        try await replay()
        return try await shared.claim(device, image: image, by: holder, lease: lease)
    }

    public func renew(_ device: String, by holder: ClaimHolder, lease: Duration) async throws(LedgerError) -> Bool {
        try await shared.renew(device, by: holder, lease: lease)
    }

    public func release(_ device: String, by holder: ClaimHolder) async throws(LedgerError) {
        do {
            try await replay()
            try await shared.release(device, by: holder)
        } catch where error.kind == .unreachable || (error.kind == .locked && unsent > 0) {
            try await outbox.keep(.release(device: device, holder: holder))
            waiting += 1
            retryLater()
        }
    }

    public func takeOver(_ device: String, image: String, from previous: ClaimHolder, by holder: ClaimHolder, lease: Duration) async throws(LedgerError) -> Bool {
        try await replay()
        return try await shared.takeOver(device, image: image, from: previous, by: holder, lease: lease)
    }

    public func claims() async throws(LedgerError) -> [Claim] {
        try await shared.claims()
    }

    public func close() async {
        retrying?.cancel()
        retrying = nil
        await shared.close()
        await outbox.close()
    }
}

/// `body`'s result with an exclusive flock on `path` held, or nil when another process holds it.
private func withFileLock<T: Sendable>(_ path: String, _ body: () async throws(LedgerError) -> T) async throws(LedgerError) -> T? {
    let fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0o644)
    guard fd >= 0 else {
        throw LedgerError(.cannotOpen, "cannot open the outbox's lock \(path): \(String(cString: strerror(errno)))")
    }
    defer { close(fd) }
    guard flock(fd, LOCK_EX | LOCK_NB) == 0 else { return nil }
    return try await body()
}
