import Crypto
import Foundation
import OTA
import OTAWire
import Testing
@testable import ESPOTA

/// The build's partition table, CSV and binary, read as `gen_esp32part.py` reads them, and the
/// OTA partition an image must fit.
@Suite struct PartitionTableTests {
    /// ESP-IDF's partitions_two_ota.csv.
    static let twoOTA = """
        # Name,   Type, SubType, Offset,   Size, Flags
        # Note: if you have increased the bootloader size, make sure to update the offsets to avoid overlap
        nvs,      data, nvs,     ,        0x4000,
        otadata,  data, ota,     ,        0x2000,
        phy_init, data, phy,     ,        0x1000,
        factory,  app,  factory, ,        1M,
        ota_0,    app,  ota_0,   ,        1M,
        ota_1,    app,  ota_1,   ,        1M,
        """

    /// The binary `gen_esp32part.py` writes for `partitions`: 32-byte entries, the MD5 entry, 0xFF.
    static func binary(_ partitions: [(String, UInt8, UInt8, UInt32, UInt32)]) -> [UInt8] {
        var out: [UInt8] = []
        for (name, type, subtype, offset, size) in partitions {
            var entry: [UInt8] = [0xAA, 0x50, type, subtype]
            for v in [offset, size] { entry += (0..<4).map { UInt8(truncatingIfNeeded: v >> (8 * $0)) } }
            entry += Array(name.utf8) + [UInt8](repeating: 0, count: 16 - name.utf8.count)
            entry += [0, 0, 0, 0]
            out += entry
        }
        out += [0xEB, 0xEB] + [UInt8](repeating: 0xFF, count: 14) + Array(Insecure.MD5.hash(data: out))
        return out + [UInt8](repeating: 0xFF, count: 0xC00 - out.count)
    }

    @Test func theTwoOTALayoutFromCSV() throws {
        let table = try ESPPartitionTable.parse(Array(Self.twoOTA.utf8), source: "partitions.csv")
        #expect(table.partitions.map(\.name) == ["nvs", "otadata", "phy_init", "factory", "ota_0", "ota_1"])
        // Offsets as gen_esp32part fills them: data after the table at 0x9000, apps on 64 KiB.
        #expect(table.partitions.map(\.offset) == [0x9000, 0xD000, 0xF000, 0x10000, 0x110000, 0x210000])
        #expect(table.otaApps.map(\.subtype) == [0x10, 0x11])
        let limit = try ESPPartitionLimit(table: table)
        #expect(limit.size == 1 << 20)
        #expect(limit.what == "its OTA partitions (ota_0, ota_1) in partitions.csv")
    }

    @Test func theSmallestOTAPartitionIsTheLimitAndNegativeSizesAreEnds() throws {
        let csv = "nvs, data, nvs, 0x9000, 0x6000\nota_0, app, ota_0, 0x10000, 0x180000\nota_1, app, 0x11, 0x190000, -0x300000\n"
        let table = try ESPPartitionTable.parse(Array(csv.utf8), source: "p.csv")
        #expect(table.otaApps.map(\.size) == [0x180000, 0x170000])
        let limit = try ESPPartitionLimit(table: table)
        #expect(limit.size == 0x170000 && limit.what.contains("its smallest OTA partition, ota_1"))
    }

    @Test func theBinaryTableWithItsMD5() throws {
        let bytes = Self.binary([("nvs", 1, 2, 0x9000, 0x6000), ("otadata", 1, 0, 0xF000, 0x2000),
                                 ("ota_0", 0, 0x10, 0x20000, 0x1E0000), ("ota_1", 0, 0x11, 0x200000, 0x1E0000)])
        let table = try ESPPartitionTable.parse(bytes, source: "partition-table.bin")
        #expect(table.otaApps.map(\.name) == ["ota_0", "ota_1"])
        #expect(try ESPPartitionLimit(table: table).size == 0x1E0000)
        var damaged = bytes
        damaged[40] ^= 0x01
        #expect(throws: ESPPartitionTable.Error.self) { try ESPPartitionTable.parse(damaged, source: "t.bin") }
        #expect(throws: ESPPartitionTable.Error.self) { try ESPPartitionTable.parse(Array(bytes.prefix(96)), source: "t.bin") }
    }

