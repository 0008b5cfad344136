/// What a file holds, judged from its bytes rather than its name.
///
/// Detection is pure and separate from policy: `detect` says what a file is; the loader decides
/// what it can send (raw binaries and Intel HEX) and refuses the rest with a line that says what
/// to do. The formats here are every protocol's (or none's); a protocol's own format comes with
/// its `Detector` from its module, and a protocol's word on a file it knows but does not send
/// with its `Hint`. `FirmwareImage.read` hands a file a detector claimed to the caller as a
/// value (`DetectedImage.claimed`), with the bytes read, so the caller routes it once.
public struct ImageFormat: Sendable, Hashable, CustomStringConvertible {
    /// An open set of formats (a struct with static members), so new ones break no `switch`.
    public struct Kind: Hashable, Sendable, CustomStringConvertible {
        public let name: String
        public init(_ name: String) { self.name = name }
        public var description: String { name }

        /// Anything not recognised below: sent byte for byte.
        public static let rawBinary = Kind("raw-binary")
        /// Text whose first record starts with ':' (Intel HEX, any extension).
        public static let intelHex = Kind("intel-hex")
        /// An ELF object or executable (magic 0x7F 'E' 'L' 'F'): a linker output, not an image.
        public static let elf = Kind("elf")
        /// A zip archive that no protocol's detector claims.
        public static let zip = Kind("zip")
        /// A UF2 file (magic "UF2\n" then 0x9E5D5157): for USB mass-storage bootloaders.
        public static let uf2 = Kind("uf2")
        /// Motorola S-record text (lines "S0"…"S9" followed by hex digits).
        public static let srecord = Kind("srecord")
        public static let gzip = Kind("gzip")
        public static let bzip2 = Kind("bzip2")
        public static let xz = Kind("xz")
        public static let zstd = Kind("zstd")
        /// A POSIX tar archive ("ustar" at offset 257).
        public static let tar = Kind("tar")
    }

    public let kind: Kind
    /// What the file is, as a phrase that follows "is": "an ELF executable".
    public let description: String
    /// For archives: the names of the first few entries, when they could be read.
    public let entries: [String]

    /// How large a file of this format may be: a file a detector claims is read whole up to it.
    public let limit: SizeLimit

    public init(_ kind: Kind, _ description: String, entries: [String] = [], limit: SizeLimit = .images) {
        self.kind = kind
        self.description = description
        self.entries = entries
        self.limit = limit
    }

    /// The largest file of a format, and what a larger one is called in its refusal ("is 300000000
    /// bytes; packages over 192 MiB are not supported").
    public struct SizeLimit: Sendable, Hashable {
        public let bytes: Int
        /// The files, plural: "images", "packages".
        public let what: String

        public init(bytes: Int, what: String) {
            self.bytes = bytes
            self.what = what
        }

        /// The limit of images (`FirmwareImage.maximumSize`).
        public static let images = SizeLimit(bytes: FirmwareImage.maximumSize, what: "images")
    }

    /// True for the formats otaflash sends itself: raw binaries and Intel HEX.
    public var isFirmwareImage: Bool { kind == .rawBinary || kind == .intelHex }

    /// A protocol's own format, recognised from a file's bytes: its module declares it, and whoever
    /// loads files for that protocol passes it to `detect` and `FirmwareImage.load`.
    public struct Detector: Sendable {
        public let kind: Kind
        /// The format, when `head` and `tail` (as `detect` takes them) are this one's; nil otherwise.
        public let detect: @Sendable (_ head: [UInt8], _ tail: [UInt8]) -> ImageFormat?
        /// Why a loader that does not send this format refuses it, and what to do instead: the
        /// words after "path: " ("is …"), given the format and the file's name.
        public let refusal: @Sendable (_ format: ImageFormat, _ fileName: String) -> String
        /// Intel HEX text may hold this format (a signing tool's HEX output): the decoded bytes
        /// are looked at too.
        public let inIntelHex: Bool

        public init(kind: Kind, inIntelHex: Bool = false, detect: @escaping @Sendable (_ head: [UInt8], _ tail: [UInt8]) -> ImageFormat?,
                    refusal: @escaping @Sendable (_ format: ImageFormat, _ fileName: String) -> String) {
            self.kind = kind
            self.inIntelHex = inIntelHex
            self.detect = detect
            self.refusal = refusal
        }

