import OTAWire

/// A tag of a GBL file (Gecko Bootloader image format 3, `btl_gbl_format.h`): an id and a length,
/// both little-endian u32, then `length` bytes of value.
public struct GBLTag: Sendable, Equatable {
    public let id: ID
    /// Where the tag's header starts in the file.
    public let offset: Int
    /// The length of its value (after the 8-byte header).
    public let length: Int

    public init(id: ID, offset: Int, length: Int) {
        self.id = id
        self.offset = offset
        self.length = length
    }

    /// Where its value starts and ends.
    public var valueRange: Range<Int> { (offset + 8)..<(offset + 8 + length) }
    public var end: Int { offset + 8 + length }

    /// A tag id. Open, so that an id no bootloader parses still decodes and can be named.
    public struct ID: RawRepresentable, Sendable, Hashable, CustomStringConvertible {
        public let rawValue: UInt32
        public init(rawValue: UInt32) { self.rawValue = rawValue }

        public static let header = ID(rawValue: 0x03A6_17EB)
        public static let versionDependency = ID(rawValue: 0x76A6_17EB)
        public static let encryptionInit = ID(rawValue: 0xFA06_06FA)
        public static let application = ID(rawValue: 0xF40A_0AF4)
        public static let seUpgrade = ID(rawValue: 0x5EA6_17EB)
        public static let bootloader = ID(rawValue: 0xF509_09F5)
        public static let prog = ID(rawValue: 0xFE01_01FE)
        public static let eraseProg = ID(rawValue: 0xFD03_03FD)
        public static let progLZ4 = ID(rawValue: 0xFD05_05FD)
        public static let progLZMA = ID(rawValue: 0xFD07_07FD)
        public static let delta = ID(rawValue: 0xF80A_0AF8)
        public static let deltaLZ4 = ID(rawValue: 0xF80B_0BF8)
        public static let deltaLZMA = ID(rawValue: 0xF80C_0CF8)
        public static let metadata = ID(rawValue: 0xF608_08F6)
        public static let encryptedData = ID(rawValue: 0xF907_07F9)
        public static let certificate = ID(rawValue: 0xF30B_0BF3)
        public static let signature = ID(rawValue: 0xF70A_0AF7)
        public static let end = ID(rawValue: 0xFC04_04FC)
        /// Defined in `btl_gbl_format.h` (`GBL_TAG_ID_ENC_HEADER`) but in no bootloader's table
        /// of tags it parses: a file holding it is refused like an unknown tag.
        public static let encryptionHeader = ID(rawValue: 0xFB05_05FB)

        /// How the bootloader's parser takes the tag (`gblTagParsingInfoStructs`,
        /// `btl_gbl_format.c`), nil for an id it does not parse: its place in the file's order
        /// (a tag of a lower order after one of a higher order is refused), whether it may
        /// occur once only, and whether it is always in the clear in an encrypted file.
        var rule: Rule? {
            switch self {
            case .header: Rule(order: 1, name: "header", once: true, clear: true)
            case .versionDependency: Rule(order: 2, name: "version dependency", once: false, clear: true)
            // 3: the SE upgrade tag of a bootloader built with BOOTLOADER_SE_UPGRADE_NO_STAGING.
            case .encryptionInit: Rule(order: 4, name: "encryption init", once: true, clear: true)
            case .application: Rule(order: 5, name: "application", once: true, clear: false)
            case .seUpgrade: Rule(order: 6, name: "SE upgrade", once: true, clear: false)
            case .bootloader: Rule(order: 7, name: "bootloader", once: true, clear: false)
            case .prog: Rule(order: 8, name: "prog", once: false, clear: false)
            case .eraseProg: Rule(order: 8, name: "erase-prog", once: false, clear: false)
            case .progLZ4: Rule(order: 8, name: "LZ4 prog", once: false, clear: false)
            case .progLZMA: Rule(order: 8, name: "LZMA prog", once: false, clear: false)
            case .delta: Rule(order: 8, name: "delta", once: false, clear: false)
            case .deltaLZ4: Rule(order: 8, name: "LZ4 delta", once: false, clear: false)
            case .deltaLZMA: Rule(order: 8, name: "LZMA delta", once: false, clear: false)
            case .metadata: Rule(order: 8, name: "metadata", once: false, clear: false)
            case .encryptedData: Rule(order: 9, name: "encrypted data", once: false, clear: true)
            case .certificate: Rule(order: 10, name: "certificate", once: true, clear: true)
            case .signature: Rule(order: 11, name: "signature", once: true, clear: true)
            case .end: Rule(order: 12, name: "end", once: true, clear: true)
            default: nil
            }
        }

        struct Rule {
            let order: Int
            let name: String
            let once: Bool
            let clear: Bool
        }

        /// Whether the tag carries bytes to program (plain, erase-first, compressed or a delta).
        var programs: Bool {
            [.prog, .eraseProg, .progLZ4, .progLZMA, .delta, .deltaLZ4, .deltaLZMA].contains(self)
        }

        /// "the application tag", or "a tag with the id 0x12345678" for one no bootloader parses.
        public var description: String {
            rule.map { "the \($0.name) tag" } ?? "a tag with the id 0x\(hex32(rawValue))"
        }
    }
}
