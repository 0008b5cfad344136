import Crypto
import GATT
import OTA
import OTAWire
import Testing
@testable import ESPOTA

@Suite struct ImageTests {
    static let body = (0..<3000).map { UInt8(truncatingIfNeeded: $0 &* 7) }

    @Test func builtImageParsesWithItsDescription() throws {
        let bytes = ESPAppImage.build(chip: .esp32c3, version: "2.1.0", project: "blink", body: Self.body)
        let image = try ESPAppImage(bytes: bytes, source: "app.bin")
        #expect(image.chip == .esp32c3)
        #expect(image.segments.count == 2)
        #expect(image.hashAppended)
        #expect(image.imageLength == bytes.count)
        #expect(image.version == "2.1.0" && image.projectName == "blink")
        #expect(image.trailer == .none)
        #expect(ImageFormat.detect(bytes, using: [.espAppImage]).kind == .espAppImage)
    }

    func refusal(_ bytes: [UInt8]) -> ESPImageError? {
        do {
            _ = try ESPAppImage(bytes: bytes, source: "app.bin")
            return nil
        } catch {
            return error
        }
    }

    @Test func badMagicTruncatedSegmentsBadChecksumAndHashAreRefused() throws {
        let good = ESPAppImage.build(body: Self.body)
        var magic = good
        magic[0] = 0xEA
        #expect(refusal(magic)?.description.contains("magic 0xE9") == true)
        #expect(refusal(Array(good.prefix(1000)))?.description.contains("runs past the end") == true)
        #expect(refusal(Array(good.prefix(10)))?.description.contains("shorter than") == true)
        var segments = good
        segments[1] = 0
        #expect(refusal(segments)?.description.contains("no segments") == true)
        var flipped = good
        flipped[600] ^= 0x01
        #expect(refusal(flipped)?.description.contains("checksum") == true)
        var hash = good
        hash[hash.count - 1] ^= 0x01
        #expect(refusal(hash)?.description.contains("SHA-256 does not match") == true)
        #expect(refusal(Array(good.dropLast(5)))?.description.contains("truncated") == true)
    }

    @Test func otherFilesOfAnESPIDFBuildNameTheAppImage() {
        let elf: [UInt8] = [0x7F, 0x45, 0x4C, 0x46, 1, 1, 1, 0] + [UInt8](repeating: 0, count: 8) + [2, 0, 94, 0] + [UInt8](repeating: 0, count: 40)
        #expect(refusal(elf)?.description.contains("build/<app>.bin") == true)
        // esptool merge_bin for an ESP32: 0xFF up to the bootloader at 0x1000, the partition table at 0x8000.
        var merged = [UInt8](repeating: 0xFF, count: 0x10000)
        merged.replaceSubrange(0x1000..<(0x1000 + 64), with: ESPAppImage.build(body: []).prefix(64))
        merged[0x8000] = 0xAA
        merged[0x8001] = 0x50
        #expect(refusal(merged)?.description.contains("merged flash image") == true)
        #expect(ImageFormat.detect(merged, using: [.espAppImage]).kind == .espAppImage)
        var mergedAtZero = ESPAppImage.build(body: Self.body) + [UInt8](repeating: 0xFF, count: 0x9000)
        mergedAtZero[0x8000] = 0xAA
        mergedAtZero[0x8001] = 0x50
        #expect(refusal(mergedAtZero)?.description.contains("merged flash image") == true)
    }

    @Test func chipAndPartitionAreChecked() throws {
        let image = try ESPAppImage(bytes: ESPAppImage.build(chip: .esp32s3, body: Self.body), source: "app.bin")
        #expect(throws: ESPImageError.self) { try image.check(chip: .esp32) }
        do {
            try image.check(chip: .esp32)
        } catch {
            #expect(error.code == .incompatibleDevice)
            #expect(error.description.contains("idf.py set-target esp32"))
        }
        try image.check(chip: .esp32s3, partitionSize: 1 << 20)
        do {
            try image.check(chip: nil, partitionSize: 1024)
            Issue.record("a 1 KiB partition took the image")
        } catch {
            #expect(error.code == .imageTooLarge)
        }
        #expect(ESPChip(name: "ESP32-C3") == .esp32c3)
        #expect(ESPChip(name: "esp8266") == nil)
    }

    @Test func signatureBlocksAreTold() throws {
        let good = ESPAppImage.build(body: Self.body)
        var v2 = good + [UInt8](repeating: 0xFF, count: (4096 - good.count % 4096) % 4096)
        v2 += [0xE7, 0x02, 0, 0] + [UInt8](repeating: 0, count: 4092)
        #expect(try ESPAppImage(bytes: v2).trailer == .secureBootV2)
        #expect(try ESPAppImage(bytes: good + [UInt8](repeating: 0, count: 68)).trailer == .secureBootV1)
        #expect(try ESPAppImage(bytes: good + [1, 2, 3]).trailer == .unknown(3))
    }

