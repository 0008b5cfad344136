import Foundation
import Ledger
import Synchronization
import Testing
import TestSupport

/// A real store whose server can be made to go away: every operation fails as unreachable while
/// `down` is set (what PostgresLedger says of a server stopped or out of reach). A fault injected
/// in front of a real ledger, as the simulator injects a link's.
final class Unplugged: LedgerStore {
    let store: any LedgerStore
    let down = Mutex(false)
    init(_ store: any LedgerStore) { self.store = store }
    var location: String { store.location }

    private func check() throws(LedgerError) {
        if down.withLock({ $0 }) { throw LedgerError(.unreachable, "cannot reach the ledger: Connection refused") }
    }

    func prepare(station: String) async throws(LedgerError) { try check(); try await store.prepare(station: station) }
    func append(_ record: LedgerRecord) async throws(LedgerError) -> Int64 { try check(); return try await store.append(record) }
    func appendOnce(_ record: LedgerRecord) async throws(LedgerError) -> Int64 { try check(); return try await store.appendOnce(record) }
    func records(_ query: LedgerQuery) async throws(LedgerError) -> [LedgerRecord] { try check(); return try await store.records(query) }
    func claim(_ device: String, image: String, by holder: ClaimHolder, lease: Duration) async throws(LedgerError) -> ClaimResult {
        try check()
        return try await store.claim(device, image: image, by: holder, lease: lease)
    }
    func renew(_ device: String, by holder: ClaimHolder, lease: Duration) async throws(LedgerError) -> Bool {
        try check()
        return try await store.renew(device, by: holder, lease: lease)
    }
    func release(_ device: String, by holder: ClaimHolder) async throws(LedgerError) { try check(); try await store.release(device, by: holder) }
    func takeOver(_ device: String, image: String, from previous: ClaimHolder, by holder: ClaimHolder, lease: Duration) async throws(LedgerError) -> Bool {
        try check()
        return try await store.takeOver(device, image: image, from: previous, by: holder, lease: lease)
    }
    func claims() async throws(LedgerError) -> [Claim] { try check(); return try await store.claims() }
    func close() async { await store.close() }
}

/// The outbox (docs/LEDGER.md, "When the server goes away"): what the shared ledger cannot take
/// is kept on the station's disk and sent first, in order, exactly once.
@Suite("Ledger: the station's outbox")
struct OutboxTests {
    let sha = String(repeating: "ab", count: 32)
    let holder = ClaimHolder(station: "st1", run: "run")

    func held(_ device: String) -> LedgerRecord {
        record(device, station: "st1")
    }

    @Test func recordsKeptWhileTheLedgerIsAwayAreSentInOrderBeforeAnyClaim() async throws {
        let folder = try Folder()
        let shared = Unplugged(try SQLiteLedger(path: folder.path + "/shared.sqlite"))
        let ledger = try SpoolingLedger(shared: shared, outbox: try Outbox(path: folder.path + "/outbox.sqlite"))
        // Claimed while the server answers; the server goes away as the devices end.
        for device in ["AA:00:00:00:00:01", "AA:00:00:00:00:02"] {
            guard case .granted = try await ledger.claim(device, image: sha, by: holder, lease: .seconds(60)) else {
                Issue.record("\(device) was not granted"); return
            }
        }
        shared.down.withLock { $0 = true }
        var second = record("AA:00:00:00:00:02", result: .error, at: 5, station: "st1")
        second.attempts = 1
        try await ledger.append(held("AA:00:00:00:00:01"))
        try await ledger.append(second)
        try await ledger.release("AA:00:00:00:00:03", by: holder)
        #expect(await ledger.unsent == 3)
        // Nothing is claimed while the server is away: a claim is the server's to grant.
        await #expect(throws: LedgerError.self) { try await ledger.claim("AA:00:00:00:00:04", image: sha, by: holder, lease: .seconds(60)) }
        // Kept on disk: another handle on the outbox (a station started again) sees them.
        #expect(try await Outbox(path: folder.path + "/outbox.sqlite").pending().count == 3)

        shared.down.withLock { $0 = false }
        // The next claim sends the outbox first: device 1 is done, device 2 released.
        guard case .done(by: "st1", _) = try await ledger.claim("AA:00:00:00:00:01", image: sha, by: ClaimHolder(station: "st2", run: "r2"), lease: .seconds(60)) else {
            Issue.record("a device whose ok record was in the outbox was not done"); return
        }
        #expect(await ledger.unsent == 0)
        let rows = try await shared.records(LedgerQuery())
        #expect(rows.map(\.device) == ["AA:00:00:00:00:01", "AA:00:00:00:00:02"], "in the order they were kept")
        let claims = try await shared.claims()
        #expect(claims.first { $0.device == "AA:00:00:00:00:01" }?.state == .done)
        #expect(claims.first { $0.device == "AA:00:00:00:00:02" }?.state == .released)
        // Sent once: replaying again writes nothing.
        #expect(try await ledger.replay() == 0)
        #expect(try await shared.records(LedgerQuery()).count == 2)
    }

