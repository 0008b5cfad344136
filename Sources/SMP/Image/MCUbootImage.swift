import Crypto
import OTA

/// An MCUboot image as `imgtool sign` writes it, checked before any radio time.
///
/// The layout (MCUboot docs/design.md, "Image Format"; imgtool `image.py`): a 32-byte header
/// padded to `hdr_size`, the firmware, an optional protected TLV area (magic 0x6908) and the TLV
/// area (magic 0x6907). The hash TLV (SHA-256, 384 or 512) covers the header, the firmware and the
/// protected TLVs; MCUboot checks it at boot, `image state-read` reports it per slot and `image
/// state-write` names the image to test or confirm by it.
///
/// Reading refuses, with one line that says what to do: a wrong magic, a header whose sizes run
/// past the file, a TLV area that does not walk exactly to its announced end, no or several hash
/// TLVs, a hash that does not match, and (once the hash matched) the ENCRYPTED and NON_BOOTABLE
/// flags. Signatures are recognised; `verifySignature(with:)` checks ECDSA P-256 and Ed25519
/// against a given key.
public struct MCUbootImage: Sendable {
    /// The header's first word, little-endian.
    public static let magic: UInt32 = 0x96F3_B83D
    /// The header's fields; `hdr_size` pads it further.
    public static let headerFieldsSize = 32

    /// Where the image came from, for messages.
    public let source: String
    public let header: Header
    /// The protected TLVs (covered by the hash), in file order; empty when the header announces none.
    public let protectedTLVs: [TLV]
    /// The TLVs after the protected area (hash, key hash, signature…), in file order.
    public let tlvs: [TLV]
    /// The image's hash algorithm, from its hash TLV.
    public let hashAlgorithm: HashAlgorithm
    /// The MCUboot image hash: the hash TLV's value, checked against header + firmware + protected
    /// TLVs. `image state-read` reports it; `image state-write` takes it to test or confirm.
    public let imageHash: [UInt8]
    /// SHA-256 of the whole file: the `sha` of an SMP upload's first request.
    public let sha256: [UInt8]
    /// The bytes to upload (the whole file, HEX decoded), with their CRC32.
    public let firmware: FirmwareImage
    /// One line each: what the user should know before the upload (bytes after the TLV area).
    public let warnings: [String]

    /// The bytes to upload: the whole file.
    public var bytes: [UInt8] { firmware.bytes }
    public var version: Version { header.version }
    /// Bytes covered by the hash: header, firmware and protected TLVs.
    public var hashedSize: Int { Int(header.headerSize) + Int(header.imageSize) + Int(header.protectedTLVSize) }
    /// The end of the TLV area; bytes after it (imgtool `--pad`) are uploaded as they are.
    public var tlvAreaEnd: Int { layout.tlvAreaEnd }
    /// The signature TLV, when the image is signed.
    public var signature: TLV? { tlvs.first { $0.type.isSignature } }
    /// The KEYHASH TLV: SHA-256 of the signing key's public part (DER SubjectPublicKeyInfo).
    public var keyHash: [UInt8]? { tlvs.first { $0.type == .keyHash }?.value }

    private let layout: Layout

    /// Reads an image file: an MCUboot binary, or Intel HEX holding one (`imgtool sign … app.hex`),
    /// decoded to the bytes of the binary.
    ///
    /// - Parameters:
    ///   - path: the file.
    ///   - slotSize: the device's slot size in bytes, when known: a larger image is refused.
    /// - Throws: `MCUbootImageError`: `.unreadable` for a file that cannot be read or is
    ///   another kind of file, else the code of the check that failed.
    public static func load(path: String, slotSize: Int? = nil) throws(MCUbootImageError) -> MCUbootImage {
        let file: FirmwareImage
        do {
            file = try FirmwareImage.load(path: path, accepting: [.mcuboot], detecting: [.mcuboot])
        } catch {
            let at = error.line.map { "\(error.path):\($0)" } ?? error.path
            throw MCUbootImageError(.unreadable, at, error.reason)
        }
        let image = try MCUbootImage(file, source: path)
        if let slotSize { try image.check(slotSize: slotSize) }
        return image
    }

    /// Parses and checks an image `FirmwareImage.read` claimed (`ImageFormat.Detector.mcuboot`),
    /// from the bytes it read (Intel HEX text decoded).
    public init(_ claimed: ClaimedImage) throws(MCUbootImageError) {
        let bytes = try claimed.bytes { MCUbootImageError(.unreadable, claimed.path, $0.reason) }
        try self.init(FirmwareImage(bytes: bytes, source: claimed.path, baseAddress: claimed.baseAddress), source: claimed.path)
    }

    /// Parses and checks an image held in memory.
    public init(bytes: [UInt8], source: String = "<memory>") throws(MCUbootImageError) {
        try self.init(FirmwareImage(bytes: bytes, source: source), source: source)
    }

