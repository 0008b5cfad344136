import Crypto
import OTA
import OTAWire

/// An Espressif chip, as the app image's extended header names it (`esp_chip_id_t`,
/// ESP-IDF `esp_app_format.h`).
public struct ESPChip: RawRepresentable, Sendable, Hashable, CustomStringConvertible {
    public let rawValue: UInt16
    public init(rawValue: UInt16) { self.rawValue = rawValue }

    public static let esp32 = ESPChip(rawValue: 0x0000)
    public static let esp32s2 = ESPChip(rawValue: 0x0002)
    public static let esp32c3 = ESPChip(rawValue: 0x0005)
    public static let esp32s3 = ESPChip(rawValue: 0x0009)
    public static let esp32c2 = ESPChip(rawValue: 0x000C)
    public static let esp32c6 = ESPChip(rawValue: 0x000D)
    public static let esp32h2 = ESPChip(rawValue: 0x0010)
    public static let esp32p4 = ESPChip(rawValue: 0x0012)
    public static let esp32c61 = ESPChip(rawValue: 0x0014)
    public static let esp32c5 = ESPChip(rawValue: 0x0017)
    public static let esp32h21 = ESPChip(rawValue: 0x0019)
    public static let esp32h4 = ESPChip(rawValue: 0x001C)

    static let names: [(ESPChip, String)] = [
        (.esp32, "esp32"), (.esp32s2, "esp32s2"), (.esp32c3, "esp32c3"), (.esp32s3, "esp32s3"), (.esp32c2, "esp32c2"),
        (.esp32c6, "esp32c6"), (.esp32h2, "esp32h2"), (.esp32p4, "esp32p4"), (.esp32c61, "esp32c61"), (.esp32c5, "esp32c5"),
        (.esp32h21, "esp32h21"), (.esp32h4, "esp32h4"),
    ]

    /// Whether ESP-IDF names this chip id (`esp_chip_id_t`).
    public var isKnown: Bool { Self.names.contains { $0.0 == self } }

    /// `esp32c3`, `ESP32-C3` or `esp32-c3`; nil for a name ESP-IDF does not use.
    public init?(name: String) {
        let key = name.lowercased().filter { $0 != "-" && $0 != "_" }
        guard let chip = Self.names.first(where: { $0.1 == key })?.0 else { return nil }
        self = chip
    }

    /// The target name `idf.py set-target` takes.
    public var target: String { Self.names.first { $0.0 == self }?.1 ?? "chip id \(rawValue)" }
    public var description: String { target }
    public static var knownNames: [String] { names.map(\.1) }
}

/// Why an ESP-IDF app image is refused, with the exit code's class.
public struct ESPImageError: Error, Sendable, Hashable, CustomStringConvertible {
    public var code: OTAError.Code
    public var description: String
    public init(_ code: OTAError.Code, _ description: String) {
        self.code = code
        self.description = description
    }
    public init(_ description: String) { self.init(.image, description) }
    public var otaError: OTAError { OTAError(code, description) }
}

/// An ESP-IDF application image (ESP-IDF "App Image Format"; `esp_app_format.h`): a 24-byte header
/// (magic 0xE9, segment count, SPI mode, speed and size, entry address, then the extended header
/// with the chip id, chip revisions and `hash_appended`), the segments (load address, length,
/// data), zero padding so that the checksum byte ends a 16-byte block, the checksum (0xEF XOR every
/// segment byte), then the SHA-256 of all that when `hash_appended` is 1, then, on a device with
/// Secure Boot, its signature block. This is what `idf.py build` writes as `build/<app>.bin` and
/// what `esp_ota_end` checks on the device.
public struct ESPAppImage: Sendable, Hashable {
    public static let magic: UInt8 = 0xE9
    public static let headerSize = 24
    public static let maxSegments = 16
    /// `esp_app_desc_t`'s magic, at the start of the first segment of an application.
    public static let appDescriptionMagic: UInt32 = 0xABCD_5432
    /// The largest flash any ESP32 has: no app partition is larger.
    public static let maximumSize = 16 << 20

    public struct Segment: Sendable, Hashable {
        public var loadAddress: UInt32
        public var offset: Int
        public var length: Int
    }

