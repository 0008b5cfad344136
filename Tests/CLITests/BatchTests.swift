import Foundation
import OTAFlashCLI
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

    /// The table's time is the device's link time, as the throughput beside it: on the virtual
    /// clock a device takes seconds, not the 0.0 s of the wall clock it used to show.
    @Test func theTableTimesEachDeviceOnItsLinksClock() async throws {
        let run = await otaflash(simulator + ["--count", "2", samplePath("seeded-256k.bin")])
        #expect(run.code == 0, "\(run.stderr)")
        let rows = run.stdout.split(separator: "\n").filter { $0.hasPrefix("C0:FF:EE:") }
        #expect(rows.count == 2, "\(run.stdout)")
        for row in rows {
            let columns = row.split(separator: " ", omittingEmptySubsequences: true)
            let seconds = try #require(columns.firstIndex(of: "s").map { Double(columns[$0 - 1]) } ?? nil, "\(row)")
            // 256 KiB at the link model's rate, then the device's CRC and activation: over a second.
            #expect(seconds > 1, "\(row)")
        }
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
        #expect(csv[0].hasPrefix("started_at,ended_at,station,device,bootloader,adapter,serial_number,result,error_code"))
        #expect(csv[0].hasSuffix(",firmware_before,firmware_after,image,image_sha256,image_version,protocol,otaflash_version,otaflash_commit"))
        let version = "," + OtaflashVersion.number + "," + (OtaflashVersion.commit ?? "unknown")
        #expect(csv.dropFirst().allSatisfy { $0.contains(",ok,") && $0.contains(",1.0.0,2.1.0,seeded-4k.bin,") && $0.hasSuffix(",native" + version) },
                "\(csv)")
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
        (["--sim-device-fault", "x:gone"], "--sim-device-fault <N:mode>': expected N:no-ota-service, N:small-slot or N:gone, with N 1"),
        (["--sim-device-fault", "1001:gone"], "--sim-device-fault <N:mode>': expected N:no-ota-service"),
        (["--sim-device-fault", "2:melted"], "--sim-device-fault <N:mode>': expected N:no-ota-service"),
        (["--skip-if-version", "one"], "--skip-if-version <version|image>': expected a version like 1.2.3, or 'image'"),
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

    /// Every output path is checked before any radio time: a typo costs nothing.
    @Test(arguments: [
        (["--report", "/nonexistent/x.csv"], "--report /nonexistent/x.csv: the folder /nonexistent does not exist"),
        (["--report", "{dir}"], "is a directory"),
        (["--log-dir", "{dir}/file"], "--log-dir {dir}/file is a file, not a directory"),
        (["--sim-state", "{dir}/file"], "--sim-state {dir}/file is a file, not a directory"),
        (["--journal-dir", "{dir}/file"], "--journal-dir {dir}/file is a file, not a directory"),
        (["--log-dir", "{dir}/file/logs"], "--log-dir {dir}/file/logs: {dir}/file is a file, not a directory"),
        (["--log-dir", "{dir}/file/a/b"], "--log-dir {dir}/file/a/b: {dir}/file is a file, not a directory"),
        (["--log-dir", "{dir}/missing/logs"], "--log-dir {dir}/missing/logs: the directory {dir}/missing does not exist; create it first"),
        (["--journal-dir", "{dir}/missing/j"], "--journal-dir {dir}/missing/j: the directory {dir}/missing does not exist"),
    ])
    func anUnusableOutputPathIsAUsageErrorBeforeAnyDeviceIsTouched(extra: [String], says: String) async throws {
        let scratch = try Scratch()
        _ = try scratch.file("file", "x")
        let dir = scratch.url.path
        let args = (simulator + ["--count", "3", "--json"] + extra + [samplePath("seeded-4k.bin")])
            .map { $0.replacingOccurrences(of: "{dir}", with: dir) }
        let run = await otaflash(args)
        #expect(run.code == 2, "\(run.stderr)")
        #expect(run.errorLines.count == 1, "\(run.stderr)")
        #expect(run.errorLines.first?.contains(says.replacingOccurrences(of: "{dir}", with: dir)) == true, "\(run.stderr)")
        #expect(!run.stdout.contains("connecting"), "a device was touched: \(run.stdout)")
        #expect(!run.stdout.contains("\"event\":\"summary\""))
    }

    @Test func simulateChecksItsStoreBeforeServing() async throws {
        let scratch = try Scratch()
        let file = try scratch.file("file", "x")
        let run = await otaflash(["simulate", "--store", file])
        #expect(run.code == 2)
        #expect(run.errorLines == ["otaflash: error: --store \(file) is a file, not a directory"])
    }

    /// A device log that cannot be written (here: a full disk) is one warning; the flash goes on.
    @Test func aLogThatCannotBeWrittenIsOneWarningAndTheBatchGoesOn() async throws {
        let scratch = try Scratch()
        let logs = scratch.url.appendingPathComponent("logs")
        try FileManager.default.createDirectory(at: logs, withIntermediateDirectories: true)
        try FileManager.default.createSymbolicLink(atPath: logs.appendingPathComponent("C0FFEE000001.jsonl").path,
                                                   withDestinationPath: try fullDevice())
        let run = await otaflash(simulator + ["--count", "2", "--json", "--log-dir", logs.path, samplePath("seeded-4k.bin")])
        #expect(run.code == 0, "\(run.stderr)")
        let warnings = run.stderr.split(separator: "\n").filter { $0.hasPrefix("otaflash: warning:") }
        #expect(warnings.count == 1, "\(run.stderr)")
        #expect(warnings.first?.contains("C0FFEE000001.jsonl: No space left on device") == true, "\(run.stderr)")
        #expect(run.jsonEvents.last?["ok"] as? Int == 2)
        let other = try String(contentsOfFile: logs.appendingPathComponent("C0FFEE000002.jsonl").path, encoding: .utf8)
        #expect(other.contains("\"event\":\"done\""))
    }

    /// Ctrl-C (or SIGTERM) in a batch: every device stops after its current write, each reports,
    /// the summary is the last line, and the run exits 130.
    @Test(arguments: [SIGINT, SIGTERM])
    func aSignalStopsTheBatchWithExit130(signal: Int32) throws {
        let child = try Child(["--simulator", "--count", "3", "--json", samplePath("seeded-1m.bin")])
        #expect(child.waitForLine { $0.contains("\"event\":\"progress\"") } != nil)
        kill(child.process.processIdentifier, signal)
        let (stdout, exit) = child.finish()
        #expect(!exit.signalled)
        #expect(exit.status == 130, "\(exit.stderr)")
        let lines = stdout.split(separator: "\n")
        let summary = try #require(lines.last.flatMap { try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any] })
        #expect(summary["event"] as? String == "summary", "\(stdout.suffix(500))")
        #expect(summary["exit_code"] as? Int == 130)
        #expect(lines.filter { $0.contains("\"event\":\"done\"") }.count == 3)
        let errors = exit.stderr.split(separator: "\n").filter { $0.hasPrefix("otaflash: error:") }
        #expect(errors.count == 1 && errors.first?.contains("interrupted") == true, "\(exit.stderr)")
    }

    /// On a terminal, several devices share a view redrawn in place: one line per device, no scroll.
    @Test func onATerminalEachDeviceHasOneLiveLine() async throws {
        let output = CapturedOutput(isTerminal: true, terminalSize: (100, 40))
        let code = await runOtaflash(simulator + ["--count", "4", "--retries", "0", "--sim-device-fault", "3:small-slot",
                                                  samplePath("seeded-256k.bin")], output: output)
        #expect(code == 14)
        #expect(output.stderr.contains("\u{1B}[2K"))
        let screen = Terminal.render(output.stderr)
        // The view: a header and one line per device with its result, then the failure with its full reason.
        let header = try #require(screen.firstIndex { $0.hasPrefix("4 devices:") }, "\(screen)")
        #expect(screen[header] == "4 devices: 3 ok, 0 skipped, 1 failed")
        let rows = Array(screen[(header + 1)...].prefix(4))
        #expect(rows.map { String($0.prefix(17)) } == (1...4).map { "C0:FF:EE:00:00:0\($0)" })
        #expect(rows.filter { $0.hasSuffix("  ok") }.count == 3, "\(rows)")
        #expect(rows[2].contains("FAILED:"))
        #expect(screen.contains { $0.hasPrefix("C0:FF:EE:00:00:03 failed: ") && $0.contains("1024") }, "\(screen)")
        // No per-event lines scrolled by.
        #expect(!screen.contains { $0.contains("connecting to") })
        #expect(screen.count < 12, "\(screen)")
    }

    /// A reason too long for the table's column is cut there, marked, and given whole below the
    /// table, on stdout with it.
    @Test func theTableGivesAFailuresWholeReasonBelowIt() async throws {
        let run = await otaflash(simulator + ["--count", "3", "--retries", "0", "--sim-device-fault", "2:small-slot", samplePath("seeded-256k.bin")])
        #expect(run.code == 14)
        let prefix = "C0:FF:EE:00:00:02 failed: "
        let note = try #require(run.stderr.split(separator: "\n").first { $0.hasPrefix(prefix) }, "\(run.stderr)")
        let reason = note.dropFirst(prefix.count)
        #expect(reason.count > 60, "a reason that fits its column: \(reason)")
        let lines = run.stdout.split(separator: "\n").map(String.init)
        let row = try #require(lines.first { $0.hasPrefix("C0:FF:EE:00:00:02") }, "\(run.stdout)")
        #expect(row.contains("FAILED: ") && row.contains(" … [1]"), "\(row)")
        #expect(lines.last == "[1] FAILED: \(reason)", "\(run.stdout)")
    }

    /// Off a terminal, human mode stays one line per event, each naming its device.
    @Test func offATerminalEventsAreLinesNamingTheirDevice() async {
        let run = await otaflash(simulator + ["--count", "2", samplePath("seeded-4k.bin")])
        #expect(run.code == 0)
        #expect(!run.stderr.contains("\u{1B}["))
        #expect(run.stderr.contains("C0:FF:EE:00:00:02: connecting to C0:FF:EE:00:00:02"))
    }
}

