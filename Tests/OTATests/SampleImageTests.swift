import Foundation
import OTA
import OTAWire
import Testing

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
