import Foundation
import Ledger
import Testing
import TestSupport

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// A claim of this station whose run has ended is taken over at once (docs/LEDGER.md, "Claims"):
/// the built `otaflash`, killed with SIGKILL mid-transfer and run again, flashes the device at
/// once though the killed run's claim has a long lease; a claim another live run of this station
/// holds is refused with words that say so.
@Suite("Claims of this station's ended runs")
struct ClaimTakeoverTests {
    /// The lease of the claims: far longer than the test, so only a takeover lets the rerun flash.
    static let lease = "600"

    func command(_ binary: URL, state: String, ledger: String) -> [String] {
        ["/usr/bin/env", "XDG_STATE_HOME=\(state)", binary.path, "--simulator", "--sim-time", "real", "--json",
         "--ledger", ledger, "--station", "bench-1", "--claim-lease", Self.lease, samplePath("seeded-1m.bin")]
    }

    /// A run that is flashing (its transfer under way), and where it keeps things.
    struct Flashing {
        let scratch: Scratch
        let binary: URL
        let ledger: String
        let state: String
        let stderr: String
        let process: SpawnedProcess

        init(_ test: ClaimTakeoverTests) throws {
            binary = try #require(ExecutableTests.executable, "the otaflash executable is not built next to the tests; run `swift build` first")
            scratch = try Scratch()
            ledger = scratch.url.appendingPathComponent("l.sqlite").path
            state = scratch.url.appendingPathComponent("state").path
            stderr = scratch.url.appendingPathComponent("stderr").path
            process = try SpawnedProcess.spawn(test.command(binary, state: state, ledger: ledger), stderrPath: stderr)
            let transfer = process.waitForLine(timeoutMilliseconds: 60_000) { $0.contains(#""event":"progress""#) }
            if transfer == nil { process.stop() }
            try #require(transfer != nil, "no progress within 60 s: \(SignalTests.text(stderr))")
        }
    }

    @Test(.timeLimit(.minutes(3)))
    func aFlashKilledWithSIGKILLAndRunAgainIsFlashedAtOnce() async throws {
        let run = try Flashing(self)
        let (first, binary, ledger, state, stderr) = (run.process, run.binary, run.ledger, run.state, run.stderr)
        defer { first.stop() }
        kill(first.pid, SIGKILL)
        _ = first.remainingLines(timeoutMilliseconds: 10_000)
        _ = first.waitForExit()
        let claims = try await SQLiteLedger(path: ledger).claims()
        #expect(claims.count == 1 && claims.first?.state == .held && claims.first?.station == "bench-1", "\(claims)")

        // The same command again, at once: the claim is taken over, the device flashed.
        let began = monotonicMilliseconds()
        let again = try SpawnedProcess.spawn(command(binary, state: state, ledger: ledger), stderrPath: stderr)
        defer { again.stop() }
        let lines = try #require(again.remainingLines(timeoutMilliseconds: 120_000), "the rerun did not end within 120 s")
        let status = again.waitForExit()
        let seconds = Double(monotonicMilliseconds() - began) / 1000
        print("kill -9, then the same command: exit \(exitCode(ofWaitStatus: status) ?? -1) after \(String(format: "%.1f", seconds)) s (lease \(Self.lease) s)")
        #expect(exitCode(ofWaitStatus: status) == 0, "\(SignalTests.text(stderr))")
        let events = lines.compactMap { (try? JSONSerialization.jsonObject(with: Data($0.utf8))) as? [String: Any] }
        #expect(events.contains { ($0["message"] as? String)?.contains("took over its claim from an earlier run on this station") == true },
                "\(lines)")
        #expect(events.last?["event"] as? String == "done" && events.last?["result"] as? String == "ok")
        #expect(seconds < 120)
        let after = try await SQLiteLedger(path: ledger).claims()
        #expect(after.first?.state == .done)
    }

    @Test(.timeLimit(.minutes(3)))
    func aClaimAnotherLiveRunOfThisStationHoldsIsRefusedWithWordsThatSaySo() async throws {
        let run = try Flashing(self)
        let (first, binary, ledger, state) = (run.process, run.binary, run.ledger, run.state)
        defer { first.stop() }
        let secondErr = run.scratch.url.appendingPathComponent("stderr2").path
        let second = try SpawnedProcess.spawn(command(binary, state: state, ledger: ledger), stderrPath: secondErr)
        defer { second.stop() }
        let lines = try #require(second.remainingLines(timeoutMilliseconds: 60_000), "the second run did not end within 60 s")
        let status = second.waitForExit()
        #expect(exitCode(ofWaitStatus: status) == 20, "\(SignalTests.text(secondErr))")
        let done = lines.compactMap { (try? JSONSerialization.jsonObject(with: Data($0.utf8))) as? [String: Any] }.last
        let message = done?["message"] as? String ?? ""
        #expect(message.contains("another otaflash run on this station (process \(first.pid)) holds its claim"), "\(message)")
    }
}
