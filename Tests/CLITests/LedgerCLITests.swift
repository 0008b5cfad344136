import Foundation
import Ledger
@testable import OTAFlashCLI
import Testing

/// The ledger as a factory line uses it: a record per device as it ends, single runs and batches,
/// queried with `otaflash ledger`; a ledger that cannot take a record stops the flash before it starts.
@Suite("Ledger through the CLI")
struct LedgerCLITests {
    static func rows(_ path: String) async throws -> [LedgerRecord] {
        try await SQLiteLedger(path: path).records(LedgerQuery())
    }

    @Test func aSingleDeviceRunRecordsItselfWithTheDeviceIdentityAndHonoursReportAndLogDir() async throws {
        let scratch = try Scratch()
        let ledger = scratch.url.appendingPathComponent("l.sqlite").path
        let report = scratch.url.appendingPathComponent("r.csv").path
        let logs = scratch.url.appendingPathComponent("logs").path
        let run = await otaflash(simulator + ["--json", "--ledger", ledger, "--station", "line-3", "--operator", "ana",
                                              "--report", report, "--log-dir", logs, samplePath("seeded-4k.bin")])
        #expect(run.code == 0, "\(run.stderr)")
        let rows = try await Self.rows(ledger)
        #expect(rows.count == 1)
        let row = try #require(rows.first)
        #expect(row.device == "C0:FF:EE:00:00:01" && row.station == "line-3" && row.operator == "ana")
        #expect(row.serialNumber == "SIMC0FFEE000001" && row.manufacturer == "otaflash")
        #expect(row.result == .ok && row.exitCode == 0 && row.errorCode == nil)
        #expect(row.imageName == "seeded-4k.bin" && row.imageSize == 4096 && row.imageSHA256.count == 64)
        #expect(row.bytesSent == 4096 && row.firmwareBefore == "1.0.0" && row.protocolName == "native")
        #expect(row.startedAt <= row.endedAt && row.startedAt.hasSuffix("Z"))
        let csv = try String(contentsOfFile: report, encoding: .utf8).split(separator: "\n")
        #expect(csv.count == 2 && csv[0].hasPrefix("started_at,ended_at,station,device"))
        #expect(csv[1].contains("SIMC0FFEE000001") && csv[1].contains(row.imageSHA256))
        let log = try String(contentsOfFile: logs + "/C0FFEE000001.jsonl", encoding: .utf8)
        #expect(log.contains("\"event\":\"done\""))

        // A second run appends, and says so. The ledger shows the device done with this image;
        // a flash the user starts sends it again (only a station skips it): a second row.
        let again = await otaflash(simulator + ["--ledger", ledger, "--report", report, samplePath("seeded-4k.bin")])
        #expect(again.code == 0, "\(again.stderr)")
        #expect(again.stderr.contains("appending this run's rows"))
        #expect(!again.stderr.contains("skipped"), "\(again.stderr)")
        let reportRows = try String(contentsOfFile: report, encoding: .utf8).split(separator: "\n")
        #expect(reportRows.count == 3 && reportRows[2].contains(",ok,"))
        #expect(try await Self.rows(ledger).count == 2)
    }

    @Test func aFailedDeviceIsRecordedWithItsErrorCode() async throws {
        let scratch = try Scratch()
        let ledger = scratch.url.appendingPathComponent("l.sqlite").path
        let run = await otaflash(simulator + ["--ledger", ledger, "--sim-flash-bitflip-at", "100", samplePath("seeded-4k.bin")])
        #expect(run.code == 8, "\(run.stderr)")
        let row = try #require(try await Self.rows(ledger).first)
        #expect(row.result == .error && row.exitCode == 8 && row.errorCode == "verify_failed")
        #expect(row.message?.isEmpty == false)
    }

    /// No record, no flash: a ledger that is not one stops the run before any radio time, exit 18.
    @Test func aCorruptLedgerStopsTheFlashBeforeItStarts() async throws {
        let scratch = try Scratch()
        let ledger = scratch.url.appendingPathComponent("junk.sqlite").path
        try Data(repeating: 0x5A, count: 8192).write(to: URL(fileURLWithPath: ledger))
        let run = await otaflash(simulator + ["--json", "--ledger", ledger, samplePath("seeded-4k.bin")])
        #expect(run.code == 18, "\(run.stderr)")
        #expect(!run.stdout.contains("\"event\":\"progress\""))
        #expect(run.errorLines.count == 1 && run.errorLines[0].contains(ledger), "\(run.stderr)")
    }

    @Test func aReportWithOtherColumnsIsRefusedBeforeAnyRadioTime() async throws {
        let scratch = try Scratch()
        let report = try scratch.file("old.csv", "device,adapter,result\nAA,hci0,ok\n")
        let run = await otaflash(simulator + ["--json", "--no-ledger", "--report", report, samplePath("seeded-4k.bin")])
        #expect(run.code == 16, "\(run.stderr)")
        #expect(!run.stdout.contains("\"event\":\"progress\""))
    }

