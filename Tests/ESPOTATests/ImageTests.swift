import Crypto
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
        #expect(refusal(segments)?.description.contains("0 segments") == true)
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

    @Test func rawBinariesAreNotTakenForESPImages() {
        #expect(ImageFormat.detect([0xE9, 0x00] + [UInt8](repeating: 0, count: 40), using: [.espAppImage]).kind == .rawBinary)
        #expect(ImageFormat.detect([0xE9, 0x02, 0, 0] + [UInt8](repeating: 0x77, count: 40), using: [.espAppImage]).kind == .rawBinary)
    }
}
