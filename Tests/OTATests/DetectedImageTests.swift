import Foundation
import OTA
import OTAWire
import Testing

/// `FirmwareImage.read`: a file read once, handed over as a value when a detector claims it, and
/// the file hints protocols register in place of the generic refusal.
@Suite("Detected images")
struct DetectedImageTests {
    static let widget = ImageFormat.Kind("widget")
    static let magic: [UInt8] = Array("WDGT".utf8)

    /// A protocol's format for these tests: files that start with "WDGT", at most `limit` bytes.
    static func detector(limit: ImageFormat.SizeLimit = .images, inIntelHex: Bool = false) -> ImageFormat.Detector {
        ImageFormat.Detector(kind: widget, inIntelHex: inIntelHex, detect: { head, _ in
            ImageFormat.Detector.starts(head, magic) ? ImageFormat(widget, "a widget image", limit: limit) : nil
        }, refusal: { format, name in "is \(format.description), which only widgets take (\(name))" })
    }

    @Test func aClaimedFileIsAValueWithItsBytesAndNeedsNoFile() throws {
        let dir = try ScratchDirectory()
        let bytes = Self.magic + testBytes(200_000, seed: 7)
        let path = try dir.write("app.wdgt", bytes)
        guard case .claimed(let claimed) = try FirmwareImage.read(path: path, detecting: [Self.detector()]) else {
            Issue.record("not claimed")
            return
        }
        #expect(claimed.path == path)
        #expect(claimed.format.kind == Self.widget)
        #expect(claimed.format.description == "a widget image")
        #expect(claimed.head == Array(bytes.prefix(ImageFormat.headSize)))
        #expect(claimed.baseAddress == nil)
        try FileManager.default.removeItem(atPath: path)
        #expect(try claimed.bytes() == bytes)
        let firmware = try claimed.firmware()
        #expect(firmware.bytes == bytes && firmware.source == path && firmware.crc32 == CRC32.checksum(bytes))
    }

    @Test func aRawBinaryIsAnImage() throws {
        let dir = try ScratchDirectory()
        let bytes = testBytes(5000, seed: 2)
        let path = try dir.write("app.bin", bytes)
        guard case .firmware(let image) = try FirmwareImage.read(path: path, detecting: [Self.detector()]) else {
            Issue.record("claimed")
            return
        }
        #expect(image.bytes == bytes)
    }

    /// Intel HEX text holding the format: the value carries the decoded bytes and their address.
    @Test func intelHexHoldingAClaimedFormatIsHandedOverDecoded() throws {
        let dir = try ScratchDirectory()
        let data = Self.magic + [1, 2, 3, 4]
        let path = try dir.write("app.hex", Array((hexRecord(0x0004, address: 0, [0x08, 0x00]) + "\n" + hexRecord(0, address: 0x1000, data) + "\n" + hexEOF + "\n").utf8))
        guard case .claimed(let claimed) = try FirmwareImage.read(path: path, detecting: [Self.detector(inIntelHex: true)]) else {
            Issue.record("not claimed")
            return
        }
        #expect(claimed.format.description == "Intel HEX text holding a widget image")
        #expect(try claimed.bytes() == data)
        #expect(claimed.baseAddress == 0x0800_1000)
        #expect(claimed.head.first == UInt8(ascii: ":"))
        // `load` refuses it unless accepted, and reads it as before when accepted.
        #expect(throws: ImageError.self) { try FirmwareImage.load(path: path, detecting: [Self.detector(inIntelHex: true)]) }
        let accepted = try FirmwareImage.load(path: path, accepting: [Self.widget], detecting: [Self.detector(inIntelHex: true)])
        #expect(accepted.bytes == data && accepted.baseAddress == 0x0800_1000)
    }

    /// A claimed file over its format's limit is not read: the refusal comes when its bytes are
    /// asked for, in the limit's words.
    @Test func aClaimedFileOverItsFormatsLimitIsRefusedWhenItsBytesAreAskedFor() throws {
        let dir = try ScratchDirectory()
        let limit = ImageFormat.SizeLimit(bytes: 1 << 20, what: "widgets")
        let path = try dir.write("big.wdgt", Self.magic + [UInt8](repeating: 0, count: (1 << 20) - 3))
        guard case .claimed(let claimed) = try FirmwareImage.read(path: path, detecting: [Self.detector(limit: limit)]) else {
            Issue.record("not claimed")
            return
        }
        #expect {
            try claimed.bytes()
        } throws: { error in
            "\(error)" == "\(path): is \((1 << 20) + 1) bytes; widgets over 1 MiB are not supported"
        }
        // At the limit it is read whole.
        let atLimit = try dir.write("limit.wdgt", Self.magic + [UInt8](repeating: 0, count: (1 << 20) - 4))
        guard case .claimed(let whole) = try FirmwareImage.read(path: atLimit, detecting: [Self.detector(limit: limit)]) else {
            Issue.record("not claimed")
            return
        }
        #expect(try whole.bytes().count == 1 << 20)
    }

    /// A registered hint replaces the generic refusal of a file it knows; the first that knows
    /// the file speaks, and a file none knows gets the generic line.
    @Test func aHintReplacesTheGenericRefusal() throws {
        let dir = try ScratchDirectory()
        let path = try dir.write("app.elf", [0x7F, 0x45, 0x4C, 0x46, 1, 1, 1, 0] + [UInt8](repeating: 0, count: 8) + [2, 0, 0x28, 0])
        let knowsELF = ImageFormat.Hint { format, head, name in
            format.kind == .elf && head.count >= 20 ? "is \(format.description) of ours; pass build/\(ImageFormat.baseName(of: name)).bin" : nil
        }
        let knowsNothing = ImageFormat.Hint { _, _, _ in nil }
        func reason(_ hints: [ImageFormat.Hint]) -> String? {
            do {
                _ = try FirmwareImage.read(path: path, hints: hints)
                return nil
            } catch {
                #expect(error.format == .elf)
                return error.reason
            }
        }
        #expect(reason([knowsNothing, knowsELF]) == "is an ELF executable of ours; pass build/app.bin")
        #expect(reason([knowsNothing])?.hasPrefix("is an ELF executable, not a firmware image; convert it with `arm-none-eabi-objcopy") == true)
        #expect(reason([])?.hasPrefix("is an ELF executable, not a firmware image; convert it with `arm-none-eabi-objcopy") == true)
    }

    @Test(arguments: [("app.elf", "app"), ("build/blink.elf", "build/blink"), (".elf", ".elf"), ("fw.tar.gz", "fw.tar"), ("noext", "noext")])
    func aFilesBaseNameDropsItsLastExtension(name: String, base: String) {
        #expect(ImageFormat.baseName(of: name) == base)
    }

    @Test func elfHeaderFieldsFollowTheFilesByteOrder() {
        var little: [UInt8] = [0x7F, 0x45, 0x4C, 0x46, 1, 1, 1] + [UInt8](repeating: 0, count: 13)
        little[16] = 2
        little[18] = 94
        #expect(ImageFormat.elfHeader(little)?.type == 2 && ImageFormat.elfHeader(little)?.machine == 94)
        var big = little
        big[5] = 2
        big[16] = 0; big[17] = 3
        big[18] = 0; big[19] = 94
        #expect(ImageFormat.elfHeader(big)?.type == 3 && ImageFormat.elfHeader(big)?.machine == 94)
        #expect(ImageFormat.elfHeader(Array(little.prefix(18)))?.machine == 0)
        #expect(ImageFormat.elfHeader(Array(little.prefix(17))) == nil)
    }
}
