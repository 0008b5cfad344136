import Foundation
@testable import OTAFlashCLI
import Testing
import TestSupport

/// Espressif's BLE OTA through the command line: picked from the image, and `--chip`, its one
/// option, checked before any radio time.
@Suite("ESP32 through the command line")
struct ESPCommandLineTests {
    static let sample = "esp32/blink-esp32.bin"

    @Test func theSampleGoesOverESPOTAAndItsChipIsTakenAsGiven() async {
        for chip in [[], ["--chip", "esp32"], ["--chip", "ESP32"]] {
            let run = await otaflash(simulator + ["--json"] + chip + [samplePath(Self.sample)])
            #expect(run.code == 0, "\(chip): \(run.stderr)")
            #expect(run.stdout.contains("\"protocol\":\"esp-ota\"") && run.stdout.contains("\"result\":\"ok\""), "\(chip)")
        }
    }

    @Test func anImageForAnotherChipIsRefusedBeforeAnyRadioTime() async {
        let run = await otaflash(simulator + ["--json", "--chip", "esp32-s3", samplePath(Self.sample)])
        #expect(run.code == 7, "\(run.stderr)")
        #expect(!run.stdout.contains("\"event\":\"connecting\""))
        #expect(run.errorLines.count == 1 && run.errorLines[0].contains("idf.py set-target esp32s3"), "\(run.stderr)")
    }

    @Test(arguments: [
        (["--chip", "esp99", "esp32/blink-esp32.bin"], "Please provide one of 'esp32', 'esp32s2'"),
        (["--chip", "esp32", "seeded-4k.bin"], "--chip applies to esp-ota only"),
    ]) func aChipThatCannotApplyIsOneUsageLine(arguments: [String], says: String) async {
        let run = await otaflash(simulator + arguments.dropLast() + [samplePath(arguments[arguments.count - 1])])
        #expect(run.code == 2, "\(run.stderr)")
        #expect(run.errorLines.count == 1 && run.errorLines[0].contains(says), "\(run.stderr)")
    }

    /// The sample with `patch` applied, written into `scratch`.
    static func patched(_ scratch: Scratch, _ name: String, _ patch: (inout [UInt8]) -> Void) throws -> String {
        var bytes = try [UInt8](Data(contentsOf: URL(fileURLWithPath: samplePath(sample))))
        patch(&bytes)
        let path = scratch.url.appendingPathComponent(name).path
        try Data(bytes).write(to: URL(fileURLWithPath: path))
        return path
    }

    /// A file that starts with 0xE9 but fails the app image checks is refused as a damaged ESP
    /// image in auto too (it was sent as a raw native image), naming the damage, before any radio time.
    @Test(arguments: [
        ("17 segments", 1, 17, "17 segments, more than ESP-IDF's limit of 16"),
        ("no segments", 1, 0, "no segments"),
        ("junk chip id", 12, 0x77, "chip id is 0x77"),
        ("a segment past the end", 30, 0x01, "runs past the end of the file"),
    ]) func aDamagedESPImageIsRefusedInAuto(what: String, at: Int, byte: UInt8, says: String) async throws {
        let scratch = try Scratch()
        let path = try Self.patched(scratch, "damaged.bin") { $0[at] = byte }
        let run = await otaflash(simulator + ["--json", path])
        #expect(run.code == 3, "\(what): \(run.stderr)")
        #expect(!run.stdout.contains("\"event\":\"connecting\""), "\(what)")
        #expect(run.errorLines.count == 1, "\(run.stderr)")
        #expect(run.errorLines.first?.contains("damaged.bin is a damaged ESP-IDF app image: ") == true, "\(run.stderr)")
        #expect(run.errorLines.first?.contains(says) == true, "\(what): \(run.stderr)")
    }

    /// `--protocol native` asked for by name sends such a file as the raw binary it may be, and says so.
    @Test func nativeByNameSendsAFileThatOnlyStartsWithTheMagic() async throws {
        let scratch = try Scratch()
        let path = try Self.patched(scratch, "starts-e9.bin") { $0[1] = 0 }
        let run = await otaflash(simulator + ["--protocol", "native", path])
        #expect(run.code == 0, "\(run.stderr)")
        #expect(run.stderr.contains("starts with 0xE9 like an ESP-IDF app image, but is none"), "\(run.stderr)")
        let esp = await otaflash(simulator + ["--protocol", "esp-ota", path])
        #expect(esp.code == 3 && esp.errorLines.first?.contains("no segments") == true, "\(esp.stderr)")
    }