    @Test func tablesThatCannotServeAreRefusedWithTheReason() throws {
        func reason(_ text: String) -> String {
            do {
                _ = try ESPPartitionLimit(table: ESPPartitionTable.parse(Array(text.utf8), source: "p.csv"))
                return "taken"
            } catch {
                return error.description
            }
        }
        #expect(reason("nvs, data, nvs, , 0x6000\nfactory, app, factory, , 1M\n").contains("has no OTA app partition"))
        #expect(reason("ota_0, app, ota_9x, , 1M\n").contains("line 1: the subtype 'ota_9x'"))
        #expect(reason("ota_0, app, ota_0, , lots\n").contains("the size 'lots' is not a number"))
        #expect(reason("ota_0, flash, ota_0, , 1M\n").contains("the type 'flash'"))
        #expect(reason("# nothing\n").contains("lists no partition"))
        #expect(throws: ESPPartitionTable.Error.self) { try ESPPartitionTable.parse([0x7F, 0x45, 0x4C, 0x46, 0, 1, 2], source: "app.elf") }
    }

    @Test func sizesAsPartitionsCSVWritesThem() {
        #expect(ESPPartitionTable.number("1M") == 1 << 20)
        #expect(ESPPartitionTable.number("1600K") == 1600 * 1024)
        #expect(ESPPartitionTable.number("0x1A0000") == 0x1A0000)
        #expect(ESPPartitionTable.number("4096") == 4096)
        #expect(ESPPartitionTable.number("1.5M") == nil)
        #expect(ESPPartitionTable.number("") == nil)
    }

    /// Known partition: larger than it is refused (exit 4's code); unknown: over 4 MiB refused,
    /// over 1 MiB warned about, smaller sent without a word.
    @Test func theLimitAndTheCeiling() throws {
        let limit = ESPPartitionLimit(size: 1 << 20, what: "the OTA partition --esp-partition-size gives")
        #expect(try ESPPartitionLimit.check(appSize: 1 << 20, source: "a.bin", limit: limit).isEmpty)
        do {
            _ = try ESPPartitionLimit.check(appSize: (1 << 20) + 1, source: "a.bin", limit: limit)
            Issue.record("an image one byte over the partition was taken")
        } catch {
            #expect(error.code == .imageTooLarge)
            #expect(error.description.contains("more than the OTA partition --esp-partition-size gives (1048576 bytes)"))
        }
        #expect(try ESPPartitionLimit.check(appSize: 900_000, source: "a.bin", limit: nil).isEmpty)
        #expect(try ESPPartitionLimit.check(appSize: 2 << 20, source: "a.bin", limit: nil).first?.contains("--esp-partition-size") == true)
        #expect(throws: ESPImageError.self) { try ESPPartitionLimit.check(appSize: 10 << 20, source: "a.bin", limit: nil) }
        #expect(try ESPPartitionLimit.check(appSize: 10 << 20, source: "a.bin", limit: ESPPartitionLimit(size: 12 << 20, what: "x")).isEmpty)
    }
}

/// The loader `flash` calls: sizes before any radio time.
@Suite struct ESPLoaderSizeTests {
    static func file(_ bytes: [UInt8]) throws -> String {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("esp-loader-\(UUID().uuidString).bin").path
        try Data(bytes).write(to: URL(fileURLWithPath: path))
        return path
    }

