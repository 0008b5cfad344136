import Foundation
import OTA
import OTAWire
import Testing

/// A zip archive with stored (uncompressed) entries: local headers, then the central directory,
/// then the end record (APPNOTE.TXT 4.3).
func zipArchive(_ entries: [(name: String, data: [UInt8])]) -> [UInt8] {
    func le16(_ v: Int) -> [UInt8] { [UInt8(v & 0xFF), UInt8(v >> 8 & 0xFF)] }
    func le32(_ v: Int) -> [UInt8] { le16(v & 0xFFFF) + le16(v >> 16 & 0xFFFF) }
    var out: [UInt8] = []
    var directory: [UInt8] = []
    for entry in entries {
        let name = Array(entry.name.utf8)
        let crc = Int(CRC32.checksum(entry.data))
        let common = le16(20) + le16(0) + le16(0) + le16(0) + le16(0) + le32(crc) + le32(entry.data.count) + le32(entry.data.count)
            + le16(name.count) + le16(0)
        directory += [0x50, 0x4B, 0x01, 0x02] + le16(20) + common + le16(0) + le16(0) + le16(0) + le32(0) + le32(out.count) + name
        out += [0x50, 0x4B, 0x03, 0x04] + common + name + entry.data
    }
    let directoryOffset = out.count
    out += directory
    out += [0x50, 0x4B, 0x05, 0x06] + le16(0) + le16(0) + le16(entries.count) + le16(entries.count)
        + le32(directory.count) + le32(directoryOffset) + le16(0)
    return out
}

/// A Cortex-M vector table (initial SP 0x20020000, reset handler 0x080000A9), as a raw image starts.
let cortexMStart: [UInt8] = [0x00, 0x00, 0x02, 0x20, 0xA9, 0x00, 0x00, 0x08] + [UInt8](repeating: 0, count: 56)

