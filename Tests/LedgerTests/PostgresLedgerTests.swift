import Foundation
import Ledger
import Logging
import PostgresNIO
import Testing
import TestSupport

/// The records every store must keep alike: devices, results, stations, adapters and serials
/// that the queries below tell apart.
func shift() -> [LedgerRecord] {
    var records = [record("AA:00:00:00:00:01", at: 0, serial: "S1"),
                   record("AA:00:00:00:00:02", result: .error, at: 60, station: "st2", serial: "S2"),
                   record("aa:00:00:00:00:02", at: 120, station: "st2", serial: "S2"),
                   record("AA:00:00:00:00:03", result: .skipped, at: 180, adapter: nil),
                   record("AA:00:00:00:00:04", result: .error, at: 240, seconds: 3.25, error: "timeout")]
    records[0].operator = "ana"
    records[0].bootloaderAddress = "AA:00:00:00:00:F1"
    records[0].firmwareBefore = "1.0.0"
    records[0].firmwareAfter = "2.0.0"
    records[0].imageVersion = "2.0.0"
    records[0].message = "ünïcode, \"quotes\", and a, comma"
    records[4].imageSHA256 = String(repeating: "cd", count: 32)
    records[4].imageName = "other.bin"
    return records
}

let shiftQueries = [
    LedgerQuery(), LedgerQuery(since: shift()[1].startedAt), LedgerQuery(until: shift()[1].startedAt),
    LedgerQuery(device: "AA:00:00:00:00:02"), LedgerQuery(device: "aa:00:00:00:00:02"), LedgerQuery(serialNumber: "S2"),
    LedgerQuery(result: .error), LedgerQuery(image: "app.bin"), LedgerQuery(image: "abababab"), LedgerQuery(image: "CDCDCDCD"),
    LedgerQuery(station: "st2"), LedgerQuery(station: "st2", limit: 1), LedgerQuery(limit: 2), LedgerQuery(result: .ok, limit: 0),
    LedgerQuery(afterID: 3), LedgerQuery(station: "st2", afterID: 2), LedgerQuery(limit: 1, afterID: 2), LedgerQuery(afterID: 99),
]