    @Test func overTheCeilingIsRefusedUnlessThePartitionIsGiven() throws {
        let path = try Self.file(ESPAppImage.build(body: [UInt8](repeating: 0x33, count: 5 << 20)))
        defer { try? FileManager.default.removeItem(atPath: path) }
        let registry = ProtocolRegistry([ESPOTAProfile()])
        do {
            _ = try ESPOTARegistration.load(path: path, protocolName: "auto", registry: registry)
            Issue.record("a 5 MiB image went without a partition size")
        } catch {
            #expect(error.code == .imageTooLarge)
            #expect(error.message.contains("more than 4 MiB") && error.message.contains("--esp-partition-size"), "\(error)")
        }
        let told = try ESPOTARegistration.load(path: path, protocolName: "auto", registry: registry,
                                               partition: ESPPartitionLimit(size: 8 << 20, what: "the OTA partition --esp-partition-size gives"))
        #expect(told.plan.size > 5 << 20 && told.warnings.isEmpty)
        #expect(told.plan.contents.contains("fits the OTA partition --esp-partition-size gives (8388608 bytes)"))
    }

    @Test func overOneMiBIsWarnedAboutWhenThePartitionIsNotKnown() throws {
        let path = try Self.file(ESPAppImage.build(body: [UInt8](repeating: 0x44, count: 3 << 19)))
        defer { try? FileManager.default.removeItem(atPath: path) }
        let loaded = try ESPOTARegistration.load(path: path, protocolName: "esp-ota", registry: ProtocolRegistry([ESPOTAProfile()]))
        #expect(loaded.warnings.contains { $0.contains("more than the 1 MiB OTA partitions") })
    }

    /// The app image `FirmwareImage.read` claimed goes through the loader from the bytes read,
    /// the file deleted, as the file itself goes.
    @Test func aClaimedImageIsLoadedFromTheValue() throws {
        let bytes = ESPAppImage.build(chip: .esp32c3, version: "2.1.0", project: "blink", body: ImageTests.body)
        let path = try Self.file(bytes)
        defer { try? FileManager.default.removeItem(atPath: path) }
        let registry = ProtocolRegistry([ESPOTAProfile()])
        let fromFile = try ESPOTARegistration.load(path: path, protocolName: "auto", registry: registry)
        guard case .claimed(let claimed) = try FirmwareImage.read(path: path, detecting: [.espAppImage]) else {
            Issue.record("the app image was not claimed")
            return
        }
        try FileManager.default.removeItem(atPath: path)
        let loaded = try ESPOTARegistration.load(claimed, protocolName: "auto", registry: registry)
        #expect(loaded.plan.firmware.bytes == bytes && loaded.plan.firmware.bytes == fromFile.plan.firmware.bytes)
        #expect(loaded.plan.contents == fromFile.plan.contents && loaded.plan.reason == fromFile.plan.reason)
        #expect(loaded.version == FirmwareVersion("2.1.0"))
    }