    /// What follows the image proper.
    public enum Trailer: Sendable, Hashable {
        case none
        /// Secure Boot v1: a version word and a 64-byte ECDSA signature (68 bytes).
        case secureBootV1
        /// Secure Boot v2: a 4 KiB-aligned signature sector of blocks starting 0xE7 (RSA or ECDSA).
        case secureBootV2
        /// Bytes that are no signature block; the device does not read them.
        case unknown(Int)
    }

    public let bytes: [UInt8]
    public let chip: ESPChip
    public let entryAddress: UInt32
    public let segments: [Segment]
    public let hashAppended: Bool
    /// The image up to and including its checksum byte and hash: what `esp_ota_end` verifies.
    public let imageLength: Int
    public let trailer: Trailer
    /// `esp_app_desc_t`'s version and project name, when the first segment starts with one.
    public let version: String?
    public let projectName: String?
    public let source: String

    public var size: Int { bytes.count }
    public var firmware: FirmwareImage { FirmwareImage(bytes: bytes, source: source) }

    /// What the user should know before the image is sent.
    public var warnings: [String] {
        var out: [String] = []
        if version == nil {
            out.append("\(source) has no application description (esp_app_desc_t) in its first segment: a bootloader image? BLE OTA writes applications (build/<app>.bin)")
        }
        if !hashAppended { out.append("\(source) carries no appended SHA-256: the device checks only its 8-bit checksum") }
        switch trailer {
        case .secureBootV1, .secureBootV2:
            out.append("\(source) is signed for Secure Boot; a device with Secure Boot enabled checks the signature with its own key")
        case .unknown(let n):
            out.append("\(n) bytes follow the image in \(source) that are no Secure Boot signature block; they are sent, and the device ignores them")
        case .none: break
        }
        return out
    }

    /// Parses and checks `bytes` as the device's `esp_ota_end` would (`esp_image_verify`: the
    /// header, at most 16 segments whose lengths are multiples of 4 and lie within the file, the
    /// checksum, the appended SHA-256), and refuses the files an ESP-IDF build writes beside the app
    /// image (its ELF, a merged flash image, a pre-encrypted image). A file that starts with the magic
    /// but fails a check is a damaged app image, and the line names the damage.
    public init(bytes: [UInt8], source: String = "image") throws(ESPImageError) {
        self.bytes = bytes
        self.source = source
        if let refusal = Self.otherBuildFile(bytes, source: source) { throw ESPImageError(refusal) }
        guard bytes.first == Self.magic else {
            throw ESPImageError("\(source) does not start with the ESP-IDF image magic 0xE9 (it starts with \(hexDump(bytes.prefix(4)))): pass build/<app>.bin from `idf.py build`")
        }
        func damaged(_ what: String, truncated: Bool = false) -> ESPImageError {
            ESPImageError("\(source) is a damaged ESP-IDF app image: \(what); "
                          + (truncated ? "the file is truncated, copy build/<app>.bin again" : "the file is damaged, build it again"))
        }
        guard bytes.count >= Self.headerSize else {
            throw damaged("it is \(bytes.count) bytes, shorter than the app image header (\(Self.headerSize) bytes)", truncated: true)
        }
        guard bytes.count <= Self.maximumSize else {
            throw ESPImageError(.imageTooLarge, "\(source) is \(bytes.count) bytes, larger than any ESP32's flash (16 MiB)")
        }
        let header = Self.Header(bytes)
        entryAddress = header.entryAddress
        chip = header.chip
        if let damage = header.damage { throw damaged(damage) }
        hashAppended = header.hashAppended
        let count = header.segmentCount
        var offset = Self.headerSize
        var segments: [Segment] = []
        var checksum: UInt8 = 0xEF
        for index in 0..<count {
            guard offset + 8 <= bytes.count else {
                throw damaged("it ends at byte \(bytes.count), inside the header of segment \(index + 1) of \(count)", truncated: true)
            }
            let load = Self.le32(bytes, offset)
            let length = Int(Self.le32(bytes, offset + 4))
            let what = "segment \(index + 1) of \(count) (load address 0x\(String(load, radix: 16)), \(length) bytes)"
            guard length < Self.maximumSize else {
                throw damaged("\(what) is longer than 16 MiB, which esp_image_verify refuses")
            }
            guard length % 4 == 0 else {
                throw damaged("\(what) is not a whole number of 32-bit words, which esp_image_verify refuses")
            }
            guard length <= bytes.count - offset - 8 else {
                throw damaged("\(what) runs past the end of the file (\(bytes.count) bytes)", truncated: true)
            }
            segments.append(Segment(loadAddress: load, offset: offset + 8, length: length))
            for b in bytes[(offset + 8)..<(offset + 8 + length)] { checksum ^= b }
            offset += 8 + length
        }
        self.segments = segments
        // Zero padding so that the checksum byte is the last of a 16-byte block.
        let checksumAt = offset + (15 - offset % 16)
        guard checksumAt < bytes.count else {
            throw damaged("it ends before its checksum byte (at \(checksumAt))", truncated: true)
        }
        guard bytes[checksumAt] == checksum else {
            throw damaged("its checksum byte is 0x\(String(bytes[checksumAt], radix: 16)) but its segments give 0x\(String(checksum, radix: 16))")
        }
        var end = checksumAt + 1
        if hashAppended {
            guard end + 32 <= bytes.count else {
                throw damaged("it says a SHA-256 follows its checksum, but the file ends \(bytes.count - end) bytes after it", truncated: true)
            }
            let digest = Array(SHA256.hash(data: bytes[0..<end]))
            guard digest[...] == bytes[end..<(end + 32)] else {
                throw damaged("its appended SHA-256 does not match its bytes")
            }
            end += 32
        }
        imageLength = end
        trailer = Self.trailer(bytes, after: end)
        (version, projectName) = Self.appDescription(bytes, segments.first)
    }