/// The claim rules (docs/LEDGER.md, "Claims") as two holders see them through two stores on one
/// ledger (two connections, or two SQLite handles). `wait` lets a short lease run out.
func claimRules(_ a: any LedgerStore, _ b: any LedgerStore) async throws {
    let sha = String(repeating: "ab", count: 32)
    let other = String(repeating: "cd", count: 32)
    let one = ClaimHolder(station: "st-a", run: "run-1")
    let two = ClaimHolder(station: "st-b", run: "run-2")
    let device = "c0:ff:ee:00:00:01"

    guard case .granted(let until) = try await a.claim(device, image: sha, by: one, lease: .seconds(3600)) else {
        Issue.record("a free device was not granted")
        return
    }
    // Another station sees who holds it, and until when; the address's case does not matter.
    #expect(try await b.claim(device.uppercased(), image: sha, by: two, lease: .seconds(3600)) == .held(by: "st-a", until: until))
    // Another run of the same station is another holder.
    #expect(try await b.claim(device, image: sha, by: ClaimHolder(station: "st-a", run: "run-9"), lease: .seconds(3600))
            == .held(by: "st-a", until: until))
    // The holder's own claim again is granted (a renewal).
    guard case .granted = try await a.claim(device, image: sha, by: one, lease: .seconds(3600)) else {
        Issue.record("the holder's own claim was refused")
        return
    }
    #expect(try await a.renew(device, by: one, lease: .seconds(3600)))
    #expect(try await b.renew(device, by: two, lease: .seconds(3600)) == false)

    // A failed attempt's record releases the claim: the other station may take it at once.
    var failed = record(device, result: .error, station: "st-a")
    failed.runID = "run-1"
    try await a.append(failed)
    guard case .granted = try await b.claim(device, image: sha, by: two, lease: .seconds(3600)) else {
        Issue.record("a released device was not granted to the other station")
        return
    }
    // Its ok record makes it done with this image, for everyone; another image may still be claimed.
    var ok = record(device, station: "st-b")
    ok.runID = "run-2"
    try await b.append(ok)
    guard case .done(by: "st-b", _) = try await a.claim(device, image: sha, by: one, lease: .seconds(3600)) else {
        Issue.record("a device done with the image was not reported done")
        return
    }
    #expect(try await a.records(LedgerQuery(device: device)).map(\.station) == ["st-a", "st-b"])
    guard case .granted = try await a.claim(device, image: other, by: one, lease: .seconds(60)) else {
        Issue.record("a device done with another image was not granted")
        return
    }
    // Released without a record: free at once.
    try await a.release(device, by: one)
    // A lease long enough that a loaded machine does not end it before the next claim, short
    // enough to wait out.
    let asked = ContinuousClock.now
    guard case .granted = try await b.claim(device, image: other, by: two, lease: .seconds(10)) else {
        Issue.record("a released claim was not granted")
        return
    }
    // An expired lease (its station died) is taken over; the old holder cannot renew it.
    guard case .held = try await a.claim(device, image: other, by: one, lease: .seconds(60)) else {
        Issue.record("a claim within its lease was taken")
        return
    }
    // Taken half a lease (the taker's: 6 s) after it ended, by a station that had the server all
    // along (asked every second: a longer silence than a third of its lease is a break).
    // (SQLite, one station's file, takes it as its lease ends.)
    let ended = asked + .milliseconds(10_000)
    while ContinuousClock.now < ended - .milliseconds(1_000) {
        try await Task.sleep(for: .seconds(1))
        guard case .held = try await a.claim(device, image: other, by: one, lease: .seconds(6)) else {
            Issue.record("a claim within its lease was taken")
            return
        }
    }
    while ContinuousClock.now < ended + .milliseconds(3_500) {
        try await Task.sleep(for: .seconds(1))
        _ = try await a.claims()
    }
    guard case .granted = try await a.claim(device, image: other, by: one, lease: .seconds(6)) else {
        Issue.record("an expired lease was not taken over")
        return
    }
    #expect(try await b.renew(device, by: two, lease: .seconds(60)) == false)
    let claims = try await b.claims()
    #expect(claims.map(\.device) == [device.uppercased()])
    #expect(claims.first?.station == "st-a" && claims.first?.state == .held && claims.first?.imageSHA256 == other)

    // A device done by a record written without a claim (a plain flash) is done too.
    try await a.append(record("C0:FF:EE:00:00:02", station: "st-c"))
    guard case .done(by: "st-c", _) = try await b.claim("c0:ff:ee:00:00:02", image: sha, by: two, lease: .seconds(60)) else {
        Issue.record("a device with an ok record was not reported done")
        return
    }
}

@Suite("Ledger: claims on SQLite")
struct SQLiteClaimTests {
    @Test func twoHandlesOnOneFileFollowTheClaimRules() async throws {
        let folder = try Folder()
        let a = try SQLiteLedger(path: folder.path + "/l.sqlite")
        let b = try SQLiteLedger(path: folder.path + "/l.sqlite")
        try await claimRules(a, b)
    }
}

@Suite("Ledger: PostgreSQL", .needs(.postgres))
struct PostgresLedgerTests {
    /// A database of its own on the test process's server.
    func database() throws -> String {
        try Prerequisites.require(PostgresServer.shared, for: .postgres).database()
    }

    @Test func recordsAndQueriesEqualSQLitesForTheSameRecords() async throws {
        let folder = try Folder()
        let sqlite = try SQLiteLedger(path: folder.path + "/l.sqlite")
        let postgres = try PostgresLedger(url: try database())
        try await postgres.prepare(station: "st1")
        for r in shift() {
            let a = try await sqlite.append(r)
            let b = try await postgres.append(r)
            #expect(a == b)
        }
        for query in shiftQueries {
            let expected = try await sqlite.records(query)
            #expect(try await postgres.records(query) == expected, "\(query)")
        }
        #expect(try await postgres.records(LedgerQuery()).count == shift().count)
        #expect(LedgerSummary(try await postgres.records(LedgerQuery())) == LedgerSummary(try await sqlite.records(LedgerQuery())))
        await postgres.close()
    }