/// Plays terminal output back the way a terminal shows it: `\r`, `\n`, and the ANSI sequences
/// the live view uses (cursor up `ESC[nA`, erase line `ESC[2K` / `ESC[K`, erase below `ESC[J`).
enum Terminal {
    static func render(_ text: String) -> [String] {
        var lines: [[Character]] = [[]]
        var row = 0, column = 0
        var chars = Array(text)[...]
        func put(_ c: Character) {
            while lines[row].count < column { lines[row].append(" ") }
            if column < lines[row].count { lines[row][column] = c } else { lines[row].append(c) }
            column += 1
        }
        while let c = chars.popFirst() {
            switch c {
            case "\r": column = 0
            case "\n":
                row += 1
                column = 0
                if row == lines.count { lines.append([]) }
            case "\u{1B}":
                guard chars.first == "[" else { continue }
                chars.removeFirst()
                var number = ""
                while let d = chars.first, d.isNumber { number.append(d); chars.removeFirst() }
                let command = chars.popFirst()
                switch command {
                case "A": row = max(0, row - (Int(number) ?? 1))
                case "K" where number == "2": lines[row] = []
                case "K": lines[row].removeSubrange(min(column, lines[row].count)...)
                case "J":
                    lines[row].removeSubrange(min(column, lines[row].count)...)
                    lines.removeSubrange((row + 1)...)
                default: Issue.record("unexpected escape sequence ESC[\(number)\(command.map(String.init) ?? "")")
                }
            default: put(c)
            }
        }
        return lines.map { String($0) }.filter { !$0.isEmpty }
    }
}

