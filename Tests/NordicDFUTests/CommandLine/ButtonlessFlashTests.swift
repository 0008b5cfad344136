import Foundation
import Testing

// `otaflash flash` with a device that runs its application: the simulated Secure DFU device
// (`--sim-buttonless`) exposes the buttonless characteristic, otaflash asks it into its
// bootloader, flashes the bootloader at the address + 1, and the device runs the new application
// at its own address again. Every refusal is one line and its exit code.

/// The simulated device's address and where its unbonded bootloader answers.
private let application = "C0:FF:EE:00:00:01"
private let bootloader = "C0:FF:EE:00:00:02"

@Suite("otaflash flash, buttonless DFU entry")
struct ButtonlessFlashTests {
    @Test func theApplicationEntersItsBootloaderIsFlashedThereAndRunsTheNewImageAtItsAddress() async throws {
        let run = await otaflash(simulator + ["--json", "--sim-buttonless", "unbonded", nordicSample("blinky-app.zip")])
        #expect(run.code == 0, "\(run.stderr)")
        let events = expectDocumentedLines(run.stdoutLines, section: "otaflash flash")
        let start = try #require(events.first)
        #expect(start["event"] == .string("start"))
        #expect(start["device"] == .string(application))
        #expect(start["bootloader"] == .string(bootloader))
        // Every session event is the bootloader's.
        let devices = Set(events.dropFirst().dropLast().compactMap { $0["device"]?.string })
        #expect(devices == [bootloader])
        let done = try #require(events.last)
        #expect(done["result"] == .string("ok"))
        #expect(done["device"] == .string(application))
        #expect(done["bootloader"] == .string(bootloader))
        let crc = try #require(done["crc32"]?.string)

        let human = await otaflash(simulator + ["--sim-buttonless", "unbonded", nordicSample("blinky-app.zip")])
        #expect(human.code == 0, "\(human.stderr)")
        #expect(human.stderr.contains("picked nordic-dfu: only nordic-dfu sends nordic-dfu-package images; the device exposes 0000fe59-"),
                "\(human.stderr)")
        #expect(human.stderr.contains("\(application) ran its application and was moved into its bootloader, through buttonless DFU; it answers at \(bootloader)"))
        #expect(human.stdout.contains("\(application) (bootloader \(bootloader)): 236 B verified and activated"), "\(human.stdout)")
        // The simulated device ends in its application, at its own address, running what was sent.
        #expect(human.stderr.contains("simulated device: runs its application at \(application), the application flashed with CRC32 \(crc)"),
                "\(human.stderr)")
    }

    /// SoftDevice+bootloader, then the application: the later image goes to the bootloader's
    /// address too, where the bootloader comes back after installing the first.
    @Test func aCombinedPackageGoesToTheBootloaderImageByImage() async throws {
        let run = await otaflash(simulator + ["--json", "--sim-buttonless", "unbonded", nordicSample("blinky-sd-bl-app.zip")])
        #expect(run.code == 0, "\(run.stderr)")
        let events = expectDocumentedLines(run.stdoutLines, section: "otaflash flash")
        let connecting = events.filter { $0["event"] == .string("connecting") }.compactMap { $0["device"]?.string }
        #expect(connecting == [bootloader, bootloader])
        #expect(events.last?["result"] == .string("ok"))
        let human = await otaflash(simulator + ["--sim-buttonless", "unbonded", nordicSample("blinky-sd-bl-app.zip")])
        #expect(human.code == 0, "\(human.stderr)")
        #expect(human.stderr.contains("simulated device: runs its application at \(application), the application flashed with"), "\(human.stderr)")
    }

    @Test(arguments: [
        ("refusing", 9, "\(application) refused Enter Bootloader: operation failed: the application could not enter the bootloader"),
        ("bonded", 12, "\(application) enters its bootloader only for a bonded central (buttonless DFU with bonds, 8EC90004); pass --pair to bond with it first"),
        ("lost", 6, "connecting to \(bootloader) failed: no answer within 10 s; nor did a device advertising 'DFU-C0FFEE000001' appear within 5 s"),
    ])
    func aDeviceThatCannotBeMovedIntoItsBootloaderGetsOneLineAndItsExitCode(kind: String, status: Int32, says: String) async throws {
        let run = await otaflash(simulator + ["--json", "--reconnect-window", "0", "--sim-buttonless", kind, nordicSample("blinky-app.zip")])
        #expect(run.code == status, "\(run.stderr)")
        #expect(run.errorLines.count == 1, "\(run.stderr)")
        #expect(run.errorLines.first?.contains(says) == true, "\(run.stderr)")
        let events = expectDocumentedLines(run.stdoutLines, section: "otaflash flash")
        #expect(events.first?["event"] == .string("start"))
        #expect(events.last?["exit_code"] == .int(Int(status)))
        let human = await otaflash(simulator + ["--reconnect-window", "0", "--sim-buttonless", kind, nordicSample("blinky-app.zip")])
        #expect(human.code == status, "\(human.stderr)")
        // Nothing was activated: the device runs the application it came with, or hangs in its reset.
        #expect(human.stderr.contains("simulated device: runs its \(kind == "lost" ? "bootloader at \(bootloader)" : "application at \(application)")\n"),
                "\(human.stderr)")
    }

    /// The bootloader never comes up: the run ends within its limits (one connect timeout shared
    /// by the address and the fallback scan, without reconnecting), not later.
    @Test func aBootloaderThatNeverAppearsEndsWithinItsLimits() async throws {
        let run = await otaflash(simulator + ["--json", "--reconnect-window", "0", "--connect-timeout", "5",
                                              "--sim-buttonless", "lost", nordicSample("blinky-app.zip")])
        #expect(run.code == 6, "\(run.stderr)")
        guard case .double(let seconds)? = expectDocumentedLines(run.stdoutLines, section: "otaflash flash").last?["seconds"] else {
            Issue.record("no seconds in \(run.stdout)")
            return
        }
        #expect(seconds >= 2.5 && seconds <= 5 + 1, "\(seconds)")
    }

    @Test func aRawImageForADeviceThatSpeaksSecureDFUIsRefusedNamingWhatItTakes() async {
        let run = await otaflash(simulator + ["--sim-buttonless", "unbonded", samplePath("seeded-4k.bin")])
        #expect(run.code == 7, "\(run.stderr)")
        #expect(run.errorLines.count == 1, "\(run.stderr)")
        #expect(run.errorLines.first?.contains("\(application): the device exposes 0000fe59-0000-1000-8000-00805f9b34fb of nordic-dfu, none of the services of native") == true,
                "\(run.stderr)")
        #expect(run.errorLines.first?.contains("give it an image nordic-dfu sends (nordic-dfu-package)") == true, "\(run.stderr)")
    }

    @Test func anUnknownSimulatedButtonlessKindIsAUsageError() async {
        let run = await otaflash(simulator + ["--sim-buttonless", "sideways", nordicSample("blinky-app.zip")])
        #expect(run.code == 2)
        #expect(run.errorLines.first?.contains("Please provide one of 'unbonded', 'bonded', 'refusing' or 'lost'") == true, "\(run.stderr)")
    }
}