@Suite("Image format detection")
struct ImageFormatTests {
    static let manifest = Array(#"{"manifest":{"application":{"bin_file":"app.bin","dat_file":"app.dat"}}}"#.utf8)

    static let cases: [(name: String, bytes: [UInt8], kind: ImageFormat.Kind)] = [
        ("Cortex-M vector table", cortexMStart, .rawBinary),
        ("a single byte", [0x42], .rawBinary),
        ("ELF (little-endian executable)", [0x7F, 0x45, 0x4C, 0x46, 1, 1, 1, 0] + [UInt8](repeating: 0, count: 8) + [2, 0, 0x28, 0], .elf),
        ("ELF magic alone", [0x7F, 0x45, 0x4C, 0x46], .elf),
        ("zip", zipArchive([("app.bin", [1, 2, 3])]), .zip),
        ("empty zip", [0x50, 0x4B, 0x05, 0x06] + [UInt8](repeating: 0, count: 18), .zip),
        // A protocol's own format is its module's detector's to find (NordicDFUTests, SMPTests):
        // without it, a Nordic package is a zip and an MCUboot image a raw binary.
        ("a zip with manifest.json, no detector given", zipArchive([("manifest.json", manifest), ("app.bin", [1, 2]), ("app.dat", [3])]), .zip),
        ("MCUboot's magic, no detector given", [0x3D, 0xB8, 0xF3, 0x96, 0, 0, 0, 0, 0x20, 0, 0, 0] + [UInt8](repeating: 0, count: 20), .rawBinary),
        ("MCUboot magic big-endian is not MCUboot", [0x96, 0xF3, 0xB8, 0x3D, 0, 0, 0, 0], .rawBinary),
        ("UF2", Array("UF2\n".utf8) + [0x57, 0x51, 0x5D, 0x9E] + [UInt8](repeating: 0, count: 24), .uf2),
        ("UF2 first magic alone", Array("UF2\n".utf8) + [0, 0, 0, 0], .rawBinary),
        ("gzip", [0x1F, 0x8B, 0x08, 0x00, 0, 0, 0, 0, 0, 3], .gzip),
        ("bzip2", Array("BZh9".utf8) + [0x31, 0x41, 0x59, 0x26], .bzip2),
        ("xz", [0xFD, 0x37, 0x7A, 0x58, 0x5A, 0x00, 0x00, 0x04], .xz),
        ("zstd", [0x28, 0xB5, 0x2F, 0xFD, 0x24, 0x00], .zstd),
        ("tar", [UInt8](repeating: 0x41, count: 257) + Array("ustar\u{0}00".utf8) + [UInt8](repeating: 0, count: 248), .tar),
        ("Intel HEX", Array((hexRecord(0, address: 0, [1, 2]) + "\n" + hexEOF + "\n").utf8), .intelHex),
        ("Intel HEX after blank lines and a byte-order mark", [0xEF, 0xBB, 0xBF] + Array("\r\n  \t:00000001FF\n".utf8), .intelHex),
        ("S-record", Array("S00F000068656C6C6F202020202000003C\n".utf8), .srecord),
        ("S followed by text is not an S-record", Array("Sensor firmware".utf8), .rawBinary),
    ]

    @Test(arguments: cases)
    func recognisesAFileFromItsBytes(name: String, bytes: [UInt8], kind: ImageFormat.Kind) {
        #expect(ImageFormat.detect(bytes).kind == kind, "\(name)")
    }

    @Test func onlyRawBinariesAndIntelHexAreFirmwareImages() {
        let sendable = Self.cases.filter { ImageFormat.detect($0.bytes).isFirmwareImage }.map(\.kind)
        #expect(Set(sendable) == [.rawBinary, .intelHex])
    }

    /// An archive's names come from the central directory at the end even when the local headers
    /// at the start do not show them (nrfutil may write manifest.json anywhere).
    @Test func aZipsEntriesAreFoundFromTheCentralDirectory() {
        let big = [UInt8](repeating: 0xAB, count: ImageFormat.headSize * 2)
        let zip = zipArchive([("app.bin", big), ("app.dat", [1]), ("manifest.json", Self.manifest)])
        let head = Array(zip.prefix(ImageFormat.headSize)), tail = Array(zip.suffix(1024))
        let format = ImageFormat.detect(head: head, tail: tail)
        #expect(format.kind == .zip)
        #expect(format.entries == ["app.bin", "app.dat", "manifest.json"])
    }

    /// Without the end record (a truncated download), the local headers in the head still name
    /// what they can.
    @Test func localHeadersNameTheEntriesWhenTheEndIsMissing() {
        let zip = zipArchive([("manifest.json", Self.manifest), ("app.bin", [1, 2, 3])])
        let truncated = Array(zip.prefix(zip.count - 22 - 2 * 46 - 20))
        let format = ImageFormat.detect(truncated)
        #expect(format.kind == .zip)
        #expect(format.entries.first == "manifest.json")
    }

    // MARK: Refusals: one line naming the file, what it is and what to do

    static func refusal(_ name: String, _ bytes: [UInt8]) throws -> ImageError? {
        let dir = try ScratchDirectory()
        let path = try dir.write(name, bytes)
        do {
            _ = try FirmwareImage.load(path: path)
            return nil
        } catch {
            #expect(error.path == path)
            #expect(error.description.hasPrefix("\(path): is "), "\(error)")
            #expect(!error.description.contains("\n"), "\(error)")
            return error
        }
    }

    static let refusals: [(file: String, bytes: [UInt8], kind: ImageFormat.Kind, says: [String])] = [
        ("app.elf", cases[2].bytes, .elf, ["is an ELF executable, not a firmware image", "`arm-none-eabi-objcopy -O binary app.elf app.bin`", "-O ihex"]),
        ("bundle.zip", zipArchive([("readme.txt", [1]), ("fw/app.bin", [2])]), .zip, ["is a zip archive, not a firmware image", "`unzip bundle.zip`", "pass fw/app.bin"]),
        ("app_package.zip", zipArchive([("app.bin", [1]), ("app.dat", [2])]), .zip, ["is a zip archive, not a firmware image", "pass app.bin"]),
        ("app.uf2", cases[9].bytes, .uf2, ["UF2 file", "uf2conv.py app.uf2 --convert --output app.bin"]),
        ("app.bin.gz", cases[11].bytes, .gzip, ["gzip-compressed", "gunzip -k app.bin.gz"]),
        ("fw.tar.gz", cases[11].bytes, .gzip, ["gzip-compressed", "tar xzf fw.tar.gz"]),
        ("fw.tar", cases[15].bytes, .tar, ["tar archive", "tar xf fw.tar"]),
        ("app.srec", cases[18].bytes, .srecord, ["S-record", "objcopy -I srec -O binary app.srec app.bin"]),
        ("app.xz", cases[13].bytes, .xz, ["xz-compressed", "unxz -k app.xz"]),
        ("app.hex", cortexMStart, .rawBinary, ["is named like Intel HEX but is not HEX text", "00 00 02 20 a9 00 00 08"]),
        ("app.hex", cases[2].bytes, .elf, ["is an ELF executable"]),
    ]

    @Test(arguments: refusals)
    func aFileThatIsNotAnImageIsRefusedWithWhatToDo(file: String, bytes: [UInt8], kind: ImageFormat.Kind, says: [String]) throws {
        let error = try #require(try Self.refusal(file, bytes), "\(file) was accepted")
        #expect(error.format == kind)
        for phrase in says { #expect(error.reason.contains(phrase), "\(error)") }
    }

    // MARK: Real files

    @Test func aRealELFExecutableIsRefused() throws {
        let elf = "/bin/true"
        let bytes = [UInt8](try #require(FileManager.default.contents(atPath: elf)))
        #expect(ImageFormat.detect(bytes).kind == .elf)
        let error = try #require(try Self.refusal("true", bytes))
        #expect(error.reason.hasPrefix("is an ELF executable, not a firmware image; convert it with `arm-none-eabi-objcopy -O binary true true.bin`"), "\(error)")
    }

    /// A zip made by Python's zipfile (deflated entries, the usual tool output); with a manifest
    /// and no detector given, still a zip (NordicDFUTests has the package's).
    @Test(arguments: [false, true])
    func aRealZipIsRefused(withManifest: Bool) throws {
        let dir = try ScratchDirectory()
        let files = [try dir.write("app.bin", testBytes(5000, seed: 3))]
            + (withManifest ? [try dir.write("manifest.json", Self.manifest)] : [])
        let zip = dir.url.appendingPathComponent("package.zip").path
        let python = Process()
        python.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        python.arguments = ["python3", "-m", "zipfile", "-c", zip] + files
        try python.run()
        python.waitUntilExit()
        try #require(python.terminationStatus == 0, "python3 -m zipfile failed (python3 is a test dependency)")
        #expect {
            try FirmwareImage.load(path: zip)
        } throws: { error in
            let e = error as? ImageError
            #expect(e?.format == .zip, "\(error)")
            #expect(e?.reason.contains("pass app.bin") == true, "\(error)")
            return e != nil
        }
    }
}