    @Test func aRecordIsCommittedWhenAppendReturns() async throws {
        let url = try database()
        let writer = try PostgresLedger(url: url)
        var written = shift()[0]
        written.id = try await writer.append(written)
        // Another connection (another station) reads it at once.
        let reader = try PostgresLedger(url: url)
        #expect(try await reader.records(LedgerQuery()) == [written])
        await writer.close()
        await reader.close()
    }

    @Test func theSchemaIsMigratedAndANewerOneRefused() async throws {
        let server = try Prerequisites.require(PostgresServer.shared, for: .postgres)
        let url = try server.database()
        let ledger = try PostgresLedger(url: url)
        try await ledger.prepare(station: "st")
        await ledger.close()
        let name = try #require(URLComponents(string: url)?.path.split(separator: "/").last.map(String.init))
        try server.psql("SELECT 1 FROM grdb_migrations WHERE identifier = 'v2'", database: name)
        // What a newer otaflash would leave: a migration this one does not know.
        try server.psql("INSERT INTO grdb_migrations VALUES ('v\(Ledger.schemaVersion + 1)')", database: name)
        let newer = try PostgresLedger(url: url)
        await #expect(throws: LedgerError.self) { try await newer.prepare(station: "st") }
        do {
            try await newer.prepare(station: "st")
        } catch {
            #expect(error.kind == .newerSchema, "\(error)")
        }
    }

    @Test func twoConnectionsFollowTheClaimRules() async throws {
        let url = try database()
        try await claimRules(try PostgresLedger(url: url), try PostgresLedger(url: url))
    }

    /// Two stations (two connections) claim the same 200 devices at once, every claim in flight
    /// together: each device is granted exactly once, and the other station is told who holds it.
    @Test func twoStationsRacingFor200DevicesAreEachGrantedOnce() async throws {
        let url = try database()
        let stations = [try PostgresLedger(url: url), try PostgresLedger(url: url)]
        for (i, s) in stations.enumerated() { try await s.prepare(station: "st-\(i)") }
        let sha = String(repeating: "5e", count: 32)
        let devices = (0..<200).map { String(format: "C0:FF:EE:00:%02X:%02X", $0 >> 8, $0 & 0xFF) }
        let results = try await withThrowingTaskGroup(of: (Int, String, ClaimResult).self) { group in
            for device in devices {
                for (i, station) in stations.enumerated() {
                    group.addTask {
                        (i, device, try await station.claim(device, image: sha, by: ClaimHolder(station: "st-\(i)", run: "r\(i)"), lease: .seconds(60)))
                    }
                }
            }
            return try await group.reduce(into: []) { $0.append($1) }
        }
        var grants: [String: [Int]] = [:]
        for (i, device, result) in results {
            switch result {
            case .granted: grants[device, default: []].append(i)
            case .held(let by, _): #expect(by != "st-\(i)")
            case .done: Issue.record("\(device) reported done")
            }
        }
        #expect(devices.allSatisfy { grants[$0]?.count == 1 }, "\(grants.filter { $0.value.count != 1 })")
        let winners = devices.compactMap { grants[$0]?.first }
        print("race: 200 devices, 2 stations, grants per device: \(Set(devices.map { grants[$0]?.count ?? 0 })), won by station 0: \(winners.filter { $0 == 0 }.count), by station 1: \(winners.filter { $0 == 1 }.count)")
        let claims = try await stations[0].claims()
        #expect(claims.count == 200 && claims.allSatisfy { $0.state == .held && $0.station == "st-\(grants[$0.device]![0])" })
        for s in stations { await s.close() }
    }

    @Test func aServerThatIsDownIsUnreachable() async throws {
        let port = try freeLoopbackPort()
        let ledger = try PostgresLedger(url: "postgres://otaflash:pw@127.0.0.1:\(port)/otaflash")
        do {
            try await ledger.prepare(station: "st")
            Issue.record("a server that is down took a write")
        } catch {
            #expect(error.kind == .unreachable, "\(error)")
            #expect(error.message.contains("127.0.0.1:\(port)") && !error.message.contains("pw@"), "\(error)")
            #expect(!error.message.contains("\n"))
        }
    }

