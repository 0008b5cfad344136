import Foundation
import Ledger
@testable import OTAFlashCLI
import Testing
import TestSupport

/// `--ledger postgres://…` through the CLI: records go to the server as each device ends, and
/// `otaflash ledger` reads them; a server that is down or refuses the password stops the flash
/// before it starts, with one line and exit 18 (ledger_failed).
@Suite("PostgreSQL ledger through the CLI", .needs(.postgres))
struct PostgresLedgerCLITests {
    @Test func aBatchRecordsToTheServerAndTheLedgerCommandReadsIt() async throws {
        let url = try Prerequisites.require(PostgresServer.shared, for: .postgres).database("cli")
        let batch = await otaflash(simulator + ["--count", "3", "--ledger", url, "--station", "st-pg", samplePath("seeded-4k.bin")])
        #expect(batch.code == 0, "\(batch.stderr)")
        let records = try await PostgresLedger(url: url).records(LedgerQuery())
        #expect(records.count == 3 && records.allSatisfy { $0.station == "st-pg" && $0.result == .ok })

        let json = await otaflash(["ledger", "--ledger", url, "--format", "json"])
        #expect(json.code == 0, "\(json.stderr)")
        #expect(json.stdout.split(separator: "\n").count == 3)
        let summary = await otaflash(["ledger", "--ledger", url, "--summary", "--format", "json"])
        let object = try #require(try JSONSerialization.jsonObject(with: Data(summary.stdout.utf8)) as? [String: Any], "\(summary.stderr)")
        #expect(object["devices"] as? Int == 3 && object["final_yield"] as? Double == 1)
    }

    @Test func aServerThatIsDownStopsTheFlashWithExit18() async throws {
        let port = try freeLoopbackPort()
        let run = await otaflash(simulator + ["--json", "--ledger", "postgres://otaflash:pw@127.0.0.1:\(port)/otaflash", samplePath("seeded-4k.bin")])
        #expect(run.code == 18, "\(run.stderr)")
        #expect(!run.stdout.contains("\"event\":\"progress\""))
        #expect(run.errorLines.count == 1 && run.errorLines[0].contains("cannot reach the PostgreSQL ledger"), "\(run.stderr)")
        let read = await otaflash(["ledger", "--ledger", "postgres://otaflash:pw@127.0.0.1:\(port)/otaflash"])
        #expect(read.code == 18 && read.errorLines.count == 1, "\(read.stderr)")
    }

    @Test func aRefusedPasswordStopsTheFlashWithExit18() async throws {
        let server = try Prerequisites.require(PostgresServer.shared, for: .postgres)
        let url = "postgres://otaflash:wrong@127.0.0.1:\(server.port)/otaflash"
        let run = await otaflash(simulator + ["--json", "--ledger", url, samplePath("seeded-4k.bin")])
        #expect(run.code == 18, "\(run.stderr)")
        #expect(!run.stdout.contains("\"event\":\"progress\""))
        #expect(run.errorLines.count == 1 && run.errorLines[0].contains("refused user otaflash")
                && !run.errorLines[0].contains("wrong"), "\(run.stderr)")
        let read = await otaflash(["ledger", "--ledger", url])
        #expect(read.code == 18 && read.errorLines.count == 1 && read.errorLines[0].contains("password"), "\(read.stderr)")
    }
}
