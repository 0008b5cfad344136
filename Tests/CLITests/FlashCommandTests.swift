import Foundation
import OTAFlashCLI
import Testing

@Suite("otaflash flash")
struct FlashCommandTests {
    /// With --json every stdout line is an event object, and the last one reports the image's CRC.
    @Test(arguments: Samples.entries)
    func jsonLinesEndWithDoneOkAndTheManifestCRC(entry: Samples.Entry) async throws {
        let run = await otaflash(simulator + ["--json", samplePath(entry.file)])
        #expect(run.code == 0, "\(run.stderr)")
        let events = run.jsonEvents
        #expect(events.count == run.stdoutLines.count)
        #expect(events.allSatisfy { $0["event"] is String })
        let done = try #require(events.last)
        #expect(done["event"] as? String == "done")
        #expect(done["result"] as? String == "ok")
        let crc = try #require(done["crc32"] as? String)
        #expect(crc == entry.crc32)
        #expect(crc.count == 8 && crc.allSatisfy { "0123456789abcdef".contains($0) })
        #expect(done["bytes"] as? Int == entry.size)
        #expect(events.first?["event"] as? String == "start")
        #expect(run.errorLines.isEmpty)
    }

    @Test func jsonReportsEachPhaseInOrder() async throws {
        let run = await otaflash(simulator + ["--json", samplePath("seeded-256k.bin")])
        let names = run.jsonEvents.compactMap { $0["event"] as? String }
        let order = ["start", "transfer", "verify", "activate", "done"]
        let positions = order.map { names.firstIndex(of: $0) }
        #expect(positions.allSatisfy { $0 != nil }, "\(names)")
        #expect(positions.compactMap { $0 } == positions.compactMap { $0 }.sorted())
        #expect(names.contains("progress"))
    }

    /// `flash` is the default subcommand: naming it changes nothing.
    @Test func flashSubcommandAndTheDefaultCommandBehaveTheSame() async {
        let args = simulator + ["--json", "--sim-seed", "5", "--sim-drop-rate", "0.01", samplePath("seeded-4k.bin")]
        let implicit = await otaflash(args)
        let explicit = await otaflash(["flash"] + args)
        #expect(implicit.code == 0)
        #expect(explicit.code == implicit.code)
        #expect(explicit.stdout == implicit.stdout)
        #expect(!implicit.stdout.isEmpty)
    }

    @Test func quietPrintsNothingOnSuccess() async {
        let run = await otaflash(simulator + ["--quiet", samplePath("blinky-cortex-m4.hex")])
        #expect(run.code == 0)
        #expect(run.stdout.isEmpty)
        #expect(run.stderr.isEmpty)
    }

    @Test func humanModePrintsTheResultOnStdout() async {
        let run = await otaflash(simulator + [samplePath("seeded-4k.bin")])
        #expect(run.code == 0)
        #expect(run.stdout.contains("a1206a16"))
        #expect(run.stdout.contains("activated"))
    }

    @Test func faultsOnTheCommandLineStillFlashTheImage() async throws {
        let run = await otaflash(simulator + ["--json", "--sim-drop-rate", "0.02", "--sim-corrupt-at", "5000",
                                              "--sim-gatt-error-rate", "0.05", samplePath("seeded-256k.hex")])
        #expect(run.code == 0, "\(run.stderr)")
        let done = try #require(run.jsonEvents.last)
        #expect(done["crc32"] as? String == "cf1fc040")
        #expect((done["bytes_resent"] as? Int ?? 0) > 0)
    }

    /// A device that already runs the version is left alone, and the run says so.
    @Test func skipIfVersionOnOneDeviceSaysItSkipped() async throws {
        let json = await otaflash(simulator + ["--json", "--skip-if-version", "1.0.0", samplePath("seeded-4k.bin")])
        #expect(json.code == 0, "\(json.stderr)")
        let done = try #require(json.jsonEvents.last)
        #expect(done["event"] as? String == "done")
        #expect(done["result"] as? String == "skipped")
        #expect(done["activated"] as? Bool == false)
        #expect(!json.stdout.contains("\"event\":\"transfer\""))

        let human = await otaflash(simulator + ["--skip-if-version", "1.0.0", samplePath("seeded-4k.bin")])
        #expect(human.code == 0)
        #expect(human.stdout.contains("skipped, it already runs 1.0.0"), "\(human.stdout)")
        #expect(!human.stdout.contains("verified"))

        // Another version on the device: flashed as usual.
        let other = await otaflash(simulator + ["--json", "--skip-if-version", "2.0.0", samplePath("seeded-4k.bin")])
        #expect(other.jsonEvents.last?["result"] as? String == "ok")
    }