    /// The 24-byte header (`esp_image_header_t`), read from a file's first bytes, with what is
    /// wrong with it as ESP-IDF reads it (`verify_image_header`, `bootloader_common_check_chip_validity`).
    public struct Header: Sendable, Hashable {
        public var segmentCount: Int
        public var spiMode: UInt8
        public var entryAddress: UInt32
        public var chip: ESPChip
        public var minimumRevision: UInt16
        public var maximumRevision: UInt16
        public var hashAppendedByte: UInt8
        public var hashAppended: Bool { hashAppendedByte == 1 }

        /// Reads `head` from its first byte; `head` holds at least 24 bytes.
        public init(_ head: some RandomAccessCollection<UInt8>) {
            let b = Array(head.prefix(ESPAppImage.headerSize))
            segmentCount = Int(b[1])
            spiMode = b[2]
            entryAddress = ESPAppImage.le32(b, 4)
            chip = ESPChip(rawValue: UInt16(b[12]) | UInt16(b[13]) << 8)
            minimumRevision = UInt16(b[15]) | UInt16(b[16]) << 8
            maximumRevision = UInt16(b[17]) | UInt16(b[18]) << 8
            hashAppendedByte = b[23]
        }

        /// What makes the header one no ESP-IDF device takes, as a phrase; nil: it checks out.
        public var damage: String? {
            if segmentCount == 0 { return "it says it has no segments; an app image has 1 to \(ESPAppImage.maxSegments)" }
            if segmentCount > ESPAppImage.maxSegments {
                return "it says it has \(segmentCount) segments, more than ESP-IDF's limit of \(ESPAppImage.maxSegments) (ESP_IMAGE_MAX_SEGMENTS)"
            }
            if !chip.isKnown {
                return "its chip id is 0x\(String(chip.rawValue, radix: 16)), which no ESP32 has (\(ESPChip.knownNames.joined(separator: ", ")))"
            }
            if spiMode > 5 { return "its SPI flash mode byte is \(spiMode); ESP-IDF writes 0 to 5 (QIO to SLOW_READ)" }
            if hashAppendedByte > 1 { return "its hash_appended byte is \(hashAppendedByte); ESP-IDF writes 0 or 1" }
            if maximumRevision != 0xFFFF, maximumRevision < minimumRevision {
                return "it says it runs on chip revisions \(minimumRevision) to \(maximumRevision) (major × 100 + minor), which no chip is"
            }
            return nil
        }
    }

