import Foundation
import OTAFlashCLI
import Testing

/// `--sim-device-version 2` (flash) and `simulate --device-version 2`: a protocol version 2 device
/// on NOR flash, with the C device library in lockstep beside the Swift model.
@Suite("Simulated version 2 device with the C library in lockstep")
struct DeviceVersion2Tests {
    static let agreed = "the C device library answered every write as the Swift model did"

    @Test(arguments: ["seeded-4k.bin", "seeded-256k.bin", "blinky-cortex-m4.hex"])
    func aVersion2FlashEndsOkWithTheCLibraryAgreeing(file: String) async throws {
        let run = await otaflash(simulator + ["--json", "--sim-device-version", "2", samplePath(file)])
        #expect(run.code == 0, "\(run.stderr)")
        let events = run.jsonEvents
        let info = try #require(events.first { $0["event"] as? String == "device_info" })
        #expect(info["protocol"] as? Int == 2, "the device did not speak version 2: \(info)")
        let notes = events.filter { $0["event"] as? String == "note" }.compactMap { $0["message"] as? String }
        #expect(notes.contains { $0.contains(Self.agreed) }, "\(notes)")
        let done = try #require(events.last)
        #expect(done["event"] as? String == "done")
        #expect(done["result"] as? String == "ok")
    }

    /// Faults the lockstep replays on both devices (lost packets, a link drop, a power cycle):
    /// the flash still ends ok and the two still agree.
    @Test func faultsReachBothDevicesAndTheyStillAgree() async throws {
        let run = await otaflash(simulator + ["--sim-device-version", "2", "--sim-seed", "3", "--sim-drop-rate", "0.02",
                                              "--sim-disconnect-at", "60000", "--sim-reboot-at", "150000",
                                              samplePath("seeded-256k.bin")])
        #expect(run.code == 0, "\(run.stderr)")
        #expect(run.stderr.contains(Self.agreed), "\(run.stderr)")
        #expect(run.stdout.contains("verified and activated"))
    }

    /// `info` reads the simulated device as it is: a version 2 device says so; the default is version 1.
    @Test(arguments: [(["--sim-device-version", "2"], "2"), ([], "1")])
    func infoReportsTheProtocolVersion(options: [String], expected: String) async throws {
        let run = await otaflash(["info", "--simulator", "--json"] + options)
        #expect(run.code == 0, "\(run.stderr)")
        let info = try #require(run.jsonEvents.first { $0["event"] as? String == "info" })
        #expect(info["ota_protocol"] as? String == expected, "\(info)")
    }

    /// A version 1 device has no C library beside it, and says nothing about one.
    @Test func aVersion1FlashSaysNothingOfTheCLibrary() async {
        let run = await otaflash(simulator + [samplePath("seeded-4k.bin")])
        #expect(run.code == 0, "\(run.stderr)")
        #expect(!run.stderr.contains("C device library"))
    }

    @Test(arguments: [
        BadValue(arguments: simulator + ["--sim-device-version", "3", samplePath("seeded-4k.bin")],
                                       says: ["--sim-device-version", "1 and 2"]),
        BadValue(arguments: simulator + ["--sim-device-version", "x", samplePath("seeded-4k.bin")],
                                       says: ["--sim-device-version", "a whole number 1–2"]),
        BadValue(arguments: simulator + ["--sim-device-version", "2", "--sim-slot-size", "5000", samplePath("seeded-4k.bin")],
                                       says: ["--sim-slot-size must be a multiple of 4096", "5000"]),
        BadValue(arguments: simulator + ["--sim-device-version", "2", "--sim-state", "/tmp/x", samplePath("seeded-4k.bin")],
                                       says: ["--sim-state keeps a version 1 device only"]),
        BadValue(arguments: simulator + ["--sim-device-version", "2", "--count", "2", samplePath("seeded-4k.bin")],
                                       says: ["--sim-device-version 2", "drop --count"]),
        BadValue(arguments: simulator + ["--sim-device-version", "2", samplePath("nordic/blinky-app.zip")],
                                       says: ["--sim-device-version applies to native only", "nordic-dfu"]),
        BadValue(arguments: ["simulate", "--device-version", "0"], says: ["--device-version", "1 and 2"]),
        BadValue(arguments: ["simulate", "--device-version", "2", "--protocol", "smp"],
                                       says: ["--device-version configures a simulated native OTA device", "add --protocol native"]),
        BadValue(arguments: ["simulate", "--device-version", "2", "--slot-size", "100000"],
                                       says: ["--slot-size must be a multiple of 4096", "100000"]),
    ])
    func aBadVersion2CombinationIsOneUsageLine(input: BadValue) async {
        let run = await otaflash(input.arguments)
        expectOneUsageLine(run, saying: input.says)
    }

    @Test func helpStatesBothOptionsWithTheirRange() async {
        let flash = await otaflash(["help", "simulator"])
        #expect(flash.stdout.contains("--sim-device-version"))
        let simulate = await otaflash(["simulate", "--help"])
        #expect(simulate.stdout.contains("--sim-device-version"))
        for run in [flash, simulate] {
            // Help wraps its lines: compare the words.
            let words = run.stdout.split(whereSeparator: \.isWhitespace).joined(separator: " ")
            #expect(words.contains("C device library in lockstep"), "\(run.stdout)")
            #expect(words.contains("(1–2)."), "\(run.stdout)")
        }
    }
}