    @Test func noActivateStopsAfterVerify() async throws {
        let run = await otaflash(simulator + ["--json", "--no-activate", samplePath("seeded-4k.bin")])
        #expect(run.code == 0)
        let names = run.jsonEvents.compactMap { $0["event"] as? String }
        #expect(!names.contains("activate"))
        #expect(run.jsonEvents.last?["activated"] as? Bool == false)
    }
}

@Suite("otaflash errors")
struct ErrorTests {
    struct BadInput: Sendable, CustomTestStringConvertible {
        let name: String
        /// Arguments; `{dir}` is replaced with a scratch directory holding `bad.hex`, `empty.bin` and
        /// `truncated-mcuboot.bin`.
        let arguments: [String]
        let code: Int32
        /// Text the error line must contain.
        let says: String
        var testDescription: String { name }
    }

    static let badInputs: [BadInput] = [
        BadInput(name: "missing file", arguments: simulator + ["{dir}/nope.bin"], code: 3, says: "no such file"),
        BadInput(name: "empty file", arguments: simulator + ["{dir}/empty.bin"], code: 3, says: "empty"),
        BadInput(name: "directory", arguments: simulator + ["{dir}"], code: 3, says: "directory"),
        BadInput(name: "malformed HEX", arguments: simulator + ["{dir}/bad.hex"], code: 3, says: "bad.hex:2:"),
        BadInput(name: "image larger than the slot", arguments: simulator + ["--sim-slot-size", "4095", samplePath("seeded-4k.bin")], code: 4, says: "4096"),
        BadInput(name: "invalid address", arguments: simulator + ["--device", "AA:BB:CC", samplePath("seeded-4k.bin")], code: 2, says: "AA:BB:CC"),
        BadInput(name: "unknown option", arguments: simulator + ["--frobnicate", samplePath("seeded-4k.bin")], code: 2, says: "frobnicate"),
        BadInput(name: "json and quiet", arguments: simulator + ["--json", "--quiet", samplePath("seeded-4k.bin")], code: 2, says: "--quiet"),
        BadInput(name: "MTU out of range", arguments: simulator + ["--sim-mtu", "22", samplePath("seeded-4k.bin")], code: 2, says: "--sim-mtu"),
        BadInput(name: "no OTA service", arguments: simulator + ["--sim-no-ota-service", samplePath("seeded-4k.bin")], code: 7, says: "OTA"),
        BadInput(name: "data without write-without-response", arguments: simulator + ["--sim-data-without-write-without-response", samplePath("seeded-4k.bin")], code: 7, says: "write-without-response"),
        // MCUboot images go over MCUmgr/SMP; a damaged one is refused before any radio time.
        BadInput(name: "MCUboot image cut short", arguments: simulator + ["{dir}/truncated-mcuboot.bin"], code: 3, says: "truncated-mcuboot.bin"),
        BadInput(name: "flash bit flip", arguments: simulator + ["--sim-flash-bitflip-at", "1000", samplePath("seeded-4k.bin")], code: 8, says: "verify"),
        // "--device" through BlueZ with no bluetoothd is covered in BlueZTests (CentralTests), which
        // owns the process-wide OTAFLASH_DBUS_ADDRESS; running it here, in parallel with those
        // tests, would reach their fake bluetoothd.
    ]

    /// Every failure prints exactly one `otaflash: error:` line and exits with its documented code.
    @Test(arguments: badInputs)
    func badInputGivesOneErrorLineAndItsExitCode(input: BadInput) async throws {
        let scratch = try Scratch()
        _ = try scratch.file("bad.hex", ":0400000001020304F2\n:04000400GG060708E2\n:00000001FF\n")
        _ = try scratch.file("empty.bin", "")
        // An imgtool image with its last 100 bytes (TLVs) cut off.
        let mcuboot = try Data(contentsOf: URL(fileURLWithPath: samplePath("mcuboot/blinky-ec256-v1.2.3+4.bin")))
        try mcuboot.dropLast(100).write(to: scratch.url.appendingPathComponent("truncated-mcuboot.bin"))
        let args = input.arguments.map { $0.replacingOccurrences(of: "{dir}", with: scratch.url.path) }
        let run = await otaflash(args)
        #expect(run.code == input.code, "\(input.name): \(run.stderr)")
        #expect(run.errorLines.count == 1, "\(input.name): \(run.stderr)")
        #expect(run.errorLines.first?.contains(input.says) == true, "\(input.name): \(run.stderr)")
    }