    /// A peer that takes the connection and never answers: the connect gives up at its timeout
    /// (the message names that limit). No wall-clock bound: under a full parallel run this test
    /// waits its turn among hundreds; the time limit only catches a connect that never ends.
    @Test(.timeLimit(.minutes(10))) func aServerThatNeverAnswersTimesOut() async throws {
        let socket = try SilentListener()
        let ledger = try PostgresLedger(url: "postgres://otaflash:pw@127.0.0.1:\(socket.port)/otaflash", connectTimeout: .milliseconds(500))
        do {
            _ = try await ledger.records(LedgerQuery())
            Issue.record("a silent server answered")
        } catch {
            #expect(error.kind == .unreachable, "\(error)")
            #expect(error.message.contains("did not answer within 0.5 s"), "\(error)")
        }
    }

    /// A statement deadline that closes the connection between two statements of one operation
    /// (here the schema's transaction, at a 1 ms limit) ends the operation with one error; it used
    /// to wait for ever on the ROLLBACK written to the closed connection (PostgresNIO drops a
    /// statement written there without failing it).
    @Test(.timeLimit(.minutes(10))) func aDeadlineThatClosesTheConnectionMidTransactionEndsTheOperation() async throws {
        let url = try Prerequisites.require(PostgresServer.shared, for: .postgres).database("deadline", statementTimeout: nil)
        for _ in 0..<5 {
            let ledger = try PostgresLedger(url: url, queryTimeout: .milliseconds(1))
            do {
                try await ledger.prepare(station: "st")
                Issue.record("a 1 ms deadline let a whole migration through")
            } catch {
                #expect(error.kind == .unreachable || error.kind == .locked, "\(error)")
            }
            await ledger.close()
        }
    }

    /// Another session holding the schema's lock (a station migrating, under load)
    /// while `body` runs; released at the end, or when `body` throws.
    func whileTheSchemaLockIsHeld<T>(on url: String, _ body: () async throws -> T) async throws -> T {
        let server = try Prerequisites.require(PostgresServer.shared, for: .postgres)
        let name = try #require(URLComponents(string: url)?.path.split(separator: "/").last.map(String.init))
        let logger = Logger(label: "test", factory: { _ in SwiftLogNoOpLogHandler() })
        let holder = try await PostgresConnection.connect(
            configuration: .init(host: "127.0.0.1", port: server.port, username: "otaflash", password: server.password, database: name, tls: .disable),
            id: 1, logger: logger)
        _ = try await holder.query("SELECT pg_advisory_lock(746102)", logger: logger).collect()
        do {
            let result = try await body()
            try await holder.close()
            return result
        } catch {
            try? await holder.close()
            throw error
        }
    }

    /// The server gives a statement as long as the URL's `statement_timeout`, not the default:
    /// a station that waits 3 s for another's schema lock gets it (it used to be cancelled by the
    /// server at the default, then fail with "current transaction is aborted").
    @Test func theServerWaitsAsLongAsTheURLSays() async throws {
        let url = try Prerequisites.require(PostgresServer.shared, for: .postgres).database("wait", statementTimeout: 60)
        let ledger = try PostgresLedger(url: url, queryTimeout: .seconds(1))
        #expect(ledger.queryTimeout == .seconds(60))
        try await whileTheSchemaLockIsHeld(on: url) {
            let waiting = Task { try await ledger.prepare(station: "st") }
            try await Task.sleep(for: .seconds(3))
            return waiting
        }.value
        #expect(try await ledger.claims().isEmpty)
        await ledger.close()
    }

