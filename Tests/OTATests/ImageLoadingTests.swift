import Foundation
import OTA
import OTAWire
import Testing

/// A scratch directory for files a test writes; removed when the value goes away.
final class ScratchDirectory {
    let url: URL

    init() throws {
        url = FileManager.default.temporaryDirectory.appendingPathComponent("otaflash-tests-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
    }

    deinit { try? FileManager.default.removeItem(at: url) }

    func write(_ name: String, _ bytes: [UInt8]) throws -> String {
        let path = url.appendingPathComponent(name).path
        try Data(bytes).write(to: URL(fileURLWithPath: path))
        return path
    }

    func write(_ name: String, text: String) throws -> String { try write(name, Array(text.utf8)) }
}

/// An Intel HEX record with its checksum computed here (two's complement of the byte sum).
func hexRecord(_ type: UInt8, address: UInt16, _ data: [UInt8]) -> String {
    let body: [UInt8] = [UInt8(data.count), UInt8(address >> 8), UInt8(address & 0xFF), type] + data
    let sum = body.reduce(UInt8(0)) { $0 &+ $1 }
    return ":" + (body + [0 &- sum]).map { String(format: "%02X", $0) }.joined()
}

let hexEOF = ":00000001FF"

@Suite("Image loading")
struct ImageLoadingTests {
    // MARK: Raw binaries

    @Test func binFileIsTakenByteForByte() throws {
        let dir = try ScratchDirectory()
        let bytes = testBytes(3000, seed: 6)
        let image = try FirmwareImage.load(path: try dir.write("app.bin", bytes))
        #expect(image.bytes == bytes)
        #expect(image.crc32 == CRC32.checksum(bytes))
        #expect(image.baseAddress == nil)
    }

    @Test func missingFileIsAnImageError() throws {
        let dir = try ScratchDirectory()
        let path = dir.url.appendingPathComponent("nope.bin").path
        #expect {
            try FirmwareImage.load(path: path)
        } throws: { error in
            let e = error as? ImageError
            return e?.path == path && e?.reason.contains("no such file") == true
        }
    }

