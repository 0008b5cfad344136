import Foundation
import OTAWire

/// A firmware image ready to send: its bytes, whole-image CRC32 and where it came from.
///
/// The bytes are held once and shared (copy-on-write), so many sessions can send the same image
/// without copying it.
public struct FirmwareImage: Sendable {
    public let bytes: [UInt8]
    public let crc32: UInt32
    /// The file it was read from, for messages.
    public let source: String
    /// For Intel HEX: the address of the first byte.
    public let baseAddress: UInt32?

    public init(bytes: [UInt8], source: String = "<memory>", baseAddress: UInt32? = nil) {
        self.bytes = bytes
        self.crc32 = CRC32.checksum(bytes)
        self.source = source
        self.baseAddress = baseAddress
    }

    public var size: Int { bytes.count }

    /// Images larger than this are refused before anything is allocated for them.
    public static let maximumSize = 64 << 20

    /// Reads a `.bin` (raw) or `.hex` (Intel HEX) file; the format follows the extension, and
    /// a file whose first non-blank character is `:` is read as HEX whatever its name.
    public static func load(path: String) throws(ImageError) -> FirmwareImage {
        var isDirectory: ObjCBool = false
        guard FileManager.default.fileExists(atPath: path, isDirectory: &isDirectory) else {
            throw ImageError(path, "no such file")
        }
        guard !isDirectory.boolValue else { throw ImageError(path, "is a directory, not a firmware image") }
        guard let data = FileManager.default.contents(atPath: path) else {
            throw ImageError(path, "cannot be read (check its permissions)")
        }
        guard !data.isEmpty else { throw ImageError(path, "is empty") }
        guard data.count <= maximumSize * 3 else {
            throw ImageError(path, "is \(data.count) bytes; images over \(maximumSize >> 20) MiB are not supported")
        }
        let bytes = [UInt8](data)
        let lower = path.lowercased()
        let looksHex = lower.hasSuffix(".hex") || lower.hasSuffix(".ihex")
            || bytes.first(where: { !($0 == 0x20 || $0 == 0x09 || $0 == 0x0A || $0 == 0x0D) }) == UInt8(ascii: ":")
        if looksHex {
            let hex = try IntelHex.parse(bytes, source: path)
            return FirmwareImage(bytes: hex.bytes, source: path, baseAddress: hex.baseAddress)
        }
        guard bytes.count <= maximumSize else {
            throw ImageError(path, "is \(bytes.count) bytes; images over \(maximumSize >> 20) MiB are not supported")
        }
        return FirmwareImage(bytes: bytes, source: path)
    }
}

/// A firmware file that cannot be used, with the line at fault for text formats.
public struct ImageError: Error, Sendable, Hashable, CustomStringConvertible {
    public let path: String
    public let line: Int?
    public let reason: String

    public init(_ path: String, line: Int? = nil, _ reason: String) {
        self.path = path
        self.line = line
        self.reason = reason
    }

    public var description: String {
        if let line { return "\(path):\(line): \(reason)" }
        return "\(path): \(reason)"
    }
}

/// Intel HEX (the 32-bit "I32HEX" form: record types 00–05).
///
/// The image runs from the lowest data address to the highest; gaps are filled with 0xFF, the
/// value of erased flash. Overlapping records that disagree are an error.
public enum IntelHex {
    public struct Decoded: Sendable {
        public let bytes: [UInt8]
        public let baseAddress: UInt32
    }

