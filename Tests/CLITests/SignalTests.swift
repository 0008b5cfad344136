import Foundation
import TestSupport
import Testing

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// Ctrl-C (SIGINT) or SIGTERM in the middle of a transfer: the built `otaflash` stops after the
/// current write, says how much the device confirmed, and exits 130 (README, "Exit codes").
@Suite("otaflash on SIGINT and SIGTERM")
struct SignalTests {
    /// How long otaflash may take from the signal to its exit: one write and the closing lines.
    static let exitBoundMilliseconds: Int32 = 5_000

    struct Ending {
        let status: Int32
        let events: [[String: Any]]
        let stderr: String
        let milliseconds: Int64
    }

    /// Runs a real-time simulated 1 MiB update, sends `signal` once the transfer is under way,
    /// and collects how the process ended.
    func interrupt(with signal: Int32, _ arguments: [String] = [samplePath("seeded-1m.bin")]) throws -> Ending {
        let binary = try #require(ExecutableTests.executable, "the otaflash executable is not built next to the tests; run `swift build` first")
        let scratch = try Scratch()
        let stderrPath = scratch.url.appendingPathComponent("stderr").path
        let child = try SpawnedProcess.spawn([binary.path, "--simulator", "--sim-time", "real", "--json"] + arguments, stderrPath: stderrPath)
        defer { child.stop() }
        // The first event of the transfer itself (real time: the whole update takes seconds).
        let started = child.waitForLine(timeoutMilliseconds: 30_000) {
            $0.contains(#""event":"transfer""#) || $0.contains(#""event":"progress""#)
        }
        try #require(started != nil, "no transfer event within 30 s: \(Self.text(stderrPath))")
        let sentAt = monotonicMilliseconds()
        kill(child.pid, signal)
        let rest = try #require(child.remainingLines(timeoutMilliseconds: Self.exitBoundMilliseconds),
                                "otaflash was still running \(Self.exitBoundMilliseconds) ms after the signal")
        let status = child.waitForExit()
        let events = rest.compactMap { (try? JSONSerialization.jsonObject(with: Data($0.utf8))) as? [String: Any] }
        return Ending(status: status, events: events, stderr: Self.text(stderrPath),
                      milliseconds: monotonicMilliseconds() - sentAt)
    }

    static func text(_ path: String) -> String {
        (try? String(contentsOfFile: path, encoding: .utf8)) ?? ""
    }

    /// SIGHUP is a closed SSH session: it stops the flash as cleanly as Ctrl-C, with a done line.
    @Test(arguments: [SIGINT, SIGTERM, SIGHUP])
    func aSignalMidTransferExits130WithOneInterruptedLine(signal: Int32) throws {
        let ending = try interrupt(with: signal)
        print("signal \(signal): exit status \(ending.status >> 8) \(ending.milliseconds) ms after the signal")
        #expect(terminatingSignal(ofWaitStatus: ending.status) == nil, "otaflash died of signal \(ending.status & 0x7f)")
        #expect(exitCode(ofWaitStatus: ending.status) == 130, "\(ending.stderr)")
        #expect(ending.milliseconds < Int64(Self.exitBoundMilliseconds))

        // One error line on stderr: interrupted, with what the device keeps and how to go on.
        let errors = ending.stderr.split(separator: "\n").filter { $0.hasPrefix("otaflash: error:") }
        #expect(errors.count == 1, "\(ending.stderr)")
        let line = String(errors.first ?? "")
        #expect(line.hasPrefix("otaflash: error: interrupted with "), "\(line)")
        #expect(line.contains("of 1048576 bytes confirmed by C0:FF:EE:00:00:01"), "\(line)")
        #expect(line.hasSuffix("run the same command again to resume"), "\(line)")

        // The last JSON line says the same.
        let done = try #require(ending.events.last)
        #expect(done["event"] as? String == "done")
        #expect(done["result"] as? String == "error")
        #expect(done["error"] as? String == "interrupted")
        #expect(done["exit_code"] as? Int == 130)
    }

    /// Espressif's BLE OTA cannot resume (one START per boot): its interrupted line asks for the
    /// reset first, and promises no resume.
    @Test(arguments: [SIGHUP, SIGINT])
    func anInterruptedESPUpdateSaysResetTheDeviceThenRunAgain(signal: Int32) throws {
        // 150 ms of flash per KiB: the 24,944-byte sample takes about 4 s.
        let ending = try interrupt(with: signal, ["--sim-slow-flash-ms", "150", samplePath("esp32/blink-esp32.bin")])
        #expect(exitCode(ofWaitStatus: ending.status) == 130, "\(ending.stderr)")
        let errors = ending.stderr.split(separator: "\n").filter { $0.hasPrefix("otaflash: error:") }
        #expect(errors.count == 1, "\(ending.stderr)")
        let line = String(errors.first ?? "")
        #expect(line.hasPrefix("otaflash: error: interrupted with "), "\(line)")
        #expect(line.hasSuffix("the esp-ota protocol cannot resume: reset the device (power cycle, or its reset button), then run the same command again"), "\(line)")
        #expect(!line.contains("to resume"), "\(line)")
    }
}
