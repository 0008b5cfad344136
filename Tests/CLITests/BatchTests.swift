import Foundation
import Testing

@Suite("otaflash batch")
struct BatchTests {
    @Test func thirtyTwoSimulatedDevicesAllEndOkWithASummary() async throws {
        let run = await otaflash(simulator + ["--count", "32", "--parallel", "32", "--json", samplePath("seeded-256k.bin")])
        #expect(run.code == 0)
        let events = run.jsonEvents
        let done = events.filter { $0["event"] as? String == "done" }
        #expect(done.count == 32)
        #expect(done.allSatisfy { $0["result"] as? String == "ok" && $0["crc32"] as? String == "cf1fc040" })
        #expect(Set(done.compactMap { $0["device"] as? String }).count == 32)
        let summary = try #require(events.last)
        #expect(summary["event"] as? String == "summary")
        #expect(summary["ok"] as? Int == 32)
        #expect(summary["failed"] as? Int == 0)
        // Every progress event names its device.
        #expect(events.filter { $0["event"] as? String == "progress" }.allSatisfy { $0["device"] is String })
    }

    @Test func aMixedBatchReportsEachFailureFinishesTheOthersAndExits14() async throws {
        let run = await otaflash(simulator + ["--count", "5", "--json", "--retries", "0",
                                              "--sim-device-fault", "2:no-ota-service", "--sim-device-fault", "3:small-slot",
                                              "--sim-device-fault", "4:gone", samplePath("seeded-256k.bin")])
        #expect(run.code == 14)
        let done = Dictionary(uniqueKeysWithValues: run.jsonEvents.filter { $0["event"] as? String == "done" }
            .map { ($0["device"] as? String ?? "", $0) })
        #expect(done["C0:FF:EE:00:00:01"]?["result"] as? String == "ok")
        #expect(done["C0:FF:EE:00:00:05"]?["result"] as? String == "ok")
        #expect(done["C0:FF:EE:00:00:02"]?["error"] as? String == "incompatible_device")
        #expect(done["C0:FF:EE:00:00:03"]?["error"] as? String == "image_too_large")
        #expect(done["C0:FF:EE:00:00:04"]?["error"] as? String == "connection")
        #expect(run.errorLines.count == 1)
        #expect(run.errorLines.first?.contains("3 of 5 devices failed") == true)
        // The summary is the last line, with the exit code it ends with.
        let last = try #require(run.jsonEvents.last)
        #expect(last["event"] as? String == "summary")
        #expect(last["failed"] as? Int == 3)
        #expect(last["exit_code"] as? Int == 14)
    }

    @Test func aBatchWhereEveryDeviceFailsExits15() async {
        let run = await otaflash(simulator + ["--count", "2", "--sim-slot-size", "1024", samplePath("seeded-4k.bin")])
        #expect(run.code == 15)
        #expect(run.errorLines.first?.contains("all 2 devices failed") == true)
    }

    @Test func devicesFileWithCommentsReportAndLogs() async throws {
        let scratch = try Scratch()
        let list = scratch.url.appendingPathComponent("devices.txt")
        try "# line 3\nC0:FF:EE:00:00:0A\n\n  c0:ff:ee:00:00:0b  # lower case works\n".write(to: list, atomically: true, encoding: .utf8)
        let report = scratch.url.appendingPathComponent("report.csv").path
        let logs = scratch.url.appendingPathComponent("logs").path
        let run = await otaflash(simulator + ["--devices-file", list.path, "--report", report, "--log-dir", logs,
                                              "--image-version", "2.1.0", samplePath("seeded-4k.bin")])
        #expect(run.code == 0)
        let csv = try String(contentsOfFile: report, encoding: .utf8).split(separator: "\n")
        #expect(csv.count == 3)
        #expect(csv[0].hasPrefix("device,adapter,result"))
        #expect(csv.dropFirst().allSatisfy { $0.contains(",ok,") && $0.hasSuffix(",1.0.0,2.1.0") })
        let logFiles = try FileManager.default.contentsOfDirectory(atPath: logs).sorted()
        #expect(logFiles == ["C0FFEE00000A.jsonl", "C0FFEE00000B.jsonl"])
        let log = try String(contentsOfFile: logs + "/C0FFEE00000A.jsonl", encoding: .utf8)
        #expect(log.contains("\"event\":\"done\""))
        #expect(!log.contains("C0:FF:EE:00:00:0B"))
        // On a terminal-less run the table still goes to stdout.
        #expect(run.stdout.contains("C0:FF:EE:00:00:0B"))
    }

    @Test func skipIfVersionLeavesUpToDateDevicesAlone() async {
        let run = await otaflash(simulator + ["--count", "2", "--skip-if-version", "1.0.0", "--json", samplePath("seeded-4k.bin")])
        #expect(run.code == 0)
        let done = run.jsonEvents.filter { $0["event"] as? String == "done" }
        #expect(done.count == 2)
        #expect(done.allSatisfy { $0["result"] as? String == "skipped" })
        #expect(!run.stdout.contains("\"event\":\"transfer\""))
    }

    @Test(arguments: [
        (["--count", "0"], "--count"),
        (["--parallel", "0"], "--parallel"),
        (["--sim-device-fault", "x:gone"], "--sim-device-fault"),
        (["--skip-if-version", "one"], "--skip-if-version"),
    ])
    func badBatchOptionsAreUsageErrors(extra: [String], names: String) async {
        let run = await otaflash(simulator + extra + [samplePath("seeded-4k.bin")])
        #expect(run.code == 2)
        #expect(run.errorLines.count == 1)
        #expect(run.errorLines.first?.contains(names) == true)
    }

    @Test func devicesFileWithABadLineNamesTheLine() async throws {
        let scratch = try Scratch()
        let list = scratch.url.appendingPathComponent("devices.txt")
        try "C0:FF:EE:00:00:0A\nnot-an-address\n".write(to: list, atomically: true, encoding: .utf8)
        let run = await otaflash(simulator + ["--devices-file", list.path, samplePath("seeded-4k.bin")])
        #expect(run.code == 2)
        #expect(run.errorLines.first?.contains("devices.txt:2") == true)
    }

    @Test func countNeedsTheSimulator() async {
        let run = await otaflash(["--count", "3", samplePath("seeded-4k.bin")])
        #expect(run.code == 2)
        #expect(run.errorLines.first?.contains("--simulator") == true)
    }
}