    /// A record the server committed though its answer was lost (the connection dropped after the
    /// commit) is kept in the outbox too: sent again, it is not written twice.
    @Test func aRecordTheServerHasAlreadyIsNotWrittenTwice() async throws {
        let folder = try Folder()
        let store = try SQLiteLedger(path: folder.path + "/shared.sqlite")
        let outbox = try Outbox(path: folder.path + "/outbox.sqlite")
        let r = held("AA:00:00:00:00:01")
        try await store.append(r)
        try await outbox.keep(.record(r))
        let ledger = try SpoolingLedger(shared: store, outbox: outbox)
        #expect(try await ledger.replay() == 1)
        #expect(try await store.records(LedgerQuery()).count == 1)
        // Another attempt (attempt 2) of the same device in the same run is another record.
        var again = r
        again.attempts = 2
        let first = try await store.appendOnce(r)
        #expect(try await store.appendOnce(again) != first)
        #expect(try await store.records(LedgerQuery()).count == 2)
    }
}

@Suite("Ledger: PostgreSQL claims after an outage", .needs(.postgres))
struct PostgresOutageClaimTests {
    /// A claim whose lease lapsed before a station had the server (an outage every station had)
    /// is given its holder again for a lease, not taken; its holder renews it and records it.
    @Test func aLeaseThatLapsedBeforeThisStationHadTheServerIsReArmedNotTaken() async throws {
        let url = try Prerequisites.require(PostgresServer.shared, for: .postgres).database()
        let sha = String(repeating: "ab", count: 32)
        let holderLedger = try PostgresLedger(url: url)
        let a = ClaimHolder(station: "st-a", run: "ra")
        guard case .granted = try await holderLedger.claim("AA:00:00:00:00:01", image: sha, by: a, lease: .milliseconds(500)) else {
            Issue.record("not granted"); return
        }
        try await Task.sleep(for: .seconds(1))
        // Another station, just connected: the lapse happened before it had the server.
        let other = try PostgresLedger(url: url)
        let answer = try await other.claim("AA:00:00:00:00:01", image: sha, by: ClaimHolder(station: "st-b", run: "rb"), lease: .seconds(5))
        guard case .held(by: "st-a", _) = answer else { Issue.record("a lapsed claim was taken at once: \(answer)"); return }
        // Its holder comes back within that lease: the claim is still its own, and its record ends it.
        #expect(try await holderLedger.renew("AA:00:00:00:00:01", by: a, lease: .seconds(5)))
        var ok = record("AA:00:00:00:00:01", station: "st-a")
        ok.runID = "ra"
        try await holderLedger.appendOnce(ok)
        try await holderLedger.appendOnce(ok)
        guard case .done(by: "st-a", _) = try await other.claim("AA:00:00:00:00:01", image: sha, by: ClaimHolder(station: "st-b", run: "rb"), lease: .seconds(5)) else {
            Issue.record("the device was not done"); return
        }
        #expect(try await other.records(LedgerQuery()).count == 1, "the record sent twice is written once")
        await holderLedger.close()
        await other.close()
    }
}
