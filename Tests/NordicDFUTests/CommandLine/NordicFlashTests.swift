import Foundation
import Testing

// `otaflash flash` with Nordic Secure DFU packages: `--protocol auto` picks nordic-dfu from the
// file, `--simulator` serves a Secure DFU bootloader, and what cannot be sent is refused with
// one line and its exit code before any radio time.

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
        (["--protocol", "smp", "blinky-app.zip"], 3, "the smp protocol does not send nordic-dfu-package images"),
        (["--no-activate", "blinky-app.zip"], 2, "--no-activate applies to native and smp only (the bootloader activates an image as soon as it has validated it)"),
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

    // MARK: --hw-version and --sd-req: what the device is, checked before any radio time

    @Test(arguments: [
        ["--hw-version", "52"], ["--sd-req", "0xAF"], ["--sd-req", "175"], ["--hw-version", "52", "--sd-req", "0xaf"],
    ])
    func expectationsThePackageMeetsFlash(extra: [String]) async {
        let run = await otaflash(simulator + extra + [nordicSample("blinky-app.zip")])
        #expect(run.code == 0, "\(run.stderr)")
    }

    /// The combined sample's first image accepts 0xB6 and 0xAF: a fleet on either may take it;
    /// the application alone accepts 0xAF only.
    @Test func everySoftDeviceInSdReqMustBeAcceptedByTheFirstImage() async {
        let combined = await otaflash(simulator + ["--sd-req", "0xAF,0xB6", nordicSample("blinky-sd-bl-app.zip")])
        #expect(combined.code == 0, "\(combined.stderr)")
        let app = await otaflash(simulator + ["--sd-req", "0xAF,0xB6", nordicSample("blinky-app.zip")])
        #expect(app.code == 7, "\(app.stderr)")
        #expect(app.errorLines == ["otaflash: error: \(nordicSample("blinky-app.zip")): blinky-cortex-m4.dat accepts SoftDevice 0xAF but the device may run 0xB6; the bootloader would refuse it (extended error 0x07): regenerate the package with nrfutil pkg generate --sd-req 0xAF,0xB6, or update the device's SoftDevice first"], "\(app.stderr)")
    }

    /// A mismatch is one line naming both values and what to do, exit 7 as the device's own
    /// refusal would be, and nothing goes over the air (no `connecting` event).
    @Test(arguments: [
        (["--hw-version", "53"], ["is for hardware version 52 but the device is hardware version 53", "nrfutil pkg generate --hw-version 53"]),
        (["--sd-req", "0x101"], ["accepts SoftDevice 0xAF but the device may run 0x101", "--sd-req 0xAF,0x101"]),
        (["--hw-version", "52", "--sd-req", "0xB6"], ["accepts SoftDevice 0xAF but the device may run 0xB6"]),
    ])
    func aPackageTheDeviceWouldRefuseIsRefusedBeforeAnyRadioTime(extra: [String], says: [String]) async {
        let run = await otaflash(simulator + ["--json"] + extra + [nordicSample("blinky-app.zip")])
        #expect(run.code == 7, "\(run.stderr)")
        #expect(run.errorLines.count == 1, "\(run.stderr)")
        for text in says {
            #expect(run.errorLines.first?.contains(text) == true, "\(run.stderr) does not say \(text)")
        }
        let events = run.jsonEvents.compactMap { $0["event"] as? String }
        #expect(!events.contains("connecting"), "\(events)")
        #expect(run.jsonEvents.last?["error"] as? String == "incompatible_device")
    }

    @Test(arguments: [
        ["--hw-version", "52"], ["--sd-req", "0xAF"], ["--sim-hw-version", "52"], ["--sim-softdevice", "0xAF"],
        ["--sim-app-version", "1"], ["--sim-open-bootloader"], ["--sim-public-key", "x.pem"],
    ])
    func secureDFUOptionsWithANativeImageAreAUsageError(extra: [String]) async {
        let run = await otaflash(simulator + extra + [samplePath("seeded-4k.bin")])
        #expect(run.code == 2, "\(run.stderr)")
        #expect(run.errorLines.count == 1, "\(run.stderr)")
        #expect(run.errorLines.first?.contains(extra[0]) == true, "\(run.stderr)")
        #expect(run.errorLines.first?.contains("goes over native: drop it") == true, "\(run.stderr)")
    }

    // MARK: The simulated bootloader's refusals

    struct Refusal: Sendable, CustomTestStringConvertible {
        let arguments: [String]
        let code: Int32
        /// Text the one error line must contain: what the device said and what to do.
        let says: [String]
        var testDescription: String { arguments.joined(separator: " ") }
    }

    static let refusals: [Refusal] = [
        Refusal(arguments: ["--sim-app-version", "3", "blinky-app.zip"], code: 7,
                says: ["the bootloader refused the init packet", "firmware version too low (ext 0x05)", "--application-version"]),
        Refusal(arguments: ["--sim-bootloader-version", "4", "blinky-sd-bl-app.zip"], code: 7, says: ["(ext 0x05)", "--bootloader-version"]),
        Refusal(arguments: ["--sim-hw-version", "53", "blinky-app.zip"], code: 7, says: ["hardware version mismatch (ext 0x06)", "--hw-version"]),
        Refusal(arguments: ["--sim-softdevice", "0x101", "blinky-app.zip"], code: 7, says: ["SoftDevice mismatch (ext 0x07)", "--sd-req"]),
        Refusal(arguments: ["--sim-softdevice", "0x101", "blinky-sd-bl-app.zip"], code: 7, says: ["SoftDevice mismatch (ext 0x07)"]),
        Refusal(arguments: ["blinky-app-unsigned-debug.zip"], code: 7, says: ["signature missing (ext 0x08)", "--key-file"]),
        Refusal(arguments: ["--sim-open-bootloader", "blinky-app-unsigned-debug.zip"], code: 7, says: ["init command invalid (ext 0x04): a debug package (is_debug) needs a debug bootloader", "--debug-mode"]),
        Refusal(arguments: ["--sim-slot-size", "235", "blinky-app.zip"], code: 4, says: ["insufficient space (ext 0x0D)"]),
    ]

    @Test(arguments: refusals)
    func aBootloaderRefusalIsOneLineAndItsExitCode(refusal: Refusal) async {
        let args = refusal.arguments.dropLast() + [nordicSample(refusal.arguments.last!)]
        let run = await otaflash(simulator + args)
        #expect(run.code == refusal.code, "\(run.stderr)")
        #expect(run.errorLines.count == 1, "\(run.stderr)")
        for text in refusal.says {
            #expect(run.errorLines.first?.contains(text) == true, "\(run.stderr) does not say \(text)")
        }
    }

    /// The knobs move the line exactly where the bootloader's rules put it: the same version is
    /// no downgrade, the bank that holds the image exactly takes it, and an open debug
    /// bootloader takes the unsigned debug package.
    @Test(arguments: [
        ["--sim-app-version", "2", "blinky-app.zip"],
        ["--sim-bootloader-version", "3", "blinky-sd-bl-app.zip"],
        ["--sim-slot-size", "236", "blinky-app.zip"],
        ["--sim-hw-version", "52", "--sim-softdevice", "0xAF", "blinky-app.zip"],
        ["--sim-open-bootloader", "--sim-debug-bootloader", "--sim-app-version", "9", "blinky-app-unsigned-debug.zip"],
    ])
    func theBoundaryOfEachRefusalFlashes(arguments: [String]) async {
        let run = await otaflash(simulator + arguments.dropLast() + [nordicSample(arguments.last!)])
        #expect(run.code == 0, "\(run.stderr)")
    }

    /// With the sample's public key the bootloader verifies the ECDSA signature: the sample passes,
    /// the same package with one signature byte flipped or checked against another key does not.
    @Test func theSimulatedBootloaderVerifiesSignaturesWithTheGivenKey() async throws {
        let key = nordicSample("test-key-public.pem")
        let good = await otaflash(simulator + ["--sim-public-key", key, nordicSample("blinky-app.zip")])
        #expect(good.code == 0, "\(good.stderr)")
        let combined = await otaflash(simulator + ["--sim-public-key", key, nordicSample("blinky-sd-bl-app.zip")])
        #expect(combined.code == 0, "\(combined.stderr)")

        let scratch = try Scratch()
        let other = try scratch.file("other.pem", """
            -----BEGIN PUBLIC KEY-----
            MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEFDAzoNJVdHPoWUMVsFxzNf3OqAbu
            pl1P4FizrqalTWNas8ggVmTF9wzH5QzvgklYGPHgyM4SBjKr6Hfa01ud2w==
            -----END PUBLIC KEY-----

            """)
        let wrongKey = await otaflash(simulator + ["--sim-public-key", other, nordicSample("blinky-app.zip")])
        #expect(wrongKey.code == 7, "\(wrongKey.stderr)")
        #expect(wrongKey.errorLines.first?.contains("the bootloader refused the init packet: signature does not verify (ext 0x0C)") == true, "\(wrongKey.stderr)")

        let notAKey = try scratch.file("not-a-key.pem", "hello\n")
        let bad = await otaflash(simulator + ["--sim-public-key", notAKey, nordicSample("blinky-app.zip")])
        #expect(bad.code == 2, "\(bad.stderr)")
        #expect(bad.errorLines == ["otaflash: error: --sim-public-key \(notAKey) is not a PEM P-256 public key; make one with nrfutil keys display --key pk --format pem KEY.pem"])
        let missing = await otaflash(simulator + ["--sim-public-key", scratch.url.appendingPathComponent("none.pem").path, nordicSample("blinky-app.zip")])
        #expect(missing.code == 2, "\(missing.stderr)")
        #expect(missing.errorLines.first?.contains("cannot be read") == true, "\(missing.stderr)")
    }

    @Test func nordicDFUOnARawBinaryIsRefused() async {
        let run = await otaflash(simulator + ["--protocol", "nordic-dfu", samplePath("seeded-4k.bin")])
        #expect(run.code == 3)
        #expect(run.errorLines.first?.contains("the nordic-dfu protocol does not send raw-binary images") == true, "\(run.stderr)")
    }
}