/// Batches of Secure DFU devices: bootloaders, and applications moved into theirs (buttonless).
@Suite("otaflash batch, Nordic Secure DFU")
struct NordicBatchTests {
    static func package(_ name: String) -> String { samplePath("nordic/\(name)") }

    @Test func threeBootloadersAreFlashedFromOnePackage() async throws {
        let run = await otaflash(simulator + ["--count", "3", "--json", Self.package("blinky-app.zip")])
        #expect(run.code == 0, "\(run.stderr)")
        let events = expectDocumentedLines(run.stdoutLines, section: "otaflash flash")
        #expect(events.first?["protocol"] == .string("nordic-dfu"))
        let done = events.filter { $0["event"] == .string("done") }
        #expect(done.count == 3)
        #expect(done.allSatisfy { $0["result"] == .string("ok") && $0["bootloader"] == .null })
        #expect(events.last?["ok"] == .int(3))
    }

    /// Each application is moved into its bootloader at its address + 1; the rows, the JSON and
    /// the report show both addresses, and every event of a device carries the address it was given.
    @Test func buttonlessDevicesShowBothAddressesInTheirRowsAndReport() async throws {
        let scratch = try Scratch()
        let report = scratch.url.appendingPathComponent("report.csv").path
        let logs = scratch.url.appendingPathComponent("logs").path
        let run = await otaflash(simulator + ["--count", "2", "--sim-buttonless", "unbonded", "--json", "--report", report,
                                              "--log-dir", logs, Self.package("blinky-sd-bl-app.zip")])
        #expect(run.code == 0, "\(run.stderr)")
        let events = expectDocumentedLines(run.stdoutLines, section: "otaflash flash")
        let done = Dictionary(uniqueKeysWithValues: events.filter { $0["event"] == .string("done") }.compactMap { d in
            d["device"]?.string.map { ($0, d) }
        })
        #expect(done["C0:FF:EE:00:00:01"]?["bootloader"] == .string("C0:FF:EE:00:00:02"))
        #expect(done["C0:FF:EE:00:00:02"]?["bootloader"] == .string("C0:FF:EE:00:00:03"))
        #expect(done.values.allSatisfy { $0["result"] == .string("ok") })
        let sessionDevices = Set(events.filter { $0["event"] == .string("connecting") }.compactMap { $0["device"]?.string })
        #expect(sessionDevices == ["C0:FF:EE:00:00:01", "C0:FF:EE:00:00:02"])
        let csv = try String(contentsOfFile: report, encoding: .utf8).split(separator: "\n").map(String.init)
        #expect(csv.first?.contains(",bootloader,") == true)
        #expect(csv.contains { $0.contains(",C0:FF:EE:00:00:01,C0:FF:EE:00:00:02,") && $0.contains(",ok,") }, "\(csv)")
        #expect(csv.contains { $0.contains(",C0:FF:EE:00:00:02,C0:FF:EE:00:00:03,") })
        let logFiles = try FileManager.default.contentsOfDirectory(atPath: logs).sorted()
        #expect(logFiles == ["C0FFEE000001.jsonl", "C0FFEE000002.jsonl"])

        let human = await otaflash(simulator + ["--count", "2", "--sim-buttonless", "unbonded", Self.package("blinky-app.zip")])
        #expect(human.code == 0, "\(human.stderr)")
        #expect(human.stdout.contains("bootloader"), "\(human.stdout)")
        #expect(human.stdout.contains("C0:FF:EE:00:00:03"), "\(human.stdout)")
    }

