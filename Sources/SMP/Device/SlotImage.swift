import Crypto

/// An image as an SMP server sees it in a slot: the version, hash and flags `image state-read`
/// reports. Only the 32-byte MCUboot header is read here (magic, sizes, flags, version), enough for
/// the device side; the full parser, with the TLV walk and the checks a flasher makes, is
/// `Sources/SMP/Image`.
///
/// The hash is what Zephyr's img_mgmt reports (`img_mgmt_read_info`): the value of the image's
/// hash TLV, read, not computed (SHA256, or SHA384/SHA512 for an MCUboot built with that hash),
/// after the protected TLV area when there is one. Bytes that hold no hash TLV, or are not an
/// MCUboot image, report the SHA-256 of the hashed bytes (of all of them, version 0.0.0): Zephyr
/// would not list such a slot; the model keeps a hash to name it by. MCUboot's own check of the
/// hash and the signature at boot is `SMPServer.boot()`.
public struct SMPSlotImage: Sendable, Hashable {
    public static let magic: UInt32 = 0x96F3_B83D
    /// MCUboot's `IMAGE_F_NON_BOOTABLE`.
    public static let nonBootableFlag: UInt32 = 0x10
    /// MCUboot's `IMAGE_F_ROM_FIXED`: the image runs only at its header's load address (direct-XIP).
    public static let romFixedFlag: UInt32 = 0x100

    /// The header's load address (`ih_load_addr`), which direct-XIP reads when `romFixedFlag` is set.
    public var loadAddress: UInt32 {
        isMCUboot ? (4..<8).reduce(UInt32(0)) { $0 | UInt32(bytes[$1]) << (8 * ($1 - 4)) } : 0
    }

    /// The flash address the image is built to run at, when it says (`romFixedFlag`).
    public var fixedAddress: UInt32? { Self.fixedAddress(header: bytes) }

    /// The load address an image header (its first 32 bytes or more) fixes the image to, when it
    /// sets `romFixedFlag`.
    public static func fixedAddress(header data: [UInt8]) -> UInt32? {
        guard data.count >= 32, hasMagic(data) else { return nil }
        func u32(_ at: Int) -> UInt32 { (0..<4).reduce(UInt32(0)) { $0 | UInt32(data[at + $1]) << (8 * $1) } }
        return u32(16) & romFixedFlag != 0 ? u32(4) : nil
    }

    /// `major.minor.revision` older than `other`'s (MCUboot's downgrade prevention ignores the build).
    public func isOlder(than other: SMPSlotImage) -> Bool {
        (version.major, version.minor, version.revision) < (other.version.major, other.version.minor, other.version.revision)
    }

    /// Newer than `other`, build number included (direct-XIP boots the highest version).
    public func isNewer(than other: SMPSlotImage) -> Bool {
        (version.major, version.minor, version.revision, version.build)
            > (other.version.major, other.version.minor, other.version.revision, other.version.build)
    }

    public let bytes: [UInt8]
    /// Whether the bytes start with an MCUboot header that fits them.
    public let isMCUboot: Bool
    /// major, minor, revision, build.
    public let version: (major: UInt8, minor: UInt8, revision: UInt16, build: UInt32)
    public let flags: UInt32
    public let hash: [UInt8]

    public init(_ bytes: [UInt8]) {
        self.bytes = bytes
        func u16(_ at: Int) -> Int { Int(bytes[at]) | Int(bytes[at + 1]) << 8 }
        func u32(_ at: Int) -> UInt32 { (0..<4).reduce(UInt32(0)) { $0 | UInt32(bytes[at + $1]) << (8 * $1) } }
        if bytes.count >= 32, u32(0) == Self.magic, u16(8) >= 32,
           u16(8) + Int(u32(12)) + u16(10) <= bytes.count {
            isMCUboot = true
            flags = u32(16)
            version = (bytes[20], bytes[21], UInt16(u16(22)), u32(24))
            let hashedEnd = u16(8) + Int(u32(12)) + u16(10)
            hash = Self.hashTLV(bytes, from: u16(8) + Int(u32(12))) ?? Array(SHA256.hash(data: bytes[0..<hashedEnd]))
        } else {
            isMCUboot = false
            flags = 0
            version = (0, 0, 0, 0)
            hash = Array(SHA256.hash(data: bytes))
        }
    }