    @Test func jsonModeEndsAFailureWithADoneErrorEvent() async throws {
        let run = await otaflash(simulator + ["--json", "--sim-flash-bitflip-at", "10", samplePath("seeded-4k.bin")])
        #expect(run.code == 8)
        let done = try #require(run.jsonEvents.last)
        #expect(done["event"] as? String == "done")
        #expect(done["result"] as? String == "error")
        #expect(done["exit_code"] as? Int == 8)
        #expect(done["error"] as? String == "verify_failed")
        #expect(run.errorLines.count == 1)
    }

    @Test func exitCodeNamesAreSnakeCase() {
        #expect(ExitCode.verifyFailed.name == "verify_failed")
        #expect(ExitCode.bluetoothUnavailable.name == "bluetooth_unavailable")
        #expect(ExitCode.success.name == "success")
    }
}

/// The built `otaflash` as a child process, for what only a real process shows: signals, closed
/// pipes, full disks. Its stdout is read line by line; a watchdog kills it after `limit`.
final class Child: @unchecked Sendable {
    let process = Process()
    private let out = Pipe()
    private let err = Pipe()
    private var buffer = Data()

    struct Exit {
        let status: Int32
        let signalled: Bool
        let stderr: String
    }

    init(_ arguments: [String], stdout: FileHandle? = nil, limit: Double = 60) throws {
        process.executableURL = try #require(ExecutableTests.executable, "the otaflash executable is not built next to the tests")
        process.arguments = arguments
        process.standardOutput = stdout ?? out
        process.standardError = err
        try process.run()
        let pid = process.processIdentifier
        DispatchQueue.global().asyncAfter(deadline: .now() + limit) { [process] in
            if process.isRunning { kill(pid, SIGKILL) }
        }
    }

    /// The next stdout line `accept` takes, or nil at end of file.
    func waitForLine(_ accept: (String) -> Bool) -> String? {
        while true {
            while let newline = buffer.firstIndex(of: UInt8(ascii: "\n")) {
                let line = String(decoding: buffer[buffer.startIndex..<newline], as: UTF8.self)
                buffer.removeSubrange(buffer.startIndex...newline)
                if accept(line) { return line }
            }
            let chunk = out.fileHandleForReading.availableData
            if chunk.isEmpty { return nil }
            buffer += chunk
        }
    }

    /// Closes the reading end of stdout, as `| head -1` does once it has its line.
    func closeStdout() throws { try out.fileHandleForReading.close() }

    /// The rest of stdout, then the exit.
    func finish() -> (stdout: String, exit: Exit) {
        let rest = (try? out.fileHandleForReading.readToEnd()) ?? nil
        let stderr = (try? err.fileHandleForReading.readToEnd()) ?? nil
        process.waitUntilExit()
        let stdout = String(decoding: buffer + (rest ?? Data()), as: UTF8.self)
        return (stdout, Exit(status: process.terminationStatus, signalled: process.terminationReason == .uncaughtSignal,
                             stderr: String(decoding: stderr ?? Data(), as: UTF8.self)))
    }

    func exit() -> Exit {
        let stderr = (try? err.fileHandleForReading.readToEnd()) ?? nil
        process.waitUntilExit()
        return Exit(status: process.terminationStatus, signalled: process.terminationReason == .uncaughtSignal,
                    stderr: String(decoding: stderr ?? Data(), as: UTF8.self))
    }
}

/// /dev/full, the device whose every write fails with ENOSPC; a test that needs it fails loudly
/// when something replaced it with a plain file (as an atomic write over it as root does).
func fullDevice() throws -> String {
    var info = stat()
    try #require(stat("/dev/full", &info) == 0 && (info.st_mode & S_IFMT) == S_IFCHR,
                 "/dev/full is not the full device; restore it with `mknod -m 666 /dev/full c 1 7`")
    return "/dev/full"
}