    @Test func directoryIsAnImageError() throws {
        let dir = try ScratchDirectory()
        #expect {
            try FirmwareImage.load(path: dir.url.path)
        } throws: { error in
            "\(error)".contains("directory")
        }
    }

    @Test(arguments: ["empty.bin", "empty.hex"])
    func emptyFileIsAnImageError(name: String) throws {
        let dir = try ScratchDirectory()
        let path = try dir.write(name, [])
        #expect {
            try FirmwareImage.load(path: path)
        } throws: { error in
            "\(error)" == "\(path): is empty"
        }
    }

    // MARK: Intel HEX

    /// The classic example from the Intel HEX specification.
    @Test func decodesADataRecordWithItsChecksum() throws {
        let hex = Array(":0300300002337A1E\n:00000001FF\n".utf8)
        let decoded = try IntelHex.parse(hex, source: "t.hex")
        #expect(decoded.bytes == [0x02, 0x33, 0x7A])
        #expect(decoded.baseAddress == 0x0030)
    }

    @Test func hexFileDecodesToTheImageAndItsBaseAddress() throws {
        let dir = try ScratchDirectory()
        let data = testBytes(64, seed: 12)
        let text = [hexRecord(0x04, address: 0, [0x08, 0x00]),
                    hexRecord(0x00, address: 0x0000, Array(data[0..<32])),
                    hexRecord(0x00, address: 0x0020, Array(data[32..<64])),
                    hexRecord(0x05, address: 0, [0x08, 0x00, 0x00, 0xC1]),
                    hexEOF].joined(separator: "\n") + "\n"
        let image = try FirmwareImage.load(path: try dir.write("app.hex", text: text))
        #expect(image.bytes == data)
        #expect(image.baseAddress == 0x0800_0000)
        #expect(image.crc32 == CRC32.checksum(data))
    }

    @Test func crlfLineEndsAreAccepted() throws {
        let text = [hexRecord(0x00, address: 0x0100, [1, 2, 3, 4]), hexEOF].joined(separator: "\r\n") + "\r\n"
        let decoded = try IntelHex.parse(Array(text.utf8), source: "crlf.hex")
        #expect(decoded.bytes == [1, 2, 3, 4])
        #expect(decoded.baseAddress == 0x0100)
    }

    /// Classic Mac OS tools end lines with a lone CR; each still counts as one line, and a CRLF
    /// split across two chunks as one line end.
    @Test(arguments: [1, 2, 5, 4096])
    func loneCRLineEndsAreAccepted(chunk: Int) throws {
        let good = Array(([hexRecord(0x00, address: 0x0100, [1, 2, 3, 4]), hexRecord(0x00, address: 0x0104, [5]), hexEOF]
            .joined(separator: "\r") + "\r").utf8)
        let bad = Array(("\r" + hexRecord(0, address: 0, [1]) + "\r\n\r:01000100ZZ00\r" + hexEOF + "\r").utf8)
        func decode(_ text: [UInt8]) throws(ImageError) -> IntelHex.Decoded {
            var decoder = IntelHex.Decoder(source: "cr.hex")
            for start in stride(from: 0, to: text.count, by: chunk) {
                try decoder.feed(text[start..<min(start + chunk, text.count)])
            }
            return try decoder.finish()
        }
        let decoded = try decode(good)
        #expect(decoded.bytes == [1, 2, 3, 4, 5])
        #expect(decoded.baseAddress == 0x0100)
        #expect {
            try decode(bad)
        } throws: { error in
            (error as? ImageError)?.line == 4
        }
    }

    /// Lower-case digits, start address records (03 and 05, which are not image data, whatever
    /// they carry) and blank lines after the end-of-file record are all legal Intel HEX.
    @Test func lowerCaseStartAddressesAndTrailingBlankLinesAreAccepted() throws {
        let text = [hexRecord(0x03, address: 0, [0x00, 0x00, 0x01, 0x00]), hexRecord(0x02, address: 0, [0x10, 0x00]),
                    hexRecord(0x00, address: 0x0000, [0xAB, 0xCD]), hexRecord(0x05, address: 0, [0x00, 0x01, 0x00, 0x00]),
                    hexEOF].joined(separator: "\n").lowercased() + "\n\n  \n\t\n"
        let decoded = try IntelHex.parse(Array(text.utf8), source: "lower.hex")
        #expect(decoded.bytes == [0xAB, 0xCD])
        #expect(decoded.baseAddress == 0x10000)
    }

    /// Type 02 (extended segment address): the value times 16 is added to each record's address.
    @Test func extendedSegmentAddressShiftsByFourBits() throws {
        let text = [hexRecord(0x02, address: 0, [0x12, 0x34]), hexRecord(0x00, address: 0x0010, [0xAA, 0xBB]), hexEOF]
            .joined(separator: "\n")
        let decoded = try IntelHex.parse(Array(text.utf8), source: "seg.hex")
        #expect(decoded.baseAddress == 0x12340 + 0x10)
        #expect(decoded.bytes == [0xAA, 0xBB])
    }

    /// Type 04 (extended linear address): the upper 16 bits of every following address.
    @Test func extendedLinearAddressSetsTheUpperSixteenBits() throws {
        let text = [hexRecord(0x04, address: 0, [0x00, 0x01]), hexRecord(0x00, address: 0xFFFE, [1, 2]),
                    hexRecord(0x04, address: 0, [0x00, 0x02]), hexRecord(0x00, address: 0x0000, [3, 4]), hexEOF]
            .joined(separator: "\n")
        let decoded = try IntelHex.parse(Array(text.utf8), source: "lin.hex")
        #expect(decoded.baseAddress == 0x0001_FFFE)
        #expect(decoded.bytes == [1, 2, 3, 4])
    }

    @Test func gapsBetweenRecordsAreFilledWithErasedFlash() throws {
        let text = [hexRecord(0x00, address: 0x1000, [0x11, 0x22]), hexRecord(0x00, address: 0x1005, [0x33]), hexEOF]
            .joined(separator: "\n")
        let decoded = try IntelHex.parse(Array(text.utf8), source: "gap.hex")
        #expect(decoded.bytes == [0x11, 0x22, 0xFF, 0xFF, 0xFF, 0x33])
        #expect(decoded.baseAddress == 0x1000)
    }

    @Test func recordsOutOfOrderStillLandAtTheirAddresses() throws {
        let text = [hexRecord(0x00, address: 0x0004, [5, 6]), hexRecord(0x00, address: 0x0000, [1, 2, 3, 4]), hexEOF]
            .joined(separator: "\n")
        #expect(try IntelHex.parse(Array(text.utf8), source: "o.hex").bytes == [1, 2, 3, 4, 5, 6])
    }

    @Test func overlappingRecordsWithTheSameDataAreAccepted() throws {
        let text = [hexRecord(0x00, address: 0, [1, 2, 3, 4]), hexRecord(0x00, address: 2, [3, 4, 5]), hexEOF]
            .joined(separator: "\n")
        #expect(try IntelHex.parse(Array(text.utf8), source: "o.hex").bytes == [1, 2, 3, 4, 5])
    }

    @Test func overlappingRecordsWithDifferentDataAreAnError() {
        let text = [hexRecord(0x00, address: 0, [1, 2, 3, 4]), hexRecord(0x00, address: 2, [9]), hexEOF]
            .joined(separator: "\n")
        #expect {
            try IntelHex.parse(Array(text.utf8), source: "o.hex")
        } throws: { error in
            "\(error)".contains("overlap") && "\(error)".contains("0x2")
        }
    }

    static let malformed: [(name: String, lines: [String], line: Int, says: String)] = [
        ("missing EOF", [hexRecord(0, address: 0, [1, 2]), hexRecord(0, address: 2, [3])], 2, "end-of-file"),
        ("bad hex digit", [hexRecord(0, address: 0, [1, 2]), ":02000200GG01F9", hexEOF], 2, "'GG' is not a hex byte"),
        ("bad checksum", [hexRecord(0, address: 0, [1]), hexRecord(0, address: 1, [2]), ":0100020003FB", hexEOF], 3, "checksum"),
        ("no colon", ["0100000001FE", hexEOF], 1, "':'"),
        ("odd digit count", [hexRecord(0, address: 0, [1]) + "0", hexEOF], 1, "odd"),
        ("count disagrees", [":0200000001FD", hexEOF], 1, "2 data bytes"),
        ("unknown record type", [":00000006FA", hexEOF], 1, "record type"),
        ("data after EOF", [hexRecord(0, address: 0, [1]), hexEOF, hexRecord(0, address: 1, [2])], 3, "after the end-of-file"),
        ("short 04 record", [":0100000400FB", hexEOF], 1, "extended linear address"),
    ]

    /// Every malformed file names its line, so the user can open the file there.
    @Test(arguments: malformed)
    func malformedHexNamesTheLineAtFault(name: String, lines: [String], line: Int, says: String) throws {
        let dir = try ScratchDirectory()
        let path = try dir.write("bad.hex", text: lines.joined(separator: "\n") + "\n")
        #expect {
            try FirmwareImage.load(path: path)
        } throws: { error in
            guard let e = error as? ImageError else { return false }
            #expect(e.line == line, "\(name): \(e)")
            #expect(e.reason.contains(says), "\(name): \(e)")
            #expect(e.description.hasPrefix("\(path):\(line): "))
            return true
        }
    }

    @Test func lineNumbersCountBlankLinesAndCRLF() throws {
        let text = "\r\n" + hexRecord(0, address: 0, [1]) + "\r\n\r\n:01000100ZZ00\r\n" + hexEOF + "\r\n"
        #expect {
            try IntelHex.parse(Array(text.utf8), source: "x.hex")
        } throws: { error in
            (error as? ImageError)?.line == 4
        }
    }

    @Test func hexWithoutDataRecordsIsAnError() {
        #expect(throws: ImageError.self) { try IntelHex.parse(Array((hexEOF + "\n").utf8), source: "e.hex") }
    }

    /// A file whose first non-blank character is ':' is Intel HEX whatever its name.
    @Test func hexContentIsRecognisedWithoutTheExtension() throws {
        let dir = try ScratchDirectory()
        let text = "\n  " + hexRecord(0, address: 0, [0xDE, 0xAD]) + "\n" + hexEOF + "\n"
        let image = try FirmwareImage.load(path: try dir.write("firmware.img", text: text))
        #expect(image.bytes == [0xDE, 0xAD])
    }

    @Test func uppercaseHexExtensionIsIntelHex() throws {
        let dir = try ScratchDirectory()
        let text = hexRecord(0, address: 0, [7]) + "\n" + hexEOF
        #expect(try FirmwareImage.load(path: try dir.write("APP.HEX", text: text)).bytes == [7])
    }

    // MARK: Size and file type, checked before reading

    /// A sparse file of `size` bytes that starts with `start`: costs no disk and no memory.
    static func sparseFile(_ dir: ScratchDirectory, _ name: String, size: Int, start: [UInt8] = []) throws -> String {
        let path = try dir.write(name, start)
        let handle = try FileHandle(forWritingTo: URL(fileURLWithPath: path))
        try handle.truncate(atOffset: UInt64(size))
        try handle.close()
        return path
    }

    @Test(arguments: [FirmwareImage.maximumSize, FirmwareImage.maximumSize + 1])
    func rawImagesUpToTheLimitLoad(size: Int) throws {
        let dir = try ScratchDirectory()
        let path = try Self.sparseFile(dir, "big.bin", size: size, start: cortexMStart)
        if size <= FirmwareImage.maximumSize {
            let image = try FirmwareImage.load(path: path)
            #expect(image.size == size)
            #expect(Array(image.bytes.prefix(cortexMStart.count)) == cortexMStart)
        } else {
            #expect {
                try FirmwareImage.load(path: path)
            } throws: { error in
                "\(error)" == "\(path): is \(size) bytes; images over 64 MiB are not supported"
            }
        }
    }

    /// 10 GiB is refused from its size alone: nothing near that is read or allocated.
    @Test func aHugeFileIsRefusedFromItsSize() throws {
        let dir = try ScratchDirectory()
        let path = try Self.sparseFile(dir, "huge.bin", size: 10 << 30)
        let started = ContinuousClock.now
        #expect {
            try FirmwareImage.load(path: path)
        } throws: { error in
            "\(error)".hasSuffix("is 10737418240 bytes; images over 64 MiB are not supported")
        }
        #expect(ContinuousClock.now - started < .seconds(2), "reading 10 GiB takes far longer than this")
    }

    @Test func hexTextOverItsLimitIsRefusedFromItsSize() throws {
        let dir = try ScratchDirectory()
        let path = try Self.sparseFile(dir, "huge.hex", size: FirmwareImage.maximumHexTextSize + 1, start: Array(":00000001FF\n".utf8))
        #expect {
            try FirmwareImage.load(path: path)
        } throws: { error in
            "\(error)".contains("bytes of Intel HEX text; HEX files over 256 MiB (images over 64 MiB) are not supported")
        }
    }

    /// The image's span is checked as records arrive: a record 128 MiB away fails at its line.
    @Test func hexDataSpanningTooFarFailsAtItsLine() throws {
        let lines = [hexRecord(0, address: 0, [1]), hexRecord(0x04, address: 0, [0x08, 0x00]),
                     hexRecord(0, address: 0, [2]), hexRecord(0, address: 1, [3]), hexEOF]
        let dir = try ScratchDirectory()
        let path = try dir.write("far.hex", text: lines.joined(separator: "\n"))
        #expect {
            try FirmwareImage.load(path: path)
        } throws: { error in
            guard let e = error as? ImageError else { return false }
            #expect(e.line == 3)
            #expect(e.reason.contains("data spans 134217729 bytes from 0x0 to 0x8000001; images over 64 MiB are not supported"), "\(e)")
            return true
        }
    }

    @Test func aLineLongerThanAnyRecordFailsWithoutReadingOn() throws {
        let text = hexRecord(0, address: 0, [1]) + "\n:" + String(repeating: "0", count: 100_000)
        #expect {
            try IntelHex.parse(Array(text.utf8), source: "long.hex")
        } throws: { error in
            let e = error as? ImageError
            return e?.line == 2 && e?.reason.contains("longer than any Intel HEX record") == true
        }
    }

    /// Fed in chunks of any size, the decoder gives what it gives for the whole text.
    @Test(arguments: [1, 2, 3, 11, 44, 45, 46, 4096])
    func hexFedInChunksDecodesTheSame(chunk: Int) throws {
        let data = testBytes(300, seed: 9)
        var lines = [hexRecord(0x04, address: 0, [0x00, 0x01])]
        for start in stride(from: 0, to: data.count, by: 16) {
            lines.append(hexRecord(0, address: UInt16(0x100 + start), Array(data[start..<min(start + 16, data.count)])))
        }
        let text = Array((lines + [hexEOF]).joined(separator: "\r\n").utf8)
        var decoder = IntelHex.Decoder(source: "c.hex")
        for start in stride(from: 0, to: text.count, by: chunk) {
            try decoder.feed(text[start..<min(start + chunk, text.count)])
        }
        let decoded = try decoder.finish()
        #expect(decoded.bytes == data)
        #expect(decoded.baseAddress == 0x0001_0100)
    }

    @Test func aByteOrderMarkBeforeHexIsSkipped() throws {
        let dir = try ScratchDirectory()
        let path = try dir.write("bom.hex", [0xEF, 0xBB, 0xBF] + Array((hexRecord(0, address: 0, [5]) + "\n" + hexEOF).utf8))
        #expect(try FirmwareImage.load(path: path).bytes == [5])
    }

    /// A FIFO or a device is refused from its type: nothing waits for a writer or reads for ever.
    @Test func aFIFOIsRefusedWithoutWaitingForAWriter() throws {
        let dir = try ScratchDirectory()
        let path = dir.url.appendingPathComponent("pipe.bin").path
        try #require(mkfifo(path, 0o600) == 0)
        #expect {
            try FirmwareImage.load(path: path)
        } throws: { error in
            "\(error)" == "\(path): is a pipe (FIFO), not a regular file; save the image to a file and pass that"
        }
    }

    @Test(arguments: ["/dev/zero", "/dev/null", "/dev/urandom"])
    func aDeviceIsRefused(path: String) throws {
        #expect {
            try FirmwareImage.load(path: path)
        } throws: { error in
            "\(error)" == "\(path): is a character device, not a regular file; pass a firmware file"
        }
    }

    @Test(.enabled(if: geteuid() != 0, "root reads any file: this test needs an unprivileged user"))
    func aFileThatCannotBeReadSaysSo() throws {
        let dir = try ScratchDirectory()
        let path = try dir.write("locked.bin", [1, 2, 3])
        try #require(chmod(path, 0) == 0)
        #expect {
            try FirmwareImage.load(path: path)
        } throws: { error in
            "\(error)".contains("permission denied")
        }
    }
}

