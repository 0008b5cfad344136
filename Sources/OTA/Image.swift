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
    /// Intel HEX text larger than this is refused before it is read: a 16-byte record costs 44
    /// characters (45 with CRLF) for 16 bytes, about 2.8 times the image, and shorter records cost
    /// more.
    public static let maximumHexTextSize = 4 * maximumSize

    /// Reads a firmware file: Intel HEX when its content is HEX text (whatever its name), a raw
    /// binary otherwise; a file in a format of the detectors' is refused with its detector's line
    /// unless `accepted`, when it is read like a raw binary (`read` hands it over instead).
    ///
    /// The size is checked before anything is read, and reads are bounded, so a huge file, a
    /// growing one or a device node costs no more than the limits. Files that are something else
    /// (ELF, zip, UF2, S-record, compressed or tar archives, a protocol's own format) are refused
    /// with what to do instead; `ImageError.format` says which.
    ///
    /// - Parameters:
    ///   - accepted: formats read byte for byte like a raw binary instead of refused (the
    ///     protocol that sends them checks them itself); Intel HEX holding one of them is then
    ///     decoded and returned.
    ///   - detectors: protocols' own formats (`ImageFormat.Detector`), recognised and refused
    ///     with their own line unless `accepted`.
    ///   - hints: protocols' words on files they know but do not send (`ImageFormat.Hint`).
    public static func load(path: String, accepting accepted: Set<ImageFormat.Kind> = [],
                            detecting detectors: [ImageFormat.Detector] = [],
                            hints: [ImageFormat.Hint] = []) throws(ImageError) -> FirmwareImage {
        switch try read(path: path, accepting: accepted, detecting: detectors, hints: hints, refusingClaimed: true) {
        case .firmware(let image):
            return image
        case .claimed(let claimed) where accepted.contains(claimed.format.kind):
            return try claimed.firmware()
        case .claimed(let claimed):
            throw ImageError(path, refusal(for: claimed.format, path: path, detectors: detectors), format: claimed.format.kind)
        }
    }

    /// Reads a firmware file once and says what it is: a raw binary or Intel HEX image (decoded),
    /// ready to send, or a file one of `detectors` claims (Intel HEX text holding such a format
    /// included), handed over with the bytes read so that its protocol's loader need not open it
    /// again.
    ///
    /// A claimed file is read whole up to its format's `limit`; a larger one is refused when its
    /// bytes are asked for (`ClaimedImage.bytes()`), so that its loader says first what it says
    /// of every file of that format. Other formats are refused as `load` refuses them, unless
    /// `accepted` (then read like a raw binary).
    ///
    /// - Throws: `ImageError` for a file that cannot be read, is empty, is too large, is HEX text
    ///   that does not decode, or is a format no detector claims and `accepted` lacks.
    public static func read(path: String, accepting accepted: Set<ImageFormat.Kind> = [],
                            detecting detectors: [ImageFormat.Detector] = [],
                            hints: [ImageFormat.Hint] = []) throws(ImageError) -> DetectedImage {
        try read(path: path, accepting: accepted, detecting: detectors, hints: hints, refusingClaimed: false)
    }

    /// `read`; with `refusingClaimed` (`load`), a file a detector claims and `accepted` lacks is
    /// refused from its head and tail, without reading the rest of it.
    private static func read(path: String, accepting accepted: Set<ImageFormat.Kind>, detecting detectors: [ImageFormat.Detector],
                             hints: [ImageFormat.Hint], refusingClaimed: Bool) throws(ImageError) -> DetectedImage {
        let file = try ImageFile(path)
        defer { file.close() }
        let head = try file.read(upTo: ImageFormat.headSize)
        guard !head.isEmpty else { throw ImageError(path, "is empty") }
        let tail = file.size > head.count ? try file.readTail(ImageFormat.tailSize) : head
        let format = ImageFormat.detect(head: head, tail: tail, using: detectors)
        if detectors.contains(where: { $0.kind == format.kind }) {
            if refusingClaimed, !accepted.contains(format.kind) {
                throw ImageError(path, refusal(for: format, path: path, detectors: detectors), format: format.kind)
            }
            return .claimed(try ClaimedImage(path: path, format: format, file: file, head: head))
        }
        let lower = path.lowercased()
        let namedHex = lower.hasSuffix(".hex") || lower.hasSuffix(".ihex")
        // A .hex file of text that does not start with ':' is HEX gone wrong: its line says how.
        let readAsHex = format.kind == .intelHex
            || (format.kind == .rawBinary && namedHex && head.prefix(512).allSatisfy { (0x20...0x7E).contains($0) || ImageFormat.isBlank($0) })
        switch format.kind {
        case _ where readAsHex:
            guard file.size <= maximumHexTextSize else {
                throw ImageError(path, "is \(file.size) bytes of Intel HEX text; HEX files over \(maximumHexTextSize >> 20) MiB (images over \(maximumSize >> 20) MiB) are not supported")
            }
            var decoder = IntelHex.Decoder(source: path)
            try decoder.feed(head[...])
            var total = head.count
            while true {
                let chunk = try file.read(upTo: min(1 << 20, maximumHexTextSize + 1 - total))
                if chunk.isEmpty { break }
                total += chunk.count
                guard total <= maximumHexTextSize else {
                    throw ImageError(path, "holds more than \(maximumHexTextSize >> 20) MiB of Intel HEX text; images over \(maximumSize >> 20) MiB are not supported")
                }
                try decoder.feed(chunk[...])
            }
            let hex = try decoder.finish()
            let inside = ImageFormat.detect(head: Array(hex.bytes.prefix(ImageFormat.headSize)), tail: [],
                                            using: detectors.filter(\.inIntelHex))
            if detectors.contains(where: { $0.inIntelHex && $0.kind == inside.kind }) {
                let described = ImageFormat(inside.kind, "Intel HEX text holding \(inside.description)", entries: inside.entries, limit: inside.limit)
                return .claimed(ClaimedImage(path: path, format: described, bytes: hex.bytes, head: head, baseAddress: hex.baseAddress))
            }
            return .firmware(FirmwareImage(bytes: hex.bytes, source: path, baseAddress: hex.baseAddress))
        case .rawBinary where namedHex:
            throw ImageError(path, "is named like Intel HEX but is not HEX text (it starts with \(hexDump(head.prefix(8))); HEX lines start with ':'); pass a raw binary as .bin, or regenerate the HEX file",
                             format: format.kind)
        case _ where format.kind == .rawBinary || accepted.contains(format.kind):
            return .firmware(FirmwareImage(bytes: try readWhole(file, head: head, limit: .images).get(), source: path))
        default:
            throw ImageError(path, refusal(for: format, path: path, head: head, detectors: detectors, hints: hints), format: format.kind)
        }
    }

    /// The rest of `file` after `head`, read in bounded chunks up to `limit`: the whole file, or
    /// the refusal of one larger than the limit (its size known before the read, or found during it).
    static func readWhole(_ file: ImageFile, head: [UInt8], limit: ImageFormat.SizeLimit) throws(ImageError) -> Result<[UInt8], ImageError> {
        let over = "\(limit.what) over \(limit.bytes >> 20) MiB are not supported"
        guard file.size <= limit.bytes else { return .failure(ImageError(file.path, "is \(file.size) bytes; \(over)")) }
        var bytes = head
        bytes.reserveCapacity(max(file.size, head.count))
        while true {
            let chunk = try file.read(upTo: min(1 << 20, limit.bytes + 1 - bytes.count))
            if chunk.isEmpty { break }
            bytes += chunk
            guard bytes.count <= limit.bytes else {
                return .failure(ImageError(file.path, "holds more than \(limit.bytes >> 20) MiB; \(over)"))
            }
        }
        return .success(bytes)
    }

    /// Why a file that is not a raw binary or HEX text is refused, and what to do instead.
    static func refusal(for format: ImageFormat, path: String, head: [UInt8] = [], detectors: [ImageFormat.Detector] = [],
                        hints: [ImageFormat.Hint] = []) -> String {
        let name = path.split(separator: "/").last.map(String.init) ?? path
        let base = ImageFormat.baseName(of: name)
        let inside = format.entries.filter { $0.lowercased().hasSuffix(".bin") || $0.lowercased().hasSuffix(".hex") }.prefix(3)
        let extract = inside.isEmpty ? "the .bin or .hex inside" : inside.joined(separator: " or ")
        let what = "is \(format.description)"
        if let detector = detectors.first(where: { $0.kind == format.kind }) { return detector.refusal(format, name) }
        for hint in hints {
            if let line = hint.refusal(format, head, name) { return line }
        }
        switch format.kind {
        case .elf:
            return "\(what), not a firmware image; convert it with `arm-none-eabi-objcopy -O binary \(name) \(base).bin` (or -O ihex \(base).hex) and pass that"
        case .zip:
            return "\(what), not a firmware image; unzip it (`unzip \(name)`) and pass \(extract)"
        case .tar:
            return "\(what), not a firmware image; extract it (`tar xf \(name)`) and pass \(extract)"
        case .gzip where name.lowercased().hasSuffix(".tar.gz") || name.lowercased().hasSuffix(".tgz"):
            return "\(what), not a firmware image; extract it (`tar xzf \(name)`) and pass the .bin or .hex inside"
        case .gzip:
            return "\(what), not a firmware image; decompress it (`gunzip -k \(name)`) and pass the result"
        case .bzip2:
            return "\(what), not a firmware image; decompress it (`bunzip2 -k \(name)`, or `tar xjf` for a tar archive) and pass the result"
        case .xz:
            return "\(what), not a firmware image; decompress it (`unxz -k \(name)`, or `tar xJf` for a tar archive) and pass the result"
        case .zstd:
            return "\(what), not a firmware image; decompress it (`unzstd \(name)`) and pass the result"
        case .uf2:
            return "\(what), not a raw image; convert it with `uf2conv.py \(name) --convert --output \(base).bin` and pass that"
        case .srecord:
            return "\(what), which otaflash does not read; convert it with `objcopy -I srec -O binary \(name) \(base).bin` (or -O ihex \(base).hex) and pass that"
        default:
            return "\(what), which otaflash does not send; pass a raw binary (.bin) or Intel HEX (.hex) image"
        }
    }

    private static func hexDump(_ bytes: some Collection<UInt8>) -> String {
        bytes.map { ($0 < 16 ? "0" : "") + String($0, radix: 16) }.joined(separator: " ")
    }
}