        /// Whether `head` holds `magic` at `offset`.
        public static func starts(_ head: [UInt8], _ magic: [UInt8], at offset: Int = 0) -> Bool {
            head.count >= offset + magic.count && head[offset..<(offset + magic.count)].elementsEqual(magic)
        }
    }

    /// A protocol's word on a file of a format no protocol sends but the protocol knows (a file
    /// its builds write beside the image): it replaces the generic refusal. Each protocol
    /// registers its own with its command line.
    public struct Hint: Sendable {
        /// The words after "path: " ("is …"), given the format, the file's first bytes (up to
        /// `headSize`) and its name; nil when the file is not one this hint knows.
        public let refusal: @Sendable (_ format: ImageFormat, _ head: [UInt8], _ fileName: String) -> String?

        public init(refusal: @escaping @Sendable (_ format: ImageFormat, _ head: [UInt8], _ fileName: String) -> String?) {
            self.refusal = refusal
        }
    }

    /// A file's name without its last extension, for the file a refusal suggests making: "app"
    /// for "app.elf", and the name itself when it has no stem (".elf").
    public static func baseName(of fileName: String) -> String {
        let stem = fileName.split(separator: ".", omittingEmptySubsequences: false).dropLast().joined(separator: ".")
        return stem.isEmpty ? fileName : stem
    }

    /// How much of a file's start `detect` looks at (tar's magic is at 257; zip's local headers follow).
    public static let headSize = 64 << 10
    /// How much of a file's end `detect` looks at: a zip's end-of-central-directory record (22
    /// bytes plus a comment of up to 64 KiB) and, for small archives, the central directory.
    public static let tailSize = 128 << 10

