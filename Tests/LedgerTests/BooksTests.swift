import Foundation
import GRDB
import Ledger
import Testing

/// The books count attempts and check out (docs/LEDGER.md, "Reading it", "Checking the books"), and
/// a ledger location is checked before anything is opened or written.
@Suite("Ledger: the books")
struct BooksTests {
    static let sha = String(repeating: "ab", count: 32)
    static let now = "2027-01-15T08:00:00.000Z"

    static func claim(_ device: String, _ state: Claim.State, station: String = "st1", expires: String) -> Claim {
        Claim(device: device, imageSHA256: sha, station: station, run: "run-1", state: state, claimedAt: "2027-01-15T07:00:00.000Z", expiresAt: expires)
    }

    @Test func booksOfAFlawlessShiftCheckOut() {
        let rows = [record("AA:00:00:00:00:01", station: "st-a"), record("AA:00:00:00:00:02", station: "st-b"),
                    record("AA:00:00:00:00:03", result: .error, station: "st-a"), record("AA:00:00:00:00:03", at: 60, station: "st-b")]
        let claims = (1...3).map { Self.claim("AA:00:00:00:00:0\($0)", .done, expires: "2027-01-15T07:30:00.000Z") }
            + [Self.claim("AA:00:00:00:00:04", .held, expires: "2027-01-15T08:00:10.000Z")]  // a running station's lease
        let check = LedgerCheck(records: rows, allRecords: rows, claims: claims, now: Self.now)
        #expect(check.passed, "\(check.findings.map(\.line))")
        #expect(check.records == 4 && check.claims == 4)
    }

    @Test func aDeviceFlashedTwiceALostRecordAStoppedHolderAndBadCountsAreEachFound() {
        let rows = [record("AA:00:00:00:00:01", station: "st-a"), record("aa:00:00:00:00:01", at: 30, station: "st-b"),
                    record("AA:00:00:00:00:05", result: LedgerResult(rawValue: "maybe"), station: "st-b")]
        var wrong = record("AA:00:00:00:00:06", station: "st-b")
        wrong.exitCode = 8
        let claims = [Self.claim("AA:00:00:00:00:02", .done, expires: "2027-01-15T07:30:00.000Z"),
                      Self.claim("AA:00:00:00:00:03", .held, station: "st-c", expires: "2027-01-15T07:59:59.000Z"),
                      Self.claim("AA:00:00:00:00:04", .released, expires: "2027-01-15T07:00:00.000Z")]
        let check = LedgerCheck(records: rows + [wrong], allRecords: rows + [wrong], claims: claims, now: Self.now)
        #expect(!check.passed)
        let kinds = check.findings.map(\.kind)
        #expect(kinds.filter { $0 == .flashedTwice }.count == 1)
        #expect(check.findings.first { $0.kind == .flashedTwice }?.line.contains("2 ok records") == true)
        #expect(check.findings.first { $0.kind == .recordMissing }?.device == "AA:00:00:00:00:02")
        let held = check.findings.first { $0.kind == .heldByStoppedStation }
        #expect(held?.device == "AA:00:00:00:00:03" && held?.line.contains("st-c") == true)
        let counts = check.findings.filter { $0.kind == .countsDoNotAddUp }
        #expect(counts.count == 1 && counts[0].line.contains("station st-b") && counts[0].line.contains("exit code disagrees"), "\(counts)")
        #expect(check.findings.count == 4, "\(check.findings.map(\.line))")
    }

    /// An encounter an older otaflash wrote as a row (nothing sent: `held_elsewhere`) is no attempt:
    /// it lowers no yield and no station's counts; `--check` notes it.
    @Test func encounterRowsOfAnOlderOtaflashAreNoAttempts() {
        let rows = [record("AA:00:00:00:00:01", station: "st-a"),
                    record("AA:00:00:00:00:01", result: .error, at: -5, station: "st-b", error: "held_elsewhere"),
                    record("AA:00:00:00:00:02", station: "st-b")]
        let summary = LedgerSummary(rows)
        #expect(summary.attempts == 2 && summary.devices == 2 && summary.firstPassYield == 1 && summary.finalYield == 1)
        #expect(summary.failuresByErrorCode.isEmpty)
        #expect(summary.stations.map { "\($0.name) \($0.attempts) \($0.ok) \($0.failed)" } == ["st-a 1 1 0", "st-b 1 1 0"])
        let check = LedgerCheck(records: rows, allRecords: rows, claims: [], now: Self.now)
        #expect(check.passed && check.notes.count == 1 && check.notes[0].contains("station st-b: 1 records are encounters"))
    }