/// An image file opened for bounded reads: regular files only, so a FIFO, a socket or a device
/// such as /dev/zero is refused before a byte is read, and nothing waits on a writer.
struct ImageFile {
    let path: String
    let descriptor: Int32
    /// The size `fstat` reported when the file was opened.
    let size: Int

    init(_ path: String) throws(ImageError) {
        self.path = path
        // O_NONBLOCK: opening a FIFO without a writer must not wait for one.
        let fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC)
        guard fd >= 0 else {
            let code = errno
            switch code {
            case ENOENT: throw ImageError(path, "no such file")
            case EACCES, EPERM: throw ImageError(path, "cannot be read: permission denied (check its permissions)")
            case ENOTDIR: throw ImageError(path, "no such file (a folder in the path is a file)")
            default: throw ImageError(path, "cannot be opened: \(String(cString: strerror(code)))")
            }
        }
        var info = stat()
        guard fstat(fd, &info) == 0 else {
            let code = errno
            closeFile(fd)
            throw ImageError(path, "cannot be read: \(String(cString: strerror(code)))")
        }
        let type = info.st_mode & S_IFMT
        guard type == S_IFREG else {
            closeFile(fd)
            let what = switch type {
            case S_IFDIR: "is a directory, not a firmware image"
            case S_IFIFO: "is a pipe (FIFO), not a regular file; save the image to a file and pass that"
            case S_IFCHR: "is a character device, not a regular file; pass a firmware file"
            case S_IFBLK: "is a block device, not a regular file; copy the image off it (`dd`) into a file and pass that"
            case S_IFSOCK: "is a socket, not a regular file; pass a firmware file"
            default: "is not a regular file; pass a firmware file"
            }
            throw ImageError(path, what)
        }
        descriptor = fd
        size = Int(info.st_size)
    }

    func close() { closeFile(descriptor) }

    /// Reads up to `count` bytes from the current offset; fewer only at the end of the file.
    func read(upTo count: Int) throws(ImageError) -> [UInt8] {
        guard count > 0 else { return [] }
        var buffer = [UInt8](repeating: 0, count: count)
        var filled = 0
        while filled < count {
            let n = buffer[filled...].withUnsafeMutableBytes { readFile(descriptor, $0.baseAddress, $0.count) }
            if n == 0 { break }
            if n < 0 {
                if errno == EINTR { continue }
                throw ImageError(path, "cannot be read: \(String(cString: strerror(errno)))")
            }
            filled += n
        }
        buffer.removeLast(count - filled)
        return buffer
    }

    /// Reads the last `count` bytes (fewer for a smaller file) without moving the read offset.
    func readTail(_ count: Int) throws(ImageError) -> [UInt8] {
        let start = max(0, size - count)
        var buffer = [UInt8](repeating: 0, count: size - start)
        var filled = 0
        while filled < buffer.count {
            let n = buffer[filled...].withUnsafeMutableBytes { pread(descriptor, $0.baseAddress, $0.count, off_t(start + filled)) }
            if n == 0 { break }
            if n < 0 {
                if errno == EINTR { continue }
                throw ImageError(path, "cannot be read: \(String(cString: strerror(errno)))")
            }
            filled += n
        }
        buffer.removeLast(buffer.count - filled)
        return buffer
    }
}

