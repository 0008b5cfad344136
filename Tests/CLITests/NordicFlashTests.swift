import Foundation
import Testing

// `otaflash flash` with Nordic Secure DFU packages: `--protocol auto` picks nordic-dfu from the
// file, `--simulator` serves a Secure DFU bootloader, and what cannot be sent is refused with
// one line and its exit code before any radio time.

private func nordicSample(_ name: String) -> String {
    repositoryRoot.appendingPathComponent("firmware-samples/nordic/\(name)").path
}

@Suite("otaflash flash, Nordic Secure DFU")
struct NordicFlashTests {
    @Test func aPackageFlashesIntoTheSimulatedBootloaderAndSaysWhatItPicked() async throws {
        let run = await otaflash(simulator + [nordicSample("blinky-app.zip")])
        #expect(run.code == 0, "\(run.stderr)")
        #expect(run.stderr.contains("picked nordic-dfu: only nordic-dfu sends nordic-dfu-package images"))
        #expect(run.stdout.contains("236 B verified and activated"))
    }

    @Test func theJSONStartEventNamesTheProtocol() async throws {
        let package = await otaflash(simulator + ["--json", nordicSample("blinky-app.zip")])
        #expect(package.code == 0, "\(package.stderr)")
        let events = expectDocumentedLines(package.stdoutLines, section: "otaflash flash")
        #expect(events.first?["protocol"] == .string("nordic-dfu"))
        #expect(events.last?["result"] == .string("ok"))
        let native = await otaflash(simulator + ["--json", samplePath("seeded-4k.bin")])
        #expect(native.jsonEvents.first?["protocol"] as? String == "native")
    }

    /// A link loss mid-object: the shared supervisor reconnects, SELECT reports where the
    /// bootloader stands, and the transfer goes on from there.
    @Test func aLinkLossMidObjectResumesWhereTheBootloaderStands() async throws {
        let run = await otaflash(simulator + ["--json", "--sim-mtu", "23", "--sim-disconnect-at", "100", nordicSample("blinky-app.zip")])
        #expect(run.code == 0, "\(run.stderr)")
        let events = expectDocumentedLines(run.stdoutLines, section: "otaflash flash")
        let names = events.compactMap { $0["event"]?.string }
        #expect(names.filter { $0 == "reconnect" }.count == 1, "\(names)")
        let resumes = events.filter { $0["event"] == .string("transfer") }.compactMap { $0["resume_offset"] }
        #expect(resumes == [.int(0), .int(100)])
        #expect(events.last?["result"] == .string("ok"))
        // Only what the bootloader lacked (past offset 100) went again, never the whole image.
        guard case .int(let resent)? = events.last?["bytes_resent"] else {
            Issue.record("no bytes_resent in \(String(describing: events.last))")
            return
        }
        #expect(resent > 0 && resent <= 236 - 100)
    }

    /// The simulator's fault options reach the Secure DFU bootloader: a byte corrupted on the
    /// way is caught at the object's checksum and the object sent again; a bank byte that rots
    /// before the post-validation fails it, and nothing is activated (exit 8).
    @Test func faultOptionsReachTheSimulatedBootloader() async throws {
        let corrupted = await otaflash(simulator + ["--json", "--sim-mtu", "23", "--sim-corrupt-at", "50", nordicSample("blinky-app.zip")])
        #expect(corrupted.code == 0, "\(corrupted.stderr)")
        let done = corrupted.jsonEvents.last
        #expect(done?["result"] as? String == "ok")
        #expect((done?["bytes_resent"] as? Int ?? 0) > 0, "\(String(describing: done))")
        let rotten = await otaflash(simulator + ["--sim-flash-bitflip-at", "10", nordicSample("blinky-app.zip")])
        #expect(rotten.code == 8, "\(rotten.stderr)")
        #expect(rotten.stderr.contains("nothing was activated"))
    }

    /// SoftDevice+bootloader, then the application (which needs the new SoftDevice): one session
    /// per image in the package's order, the device rebooting and reconnected in between.
    @Test func aCombinedPackageGoesImageByImageInItsOrder() async throws {
        let run = await otaflash(simulator + ["--json", nordicSample("blinky-sd-bl-app.zip")])
        #expect(run.code == 0, "\(run.stderr)")
        let events = expectDocumentedLines(run.stdoutLines, section: "otaflash flash")
        let totals = events.filter { $0["event"] == .string("transfer") }.compactMap { $0["total"] }
        #expect(totals == [.int(20480 + 6144), .int(236)])
        #expect(events.filter { $0["event"] == .string("connecting") }.count == 2)
        #expect(events.first?["size"] == .int(20480 + 6144 + 236))
        #expect(events.last?["result"] == .string("ok"))
        #expect(events.last?["bytes"] == .int(20480 + 6144 + 236))
        let human = await otaflash(simulator + [nordicSample("blinky-sd-bl-app.zip")])
        #expect(human.code == 0)
        #expect(human.stderr.contains("image 1 of 2: softdevice_bootloader"))
        #expect(human.stderr.contains("image 2 of 2: application, 236 B"))
    }

    @Test(arguments: [
        (["--protocol", "native", "blinky-app.zip"], 3, "the native protocol does not send nordic-dfu-package images"),
        (["--protocol", "smp", "blinky-app.zip"], 2, "--protocol must be auto, native or nordic-dfu, got 'smp'"),
        (["--no-activate", "blinky-app.zip"], 2, "--no-activate is not possible with nordic-dfu"),
        (["blinky-app-unsigned-debug.zip"], 7, "signature missing (ext 0x08)"),
    ])
    func whatCannotBeSentGetsOneLineAndItsExitCode(arguments: [String], status: Int32, says: String) async {
        let args = arguments.dropLast() + [nordicSample(arguments.last!)]
        let run = await otaflash(simulator + args)
        #expect(run.code == status, "\(run.stderr)")
        let errors = run.errorLines
        #expect(errors.count == 1, "\(run.stderr)")
        #expect(errors.first?.contains(says) == true, "\(run.stderr)")
    }

    @Test func nordicDFUOnARawBinaryIsRefused() async {
        let run = await otaflash(simulator + ["--protocol", "nordic-dfu", samplePath("seeded-4k.bin")])
        #expect(run.code == 3)
        #expect(run.errorLines.first?.contains("the nordic-dfu protocol does not send raw-binary images") == true, "\(run.stderr)")
    }
}