    /// Every file that starts with 0xE9 is taken for an app image, damaged or not, so that auto
    /// never sends a damaged one as a raw binary; a file that does not is not.
    @Test func everyFileThatStartsWithTheMagicIsAnESPImageDamagedOrNot() {
        let damaged: [[UInt8]] = [
            [0xE9, 0x00] + [UInt8](repeating: 0, count: 40),
            [0xE9, 0x02, 0, 0] + [UInt8](repeating: 0x77, count: 40),
            [0xE9, 0x11] + [UInt8](repeating: 0, count: 40),
            [0xE9, 0x03],
        ]
        for bytes in damaged {
            let format = ImageFormat.detect(bytes, using: [.espAppImage])
            #expect(format.kind == .espAppImage, "\(bytes.prefix(4))")
            #expect(format.description.contains("damaged") || format.description.contains("shorter than its header"), "\(format.description)")
        }
        #expect(ImageFormat.detect(ESPAppImage.build(body: Self.body), using: [.espAppImage]).description == "an ESP-IDF app image (magic 0xE9)")
        #expect(ImageFormat.detect([0xEA, 0x02] + [UInt8](repeating: 0, count: 40), using: [.espAppImage]).kind == .rawBinary)
        #expect(ImageFormat.detect([0x00, 0x80, 0x00, 0x20] + [UInt8](repeating: 0, count: 40), using: [.espAppImage]).kind == .rawBinary)
    }

    /// ESP-IDF's own checks (`verify_image_header`, `verify_segment_header`, `process_segment`):
    /// each refusal says the file is a damaged app image and names the damage.
    /// The bytes set, as (offset, value): the first segment of `build(body: body)` is 3,256
    /// bytes (0x0CB8: bytes 28 and 29).
    @Test(arguments: [
        ("17 segments", [(1, 17)], "17 segments, more than ESP-IDF's limit of 16"),
        ("255 segments", [(1, 255)], "255 segments"),
        ("no segments", [(1, 0)], "no segments"),
        ("unknown chip", [(12, 0x42)], "chip id is 0x42"),
        ("SPI mode", [(2, 9)], "SPI flash mode byte is 9"),
        ("hash_appended", [(23, 7)], "hash_appended byte is 7"),
        ("revisions", [(15, 5), (16, 1), (17, 0), (18, 1)], "chip revisions 261 to 256"),
        ("unaligned length", [(28, 0xB9)], "not a whole number of 32-bit words"),
        ("past the end", [(29, 0x7F)], "runs past the end of the file"),
        ("over 16 MiB", [(31, 0x10)], "longer than 16 MiB"),
    ] as [(String, [(Int, UInt8)], String)])
    func aDamagedHeaderIsNamed(what: String, patches: [(Int, UInt8)], says: String) {
        var bytes = ESPAppImage.build(body: Self.body)
        #expect(bytes[28] == 0xB8 && bytes[29] == 0x0C)
        for (at, value) in patches { bytes[at] = value }
        let error = refusal(bytes)
        #expect(error?.code == .image, "\(what)")
        #expect(error?.description.hasPrefix("app.bin is a damaged ESP-IDF app image: ") == true, "\(what): \(error?.description ?? "taken")")
        #expect(error?.description.contains(says) == true, "\(what): \(error?.description ?? "taken")")
        #expect(ImageFormat.detect(bytes, using: [.espAppImage]).kind == .espAppImage, "\(what)")
    }

    @Test func junkAfterTheMagicIsADamagedImage() {
        var rng = SeededGenerator(seed: 32)
        var refused = 0
        for _ in 0..<500 {
            let bytes = [ESPAppImage.magic] + (0..<4000).map { _ in UInt8.random(in: 0...255, using: &rng) }
            guard let error = refusal(bytes) else {
                Issue.record("random bytes after 0xE9 were taken for an app image")
                continue
            }
            #expect(error.description.contains("damaged ESP-IDF app image"), "\(error.description)")
            refused += 1
        }
        #expect(refused == 500)
    }

    @Test func newerChipsAreKnown() {
        for (name, id) in [("esp32c5", 0x17), ("esp32c61", 0x14), ("esp32h21", 0x19), ("esp32h4", 0x1C)] as [(String, UInt16)] {
            #expect(ESPChip(name: name)?.rawValue == id)
            #expect(ESPChip(rawValue: id).isKnown)
        }
        #expect(!ESPChip(rawValue: 0x42).isKnown)
    }
}
