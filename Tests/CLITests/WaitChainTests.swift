import Foundation
import Testing

// Every failure ends within a minute by default, a slow slot erase still passes, and a lost
// answer to the command that activates the image ends in what the device's next state shows:
// `otaflash flash --simulator` on virtual time, its `done` event's seconds read.

private let app = repositoryRoot.appendingPathComponent("firmware-samples/nordic/blinky-app.zip").path
private let mcuboot = repositoryRoot.appendingPathComponent("firmware-samples/mcuboot/blinky-ec256-v1.3.0.bin").path

@Suite("otaflash flash, wait chains and the lost last answer")
struct WaitChainTests {
    struct Ending {
        var code: Int32
        var seconds: Double
        var error: String?
        var stderr: String
        var notices: [String]
    }

    func flash(_ arguments: [String]) async throws -> Ending {
        let run = await otaflash(simulator + ["--json"] + arguments)
        let events = expectDocumentedLines(run.stdoutLines, section: "otaflash flash")
        let done = try #require(events.last)
        guard case .double(let seconds)? = done["seconds"] else {
            Issue.record("no seconds in \(run.stdout)")
            return Ending(code: run.code, seconds: .infinity, error: nil, stderr: run.stderr, notices: [])
        }
        let notices = events.filter { $0["event"] == .string("note") }.compactMap { $0["message"]?.string }
        return Ending(code: run.code, seconds: seconds, error: done["error"]?.string, stderr: run.stderr, notices: notices)
    }

    /// Before: 83.5 s (three connect timeouts per attempt, attempts started until 60 s after the
    /// first failed one). Now the reconnect window bounds the attempts themselves.
    @Test func aBootloaderThatNeverAppearsEndsWithinAMinute() async throws {
        let end = try await flash(["--sim-buttonless", "lost", app])
        #expect(end.code == 6, "\(end.stderr)")
        #expect(end.seconds >= 55 && end.seconds <= 61, "\(end.seconds)")
        #expect(end.stderr.contains("gave up reconnecting"), "\(end.stderr)")
    }

    /// Before: 224.6 s (40 s per first-request try, four tries, then reconnects). Now: one
    /// re-ask after the reply timeout, the erase allowance, and no reconnect to a device that
    /// kept the link and answered nothing.
    @Test func anSMPDeviceThatStopsAnsweringAtTheFirstRequestEndsWithinAMinute() async throws {
        let end = try await flash(["--sim-stop-answering-at", "100", mcuboot])
        #expect(end.code == 10, "\(end.stderr)")
        #expect(end.seconds <= 60, "\(end.seconds)")
        #expect(end.stderr.contains("kept the link but did not answer the first upload request in 50 s"), "\(end.stderr)")
    }

    /// A 40 s erase (a 1 MiB slot on an nRF52840) is a busy device, not a gone one: it passes.
    @Test(arguments: [20.0, 40.0])
    func aSlotEraseOfUpToFortySecondsPasses(seconds erase: Double) async throws {
        let end = try await flash(["--sim-smp-erase-seconds", String(erase), mcuboot])
        #expect(end.code == 0, "\(end.stderr)")
        #expect(end.seconds >= erase, "\(end.seconds)")
        #expect(end.notices.contains { $0.contains("has not answered the first upload request in 5 s") }, "\(end.notices)")
    }

    /// An erase longer than the allowance ends as the hung device does, and --reply-timeout asks for more.
    @Test func anEraseLongerThanTheAllowanceFailsAndAReplyTimeoutAsksForMore() async throws {
        let long = try await flash(["--sim-smp-erase-seconds", "55", mcuboot])
        #expect(long.code == 10, "\(long.stderr)")
        let allowed = try await flash(["--sim-smp-erase-seconds", "55", "--reply-timeout", "60", mcuboot])
        #expect(allowed.code == 0, "\(allowed.stderr)")
    }

    /// nRF5 SDK: the bootloader's disconnect overtakes the last EXECUTE's answer. The application
    /// at its own address shows it activated the image.
    @Test func aLostLastExecuteAnswerIsConfirmedByTheApplication() async throws {
        let end = try await flash(["--sim-buttonless", "unbonded", "--sim-lose-final-answer", app])
        #expect(end.code == 0, "\(end.stderr)")
        #expect(end.notices.contains { $0.contains("the device runs its application again: the image was activated") }, "\(end.notices)")
        #expect(end.seconds <= 30, "\(end.seconds)")
    }

    /// A device given in its bootloader: where its application runs is not known, and the
    /// bootloader that comes back at the address is no confirmation: sent and executed, not confirmed.
    @Test func aLostLastExecuteAnswerWithNothingToConfirmItIsNotConfirmed() async throws {
        let end = try await flash(["--sim-lose-final-answer", app])
        #expect(end.code == 21, "\(end.stderr)")
        #expect(end.error == "not_confirmed")
        // The bootloader the simulator brings back at its address holds no init packet: it ran the EXECUTE.
        #expect(end.stderr.contains("during the last EXECUTE and the bootloader has since ended the transfer"), "\(end.stderr)")
        #expect(end.seconds <= 60, "\(end.seconds)")
    }

    /// SMP: the reset's answer lost; the image list after the reset confirms the swap.
    @Test func aLostResetAnswerIsConfirmedByTheImageList() async throws {
        let end = try await flash(["--sim-lose-final-answer", mcuboot])
        #expect(end.code == 0, "\(end.stderr)")
        let human = await otaflash(simulator + ["--sim-lose-final-answer", mcuboot])
        #expect(human.code == 0, "\(human.stderr)")
        #expect(human.stdout.contains("now runs 1.3.0: slot 0 1.3.0 active"), "\(human.stdout)")
    }
}

@Suite("otaflash flash, the lost ACTIVATE reply on a native device")
struct NativeLostFinalAnswerTests {
    /// The native device reports its running image's CRC: the next connection confirms it.
    @Test func aLostActivateReplyIsConfirmedByTheRunningImagesCRC() async throws {
        let run = await otaflash(simulator + ["--json", "--sim-lose-final-answer", samplePath("seeded-4k.bin")])
        #expect(run.code == 0, "\(run.stderr)")
        let done = try #require(expectDocumentedLines(run.stdoutLines, section: "otaflash flash").last)
        #expect(done["result"] == .string("ok"))
        #expect(done["activated"] == .bool(true))
    }
}