    /// Yields are over devices: a device that failed once then succeeded counts once in each.
    @Test func yieldsAreOverDevicesNotRows() {
        let rows = [record("AA:00:00:00:00:01", result: .error, at: 0), record("AA:00:00:00:00:01", at: 20),
                    record("AA:00:00:00:00:02", at: 5), record("AA:00:00:00:00:03", result: .error, at: 7)]
        let summary = LedgerSummary(rows)
        #expect(summary.devices == 3 && summary.attempts == 4)
        #expect(abs(summary.firstPassYield - 1.0 / 3) < 1e-9 && abs(summary.finalYield - 2.0 / 3) < 1e-9)
    }

    /// Another program's SQLite file is left as it was (not even its journal mode changes);
    /// `initialize` adds the ledger's tables beside its own.
    @Test func anotherProgramsSQLiteFileIsRefusedUntouchedUnlessInitialised() async throws {
        let folder = try Folder()
        let path = folder.path + "/inventory.db"
        do {
            let other = try DatabaseQueue(path: path)
            try await other.write { db in
                try db.execute(sql: "CREATE TABLE parts (id INTEGER PRIMARY KEY, name TEXT)")
                try db.execute(sql: "INSERT INTO parts (name) VALUES ('bolt')")
            }
            try other.close()
        }
        let before = try Data(contentsOf: URL(fileURLWithPath: path))
        #expect {
            _ = try SQLiteLedger(path: path)
        } throws: { error in
            guard let error = error as? LedgerError else { return false }
            return error.kind == .foreign && error.message.contains("tables parts") && error.message.contains("--ledger-init")
        }
        #expect(try Data(contentsOf: URL(fileURLWithPath: path)) == before, "the refused file was changed")
        #expect(!FileManager.default.fileExists(atPath: path + "-wal"))

        let ledger = try SQLiteLedger(path: path, initialize: true)
        try await ledger.append(record("AA:00:00:00:00:01"))
        #expect(try await ledger.records(LedgerQuery()).count == 1)
        await ledger.close()
        // Now a ledger (with a table of the other program's beside it): opened without the flag.
        #expect(try await SQLiteLedger(path: path).records(LedgerQuery()).count == 1)
        let parts = try await DatabaseQueue(path: path).read { db in try Int.fetchOne(db, sql: "SELECT count(*) FROM parts") }
        #expect(parts == 1)
    }

    @Test func anEmptyFileIsANewLedger() async throws {
        let folder = try Folder()
        let path = folder.path + "/empty.sqlite"
        FileManager.default.createFile(atPath: path, contents: Data())
        let ledger = try SQLiteLedger(path: path)
        try await ledger.append(record("AA:00:00:00:00:01"))
        #expect(try await ledger.records(LedgerQuery()).count == 1)
    }

    @Test(arguments: [
        ("", "empty value"), ("ftp://host/x", "not a path or a postgres:// URL"),
        ("postgres://u@h:notaport/db", "the form is postgres://"), ("postgres://u@h:99999/db", "port 99999 is not 1 to 65535"), ("postgres://u@h/db?sslmode=maybe", "sslmode"),
    ])
    func aMalformedLocationIsRefusedBeforeAnythingIsOpened(location: String, says: String) {
        #expect {
            try Ledger.check(location, environment: [:])
        } throws: { error in
            guard let error = error as? LedgerError else { return false }
            return error.kind == .badLocation && error.message.contains(says)
        }
    }

    @Test func wellFormedLocationsPass() throws {
        try Ledger.check("/var/lib/otaflash/ledger.sqlite", environment: [:])
        try Ledger.check("relative.sqlite", environment: [:])
        try Ledger.check("postgres://line:pw@db:5432/otaflash?sslmode=require", environment: [:])
    }
}