    /// A batch killed with SIGKILL part-way: every device whose done line was printed has its
    /// record, its report row and its closed log; no record is half-written.
    @Test func aBatchKilledPartWayKeepsTheRecordOfEveryDeviceReportedDone() async throws {
        let scratch = try Scratch()
        let ledger = scratch.url.appendingPathComponent("l.sqlite").path
        let report = scratch.url.appendingPathComponent("r.csv").path
        let child = try Child(["--simulator", "--count", "4", "--parallel", "1", "--json", "--ledger", ledger,
                               "--report", report, samplePath("seeded-256k.bin")])
        var done: [String] = []
        while done.count < 2, let line = child.waitForLine({ $0.contains("\"event\":\"done\"") }) {
            let object = try #require(try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any])
            done.append(try #require(object["device"] as? String))
        }
        kill(child.process.processIdentifier, SIGKILL)
        let (_, exit) = child.finish()
        #expect(exit.signalled)
        #expect(done.count == 2)
        let rows = try await Self.rows(ledger)
        // Every device reported done has exactly one row; a third may have ended between the
        // line and the kill, never a device with a half-written row.
        for device in done { #expect(rows.filter { $0.device == device }.count == 1, "\(device): \(rows.map(\.device))") }
        #expect(rows.count >= 2 && rows.count <= 3)
        #expect(rows.allSatisfy { $0.result == .ok && $0.imageSHA256.count == 64 })
        let csv = try String(contentsOfFile: report, encoding: .utf8).split(separator: "\n")
        #expect(csv.count - 1 >= done.count)
    }

    @Test func theLedgerCommandFiltersExportsAndSummarises() async throws {
        let scratch = try Scratch()
        let ledger = scratch.url.appendingPathComponent("l.sqlite").path
        let batch = await otaflash(simulator + ["--count", "3", "--ledger", ledger, "--station", "st-a", "--retries", "0",
                                                "--sim-device-fault", "2:small-slot", samplePath("seeded-256k.bin")])
        #expect(batch.code == 14, "\(batch.stderr)")

        let all = await otaflash(["ledger", "--ledger", ledger, "--format", "json"])
        #expect(all.code == 0, "\(all.stderr)")
        let records = all.stdout.split(separator: "\n").compactMap { try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any] }
        #expect(records.count == 3)
        #expect(Set(records.compactMap { $0["result"] as? String }) == ["ok", "error"])
        #expect(records.allSatisfy { $0.keys.contains("serial_number") && $0.keys.contains("operator") })

        let failures = await otaflash(["ledger", "--ledger", ledger, "--result", "error", "--format", "csv"])
        let lines = failures.stdout.split(separator: "\n")
        #expect(lines.count == 2 && lines[0].hasPrefix("id,run_id,started_at"), "\(failures.stdout)")
        #expect(lines[1].contains("C0:FF:EE:00:00:02") && lines[1].contains("image_too_large"), "\(lines)")

        let summary = await otaflash(["ledger", "--ledger", ledger, "--summary", "--format", "json"])
        let object = try #require(try JSONSerialization.jsonObject(with: Data(summary.stdout.utf8)) as? [String: Any])
        #expect(object["devices"] as? Int == 3)
        #expect(abs((object["first_pass_yield"] as? Double ?? 0) - 2.0 / 3) < 1e-9)
        let byCode = try #require(object["failures_by_error_code"] as? [[String: Any]])
        #expect(byCode.first?["error_code"] as? String == "image_too_large")

        let table = await otaflash(["ledger", "--ledger", ledger, "--summary"])
        #expect(table.stdout.contains("first-pass yield  66.7 %"), "\(table.stdout)")

        let none = await otaflash(["ledger", "--ledger", ledger, "--station", "elsewhere"])
        #expect(none.code == 0 && none.stdout.contains("(no records)"))
    }

    @Test(arguments: [
        (["ledger", "--since", "yesterday"], 2), (["ledger", "--result", "maybe"], 2), (["ledger", "--limit", "0"], 2),
        (["ledger", "--ledger", "/nonexistent/l.sqlite"], 18),
        (["--simulator", "--ledger", "x.sqlite", "--no-ledger", "app.bin"], 2),
        (["--simulator", "--station", "", "app.bin"], 2),
    ])
    func badLedgerInputIsRefusedWithOneLine(arguments: [String], code: Int) async {
        let run = await otaflash(arguments)
        #expect(Int(run.code) == code, "\(run.stderr)")
        #expect(run.errorLines.count == 1, "\(run.stderr)")
    }

    @Test func sinceTakesDatesTimesAndAges() {
        let now = Date(timeIntervalSince1970: 1_800_000_000)
        #expect(LedgerCommand.time("2026-11-26", now: now) == "2026-11-26T00:00:00.000Z")
        #expect(LedgerCommand.time("2026-11-26T06:30", now: now) == "2026-11-26T06:30:00.000Z")
        #expect(LedgerCommand.time("2026-11-26T06:30:05Z", now: now) == "2026-11-26T06:30:05.000Z")
        #expect(LedgerCommand.time("2h", now: now) == LedgerRecord.timestamp(now.addingTimeInterval(-7200)))
        #expect(LedgerCommand.time("soon", now: now) == nil)
    }
}
