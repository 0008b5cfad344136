import Crypto

extension MCUbootImage {
    /// An image version: `major.minor.revision+build` (imgtool `--version`; MCUboot
    /// `struct image_version`).
    ///
    /// Ordered field by field, the build last; MCUboot itself compares the build number only when
    /// built with `MCUBOOT_VERSION_CMP_USE_BUILD_NUMBER`.
    public struct Version: Sendable, Hashable, Comparable, CustomStringConvertible {
        public var major: UInt8
        public var minor: UInt8
        public var revision: UInt16
        public var build: UInt32

        public init(major: UInt8, minor: UInt8 = 0, revision: UInt16 = 0, build: UInt32 = 0) {
            self.major = major
            self.minor = minor
            self.revision = revision
            self.build = build
        }

        /// Parses the forms people and devices write: imgtool's `1.2.3+4`, Zephyr's `image
        /// state-read` form `1.2.3.4` (the build shown only when non-zero), and the shorter `1`,
        /// `1.2`, `1.2.3`. Nil for anything else, or a field out of its range (255, 255, 65535,
        /// 4294967295).
        public init?(_ text: String) {
            var main = Substring(text)
            var build: Substring?
            if let plus = text.firstIndex(of: "+") {
                main = text[..<plus]
                build = text[text.index(after: plus)...]
            }
            var fields = main.split(separator: ".", omittingEmptySubsequences: false)
            if build == nil, fields.count == 4 { build = fields.removeLast() }
            guard (1...3).contains(fields.count) else { return nil }
            func number<T: FixedWidthInteger>(_ s: Substring) -> T? {
                guard !s.isEmpty, s.utf8.allSatisfy({ (0x30...0x39).contains($0) }) else { return nil }
                return T(s)
            }
            func field<T: FixedWidthInteger>(_ i: Int) -> T? { i < fields.count ? number(fields[i]) : 0 }
            guard let major: UInt8 = field(0), let minor: UInt8 = field(1), let revision: UInt16 = field(2) else { return nil }
            var buildNumber: UInt32 = 0
            if let build {
                guard let value: UInt32 = number(build) else { return nil }
                buildNumber = value
            }
            self.init(major: major, minor: minor, revision: revision, build: buildNumber)
        }

        /// "1.2.3+4", or "1.2.3" when the build is 0.
        public var description: String {
            "\(major).\(minor).\(revision)" + (build == 0 ? "" : "+\(build)")
        }

        public static func < (a: Version, b: Version) -> Bool {
            (a.major, a.minor, a.revision, a.build) < (b.major, b.minor, b.revision, b.build)
        }
    }

    /// The header's flags (imgtool `image.py` `IMAGE_F`; MCUboot `image.h`).
    public struct Flags: OptionSet, Sendable, Hashable {
        public let rawValue: UInt32
        public init(rawValue: UInt32) { self.rawValue = rawValue }

        public static let positionIndependent = Flags(rawValue: 0x01)
        public static let encryptedAES128 = Flags(rawValue: 0x04)
        public static let encryptedAES256 = Flags(rawValue: 0x08)
        public static let nonBootable = Flags(rawValue: 0x10)
        public static let ramLoad = Flags(rawValue: 0x20)
        public static let romFixed = Flags(rawValue: 0x100)
        public static let compressedLZMA1 = Flags(rawValue: 0x200)
        public static let compressedLZMA2 = Flags(rawValue: 0x400)
        public static let compressedARMThumb = Flags(rawValue: 0x800)
    }

    /// The 32 bytes at the start of the image, little-endian (MCUboot `struct image_header`).
    public struct Header: Sendable, Hashable {
        /// Where the image runs from (with RAM_LOAD or ROM_FIXED); 0 otherwise.
        public let loadAddress: UInt32
        /// The header with its padding: the firmware starts here.
        public let headerSize: UInt16
        /// The protected TLV area with its 4-byte info; 0 when there is none.
        public let protectedTLVSize: UInt16
        /// The firmware, without the header.
        public let imageSize: UInt32
        public let flags: Flags
        public let version: Version
    }

    /// A TLV's type. Vendor types are 0xXXA0–0xXXFE.
    public struct TLVType: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
        public let rawValue: UInt16
        public init(rawValue: UInt16) { self.rawValue = rawValue }