/// Output that cannot be written (a closed pipe, a full disk) is a clean stop with exit 16, never a crash.
@Suite("otaflash output failures")
struct OutputFailureTests {
    @Test func aClosedStdoutPipeStopsTheFlashWithExit16() throws {
        let child = try Child(["--simulator", "--json", samplePath("seeded-256k.bin")])
        let first = try #require(child.waitForLine { _ in true })
        #expect(first.contains("\"event\":\"start\""))
        try child.closeStdout()
        let exit = child.exit()
        #expect(!exit.signalled, "otaflash died of a signal: \(exit.stderr)")
        #expect(exit.status == 16, "\(exit.stderr)")
        let errors = exit.stderr.split(separator: "\n").filter { $0.hasPrefix("otaflash: error:") }
        #expect(errors.count == 1, "\(exit.stderr)")
        #expect(errors.first?.contains("cannot write to stdout: Broken pipe") == true, "\(exit.stderr)")
    }

    @Test func aFullDiskUnderStdoutStopsWithExit16() throws {
        let full = try #require(FileHandle(forWritingAtPath: try fullDevice()))
        let child = try Child(simulator + ["--json", samplePath("seeded-4k.bin")], stdout: full)
        let exit = child.exit()
        #expect(!exit.signalled)
        #expect(exit.status == 16, "\(exit.stderr)")
        #expect(exit.stderr.contains("cannot write to stdout: No space left on device"), "\(exit.stderr)")
    }

    /// The report's header is written before any radio time: a full disk stops the run there.
    @Test func aReportOnAFullDiskExits16BeforeAnyRadioTime() async throws {
        let run = await otaflash(simulator + ["--count", "2", "--json", "--report", try fullDevice(), samplePath("seeded-4k.bin")])
        #expect(run.code == 16, "\(run.stderr)")
        #expect(run.errorLines == ["otaflash: error: cannot write the report /dev/full: No space left on device"])
        #expect(!run.jsonEvents.contains { $0["event"] as? String == "progress" })
        let done = try #require(run.jsonEvents.last)
        #expect(done["event"] as? String == "done")
        #expect(done["exit_code"] as? Int == 16)
    }

    /// In process: the sink's stdout fails after its first line; the session is cancelled and the run exits 16.
    @Test func aSinkThatFailsStopsTheSessionCleanly() async {
        let output = CapturedOutput(stdoutFailsAfter: 1)
        let code = await runOtaflash(simulator + ["--json", samplePath("seeded-256k.bin")], output: output)
        #expect(code == 16)
        #expect(output.stdout.split(separator: "\n").count == 1)
        let errors = output.stderr.split(separator: "\n").filter { $0.hasPrefix("otaflash: error:") }
        #expect(errors == ["otaflash: error: cannot write to stdout: Broken pipe; stopped (exit 16)"])
    }
}

/// A device that accepts commands but never confirms data still ends, with its own exit code and
/// a line that says why, within the bound the options give (docs/PRODUCTION.md, "Time limits").
@Suite("otaflash flash: devices that never confirm")
struct NeverConfirmingDeviceTests {
    @Test(arguments: [
        (["--sim-drop-rate", "1"], Int32(10), "no new data in 2.0 s of connected time"),
        (["--sim-corrupt-rate", "1"], Int32(9), "no new data in 64 recoveries in a row"),
        (["--sim-stop-answering-at", "2000"], Int32(10), "no new data in 2.0 s of connected time"),
    ])
    func endsWithItsOwnCodeAndLine(fault: [String], code: Int32, line: String) async throws {
        let run = await otaflash(simulator + fault + ["--stall-timeout", "2", "--reply-timeout", "0.5", "--reconnect-window", "0",
                                                      samplePath("seeded-256k.bin")])
        #expect(run.code == code, "\(run.stderr)")
        #expect(run.errorLines.count == 1, "\(run.stderr)")
        #expect(run.errorLines.first?.contains(line) == true, "\(run.stderr)")
    }

    @Test func theStallTimeoutHasARange() async {
        for value in ["0", "inf", "nan", "-3"] {
            let run = await otaflash(simulator + ["--stall-timeout", value, samplePath("seeded-4k.bin")])
            #expect(run.code == 2)
            #expect(run.stderr.contains("--stall-timeout must be between 0.001 and 86400 seconds"), "\(run.stderr)")
        }
    }
}