    private init(_ file: FirmwareImage, source: String) throws(MCUbootImageError) {
        let bytes = file.bytes
        let layout = try Layout(parsing: bytes, source: source)
        let header = layout.header
        let hashes = (layout.protectedTLVs + layout.tlvs).filter { HashAlgorithm(tlv: $0.type) != nil }
        guard let hash = hashes.first, let algorithm = HashAlgorithm(tlv: hash.type) else {
            throw MCUbootImageError(.noHash, source, "carries no SHA256, SHA384 or SHA512 TLV, so neither MCUboot nor otaflash can check it; sign it with `imgtool sign`")
        }
        guard hashes.count == 1 else {
            let names = hashes.map(\.type.description).joined(separator: ", ")
            throw MCUbootImageError(.badTLVArea, source, "carries \(hashes.count) hash TLVs (\(names)) where MCUboot expects one; sign the image again with `imgtool sign`")
        }
        guard hash.value.count == algorithm.digestSize else {
            throw MCUbootImageError(.badTLVArea, source, "its \(hash.type) TLV is \(hash.value.count) bytes, but a \(algorithm) hash is \(algorithm.digestSize); the image is corrupt, sign it again")
        }
        let hashed = bytes[0..<(Int(header.headerSize) + Int(header.imageSize) + Int(header.protectedTLVSize))]
        let digest = algorithm.digest(hashed)
        let encryption: String? = header.flags.contains(.encryptedAES256) ? "AES-256, flag 0x08"
            : header.flags.contains(.encryptedAES128) ? "AES-128, flag 0x04" : nil
        func encrypted(_ bits: String) -> MCUbootImageError {
            MCUbootImageError(.encrypted, source, "is encrypted (\(bits)); otaflash uploads plain images only, sign it without `--encrypt`")
        }
        guard digest == hash.value else {
            // imgtool hashes an image before it encrypts it (`image.py`, `create`), so a real
            // encrypted image, which carries its wrapped key in an ENC TLV (0x30–0x34), never
            // matches here: say so, not that it is corrupt.
            if let encryption, layout.tlvs.contains(where: { (0x30...0x34).contains($0.type.rawValue) }) {
                throw encrypted(encryption)
            }
            throw MCUbootImageError(.hashMismatch, source, "the \(algorithm) of its header, firmware and protected TLVs is \(Self.hexPrefix(digest)), but its hash TLV says \(Self.hexPrefix(hash.value)); the file is corrupt, download or sign it again")
        }
        // The flags are covered by the hash: checked once they are known to be the signer's.
        if let encryption { throw encrypted(encryption) }
        if header.flags.contains(.nonBootable) {
            throw MCUbootImageError(.nonBootable, source, "is marked non-bootable (flag 0x10), so MCUboot would never run it; sign it without `--non-bootable`")
        }
        var warnings: [String] = []
        let extra = bytes.count - layout.tlvAreaEnd
        if extra > 0 {
            warnings.append("\(source): \(extra) bytes follow the TLV area (imgtool --pad?); they are uploaded with the image")
        }
        self.source = source
        self.layout = layout
        self.header = header
        self.protectedTLVs = layout.protectedTLVs
        self.tlvs = layout.tlvs
        self.hashAlgorithm = algorithm
        self.imageHash = digest
        self.sha256 = Array(SHA256.hash(data: bytes))
        self.firmware = file
        self.warnings = warnings
    }

    /// Checks that the image fits a slot of `slotSize` bytes.
    ///
    /// MCUboot also keeps a trailer at the slot's end (its size depends on the device's flash
    /// alignment and sector count); a device that lacks room for it refuses the upload itself.
    ///
    /// - Throws: `MCUbootImageError` `.overSlot` (`OTAError.Code.imageTooLarge`).
    public func check(slotSize: Int) throws(MCUbootImageError) {
        guard bytes.count <= slotSize else {
            throw MCUbootImageError(.overSlot, source, "is \(bytes.count) bytes but the slot holds \(slotSize) (0x\(String(slotSize, radix: 16))); build a smaller image, or check the slot size")
        }
    }
}

extension MCUbootImage {
    /// "d341c1df846ce9dc…": the first bytes of a hash, enough to tell two apart in a message.
    static func hexPrefix(_ bytes: [UInt8], count: Int = 8) -> String {
        bytes.prefix(count).map { ($0 < 16 ? "0" : "") + String($0, radix: 16) }.joined() + (bytes.count > count ? "…" : "")
    }
}

/// A file that is not a usable MCUboot image: why, and what to do, in one line.
public typealias MCUbootImageError = ImageFileError

extension ImageFileError.Code {
    /// The first word is not the MCUboot magic.
    public static let notMCUboot = Self("not-mcuboot")
    /// The header's fields are impossible (a header size under 32 bytes).
    public static let badHeader = Self("bad-header")
    /// The header announces more bytes than the file has.
    public static let truncated = Self("truncated")
    /// A TLV area is missing, overruns the file, or does not walk to its announced end.
    public static let badTLVArea = Self("bad-tlv-area")
    /// No hash TLV.
    public static let noHash = Self("no-hash")
    public static let encrypted = Self("encrypted")
    public static let nonBootable = Self("non-bootable")
    /// Larger than the device's slot (`OTAError.Code.imageTooLarge`, exit code 4).
    public static let overSlot = Self("over-slot", failure: .imageTooLarge)
    /// The signature or key hash does not match the given key, or the key is unusable.
    public static let badSignature = Self("bad-signature")
}
