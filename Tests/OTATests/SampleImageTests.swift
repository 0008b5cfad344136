import Foundation
import OTA
import OTAWire
import Testing

/// The committed sample images and their manifest.
enum Samples {
    struct Entry: Decodable, Sendable, CustomTestStringConvertible {
        let file: String
        let format: String
        let size: Int
        let crc32: String
        let base_address: String?
        var testDescription: String { file }
    }

    struct Manifest: Decodable {
        let version: Int
        let files: [Entry]
    }

    /// The repository root, three levels above this file (Tests/OTATests/<file>).
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
    static let directory = root.appendingPathComponent("firmware-samples")

    static func path(_ file: String) -> String { directory.appendingPathComponent(file).path }

    /// The manifest's entries; empty (and the tests using them fail) when it cannot be read.
    static let entries: [Entry] = {
        guard let data = FileManager.default.contents(atPath: path("manifest.json")),
              let manifest = try? JSONDecoder().decode(Manifest.self, from: data) else { return [] }
        return manifest.files
    }()
}

@Suite("Sample images")
struct SampleImageTests {
    @Test func manifestListsEverySample() throws {
        let data = try #require(FileManager.default.contents(atPath: Samples.path("manifest.json")),
                                "firmware-samples/manifest.json not found under \(Samples.root.path)")
        let manifest = try JSONDecoder().decode(Samples.Manifest.self, from: data)
        #expect(manifest.version == 1)
        #expect(Set(manifest.files.map(\.file)) == ["blinky-cortex-m4.bin", "blinky-cortex-m4.hex", "seeded-4k.bin",
                                                    "seeded-256k.bin", "seeded-1m.bin", "seeded-256k.hex"])
    }

    @Test(arguments: Samples.entries)
    func sampleDecodesToTheManifestSizeAndCRC(entry: Samples.Entry) throws {
        let image = try FirmwareImage.load(path: Samples.path(entry.file))
        #expect(image.size == entry.size)
        #expect(hex32(image.crc32) == entry.crc32)
        #expect(image.crc32 == CRC32.checksum(image.bytes))
        if let base = entry.base_address {
            #expect(image.baseAddress.map { String(format: "0x%08x", $0) } == base)
        } else {
            #expect(image.baseAddress == nil)
        }
    }

    @Test(arguments: [("blinky-cortex-m4.hex", "blinky-cortex-m4.bin"), ("seeded-256k.hex", "seeded-256k.bin")])
    func hexSampleDecodesToTheSameBytesAsItsBinary(hex: String, bin: String) throws {
        let fromHex = try FirmwareImage.load(path: Samples.path(hex))
        let fromBin = try FirmwareImage.load(path: Samples.path(bin))
        #expect(fromHex.bytes == fromBin.bytes)
    }

    /// The blinky image is real Cortex-M4 firmware: its vector table starts with the initial stack
    /// pointer at the top of RAM and an odd (Thumb) reset vector, and "1.0.0" sits at 0x40.
    @Test func blinkyImageHasAVectorTableAndItsVersionString() throws {
        let bytes = try FirmwareImage.load(path: Samples.path("blinky-cortex-m4.hex")).bytes
        let word = { (i: Int) in UInt32(bytes[i]) | UInt32(bytes[i + 1]) << 8 | UInt32(bytes[i + 2]) << 16 | UInt32(bytes[i + 3]) << 24 }
        #expect(word(0) == 0x2002_0000)
        #expect(word(4) & 1 == 1)
        #expect(Array(bytes[0x40..<0x45]) == Array("1.0.0".utf8))
    }
}