    /// The device cannot say its OTA partition's size: the option or the build's table gives it,
    /// and a larger image is refused before any radio time (exit 4).
    @Test func anImageLargerThanTheGivenPartitionIsRefusedBeforeAnyRadioTime() async throws {
        let scratch = try Scratch()
        let small = try scratch.file("partitions.csv", "nvs, data, nvs, , 0x6000\notadata, data, ota, , 0x2000\nota_0, app, ota_0, , 16K\nota_1, app, ota_1, , 16K\n")
        for options in [["--esp-partition-size", "16K"], ["--esp-partition-size", "0x4000"], ["--partition-table", small]] {
            let run = await otaflash(simulator + ["--json"] + options + [samplePath(Self.sample)])
            #expect(run.code == 4, "\(options): \(run.stderr)")
            #expect(!run.stdout.contains("\"event\":\"connecting\""))
            #expect(run.errorLines.count == 1 && run.errorLines[0].contains("more than"), "\(run.stderr)")
        }
        let fits = try scratch.file("big.csv", "ota_0, app, ota_0, , 1M\nota_1, app, ota_1, , 1M\n")
        for options in [["--esp-partition-size", "1M"], ["--partition-table", fits]] {
            let run = await otaflash(simulator + ["--json"] + options + [samplePath(Self.sample)])
            #expect(run.code == 0, "\(options): \(run.stderr)")
        }
    }

    @Test(arguments: [
        (["--esp-partition-size", "100"], "--esp-partition-size must be between 4096 and 16777216 bytes"),
        (["--esp-partition-size", "1.5M"], "expected a size in bytes"),
        (["--esp-partition-size", "1M", "--partition-table", "p.csv"], "give one"),
        (["--partition-table", "/nonexistent/partitions.csv"], "cannot be read"),
        (["--esp-partition-size", "1M", "--protocol", "native"], "--esp-partition-size applies to esp-ota only"),
    ]) func partitionOptionsThatCannotServeAreOneUsageLine(options: [String], says: String) async {
        let image = options.contains("native") ? samplePath("seeded-4k.bin") : samplePath(Self.sample)
        let run = await otaflash(simulator + options + [image])
        expectOneUsageLine(run, saying: [says])
    }

    @Test func aTableWithoutOTAPartitionsIsOneUsageLine() async throws {
        let scratch = try Scratch()
        let factoryOnly = try scratch.file("factory.csv", "nvs, data, nvs, , 0x6000\nfactory, app, factory, , 1M\n")
        let run = await otaflash(simulator + ["--partition-table", factoryOnly, samplePath(Self.sample)])
        expectOneUsageLine(run, saying: ["has no OTA app partition"])
    }

    /// A pre-encrypted image goes as it is, with what the device must be; the simulated device is
    /// built without CONFIG_PRE_ENC_OTA, so it writes the ciphertext and does not restart (exit 8).
    @Test func aPreEncryptedImageIsSentAsItIsWithWhatTheDeviceNeeds() async throws {
        let scratch = try Scratch()
        let ciphertext = (0..<20000).map { UInt8(truncatingIfNeeded: $0 &* 131 &+ 7) }
        var bytes: [UInt8] = [0xCF, 0xB6, 0x88, 0x07] + [UInt8](repeating: 0x5A, count: 384) + [UInt8](repeating: 0x11, count: 16)
        bytes += [0x20, 0x4E, 0x00, 0x00] + [UInt8](repeating: 0x22, count: 16) + [UInt8](repeating: 0, count: 88) + ciphertext
        let path = scratch.url.appendingPathComponent("blink_enc.bin").path
        try Data(bytes).write(to: URL(fileURLWithPath: path))
        let run = await otaflash(simulator + ["--chip", "esp32", path])
        #expect(run.stderr.contains("pre-encrypted image (esp_encrypted_img): it is sent as it is"), "\(run.stderr)")
        #expect(run.stderr.contains("CONFIG_PRE_ENC_OTA"), "\(run.stderr)")
        #expect(run.stderr.contains("--chip esp32 cannot be checked"), "\(run.stderr)")
        #expect(run.code == 8, "\(run.stderr)")
        // Its header's length disagrees with the file: damage, before any radio time.
        bytes[405] = 0x4F
        try Data(bytes).write(to: URL(fileURLWithPath: path))
        let damaged = await otaflash(simulator + [path])
        #expect(damaged.code == 3 && damaged.errorLines.first?.contains("damaged pre-encrypted image") == true, "\(damaged.stderr)")
    }

    /// The committed samples scripts/make-esp32-sample writes beside the app image.
    @Test func theDamagedAndThePreEncryptedSamples() async {
        let damaged = await otaflash(simulator + [samplePath("esp32/blink-esp32-damaged.bin")])
        #expect(damaged.code == 3 && damaged.errorLines.first?.contains("17 segments, more than ESP-IDF's limit of 16") == true, "\(damaged.stderr)")
        let encrypted = await otaflash(simulator + [samplePath("esp32/blink-esp32-enc.bin")])
        #expect(encrypted.code == 8, "\(encrypted.stderr)")
        #expect(encrypted.stderr.contains("only a device built with CONFIG_PRE_ENC_OTA"), "\(encrypted.stderr)")
    }
}

