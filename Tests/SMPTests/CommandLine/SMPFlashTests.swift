import Foundation
import Testing

// `otaflash` with MCUboot images (imgtool sign) to a simulated Zephyr device with an SMP server:
// upload, the slot's hash checked, marked for test or confirmed, reset, and what runs after.

private func mcuboot(_ name: String) -> String { samplePath("mcuboot/\(name)") }

@Suite("otaflash flash, SMP")
struct SMPFlashTests {
    @Test func anMCUbootImageIsUploadedTestedAndRunsAfterTheReset() async throws {
        let run = await otaflash(simulator + ["--json", mcuboot("blinky-ec256-v1.3.0.bin")])
        #expect(run.code == 0, "\(run.stderr)")
        let events = expectDocumentedLines(run.stdoutLines, section: "otaflash flash")
        #expect(events.first?["protocol"] == .string("smp"))
        // Marking the image and the reset are one activation, announced once.
        #expect(events.filter { $0["event"] == .string("activate") }.count == 1)
        let done = try #require(events.last)
        #expect(done["result"] == .string("ok"))
        #expect(done["firmware_before"] == .string("1.0.0"))
        #expect(done["firmware_after"] == .string("1.3.0"))

        let human = await otaflash(simulator + [mcuboot("blinky-ec256-v1.3.0.bin")])
        #expect(human.code == 0, "\(human.stderr)")
        #expect(human.stderr.contains("picked smp"), "\(human.stderr)")
        #expect(human.stdout.contains("now runs 1.3.0"), "\(human.stdout)")
        // A test image runs unconfirmed until the application (or `image confirm`) confirms it.
        #expect(!human.stdout.contains("1.3.0 active confirmed"), "\(human.stdout)")
    }

    @Test func confirmKeepsTheImageForGood() async throws {
        let human = await otaflash(simulator + ["--confirm", mcuboot("blinky-ed25519-v1.2.3+4.bin")])
        #expect(human.code == 0, "\(human.stderr)")
        #expect(human.stdout.contains("now runs 1.2.3: slot 0 1.2.3.4 active confirmed"), "\(human.stdout)")
    }

    @Test func noResetLeavesTheImagePendingAndTheOldOneRunning() async throws {
        let run = await otaflash(simulator + ["--json", "--no-reset", mcuboot("blinky-ec256-v1.3.0.bin")])
        #expect(run.code == 0, "\(run.stderr)")
        let done = try #require(run.jsonEvents.last)
        #expect(done["firmware_after"] as? String == "1.0.0")
    }

    @Test func theHexFromImgtoolGoesTheSameWay() async throws {
        let run = await otaflash(simulator + ["--json", mcuboot("blinky-ed25519-v1.2.3+4.hex")])
        #expect(run.code == 0, "\(run.stderr)")
        #expect(run.jsonEvents.last?["firmware_after"] as? String == "1.2.3")
    }

    @Test func aLostLinkResumesThroughTheServersOffset() async throws {
        let run = await otaflash(simulator + ["--json", "--sim-smp-buf-size", "256", "--sim-disconnect-at", "500",
                                              mcuboot("blinky-ec256-v1.3.0.bin")])
        #expect(run.code == 0, "\(run.stderr)")
        #expect(run.jsonEvents.contains { $0["event"] as? String == "reconnect" })
        #expect(run.jsonEvents.last?["result"] as? String == "ok")
    }

    /// A device with fewer buffers free than it reported answers EBUSY: the upload goes on with
    /// one request in flight, and says so once.
    @Test func aDeviceOutOfBuffersFallsBackToOneRequestAndSaysSo() async throws {
        let options = ["--sim-smp-busy-above", "2", "--sim-slow-flash-ms", "20", samplePath("mcuboot-large/seeded96k-ed25519-v2.0.0.bin")]
        let run = await otaflash(simulator + ["--json"] + options)
        #expect(run.code == 0, "\(run.stderr)")
        let events = expectDocumentedLines(run.stdoutLines, section: "otaflash flash")
        let notes = events.filter { $0["event"] == .string("note") }
        #expect(notes.count == 1)
        #expect(notes.first?["message"].map { "\($0)".contains("one request in flight") } == true, "\(notes)")
        #expect(events.last?["result"] == .string("ok"))

        let human = await otaflash(simulator + options)
        #expect(human.code == 0, "\(human.stderr)")
        #expect(human.stderr.contains("requests in flight (out of SMP buffers, or busy)"), "\(human.stderr)")
    }