    /// The value of the first hash TLV (type 0x10, 0x11 or 0x12 with 32, 48 or 64 bytes) in the TLV
    /// area at `start` (past a protected area, magic 0x6908, when one is there); nil when there is
    /// none, or the area runs past the bytes.
    static func hashTLV(_ bytes: [UInt8], from start: Int) -> [UInt8]? {
        func u16(_ at: Int) -> Int? { at + 2 <= bytes.count ? Int(bytes[at]) | Int(bytes[at + 1]) << 8 : nil }
        var at = start
        if u16(at) == 0x6908, let total = u16(at + 2) { at += total }
        guard u16(at) == 0x6907, let total = u16(at + 2) else { return nil }
        let end = min(at + total, bytes.count)
        at += 4
        while at + 4 <= end, let length = u16(at + 2) {
            let type = bytes[at]
            let sizes: [UInt8: Int] = [0x10: 32, 0x11: 48, 0x12: 64]
            if sizes[type] == length, at + 4 + length <= end { return Array(bytes[(at + 4)..<(at + 4 + length)]) }
            at += 4 + length
        }
        return nil
    }

    /// Whether the first bytes of an upload carry MCUboot's magic (Zephyr's img_mgmt checks it on
    /// the first chunk).
    public static func hasMagic(_ prefix: [UInt8]) -> Bool {
        prefix.count >= 4 && prefix[0..<4].elementsEqual([0x3D, 0xB8, 0xF3, 0x96])
    }

    /// MCUboot's image is bootable unless flagged otherwise; bytes that are no MCUboot image are not.
    public var bootable: Bool { isMCUboot && flags & Self.nonBootableFlag == 0 }

    /// The version as img_mgmt writes it: `major.minor.revision`, with `.build` when it is not 0.
    public var versionText: String {
        let base = "\(version.major).\(version.minor).\(version.revision)"
        return version.build == 0 ? base : base + ".\(version.build)"
    }

    /// Whether the version in an image header's bytes (`data`, at least 32 of them) is newer
    /// than `other`'s: the first chunk of an upload with `upgrade` set.
    static func headerVersion(_ data: [UInt8], isNewerThan other: SMPSlotImage) -> Bool {
        let revision = UInt16(data[22]) | UInt16(data[23]) << 8
        let build = (0..<4).reduce(UInt32(0)) { $0 | UInt32(data[24 + $1]) << (8 * $1) }
        let b = other.version
        return (data[20], data[21], revision, build) > (b.major, b.minor, b.revision, b.build)
    }

    public static func == (l: SMPSlotImage, r: SMPSlotImage) -> Bool { l.bytes == r.bytes }
    public func hash(into hasher: inout Hasher) { hasher.combine(bytes) }

    /// A small unsigned MCUboot image as `imgtool sign` lays it out without a key: a 32-byte
    /// header, `body`, and a TLV area holding only the SHA256 TLV. For the simulated device's
    /// factory image and for tests.
    public static func build(major: UInt8, minor: UInt8, revision: UInt16, build: UInt32 = 0, body: [UInt8],
                             flags: UInt32 = 0, loadAddress: UInt32 = 0) -> [UInt8] {
        func le(_ value: UInt32, _ count: Int) -> [UInt8] { (0..<count).map { UInt8(truncatingIfNeeded: value >> (8 * $0)) } }
        var header = le(magic, 4) + le(loadAddress, 4) + le(32, 2) + le(0, 2) + le(UInt32(body.count), 4) + le(flags, 4)
        header += [major, minor] + le(UInt32(revision), 2) + le(build, 4) + le(0, 4)
        let hashed = header + body
        let digest = Array(SHA256.hash(data: hashed))
        return hashed + [0x07, 0x69] + le(4 + 4 + 32, 2) + [0x10, 0x00] + le(32, 2) + digest
    }
}
