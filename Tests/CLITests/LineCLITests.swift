import Foundation
import Ledger
@testable import OTAFlashCLI
import Testing

/// `otaflash ledger --html` and `--format junit` on a simulated shift's ledger: the report's
/// counts are the summary's and the station's, the JUnit XML has a test case per attempt.
@Suite("Shift report and JUnit through the CLI")
struct LineCLITests {
    /// A shift of 24 devices with failing and flaky ones (`StationTests`' line), its ledger's path.
    static func shift(_ scratch: Scratch) async throws -> (ledger: String, summary: [String: Any]) {
        let ledger = scratch.url.appendingPathComponent("l.sqlite").path
        let run = await otaflash(StationTests.station(ledger, ["--station", "st-1"]))
        #expect(run.code == 0, "\(run.stderr)")
        return (ledger, try #require(run.jsonEvents.last))
    }

    @Test func theHtmlReportShowsTheSummarysAndTheStationsCounts() async throws {
        let scratch = try Scratch()
        let (ledger, station) = try await Self.shift(scratch)
        let file = scratch.url.appendingPathComponent("shift.html").path
        let run = await otaflash(["ledger", "--ledger", ledger, "--html", file])
        #expect(run.code == 0 && run.stdout.isEmpty, "\(run.stderr)")
        let page = try String(contentsOfFile: file, encoding: .utf8)
        func value(_ id: String) -> String? {
            page.firstMatch(of: try! Regex("id=\"count-\(id)\" data-value=\"([^\"]*)\""))?.output[1].substring.map(String.init)
        }
        let summaryRun = await otaflash(["ledger", "--ledger", ledger, "--summary", "--format", "json"])
        let summary = try #require(try JSONSerialization.jsonObject(with: Data(summaryRun.stdout.utf8)) as? [String: Any])
        #expect(value("devices") == "\(summary["devices"] as? Int ?? -1)")
        #expect(value("attempts") == "\(summary["attempts"] as? Int ?? -1)")
        #expect(Double(value("first-pass-yield") ?? "") == summary["first_pass_yield"] as? Double)
        #expect(Double(value("final-yield") ?? "") == summary["final_yield"] as? Double)
        #expect(value("done") == "\(station["done"] as? Int ?? -1)")
        #expect(value("failed-attempts") == "\(station["failed"] as? Int ?? -1)")
        #expect(value("quarantined") == "\(station["quarantined"] as? Int ?? -1)")
        for kind in ["throughput", "yield", "durations", "failures"] {
            #expect(page.components(separatedBy: "data-kind=\"\(kind)\"").count == 2, "\(kind)")
        }
        #expect(!page.contains("src=") && !page.contains("href="))

        // The usual filters: one station that is not there leaves an empty report.
        let none = await otaflash(["ledger", "--ledger", ledger, "--station", "nobody", "--html", file])
        #expect(none.code == 0, "\(none.stderr)")
        #expect(try String(contentsOfFile: file, encoding: .utf8).contains("id=\"count-attempts\" data-value=\"0\""))
    }

    @Test func junitHasATestCasePerAttemptAndAFailurePerFailedOne() async throws {
        let scratch = try Scratch()
        let (ledger, _) = try await Self.shift(scratch)
        let rows = try await SQLiteLedger(path: ledger).records(LedgerQuery())
        let run = await otaflash(["ledger", "--ledger", ledger, "--format", "junit"])
        #expect(run.code == 0, "\(run.stderr)")
        #expect(run.stdout.hasPrefix("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites>"))
        #expect(run.stdout.components(separatedBy: "<testcase ").count - 1 == rows.count)
        #expect(run.stdout.components(separatedBy: "<failure ").count - 1 == rows.filter { !$0.result.succeeded }.count)
        #expect(run.stdout.contains("tests=\"\(rows.count)\""))
    }

    @Test(arguments: [
        (["--format", "junit", "--summary"], "--format junit writes the attempts: drop --summary"),
        (["--html", "r.html", "--check"], "--html writes a report of its own: drop --check"),
        (["--html", "r.html", "--format", "csv"], "--html writes HTML: drop --format"),
        (["--html", "/nonexistent-folder/r.html"], "--html /nonexistent-folder/r.html: the folder /nonexistent-folder does not exist"),
        (["--html", "/tmp"], "--html /tmp is a folder: name a file"),
    ])
    func reportOptionsThatDoNotFitAreRefusedWithExit2(_ arguments: [String], _ line: String) async throws {
        let run = await otaflash(["ledger", "--ledger", "/nonexistent-ledger.sqlite"] + arguments)
        #expect(run.code == 2, "\(run.stderr)")
        #expect(run.stderr.contains(line), "\(run.stderr)")
    }
}