    @Test func aBatchOfSMPDevicesReadsEachVersionBack() async throws {
        let run = await otaflash(simulator + ["--json", "--count", "3", mcuboot("blinky-ec256-v1.3.0.bin")])
        #expect(run.code == 0, "\(run.stderr)")
        let done = run.jsonEvents.filter { $0["event"] as? String == "done" }
        #expect(done.count == 3)
        #expect(done.allSatisfy { $0["firmware_after"] as? String == "1.3.0" })
    }

    @Test(arguments: [
        (["--confirm", "seeded-4k.bin"], 2, "--confirm applies to smp only; "),
        (["--smp-any-image", "seeded-4k.bin"], 2, "--smp-any-image sends a file over SMP as it is: it needs --protocol smp"),
        (["--smp-window", "0", "mcuboot/blinky-ec256-v1.3.0.bin"], 2, "--smp-window"),
        (["--sim-smp-buf-size", "10", "mcuboot/blinky-ec256-v1.3.0.bin"], 2, "--sim-smp-buf-size"),
        // A raw binary (or an MCUboot image whose magic is damaged) with --protocol smp: what an
        // MCUboot image is, and the two ways on.
        (["--protocol", "smp", "seeded-4k.bin"], 3, "starts with the magic 0x96f3b83d: sign the binary with `imgtool sign`"),
        (["--protocol", "smp", "seeded-4k.bin"], 3, "add --smp-any-image to upload it as it is"),
    ])
    func badSMPOptionsAreUsageErrors(arguments: [String], status: Int32, says: String) async {
        let run = await otaflash(simulator + arguments.dropLast() + [samplePath(arguments.last!)])
        #expect(run.code == status, "\(run.stderr)")
        #expect(run.stderr.contains(says), "\(run.stderr)")
    }

    /// A device's refusal of the upload: the simulator options that make it, its exit code, and
    /// what its one error line says (what is wrong, what to do).
    struct Refusal: Sendable, CustomTestStringConvertible {
        let options: [String]
        let status: Int32
        let says: [String]
        var testDescription: String { options.joined(separator: " ") }
    }

    static let refusals: [Refusal] = [
        Refusal(options: ["--sim-smp-pending"], status: 9,
                says: ["no free slot (9)", "holds image 1.0.0, marked to run at the next reset", "otaflash reset", "otaflash image confirm"]),
        Refusal(options: ["--sim-smp-unconfirmed"], status: 9,
                says: ["no free slot (9)", "runs test image 1.0.0, not confirmed", "otaflash image confirm", "otaflash reset"]),
        Refusal(options: ["--sim-smp-downgrade-check", "--sim-firmware-version", "2.0.0"], status: 7,
                says: ["current version is newer (27)", "it runs 2.0.0", "higher version"]),
        Refusal(options: ["--sim-smp-downgrade-check", "--sim-firmware-version", "1.3.0"], status: 7,
                says: ["current version is newer (27)", "it runs 1.3.0"]),
        Refusal(options: ["--sim-smp-busy"], status: 9, says: ["busy (10)", "wait for it to finish and retry"]),
        Refusal(options: ["--sim-slot-size", "500"], status: 4, says: ["image too large (30)", "build a smaller image"]),
        Refusal(options: ["--sim-smp-refuse-upload", "31"], status: 9, says: ["data overrun (31)", "run the upload again"]),
        Refusal(options: ["--sim-smp-refuse-upload", "23"], status: 3, says: ["bad image magic (23)", "imgtool"]),
    ]

    @Test(arguments: refusals)
    func deviceRefusalsEndWithOneLineAndTheirExitCode(_ refusal: Refusal) async {
        let run = await otaflash(simulator + refusal.options + [mcuboot("blinky-ec256-v1.3.0.bin")])
        #expect(run.code == refusal.status, "\(run.stderr)")
        #expect(run.errorLines.count == 1, "\(run.stderr)")
        for text in refusal.says {
            #expect(run.errorLines.first?.contains(text) == true, "\(run.stderr) does not say \(text)")
        }
    }

    @Test func aDowngradeCheckLetsANewerImageThrough() async {
        let run = await otaflash(simulator + ["--sim-smp-downgrade-check", "--sim-firmware-version", "1.2.9", mcuboot("blinky-ec256-v1.3.0.bin")])
        #expect(run.code == 0, "\(run.stderr)")
        #expect(run.stdout.contains("now runs 1.3.0"), "\(run.stdout)")
    }