    /// Recognises a file from its first and last bytes (for a small file, both are the whole file).
    ///
    /// - Parameters:
    ///   - head: the file's first bytes (up to `headSize`).
    ///   - tail: its last bytes (up to `tailSize`); pass `head` when the file is that small.
    ///   - detectors: protocols' own formats, asked first, in order (a protocol's package that is
    ///     a zip is claimed by its detector before it counts as a zip).
    public static func detect(head: [UInt8], tail: [UInt8], using detectors: [Detector] = []) -> ImageFormat {
        for detector in detectors {
            if let format = detector.detect(head, tail) { return format }
        }
        func starts(_ magic: [UInt8], at offset: Int = 0) -> Bool { Detector.starts(head, magic, at: offset) }
        if starts([0x7F, 0x45, 0x4C, 0x46]) {
            return ImageFormat(.elf, elfDescription(head))
        }
        if starts([0x50, 0x4B, 0x03, 0x04]) || starts([0x50, 0x4B, 0x05, 0x06]) {
            let names = zipEntryNames(head: head, tail: tail)
            return ImageFormat(.zip, names.isEmpty && starts([0x50, 0x4B, 0x05, 0x06]) ? "an empty zip archive" : "a zip archive",
                               entries: names)
        }
        if starts(Array("UF2\n".utf8)), starts([0x57, 0x51, 0x5D, 0x9E], at: 4) {
            return ImageFormat(.uf2, "a UF2 file (for USB drag-and-drop bootloaders)")
        }
        if starts([0x1F, 0x8B]) { return ImageFormat(.gzip, "gzip-compressed") }
        if starts(Array("BZh".utf8)), head.count > 3, (UInt8(ascii: "1")...UInt8(ascii: "9")).contains(head[3]) {
            return ImageFormat(.bzip2, "bzip2-compressed")
        }
        if starts([0xFD, 0x37, 0x7A, 0x58, 0x5A, 0x00]) { return ImageFormat(.xz, "xz-compressed") }
        if starts([0x28, 0xB5, 0x2F, 0xFD]) { return ImageFormat(.zstd, "zstd-compressed") }
        if starts(Array("ustar".utf8), at: 257) { return ImageFormat(.tar, "a tar archive") }

        // Text formats: look at the first character that is not a byte-order mark or blank.
        var i = starts([0xEF, 0xBB, 0xBF]) ? 3 : 0
        while i < head.count, isBlank(head[i]) { i += 1 }
        if i < head.count, head[i] == UInt8(ascii: ":") {
            return ImageFormat(.intelHex, "Intel HEX text")
        }
        if i + 4 <= head.count, head[i] == UInt8(ascii: "S"),
           (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(head[i + 1]),
           head[(i + 2)..<(i + 4)].allSatisfy(isHexDigit) {
            return ImageFormat(.srecord, "a Motorola S-record file")
        }
        return ImageFormat(.rawBinary, "a raw binary")
    }

    /// Recognises bytes held in memory whole.
    public static func detect(_ bytes: [UInt8], using detectors: [Detector] = []) -> ImageFormat {
        detect(head: Array(bytes.prefix(headSize)), tail: Array(bytes.suffix(tailSize)), using: detectors)
    }

    static func isBlank(_ c: UInt8) -> Bool { c == 0x20 || c == 0x09 || c == 0x0A || c == 0x0D }

    static func isHexDigit(_ c: UInt8) -> Bool {
        (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(c) || (UInt8(ascii: "a")...UInt8(ascii: "f")).contains(c)
            || (UInt8(ascii: "A")...UInt8(ascii: "F")).contains(c)
    }

    /// "an ELF executable", "an ELF object file" (ELF header e_type, at offset 16).
    private static func elfDescription(_ head: [UInt8]) -> String {
        switch elfHeader(head)?.type {
        case 1: return "an ELF object file"
        case 2, 3: return "an ELF executable"  // 3: position-independent executables and shared objects
        case 4: return "an ELF core dump"
        default: return "an ELF file"
        }
    }

    /// An ELF file's e_type (offset 16) and e_machine (offset 18; 0 when `head` ends before it),
    /// in the byte order its EI_DATA (offset 5) gives: 1 little-endian, 2 big-endian. Nil when
    /// `head` ends before e_type.
    public static func elfHeader(_ head: [UInt8]) -> (type: Int, machine: Int)? {
        guard head.count >= 18 else { return nil }
        func field(_ at: Int) -> Int { head[5] == 2 ? Int(head[at]) << 8 | Int(head[at + 1]) : le16(head, at) }
        return (field(16), head.count >= 20 ? field(18) : 0)
    }

    private static func le16(_ b: [UInt8], _ at: Int) -> Int { Int(b[at]) | Int(b[at + 1]) << 8 }
    private static func le32(_ b: [UInt8], _ at: Int) -> Int { le16(b, at) | le16(b, at + 2) << 16 }

    /// The names in a zip archive (APPNOTE.TXT 4.3): from the central directory when the
    /// end-of-central-directory record and the directory lie in `tail`, else from the local file
    /// headers that lie in `head`.
    public static func zipEntryNames(head: [UInt8], tail: [UInt8]) -> [String] {
        // The end-of-central-directory record: 22 bytes plus a comment, the last thing in the file.
        var eocd = tail.count - 22
        while eocd >= 0, eocd >= tail.count - 22 - 0xFFFF {
            if tail[eocd] == 0x50, tail[eocd + 1] == 0x4B, tail[eocd + 2] == 0x05, tail[eocd + 3] == 0x06,
               eocd + 22 + le16(tail, eocd + 20) == tail.count {
                break
            }
            eocd -= 1
        }
        var names: [String] = []
        if eocd >= 0, eocd >= tail.count - 22 - 0xFFFF {
            let directorySize = le32(tail, eocd + 12)
            var at = eocd - directorySize
            if at >= 0 {
                while at + 46 <= eocd, tail[at] == 0x50, tail[at + 1] == 0x4B, tail[at + 2] == 0x01, tail[at + 3] == 0x02 {
                    let nameLength = le16(tail, at + 28)
                    let next = at + 46 + nameLength + le16(tail, at + 30) + le16(tail, at + 32)
                    guard at + 46 + nameLength <= eocd else { break }
                    names.append(String(decoding: tail[(at + 46)..<(at + 46 + nameLength)], as: UTF8.self))
                    at = next
                }
                return names
            }
        }
        // Local file headers: 30 bytes, the name, the extra field, then the data (whose size is
        // only known here when bit 3 of the flags is clear).
        var at = 0
        while at + 30 <= head.count, head[at] == 0x50, head[at + 1] == 0x4B, head[at + 2] == 0x03, head[at + 3] == 0x04 {
            let nameLength = le16(head, at + 26)
            guard at + 30 + nameLength <= head.count else { break }
            names.append(String(decoding: head[(at + 30)..<(at + 30 + nameLength)], as: UTF8.self))
            guard le16(head, at + 6) & 0x08 == 0 else { break }
            at += 30 + nameLength + le16(head, at + 28) + le32(head, at + 18)
        }
        return names
    }
}