    /// A device whose bootloader never comes back fails on its own; a device without the service
    /// is refused; the others end ok. The batch exits 14.
    @Test func aMixedSecureDFUBatchReportsEachFailure() async throws {
        let run = await otaflash(simulator + ["--count", "3", "--json", "--retries", "0", "--reconnect-window", "1",
                                              "--sim-device-fault", "2:no-ota-service", "--sim-device-fault", "3:gone",
                                              Self.package("blinky-sd-bl-app.zip")])
        #expect(run.code == 14, "\(run.stderr)")
        let done = Dictionary(uniqueKeysWithValues: run.jsonEvents.filter { $0["event"] as? String == "done" }
            .map { ($0["device"] as? String ?? "", $0) })
        #expect(done["C0:FF:EE:00:00:01"]?["result"] as? String == "ok")
        #expect(done["C0:FF:EE:00:00:02"]?["error"] as? String == "incompatible_device")
        #expect(done["C0:FF:EE:00:00:03"]?["error"] as? String == "connection")
    }

    /// Without a reconnect window, a lost link ends the attempt; the retry resumes the package's
    /// first image (26,624 bytes) where the bootloader stands, then sends the application.
    @Test func aRetryResumesThePackageWhereTheLinkWasLost() async throws {
        let run = await otaflash(simulator + ["--count", "2", "--json", "--retries", "1", "--reconnect-window", "0",
                                              "--sim-disconnect-at", "10000", Self.package("blinky-sd-bl-app.zip")])
        #expect(run.code == 0, "\(run.stderr)")
        let done = run.jsonEvents.filter { $0["event"] as? String == "done" }
        #expect(done.count == 2)
        for device in done {
            #expect(device["result"] as? String == "ok")
            #expect(device["attempts"] as? Int == 2)
            #expect(device["bytes"] as? Int == 26624 + 236)
            // The retry's own sending: the rest of the first image and the second, not all of it again.
            let sent = try #require(device["bytes_sent"] as? Int)
            #expect(sent < 26624 - 4096 + 236)
        }
    }
}