    @Test func anOlderServerWithoutParametersGetsOneRequestInFlightSaidOnce() async {
        let run = await otaflash(simulator + ["--sim-smp-no-params", mcuboot("blinky-ec256-v1.3.0.bin")])
        #expect(run.code == 0, "\(run.stderr)")
        let notes = run.stderr.components(separatedBy: "buffers not reported (an older SMP server): one request in flight").count - 1
        #expect(notes == 1, "\(run.stderr)")
        #expect(run.stdout.contains("now runs 1.3.0"), "\(run.stdout)")
    }

    @Test func theSMPRefusalOptionsAreChecked() async {
        let image = mcuboot("blinky-ec256-v1.3.0.bin")
        expectOneUsageLine(await otaflash(simulator + ["--sim-smp-refuse-upload", "34", image]), saying: ["--sim-smp-refuse-upload", "1 and 33"])
        expectOneUsageLine(await otaflash(simulator + ["--sim-smp-refuse-upload", "x", image]), saying: ["--sim-smp-refuse-upload", "1–33"])
        expectOneUsageLine(await otaflash(simulator + ["--sim-smp-pending", "--sim-smp-unconfirmed", image]), saying: ["give one"])
    }

    @Test func imageCommandsListConfirmAndEcho() async throws {
        let list = await otaflash(["image", "list", "--simulator", "--json"])
        #expect(list.code == 0, "\(list.stderr)")
        let slots = expectDocumentedLines(list.stdoutLines, section: "otaflash image").filter { $0["event"] == .string("slot") }
        #expect(slots.count >= 1)
        #expect(slots.first?["active"] == .bool(true))
        #expect(slots.first?["version"]?.string?.hasPrefix("1.0.0") == true)
        let echo = await otaflash(["echo", "--simulator", "hello"])
        #expect(echo.code == 0, "\(echo.stderr)")
        #expect(echo.stdout.contains("hello"))
        let badHash = await otaflash(["image", "test", "--simulator", "--hash", String(repeating: "ab", count: 32)])
        #expect(badHash.code != 0)
        #expect(badHash.errorLines.count == 1, "\(badHash.stderr)")
    }

    /// The device commands' simulated device takes the options `flash --simulator` gives it: an
    /// nRF5340 lists its network core's image, a device with an image pending lists it pending;
    /// without --simulator they are refused, not ignored.
    @Test func imageCommandsTakeTheSimulatedDevicesOptions() async throws {
        let twoCores = await otaflash(["image", "list", "--simulator", "--json", "--sim-smp-network-core"])
        #expect(twoCores.code == 0, "\(twoCores.stderr)")
        let slots = expectDocumentedLines(twoCores.stdoutLines, section: "otaflash image").filter { $0["event"] == .string("slot") }
        #expect(slots.contains { $0["image"] == .int(1) }, "\(twoCores.stdout)")
        let pending = await otaflash(["image", "list", "--simulator", "--json", "--sim-smp-pending"])
        #expect(pending.code == 0, "\(pending.stderr)")
        #expect(pending.jsonEvents.contains { $0["event"] as? String == "slot" && $0["pending"] as? Bool == true }, "\(pending.stdout)")
        expectOneUsageLine(await otaflash(["image", "list", "--device", "AA:BB:CC:DD:EE:FF", "--sim-smp-network-core"]),
                           saying: ["--sim-smp-network-core", "add --simulator"])
    }
}

@Suite("otaflash flash, SMP, --skip-if-version image")
struct SMPSkipTests {
    @Test func aDeviceAlreadyRunningTheImagesVersionIsLeftAlone() async throws {
        let run = await otaflash(simulator + ["--json", "--sim-firmware-version", "1.3.0", "--skip-if-version", "image",
                                              samplePath("mcuboot/blinky-ec256-v1.3.0.bin")])
        #expect(run.code == 0, "\(run.stderr)")
        #expect(run.jsonEvents.last?["result"] as? String == "skipped")
        let older = await otaflash(simulator + ["--json", "--sim-firmware-version", "1.2.0", "--skip-if-version", "image",
                                                samplePath("mcuboot/blinky-ec256-v1.3.0.bin")])
        #expect(older.code == 0, "\(older.stderr)")
        #expect(older.jsonEvents.last?["result"] as? String == "ok")
        let raw = await otaflash(simulator + ["--skip-if-version", "image", samplePath("seeded-4k.bin")])
        #expect(raw.code == 2)
        #expect(raw.stderr.contains("the version is read from an MCUboot image's header"), "\(raw.stderr)")
    }
}