    static func le32(_ b: some RandomAccessCollection<UInt8>, _ at: Int) -> UInt32 {
        let i = b.index(b.startIndex, offsetBy: at)
        return (0..<4).reduce(UInt32(0)) { $0 | UInt32(b[b.index(i, offsetBy: $1)]) << (8 * $1) }
    }

    /// Refuses the image for a device: `chip` (from `--chip`, or what the device says) must be the
    /// one the image was built for; `partitionSize` (the device's OTA partition) must hold it.
    public func check(chip expected: ESPChip?, partitionSize: Int? = nil) throws(ESPImageError) {
        if let expected, expected != chip {
            throw ESPImageError(.incompatibleDevice, "\(source) is built for \(chip.target) (chip id \(chip.rawValue)), not \(expected.target): build it with `idf.py set-target \(expected.target)`")
        }
        if let partitionSize {
            _ = try ESPPartitionLimit.check(appSize: bytes.count, source: source,
                                            limit: ESPPartitionLimit(size: partitionSize, what: "the device's OTA partition"))
        }
    }

    /// Reads and checks the file at `path`.
    public static func load(path: String) throws(ESPImageError) -> ESPAppImage {
        let firmware: FirmwareImage
        do {
            firmware = try FirmwareImage.load(path: path, accepting: [.espAppImage, .elf], detecting: [.espAppImage])
        } catch {
            throw ESPImageError("\(error)")
        }
        return try ESPAppImage(bytes: firmware.bytes, source: path)
    }

    /// The line for a file an ESP-IDF build writes that is not the app image: its ELF, a merged
    /// flash image (bootloader + partition table + app, `esptool merge_bin`), a pre-encrypted image.
    static func otherBuildFile(_ bytes: [UInt8], source: String) -> String? {
        if bytes.starts(with: [0x7F, 0x45, 0x4C, 0x46]) {
            return "\(source) is an ELF file (the linker's output); BLE OTA sends the app image ESP-IDF builds beside it: pass build/<app>.bin (or make one with `esptool elf2image`)"
        }
        if isMergedFlashImage(bytes) {
            return "\(source) is a merged flash image (bootloader, partition table and app, as `esptool merge_bin` writes it); BLE OTA writes only the app: pass build/<app>.bin"
        }
        if bytes.starts(with: ESPEncryptedImage.magicBytes) {
            return "\(source) is a pre-encrypted image (esp_encrypted_img, magic 0x0788b6cf), not a plain app image: only a device built with CONFIG_PRE_ENC_OTA decrypts it; pass the plain build/<app>.bin to a device without it"
        }
        return nil
    }

    /// A bootloader image at 0x0 (ESP32-C3 and later) or 0x1000 (ESP32, ESP32-S2), with the
    /// partition table's first entry (magic 0x50AA) at 0x8000.
    static func isMergedFlashImage(_ bytes: [UInt8]) -> Bool {
        guard bytes.count > 0x8002, bytes[0x8000] == 0xAA, bytes[0x8001] == 0x50 else { return false }
        return bytes[0] == magic || (bytes[0x1000] == magic && bytes[0..<0x1000].allSatisfy { $0 == 0xFF || $0 == 0 })
    }

    static func trailer(_ bytes: [UInt8], after end: Int) -> Trailer {
        let rest = bytes.count - end
        if rest == 0 { return .none }
        if rest == 68, bytes[end..<(end + 4)].allSatisfy({ $0 == 0 }) { return .secureBootV1 }
        let aligned = (end + 4095) / 4096 * 4096
        if aligned + 4 <= bytes.count, bytes[aligned] == 0xE7, (2...3).contains(bytes[aligned + 1]) { return .secureBootV2 }
        return .unknown(rest)
    }

    static func appDescription(_ bytes: [UInt8], _ first: Segment?) -> (String?, String?) {
        guard let first, first.length >= 80 else { return (nil, nil) }
        var reader = ByteReader(bytes[first.offset..<(first.offset + 80)])
        guard (try? reader.u32()) == appDescriptionMagic else { return (nil, nil) }
        func text(_ at: Int) -> String {
            let field = bytes[(first.offset + at)..<(first.offset + at + 32)]
            return String(decoding: field.prefix { $0 != 0 }, as: UTF8.self)
        }
        return (text(16), text(48))
    }
}
