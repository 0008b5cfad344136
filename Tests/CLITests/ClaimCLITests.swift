import Foundation
import Ledger
@testable import OTAFlashCLI
import Testing
import TestSupport

/// Claims wired into flash and batch (docs/LEDGER.md, "Claims"): a device another station holds is
/// not flashed (event `held`, exit 20); one the ledger shows done with this image is flashed again
/// as asked (only a station's shift skips it); a device's claim ends with its record.
enum ClaimChecks {
    static func heldDeviceIsNotFlashedAndDoneDeviceIsSkipped(ledger location: String) async throws {
        let image = samplePath("seeded-4k.bin")
        let sha = try RunRecords.describe(imageAt: image, version: nil).sha256
        let store = try Ledger.open(location)
        // Another station holds device 2, for an hour (it renews its claim; this test takes seconds).
        let other = ClaimHolder(station: "st-other", run: "r-other")
        let granted = try await store.claim("C0:FF:EE:00:00:02", image: sha, by: other, lease: .seconds(3600))
        guard case .granted = granted else { Issue.record("the other station's claim: \(granted)"); return }

        let first = await otaflash(simulator + ["--json", "--count", "3", "--ledger", location, "--station", "st-a", image])
        #expect(first.code == 20, "\(first.stderr)")  // its only failure is a held device
        let events = first.jsonEvents
        let held = events.filter { $0["event"] as? String == "held" }
        #expect(held.count == 1 && held.first?["device"] as? String == "C0:FF:EE:00:00:02" && held.first?["station"] as? String == "st-other")
        let done = Dictionary(events.filter { $0["event"] as? String == "done" }.map { ($0["device"] as? String ?? "", $0) }, uniquingKeysWith: { a, _ in a })
        #expect(done["C0:FF:EE:00:00:02"]?["error"] as? String == "held_elsewhere")
        #expect(done["C0:FF:EE:00:00:02"]?["exit_code"] as? Int == 20)
        #expect(done["C0:FF:EE:00:00:01"]?["result"] as? String == "ok" && done["C0:FF:EE:00:00:03"]?["result"] as? String == "ok")
        var rows = try await store.records(LedgerQuery())
        #expect(rows.count == 2 && !rows.contains { $0.device == "C0:FF:EE:00:00:02" }, "a held device has no row of its own")
        let claims = try await store.claims()
        #expect(claims.first { $0.device == "C0:FF:EE:00:00:01" }?.state == .done)
        #expect(claims.first { $0.device == "C0:FF:EE:00:00:02" }.map { $0.state == .held && $0.station == "st-other" } == true)

        // Every device held: the batch's own code, 20.
        let only = await otaflash(simulator + ["--device", "C0:FF:EE:00:00:02", "--ledger", location, "--station", "st-a", image])
        #expect(only.code == 20, "\(only.stderr)")
        #expect(only.errorLines.count == 1 && only.errorLines[0].contains("st-other"), "\(only.stderr)")

        // The other station gives it up: a rerun flashes all three (the user asked for them; a
        // station would skip 1 and 3), a row each.
        try await store.release("C0:FF:EE:00:00:02", by: other)
        let second = await otaflash(simulator + ["--json", "--count", "3", "--ledger", location, "--station", "st-b", image])
        #expect(second.code == 0, "\(second.stderr)")
        let results = second.jsonEvents.filter { $0["event"] as? String == "done" }.map { "\($0["device"] ?? "")=\($0["result"] ?? "")" }.sorted()
        #expect(results == ["C0:FF:EE:00:00:01=ok", "C0:FF:EE:00:00:02=ok", "C0:FF:EE:00:00:03=ok"])
        rows = try await store.records(LedgerQuery())
        #expect(rows.count == 5 && Set(rows.map(\.device)).count == 3, "one row per attempt")
        #expect(rows.first { $0.device == "C0:FF:EE:00:00:02" }?.station == "st-b")
        await store.close()
    }
}

@Suite("Claims through the CLI")
struct ClaimCLITests {
    @Test func onSQLite() async throws {
        let scratch = try Scratch()
        try await ClaimChecks.heldDeviceIsNotFlashedAndDoneDeviceIsSkipped(ledger: scratch.url.appendingPathComponent("l.sqlite").path)
    }

    @Test(.needs(.postgres)) func onPostgreSQL() async throws {
        let url = try Prerequisites.require(PostgresServer.shared, for: .postgres).database("claimcli")
        try await ClaimChecks.heldDeviceIsNotFlashedAndDoneDeviceIsSkipped(ledger: url)
    }

    /// A single device that a ledger shows done with this image is flashed again, as asked: a
    /// second row (only a station's shift skips a device done with its image).
    @Test func aSingleDeviceDoneAlreadyIsFlashedAgain() async throws {
        let scratch = try Scratch()
        let ledger = scratch.url.appendingPathComponent("l.sqlite").path
        let image = samplePath("seeded-4k.bin")
        #expect(await otaflash(simulator + ["--ledger", ledger, image]).code == 0)
        let again = await otaflash(simulator + ["--json", "--ledger", ledger, image])
        #expect(again.code == 0, "\(again.stderr)")
        #expect(again.jsonEvents.last?["result"] as? String == "ok")
        #expect(again.stdout.contains("\"event\":\"progress\""))
        #expect(try await SQLiteLedger(path: ledger).records(LedgerQuery()).count == 2)
    }

    @Test func claimLeaseOutOfRangeIsRefused() async {
        expectOneUsageLine(await otaflash(simulator + ["--claim-lease", "0", samplePath("seeded-4k.bin")]), saying: ["--claim-lease", "0.1"])
    }
}
