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

    static let names: [(ESPChip, String)] = [
        (.esp32, "esp32"), (.esp32s2, "esp32s2"), (.esp32c3, "esp32c3"), (.esp32s3, "esp32s3"), (.esp32c2, "esp32c2"),
        (.esp32c6, "esp32c6"), (.esp32h2, "esp32h2"), (.esp32p4, "esp32p4"),
    ]

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

    /// Parses and checks `bytes` as the device's `esp_ota_end` would (header, segments within the
    /// file, checksum, appended SHA-256), and refuses the files an ESP-IDF build writes beside the
    /// app image (its ELF, a merged flash image).
    public init(bytes: [UInt8], source: String = "image") throws(ESPImageError) {
        self.bytes = bytes
        self.source = source
        if let refusal = Self.otherBuildFile(bytes, source: source) { throw ESPImageError(refusal) }
        guard bytes.count >= Self.headerSize else {
            throw ESPImageError("\(source) is \(bytes.count) bytes, shorter than an ESP-IDF app image header (\(Self.headerSize) bytes): pass build/<app>.bin from `idf.py build`")
        }
        guard bytes[0] == Self.magic else {
            throw ESPImageError("\(source) does not start with the ESP-IDF image magic 0xE9 (it starts with \(hexDump(bytes.prefix(4)))): pass build/<app>.bin from `idf.py build`")
        }
        guard bytes.count <= Self.maximumSize else {
            throw ESPImageError(.imageTooLarge, "\(source) is \(bytes.count) bytes, larger than any ESP32's flash (16 MiB)")
        }
        var reader = ByteReader(bytes)
        let count: Int
        do {
            _ = try reader.u8()
            count = Int(try reader.u8())
            _ = try reader.u16()
            entryAddress = try reader.u32()
            _ = try reader.u32()  // wp_pin, spi_pin_drv[3]
            chip = ESPChip(rawValue: try reader.u16())
        } catch {
            throw ESPImageError("\(source): \(error)")
        }
        hashAppended = bytes[23] == 1
        guard (1...Self.maxSegments).contains(count) else {
            throw ESPImageError("\(source) says it has \(count) segments; an ESP-IDF app image has 1 to \(Self.maxSegments): the file is damaged, build it again")
        }
        var offset = Self.headerSize
        var segments: [Segment] = []
        var checksum: UInt8 = 0xEF
        for index in 0..<count {
            guard offset + 8 <= bytes.count else {
                throw ESPImageError("\(source) ends at byte \(bytes.count) inside the header of segment \(index + 1) of \(count): the file is truncated, copy build/<app>.bin again")
            }
            var header = ByteReader(bytes[offset..<(offset + 8)])
            let load = (try? header.u32()) ?? 0
            let length = Int((try? header.u32()) ?? 0)
            guard length <= bytes.count - offset - 8 else {
                throw ESPImageError("\(source): segment \(index + 1) of \(count) (load address 0x\(String(load, radix: 16)), \(length) bytes) runs past the end of the file (\(bytes.count) bytes): the file is truncated, copy build/<app>.bin again")
            }
            segments.append(Segment(loadAddress: load, offset: offset + 8, length: length))
            for b in bytes[(offset + 8)..<(offset + 8 + length)] { checksum ^= b }
            offset += 8 + length
        }
        self.segments = segments
        // Zero padding so that the checksum byte is the last of a 16-byte block.
        let checksumAt = offset + (15 - offset % 16)
        guard checksumAt < bytes.count else {
            throw ESPImageError("\(source) ends before its checksum byte (at \(checksumAt)): the file is truncated, copy build/<app>.bin again")
        }
        guard bytes[checksumAt] == checksum else {
            throw ESPImageError("\(source): its checksum byte is 0x\(String(bytes[checksumAt], radix: 16)) but its segments give 0x\(String(checksum, radix: 16)): the file is damaged, build it again")
        }
        var end = checksumAt + 1
        if hashAppended {
            guard end + 32 <= bytes.count else {
                throw ESPImageError("\(source) says a SHA-256 follows its checksum, but the file ends \(bytes.count - end) bytes after it: the file is truncated, copy build/<app>.bin again")
            }
            let digest = Array(SHA256.hash(data: bytes[0..<end]))
            guard digest[...] == bytes[end..<(end + 32)] else {
                throw ESPImageError("\(source): its appended SHA-256 does not match its bytes: the file is damaged, build it again")
            }
            end += 32
        }
        imageLength = end
        trailer = Self.trailer(bytes, after: end)
        (version, projectName) = Self.appDescription(bytes, segments.first)
    }

    /// Refuses the image for a device: `chip` (from `--chip`, or what the device says) must be the
    /// one the image was built for; `partitionSize` (the device's OTA partition) must hold it.
    public func check(chip expected: ESPChip?, partitionSize: Int? = nil) throws(ESPImageError) {
        if let expected, expected != chip {
            throw ESPImageError(.incompatibleDevice, "\(source) is built for \(chip.target) (chip id \(chip.rawValue)), not \(expected.target): build it with `idf.py set-target \(expected.target)`")
        }
        if let partitionSize, bytes.count > partitionSize {
            throw ESPImageError(.imageTooLarge, "\(source) is \(bytes.count) bytes, more than the device's OTA partition (\(partitionSize) bytes): shrink the app or give its OTA partitions more room in partitions.csv")
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
        if bytes.starts(with: [0xCF, 0xB6, 0x88, 0x07]) {
            return "\(source) is a pre-encrypted image (esp_encrypted_img, magic 0x0788b6cf); it goes to a device built with CONFIG_PRE_ENC_OTA, which otaflash does not support yet: pass the plain build/<app>.bin to a device without it"
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