    /// The module's file hint: an Xtensa ELF executable is an ESP-IDF build's linker output; the
    /// core alone gives the generic ELF line.
    @Test func theBuildsELFGetsTheHint() throws {
        var elf: [UInt8] = [0x7F, 0x45, 0x4C, 0x46, 1, 1, 1] + [UInt8](repeating: 0, count: 57)
        elf[16] = 2
        elf[18] = 94
        let path = try Self.file(elf)
        defer { try? FileManager.default.removeItem(atPath: path) }
        let name = URL(fileURLWithPath: path).lastPathComponent
        let base = URL(fileURLWithPath: path).deletingPathExtension().lastPathComponent
        func reason(_ hints: [ImageFormat.Hint]) -> String? {
            do {
                _ = try FirmwareImage.load(path: path, detecting: [.espAppImage], hints: hints)
                return nil
            } catch {
                return error.reason
            }
        }
        #expect(reason([.espIDFLinkerOutput]) == "is an Xtensa ELF executable (an ESP-IDF build's linker output), not a firmware image; pass the app "
                + "image ESP-IDF builds beside it: build/\(base).bin (or make one with `esptool elf2image \(name)`)")
        #expect(reason([])?.hasPrefix("is an ELF executable, not a firmware image; convert it with `arm-none-eabi-objcopy") == true)
        // Another machine's ELF (ARM, 40) or an object file is not the build's executable.
        for (type, machine) in [(2, 40), (1, 94)] {
            var other = elf
            other[16] = UInt8(type)
            other[18] = UInt8(machine)
            #expect(ImageFormat.Hint.espIDFLinkerOutput.refusal(ImageFormat.detect(other), other, "x.elf") == nil, "\(type) \(machine)")
        }
    }

    @Test func aPreEncryptedImageIsCheckedAgainstThePartitionByItsAppSize() throws {
        let bytes = EncryptedImageTests.encrypted(ciphertext: 8192)
        let path = try Self.file(bytes)
        defer { try? FileManager.default.removeItem(atPath: path) }
        let registry = ProtocolRegistry([ESPOTAProfile()])
        // 8192 bytes of app in an 8192-byte partition: the 512-byte header is not written.
        let fits = try ESPOTARegistration.load(path: path, protocolName: "auto", registry: registry, chip: .esp32c3,
                                               partition: ESPPartitionLimit(size: 8192, what: "x"))
        #expect(fits.plan.size == 8704 && fits.version == nil)
        #expect(fits.warnings.contains { $0.contains("--chip esp32c3 cannot be checked") })
        #expect(throws: OTAError.self) {
            try ESPOTARegistration.load(path: path, protocolName: "auto", registry: registry, partition: ESPPartitionLimit(size: 8188, what: "x"))
        }
    }
}

/// Pre-encrypted images (`esp_encrypted_img`): recognised, checked for what can be checked
/// without the key, and sent as they are.
@Suite struct EncryptedImageTests {
    /// The layout `esp_enc_img_gen.py encrypt` writes, with stand-in key, IV, tag and ciphertext.
    static func encrypted(ciphertext: Int, saying length: Int? = nil) -> [UInt8] {
        var header = ESPEncryptedImage.magicBytes + [UInt8](repeating: 0x5A, count: 384) + [UInt8](repeating: 0x11, count: 16)
        let n = UInt32(length ?? ciphertext)
        header += (0..<4).map { UInt8(truncatingIfNeeded: n >> (8 * $0)) }
        header += [UInt8](repeating: 0x22, count: 16) + [UInt8](repeating: 0, count: 88)
        return header + (0..<ciphertext).map { UInt8(truncatingIfNeeded: $0 &* 31) }
    }

    @Test func itIsDetectedAndItsAppSizeIsTheCiphertext() throws {
        let bytes = Self.encrypted(ciphertext: 4000)
        #expect(bytes.count == 4512)
        let format = ImageFormat.detect(bytes, using: [.espAppImage])
        #expect(format.kind == .espAppImage && format.description.contains("pre-encrypted"))
        let image = try ESPEncryptedImage(bytes: bytes, source: "app_enc.bin")
        #expect(image.appSize == 4000 && image.size == 4512)
        #expect(image.warnings.first?.contains("CONFIG_PRE_ENC_OTA") == true)
        // As a plain app image (what a device without CONFIG_PRE_ENC_OTA writes) it is refused.
        #expect(throws: ESPImageError.self) { try ESPAppImage(bytes: bytes, source: "app_enc.bin") }
    }

    @Test func aHeaderThatDisagreesWithTheFileIsDamage() {
        func reason(_ bytes: [UInt8]) -> String {
            do {
                _ = try ESPEncryptedImage(bytes: bytes, source: "e.bin")
                return "taken"
            } catch {
                return error.description
            }
        }
        #expect(reason(Self.encrypted(ciphertext: 4000, saying: 5000)).contains("says 5000 bytes of ciphertext follow it, the file holds 4000; the file is truncated"))
        #expect(reason(Self.encrypted(ciphertext: 4000, saying: 100)).contains("the file holds 4000; the file is damaged"))
        #expect(reason(Array(Self.encrypted(ciphertext: 0).prefix(300))).contains("no longer than its 512-byte header"))
    }
}