        public static let keyHash = TLVType(rawValue: 0x01)
        public static let publicKey = TLVType(rawValue: 0x02)
        public static let sha256 = TLVType(rawValue: 0x10)
        public static let sha384 = TLVType(rawValue: 0x11)
        public static let sha512 = TLVType(rawValue: 0x12)
        public static let rsa2048 = TLVType(rawValue: 0x20)
        /// ECDSA over P-256 or P-384, DER-encoded.
        public static let ecdsaSignature = TLVType(rawValue: 0x22)
        public static let rsa3072 = TLVType(rawValue: 0x23)
        /// Ed25519 over the image hash.
        public static let ed25519 = TLVType(rawValue: 0x24)
        /// A signature over the hashed bytes themselves (`imgtool sign --pure`).
        public static let signaturePure = TLVType(rawValue: 0x25)
        public static let encryptedRSA2048 = TLVType(rawValue: 0x30)
        public static let encryptedKeyWrap = TLVType(rawValue: 0x31)
        public static let encryptedEC256 = TLVType(rawValue: 0x32)
        public static let encryptedX25519 = TLVType(rawValue: 0x33)
        public static let dependency = TLVType(rawValue: 0x40)
        public static let securityCounter = TLVType(rawValue: 0x50)
        public static let bootRecord = TLVType(rawValue: 0x60)

        /// Names as `imgtool dumpinfo` prints them.
        private static let names: [UInt16: String] = [
            0x01: "KEYHASH", 0x02: "PUBKEY", 0x10: "SHA256", 0x11: "SHA384", 0x12: "SHA512",
            0x20: "RSA2048", 0x22: "ECDSASIG", 0x23: "RSA3072", 0x24: "ED25519", 0x25: "SIG_PURE",
            0x30: "ENCRSA2048", 0x31: "ENCKW", 0x32: "ENCEC256", 0x33: "ENCX25519",
            0x40: "DEPENDENCY", 0x50: "SEC_CNT", 0x60: "BOOT_RECORD",
        ]

        /// "SHA256 (0x10)", "vendor TLV 0x12a0", "unknown TLV 0x77".
        public var description: String {
            let hex = "0x" + String(rawValue, radix: 16)
            if let name = Self.names[rawValue] { return "\(name) (\(hex))" }
            return (0xA0...0xFE).contains(rawValue & 0xFF) ? "vendor TLV \(hex)" : "unknown TLV \(hex)"
        }