    public static func parse(_ text: [UInt8], source: String) throws(ImageError) -> Decoded {
        var segments: [(address: UInt32, bytes: [UInt8])] = []
        var upper: UInt32 = 0  // from type 02 or 04 records
        var sawEOF = false
        var lineNumber = 0
        var index = 0
        while index < text.count {
            var end = index
            while end < text.count, text[end] != 0x0A { end += 1 }
            lineNumber += 1
            var line = text[index..<end]
            index = end + 1
            while let last = line.last, last == 0x0D || last == 0x20 || last == 0x09 { line = line.dropLast() }
            while let first = line.first, first == 0x20 || first == 0x09 { line = line.dropFirst() }
            if line.isEmpty { continue }
            func fail(_ reason: String) -> ImageError { ImageError(source, line: lineNumber, reason) }
            if sawEOF { throw fail("data after the end-of-file record") }
            guard line.first == UInt8(ascii: ":") else { throw fail("a record must start with ':'") }
            let hex = line.dropFirst()
            guard hex.count >= 10, hex.count % 2 == 0 else { throw fail("record is too short or has an odd number of hex digits") }
            var record: [UInt8] = []
            record.reserveCapacity(hex.count / 2)
            var i = hex.startIndex
            while i < hex.endIndex {
                guard let hi = nibble(hex[i]), let lo = nibble(hex[i + 1]) else {
                    throw fail("'\(String(decoding: hex[i...(i + 1)], as: UTF8.self))' is not a hex byte")
                }
                record.append(hi << 4 | lo)
                i += 2
            }
            let count = Int(record[0])
            guard record.count == count + 5 else {
                throw fail("record says \(count) data bytes but has \(record.count - 5)")
            }
            let sum = record.reduce(UInt8(0)) { $0 &+ $1 }
            guard sum == 0 else {
                let expected = 0 &- record.dropLast().reduce(UInt8(0)) { $0 &+ $1 }
                throw fail("checksum mismatch: record has 0x\(hex2(record.last!)), expected 0x\(hex2(expected))")
            }
            let offset = UInt32(record[1]) << 8 | UInt32(record[2])
            let data = Array(record[4..<(4 + count)])
            switch record[3] {
            case 0x00:
                guard !data.isEmpty else { continue }
                let address = upper &+ offset
                guard UInt64(address) + UInt64(data.count) <= 1 << 32 else { throw fail("data runs past the 4 GiB address space") }
                if let last = segments.last, last.address &+ UInt32(last.bytes.count) == address {
                    segments[segments.count - 1].bytes.append(contentsOf: data)
                } else {
                    segments.append((address, data))
                }
            case 0x01:
                sawEOF = true
            case 0x02:
                guard count == 2 else { throw fail("extended segment address record must carry 2 bytes") }
                upper = (UInt32(data[0]) << 8 | UInt32(data[1])) << 4
            case 0x04:
                guard count == 2 else { throw fail("extended linear address record must carry 2 bytes") }
                upper = (UInt32(data[0]) << 8 | UInt32(data[1])) << 16
            case 0x03, 0x05:
                break  // start address: not part of the image
            default:
                throw fail("unknown record type 0x\(hex2(record[3]))")
            }
        }
        guard sawEOF else {
            throw ImageError(source, line: lineNumber, "no end-of-file record (:00000001FF); is the file truncated?")
        }
        guard !segments.isEmpty else { throw ImageError(source, "contains no data records") }
        let low = segments.map(\.address).min()!
        let high = segments.map { UInt64($0.address) + UInt64($0.bytes.count) }.max()!
        let span = high - UInt64(low)
        guard span <= UInt64(FirmwareImage.maximumSize) else {
            throw ImageError(source, "data spans \(span) bytes from 0x\(String(low, radix: 16)); images over \(FirmwareImage.maximumSize >> 20) MiB are not supported")
        }
        var image = [UInt8](repeating: 0xFF, count: Int(span))
        var written = [Bool](repeating: false, count: Int(span))
        for segment in segments {
            let start = Int(segment.address - low)
            for (k, byte) in segment.bytes.enumerated() {
                if written[start + k], image[start + k] != byte {
                    throw ImageError(source, "records overlap with different data at address 0x\(String(segment.address + UInt32(k), radix: 16))")
                }
                image[start + k] = byte
                written[start + k] = true
            }
        }
        return Decoded(bytes: image, baseAddress: low)
    }

    private static func nibble(_ c: UInt8) -> UInt8? {
        switch c {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): c - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): c - UInt8(ascii: "a") + 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): c - UInt8(ascii: "A") + 10
        default: nil
        }
    }

    private static func hex2(_ b: UInt8) -> String {
        (b < 16 ? "0" : "") + String(b, radix: 16).uppercased()
    }
}