    /// A lock held past `statement_timeout` is named as a lock (exit 18, kind `locked`), from the
    /// server's own answer, which comes before this process's deadline (twice as long: 20 s of
    /// margin for the statements before the lock on a loaded host; 3 s were not enough in a full run).
    @Test func aLockHeldPastTheTimeoutIsNamed() async throws {
        let url = try Prerequisites.require(PostgresServer.shared, for: .postgres).database("lock", statementTimeout: 20)
        let ledger = try PostgresLedger(url: url)
        try await whileTheSchemaLockIsHeld(on: url) {
            do {
                try await ledger.prepare(station: "st")
                Issue.record("a held schema lock let the migration through")
            } catch let error as LedgerError {
                #expect(error.kind == .locked, "\(error)")
                #expect(error.message.contains("waited over 20 s for another session's lock"), "\(error)")
            }
        }
        await ledger.close()
    }

    /// A ledger already at this schema is only read: a station starting while another holds the
    /// schema's lock does not wait for it (one that did would fail when the lock's 30 s are up).
    @Test func aMigratedLedgerIsOpenedWithoutTheLock() async throws {
        let url = try Prerequisites.require(PostgresServer.shared, for: .postgres).database("migrated", statementTimeout: 30)
        let first = try PostgresLedger(url: url)
        try await first.prepare(station: "st-a")
        await first.close()
        let second = try PostgresLedger(url: url)
        try await whileTheSchemaLockIsHeld(on: url) { try await second.prepare(station: "st-b") }
        await second.close()
    }

    @Test func aWrongPasswordIsRefusedAsAuthentication() async throws {
        let server = try Prerequisites.require(PostgresServer.shared, for: .postgres)
        let ledger = try PostgresLedger(url: "postgres://otaflash:wrong@127.0.0.1:\(server.port)/otaflash")
        do {
            try await ledger.prepare(station: "st")
            Issue.record("a wrong password was let in")
        } catch {
            #expect(error.kind == .authentication, "\(error)")
            #expect(error.message.contains("refused user otaflash") && !error.message.contains("wrong"), "\(error)")
        }
    }

    @Test func aDatabaseThatDoesNotExistIsNamed() async throws {
        let server = try Prerequisites.require(PostgresServer.shared, for: .postgres)
        let ledger = try PostgresLedger(url: "postgres://otaflash:\(server.password)@127.0.0.1:\(server.port)/nope")
        do {
            _ = try await ledger.records(LedgerQuery())
            Issue.record("a missing database was read")
        } catch {
            #expect(error.kind == .cannotOpen && error.message.contains("createdb nope"), "\(error)")
        }
    }
}

@Suite("Ledger: PostgreSQL URLs")
struct PostgresURLTests {
    @Test func aURLIsReadAsLibpqReadsIt() throws {
        let ledger = try PostgresLedger(url: "postgresql://line%40a:p%3Ass@db.example:6543/factory?sslmode=disable&connect_timeout=3&statement_timeout=45")
        #expect(ledger.location == "postgresql://line@a@db.example:6543/factory")
        #expect(ledger.connectTimeout == .seconds(3))
        #expect(ledger.queryTimeout == .seconds(45))
        let defaults = try PostgresLedger(url: "postgres://127.0.0.1", environment: ["PGUSER": "ops"])
        #expect(defaults.location == "postgres://ops@127.0.0.1:5432/ops")
        #expect(try Ledger.open("postgres://u@[::1]:5433/db").location == "postgres://u@[::1]:5433/db")
    }

    @Test(arguments: [
        ("postgres://u:secret@h/db?sslmode=sometimes", "sslmode must be one of"),
        ("postgres://u:secret@h/db?sslmod=disable", "unknown parameter 'sslmod'"),
        ("postgres://u:secret@h/db?connect_timeout=0", "connect_timeout must be 1 to 600"),
        ("postgres://u:secret@h/db?statement_timeout=601", "statement_timeout must be 1 to 600"),
        ("postgres://u:secret@h/a/b", "is not a database name"),
        ("postgres://u:secret@h:99999/db", "port"),
        ("mysql://u:secret@h/db", "not a path or a postgres:// URL"),
    ])
    func aBadURLIsRefusedWithoutItsPassword(url: String, says: String) {
        do {
            _ = try Ledger.open(url)
            Issue.record("\(url) was accepted")
        } catch {
            #expect(error.kind == .badLocation && error.message.contains(says), "\(error)")
            #expect(url.hasPrefix("mysql") || !error.message.contains("secret"), "\(error)")
        }
    }
}