private func closeFile(_ fd: Int32) { _ = close(fd) }
private func readFile(_ fd: Int32, _ buffer: UnsafeMutableRawPointer?, _ count: Int) -> Int { read(fd, buffer, count) }

/// A firmware file that cannot be used, with the line at fault for text formats.
public struct ImageError: Error, Sendable, Hashable, CustomStringConvertible {
    public let path: String
    public let line: Int?
    public let reason: String
    /// Set when the file was refused for what it is (an ELF executable, a protocol's package…).
    public let format: ImageFormat.Kind?

    public init(_ path: String, line: Int? = nil, _ reason: String, format: ImageFormat.Kind? = nil) {
        self.path = path
        self.line = line
        self.reason = reason
        self.format = format
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

    /// The longest line a record can take: ':', then 255 data bytes and 5 bytes of count,
    /// address, type and checksum as hex digits, with room for blanks around it.
    public static let maximumLineLength = 1 + 2 * (255 + 5) + 64

    /// Decodes text held in memory whole.
    public static func parse(_ text: [UInt8], source: String) throws(ImageError) -> Decoded {
        var decoder = Decoder(source: source)
        try decoder.feed(text[...])
        return try decoder.finish()
    }

    /// Decodes text fed in chunks of any size, so a file is never held whole: memory is the
    /// decoded image plus one line. The image's span is checked as each record arrives, so an
    /// address far away fails at its line, not after the whole file.
    public struct Decoder {
        public let source: String
        private var partial: [UInt8] = []
        private var segments: [(address: UInt32, bytes: [UInt8])] = []
        private var upper: UInt32 = 0  // from type 02 or 04 records
        private var sawEOF = false
        /// The last chunk ended in CR: an LF starting the next one ends the same line.
        private var afterCR = false
        private var lineNumber = 0
        private var low = UInt64.max
        private var high: UInt64 = 0

        public init(source: String) { self.source = source }

        /// Lines end in LF, CRLF or a lone CR (classic Mac OS tools); a CRLF split across two
        /// chunks is one line end.
        public mutating func feed(_ chunk: ArraySlice<UInt8>) throws(ImageError) {
            var start = chunk.startIndex
            if afterCR, chunk.first == 0x0A { start += 1 }
            if !chunk.isEmpty { afterCR = false }
            while let end = chunk[start...].firstIndex(where: { $0 == 0x0A || $0 == 0x0D }) {
                if partial.isEmpty {
                    try decodeLine(chunk[start..<end])
                } else {
                    partial += chunk[start..<end]
                    let line = partial[...]
                    partial = []
                    try decodeLine(line)
                }
                start = end + 1
                if chunk[end] == 0x0D {
                    if start == chunk.endIndex {
                        afterCR = true
                    } else if chunk[start] == 0x0A {
                        start += 1
                    }
                }
            }
            partial += chunk[start...]
            guard partial.count <= IntelHex.maximumLineLength else { throw longLine(lineNumber + 1) }
        }

        private func longLine(_ number: Int) -> ImageError {
            ImageError(source, line: number, "line is longer than any Intel HEX record (\(IntelHex.maximumLineLength) characters); is this a HEX file?")
        }

        /// Ends the text: decodes a last line without a line break and lays the records out.
        public mutating func finish() throws(ImageError) -> Decoded {
            if !partial.isEmpty {
                let line = partial[...]
                partial = []
                try decodeLine(line)
            }
            guard sawEOF else {
                throw ImageError(source, line: lineNumber, "no end-of-file record (:00000001FF); is the file truncated?")
            }
            guard !segments.isEmpty else { throw ImageError(source, "contains no data records") }
            let span = high - low
            var image = [UInt8](repeating: 0xFF, count: Int(span))
            var written = [Bool](repeating: false, count: Int(span))
            for segment in segments {
                let start = Int(UInt64(segment.address) - low)
                for (k, byte) in segment.bytes.enumerated() {
                    if written[start + k], image[start + k] != byte {
                        throw ImageError(source, "records overlap with different data at address 0x\(String(segment.address + UInt32(k), radix: 16))")
                    }
                    image[start + k] = byte
                    written[start + k] = true
                }
            }
            return Decoded(bytes: image, baseAddress: UInt32(low))
        }

        private mutating func decodeLine(_ raw: ArraySlice<UInt8>) throws(ImageError) {
            lineNumber += 1
            guard raw.count <= IntelHex.maximumLineLength else { throw longLine(lineNumber) }
            var line = raw
            if lineNumber == 1, line.starts(with: [0xEF, 0xBB, 0xBF]) { line = line.dropFirst(3) }
            while let last = line.last, last == 0x0D || last == 0x20 || last == 0x09 { line = line.dropLast() }
            while let first = line.first, first == 0x20 || first == 0x09 { line = line.dropFirst() }
            if line.isEmpty { return }
            let lineNumber = lineNumber
            let source = source
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
            let data = record[4..<(4 + count)]
            switch record[3] {
            case 0x00:
                guard !data.isEmpty else { return }
                let address = upper &+ offset
                let end = UInt64(address) + UInt64(data.count)
                guard end <= 1 << 32 else { throw fail("data runs past the 4 GiB address space") }
                let newLow = min(low, UInt64(address)), newHigh = max(high, end)
                guard newHigh - newLow <= UInt64(FirmwareImage.maximumSize) else {
                    throw fail("data spans \(newHigh - newLow) bytes from 0x\(String(newLow, radix: 16)) to 0x\(String(newHigh, radix: 16)); images over \(FirmwareImage.maximumSize >> 20) MiB are not supported")
                }
                (low, high) = (newLow, newHigh)
                // Indexes, not a copy of the last segment: a copy would make the append copy its bytes.
                if let last = segments.indices.last,
                   UInt64(segments[last].address) + UInt64(segments[last].bytes.count) == UInt64(address) {
                    segments[last].bytes += data
                } else {
                    segments.append((address, Array(data)))
                }
            case 0x01:
                sawEOF = true
            case 0x02:
                guard count == 2 else { throw fail("extended segment address record must carry 2 bytes") }
                upper = (UInt32(data[data.startIndex]) << 8 | UInt32(data[data.startIndex + 1])) << 4
            case 0x04:
                guard count == 2 else { throw fail("extended linear address record must carry 2 bytes") }
                upper = (UInt32(data[data.startIndex]) << 8 | UInt32(data[data.startIndex + 1])) << 16
            case 0x03, 0x05:
                break  // start address: not part of the image
            default:
                throw fail("unknown record type 0x\(hex2(record[3]))")
            }
        }
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