        public var isSignature: Bool {
            [Self.rsa2048, .ecdsaSignature, .rsa3072, .ed25519, .signaturePure].contains(self)
        }
    }

    /// One type-length-value entry of a TLV area.
    public struct TLV: Sendable, Hashable {
        public let type: TLVType
        /// Where the value starts in the file.
        public let offset: Int
        public let value: [UInt8]
    }

    /// The hash an image carries in its hash TLV.
    public enum HashAlgorithm: Sendable, Hashable, CustomStringConvertible {
        case sha256, sha384, sha512

        /// The algorithm of a hash TLV; nil for other types.
        public init?(tlv type: TLVType) {
            switch type {
            case .sha256: self = .sha256
            case .sha384: self = .sha384
            case .sha512: self = .sha512
            default: return nil
            }
        }

        public var digestSize: Int {
            switch self {
            case .sha256: 32
            case .sha384: 48
            case .sha512: 64
            }
        }

        public var description: String {
            switch self {
            case .sha256: "SHA-256"
            case .sha384: "SHA-384"
            case .sha512: "SHA-512"
            }
        }

        /// The hash of `bytes` (for an image, its first `hashedSize` bytes).
        public func digest(_ bytes: ArraySlice<UInt8>) -> [UInt8] {
            switch self {
            case .sha256: Array(SHA256.hash(data: bytes))
            case .sha384: Array(SHA384.hash(data: bytes))
            case .sha512: Array(SHA512.hash(data: bytes))
            }
        }
    }

    /// An image's structure, walked with bounds checks but not hashed: the header and both TLV
    /// areas (MCUboot `bootutil_tlv_iter_begin`/`_next`).
    ///
    /// Public so that fuzzing can reach past the hash check (fuzz/Sources/fuzz-mcuboot).
    public struct Layout: Sendable, Hashable {
        public let header: Header
        public let protectedTLVs: [TLV]
        public let tlvs: [TLV]
        /// The offset just past the TLV area.
        public let tlvAreaEnd: Int

        static let protectedInfoMagic: UInt16 = 0x6908
        static let infoMagic: UInt16 = 0x6907

        /// - Throws: `MCUbootImageError` `.truncated`, `.notMCUboot`, `.badHeader` or `.badTLVArea`.
        public init(parsing bytes: [UInt8], source: String = "<memory>") throws(MCUbootImageError) {
            func fail(_ code: MCUbootImageError.Code, _ reason: String) -> MCUbootImageError {
                MCUbootImageError(code, source, reason)
            }
            let size = bytes.count
            guard size >= 4 else {
                throw fail(.truncated, "is \(size) bytes, too short for an MCUboot image (a 32-byte header, the firmware, then TLVs); the file is truncated")
            }
            let magic = le32(bytes, 0)
            guard magic == MCUbootImage.magic else {
                throw fail(.notMCUboot, "starts with 0x\(String(magic, radix: 16)), not the MCUboot magic 0x96f3b83d, so it is not an MCUboot image; sign it with `imgtool sign`")
            }
            guard size >= MCUbootImage.headerFieldsSize else {
                throw fail(.truncated, "is \(size) bytes, shorter than an MCUboot header (32 bytes); the file is truncated, download or sign it again")
            }
            let header = Header(
                loadAddress: le32(bytes, 4), headerSize: le16(bytes, 8), protectedTLVSize: le16(bytes, 10),
                imageSize: le32(bytes, 12), flags: Flags(rawValue: le32(bytes, 16)),
                version: Version(major: bytes[20], minor: bytes[21], revision: le16(bytes, 22), build: le32(bytes, 24)))
            let headerSize = Int(header.headerSize), protectedSize = Int(header.protectedTLVSize)
            guard headerSize >= MCUbootImage.headerFieldsSize else {
                throw fail(.badHeader, "its header size (hdr_size) is \(headerSize) bytes, less than the 32-byte header; the header is corrupt, sign the image again")
            }
            let firmwareEnd = headerSize + Int(header.imageSize)
            let hashedEnd = firmwareEnd + protectedSize
            guard hashedEnd + 4 <= size else {
                throw fail(.truncated, "its header announces a \(headerSize)-byte header, \(header.imageSize) bytes of firmware and \(protectedSize) of protected TLVs, then a TLV area at offset \(hashedEnd), but the file is \(size) bytes; the file is truncated, download or sign it again")
            }
            var protected: [TLV] = []
            if protectedSize > 0 {
                guard protectedSize >= 4, le16(bytes, firmwareEnd) == Self.protectedInfoMagic else {
                    throw fail(.badTLVArea, "the header announces \(protectedSize) bytes of protected TLVs at offset \(firmwareEnd), but no protected TLV area starts there (magic 0x6908); the image is corrupt, sign it again")
                }
                let announced = Int(le16(bytes, firmwareEnd + 2))
                guard announced == protectedSize else {
                    throw fail(.badTLVArea, "its protected TLV area says it is \(announced) bytes, the header says \(protectedSize); the image is corrupt, sign it again")
                }
                protected = try Self.walk(bytes, from: firmwareEnd + 4, to: hashedEnd, area: "protected TLV area", fail)
            } else if le16(bytes, firmwareEnd) == Self.protectedInfoMagic {
                throw fail(.badTLVArea, "a protected TLV area (magic 0x6908) follows the firmware at offset \(firmwareEnd), but the header announces none (protect_tlv_size 0); the header is corrupt, sign the image again")
            }
            let infoMagic = le16(bytes, hashedEnd)
            guard infoMagic == Self.infoMagic else {
                throw fail(.badTLVArea, "no TLV area at offset \(hashedEnd), where the header's sizes put it (found 0x\(String(infoMagic, radix: 16)), expected the magic 0x6907); the image is corrupt, sign it again")
            }
            let total = Int(le16(bytes, hashedEnd + 2))
            guard total >= 4 else {
                throw fail(.badTLVArea, "its TLV area says it is \(total) bytes, less than its own 4-byte info; the image is corrupt, sign it again")
            }
            guard hashedEnd + total <= size else {
                throw fail(.badTLVArea, "its TLV area at offset \(hashedEnd) says it is \(total) bytes, running past the end of the \(size)-byte file; the file is truncated, download or sign it again")
            }
            self.header = header
            self.protectedTLVs = protected
            self.tlvs = try Self.walk(bytes, from: hashedEnd + 4, to: hashedEnd + total, area: "TLV area", fail)
            self.tlvAreaEnd = hashedEnd + total
        }

        /// The TLVs in `bytes[start..<end]`, which they must fill exactly.
        private static func walk(_ bytes: [UInt8], from start: Int, to end: Int, area: String,
                                 _ fail: (MCUbootImageError.Code, String) -> MCUbootImageError) throws(MCUbootImageError) -> [TLV] {
            var tlvs: [TLV] = []
            var at = start
            while at < end {
                guard at + 4 <= end else {
                    throw fail(.badTLVArea, "the \(area) ends \(end - at) bytes into a TLV's 4-byte header at offset \(at); the image is corrupt, sign it again")
                }
                let type = TLVType(rawValue: le16(bytes, at))
                let length = Int(le16(bytes, at + 2))
                guard at + 4 + length <= end else {
                    throw fail(.badTLVArea, "its \(type) at offset \(at) says it is \(length) bytes, running \(at + 4 + length - end) bytes past the end of the \(area) at offset \(end); the image is corrupt, sign it again")
                }
                tlvs.append(TLV(type: type, offset: at + 4, value: Array(bytes[(at + 4)..<(at + 4 + length)])))
                at += 4 + length
            }
            return tlvs
        }
    }
}

private func le16(_ b: [UInt8], _ at: Int) -> UInt16 { UInt16(b[at]) | UInt16(b[at + 1]) << 8 }
private func le32(_ b: [UInt8], _ at: Int) -> UInt32 { UInt32(le16(b, at)) | UInt32(le16(b, at + 2)) << 16 }
