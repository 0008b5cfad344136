import Crypto
import Foundation
import OTA
import OTAWire

/// Why a GBL file or a key is refused: one line that says what is wrong and what to do, and the
/// exit code's class (`.image`, or `.imageTooLarge` for a file larger than any storage slot).
public struct GBLError: Error, Sendable, Equatable, CustomStringConvertible {
    public let code: OTAError.Code
    public let description: String

    public init(_ code: OTAError.Code, _ description: String) {
        self.code = code
        self.description = description
    }
    public init(_ description: String) { self.init(.image, description) }
    public init(description: String) { self.init(.image, description) }

    public var otaError: OTAError { OTAError(code, description) }
}

/// A Silicon Labs GBL file (Gecko Bootloader image format 3), checked as the Gecko Bootloader's
/// parser checks it before any radio time: the file is sent to the device as it is, and the
/// device's bootloader parses it again (`platform/bootloader/parser/gbl/btl_gbl_parser.c`).
///
/// The format: tags of an id and a length (little-endian u32 each) and a value. The header tag
/// comes first (GBL version, major 3; type flags: 0x1 AES-CCM encrypted, 0x100 ECDSA signed);
/// then, in the order the parser's table gives (`btl_gbl_format.c`), version dependency tags, the
/// encryption init tag, the application tag (`ApplicationData_t`: type, version, capabilities,
/// product id), the SE upgrade and bootloader tags, prog, erase-prog, LZ4/LZMA prog, delta and
/// metadata tags in any mix, encrypted data tags (which hold the tags after the init tag of an
/// encrypted file), the certificate and signature tags, and the end tag, whose value is the CRC-32
/// of every byte before it: the parser runs the CRC over the whole file including that value and
/// wants the residue 0xDEBB20E3 (`BTL_CRC32_END`), which is zlib's CRC-32 of the file up to the
/// end tag's value being that value.
public struct GBLFile: Sendable, Equatable {
    /// The whole .gbl, sent to the device as it is.
    public let bytes: [UInt8]
    /// From the application tag (`ApplicationData_t.version`); nil when the file has none, or it
    /// is encrypted.
    public let applicationVersion: UInt32?
    /// The 16-byte product id from the application tag, nil where absent.
    public let productID: [UInt8]?
    /// An encrypted GBL: only the device can check what it carries.
    public let isEncrypted: Bool
    /// The file has a signature tag.
    public let isSigned: Bool
    /// The signature was verified against a key given.
    public let signatureChecked: Bool
    /// What it carries, as short texts: "application", "bootloader", "SE upgrade", "metadata"…
    public let contents: [String]
    /// The application tag's type bits (`APPLICATION_TYPE_*`, 0x20: a Bluetooth application).
    public let applicationType: UInt32?
    /// The versions of a bootloader or SE upgrade it carries.
    public let bootloaderVersion: UInt32?
    public let seUpgradeVersion: UInt32?
    /// Its tags as they lie in the file (the encrypted data tags' contents unread).
    public let tags: [GBLTag]

    /// The largest GBL a device of these families can store: 8 MiB, the largest SPI flash the
    /// Gecko Bootloader's storage driver supports (Macronix MX25R6435F, 64 Mbit, in
    /// `btl_storage_spiflash`'s device list); no internal flash of an EFR32 is as large (xG26:
    /// 3,200 KiB), and a storage slot lies within one of them.
    public static let maximumSize = 8 << 20
    /// GBL format major version 3 (`GBL_COMPATIBILITY_MAJOR_VERSION`): the top byte of the
    /// header's version.
    public static let majorVersion: UInt32 = 0x0300_0000
    /// Header type flags (`GBL_TYPE_ENCRYPTION_AESCCM`, `GBL_TYPE_SIGNATURE_ECDSA`).
    public static let encryptedFlag: UInt32 = 0x0000_0001
    public static let signedFlag: UInt32 = 0x0000_0100
    /// The parser reads the application tag whole into its 64-byte buffer (`GBL_PARSER_BUFFER_SIZE`).
    static let parserBuffer = 64

    public init(parsing bytes: [UInt8], key: P256.Signing.PublicKey? = nil) throws(GBLError) {
        try self.init(parsing: bytes, key: key, source: nil)
    }

    /// Parses and checks `bytes` as the Gecko Bootloader would, and verifies the signature with
    /// `key` when one is given.
    ///
    /// - Parameter source: the file's name, which starts each refusal ("app.gbl is …").
    /// - Throws: `GBLError`, naming the damage and what to do.
    public init(parsing bytes: [UInt8], key: P256.Signing.PublicKey? = nil, source: String?) throws(GBLError) {
        let file = source.map { "\($0) is" } ?? "this is"
        func damaged(_ what: String, truncated: Bool = false) -> GBLError {
            GBLError("\(file) a damaged GBL file: \(what); "
                     + (truncated ? "the file is truncated, copy it again" : "the file is damaged, make it again with `commander gbl create`"))
        }
        func refused(_ what: String) -> GBLError { GBLError("\(file) a GBL file the Gecko Bootloader refuses: \(what)") }

        guard bytes.count <= Self.maximumSize else {
            throw GBLError(.imageTooLarge, "\(file) \(bytes.count) bytes, larger than any storage slot of a Silicon Labs device (\(Self.maximumSize >> 20) MiB)")
        }
        // The header tag: id, length 8, version, type.
        guard bytes.count >= 8 else {
            throw damaged("it is \(bytes.count) bytes, shorter than a tag's header (8 bytes)", truncated: true)
        }
        let first = GBLTag.ID(rawValue: Self.le32(bytes, 0))
        guard first == .header else {
            if first.rule != nil {
                throw damaged("its first tag is \(first), not the header tag (0x03a617eb), which the bootloader takes first only")
            }
            throw GBLError("\(file) not a GBL file: it does not start with the GBL header tag 0x03a617eb (it starts with 0x\(hex32(first.rawValue)), little-endian); "
                           + "make one with `commander gbl create app.gbl --app app.s37`")
        }
        let headerLength = Int(Self.le32(bytes, 4))
        guard headerLength == 8 else {
            throw damaged("its header tag says it holds \(headerLength) bytes; a GBL 3 header holds 8 (version, type)")
        }
        guard bytes.count >= 16 else {
            throw damaged("it ends at byte \(bytes.count), inside its 16-byte header tag", truncated: true)
        }
        let version = Self.le32(bytes, 8)
        guard version & 0xFF00_0000 == Self.majorVersion else {
            throw refused("its header says GBL version 0x\(hex32(version)); the Gecko Bootloader parses major version 3 (0x03xxxxxx) only (BOOTLOADER_ERROR_PARSER_VERSION); make it again with `commander gbl create`")
        }
        let type = Self.le32(bytes, 12)
        let headerEncrypted = type & Self.encryptedFlag != 0
        let headerSigned = type & Self.signedFlag != 0

        // The tags, in the parser's order.
        var tags = [GBLTag(id: .header, offset: 0, length: 8)]
        var order = 2  // after the header (order 1, once)
        var previous = GBLTag.ID.header
        var offset = 16
        var end: GBLTag?
        while offset < bytes.count {
            guard offset + 8 <= bytes.count else {
                throw damaged("it ends at byte \(bytes.count), inside the header of the tag at byte \(offset)", truncated: true)
            }
            let id = GBLTag.ID(rawValue: Self.le32(bytes, offset))
            let length = Int(Self.le32(bytes, offset + 4))
            guard let rule = id.rule else {
                if tags.count == 1, previous == .header, id.rawValue == 0 || id.rawValue == 0xFFFF_FFFF {
                    throw damaged("its header tag is followed by blank bytes (0x\(hex32(id.rawValue))) at byte \(offset)")
                }
                throw refused("\(id) at byte \(offset), which no Gecko Bootloader parses (BOOTLOADER_ERROR_PARSER_UNKNOWN_TAG); make it again with `commander gbl create`")
            }
            let tag = GBLTag(id: id, offset: offset, length: length)
            guard length <= bytes.count - offset - 8 else {
                throw damaged("\(id) at byte \(offset) says it holds \(length) bytes, but the file ends \(bytes.count - offset - 8) bytes after its header", truncated: true)
            }
            // The SE upgrade tag of a bootloader that upgrades the SE without staging comes before
            // the encryption init tag, in the clear (order 3).
            let tagOrder = id == .seUpgrade && order <= 3 ? 3 : rule.order
            if tagOrder < order {
                if rule.once, tags.contains(where: { $0.id == id }) {
                    throw refused("it has a second \(rule.name) tag (at byte \(offset)); a GBL holds one, and the bootloader refuses another (BOOTLOADER_ERROR_PARSER_INVALID_TAG_ORDER)")
                }
                throw refused("\(id) at byte \(offset) comes after \(previous); the bootloader takes tags in the order header, version dependency, "
                              + "encryption init, application, SE upgrade, bootloader, prog and metadata, encrypted data, certificate, signature, end "
                              + "and refuses this one (BOOTLOADER_ERROR_PARSER_INVALID_TAG_ORDER); make it again with `commander gbl create`")
            }
            if id != .encryptedData { order = rule.once ? tagOrder + 1 : tagOrder }
            try Self.checkLength(tag, in: bytes, damaged: damaged)
            tags.append(tag)
            previous = id
            offset = tag.end
            if id == .end {
                end = tag
                break
            }
        }
        guard let end else {
            throw damaged("it has no end tag (the file ends at byte \(bytes.count), after \(previous))", truncated: true)
        }
        let stored = Self.le32(bytes, end.offset + 8)
        let computed = CRC32.checksum(bytes[0..<(end.offset + 8)])
        guard stored == computed else {
            throw damaged("its end tag's CRC-32 is 0x\(hex32(stored)), but its bytes give 0x\(hex32(computed)) (BOOTLOADER_ERROR_PARSER_CRC)")
        }
        guard end.end == bytes.count else {
            throw damaged("\(bytes.count - end.end) bytes follow its end tag (at byte \(end.end)); the bootloader's parser stops at the end tag and answers any byte after it with BOOTLOADER_ERROR_PARSER_EOF: "
                          + "two files joined, or something appended")
        }

        // Encryption: the init tag before any encrypted data; in an encrypted file every tag but
        // those always in the clear lies in an encrypted data tag.
        let initTag = tags.first { $0.id == .encryptionInit }
        let encryptedData = tags.filter { $0.id == .encryptedData }
        let encrypted = headerEncrypted || initTag != nil || !encryptedData.isEmpty
        if let data = encryptedData.first, initTag.map({ $0.offset > data.offset }) ?? true {
            throw damaged("it holds encrypted data (at byte \(data.offset)) with no encryption init tag before it, so no bootloader can decrypt it")
        }
        if encrypted {
            // The SE upgrade tag of a bootloader without staging lies before the init tag, in the clear.
            let clearSE: (GBLTag) -> Bool = { tag in tag.id == .seUpgrade && initTag.map { tag.offset < $0.offset } == true }
            if let clear = tags.first(where: { $0.id.rule?.clear == false && !clearSE($0) }) {
                throw refused("it is encrypted, but \(clear.id) at byte \(clear.offset) is in the clear, which the bootloader refuses in an encrypted GBL; make it again with `commander gbl create … --encrypt KEY`")
            }
            if encryptedData.isEmpty {
                throw damaged("it is encrypted (header type 0x\(hex32(type))) but holds no encrypted data tag: it carries nothing to install")
            }
        }

        // What it carries.
        let application = tags.first { $0.id == .application }
        let bootloader = tags.first { $0.id == .bootloader }
        let se = tags.first { $0.id == .seUpgrade }
        if !encrypted {
            let programs = tags.contains { $0.id.programs }
            if application == nil, bootloader == nil, se == nil {
                throw refused("it carries no application tag (nor a bootloader or SE upgrade), and the bootloader installs no application from it (\"No app in slot\", btl_storage.c); "
                              + "make it with `commander gbl create app.gbl --app app.s37`")
            }
            if application != nil, !programs {
                throw damaged("it has an application tag but no prog, erase-prog, LZ4 or LZMA prog or delta tag: it carries no application bytes")
            }
        }
        var appVersion: UInt32?
        var product: [UInt8]?
        var appType: UInt32?
        if let application {
            let value = Array(bytes[application.valueRange])
            if value.count >= 4 { appType = Self.le32(value, 0) }
            if value.count >= 8 { appVersion = Self.le32(value, 4) }
            if value.count >= 28 { product = Array(value[12..<28]) }
        }

        // The signature: ECDSA P-256 over the SHA-256 of every byte before the signature tag (the
        // parser hashes each tag it reads but the signature and end tags, encrypted tags as they
        // lie in the file), r and s big-endian.
        let signature = tags.first { $0.id == .signature }
        if headerSigned, signature == nil {
            throw damaged("its header says it is signed (type 0x\(hex32(type))) but it has no signature tag")
        }
        var checked = false
        if let key {
            guard let signature else {
                throw GBLError("\(file) an unsigned GBL file (no signature tag), but --gbl-key was given: a bootloader that enforces signed upgrades "
                               + "(BOOTLOADER_ENFORCE_SIGNED_UPGRADE) refuses it; sign it with `commander gbl create app.gbl --app app.s37 --sign signing-key.pem`")
            }
            let digest = SHA256.hash(data: bytes[0..<signature.offset])
            var signer = key
            var through = "the given key"
            if let certificate = tags.first(where: { $0.id == .certificate }) {
                let value = Array(bytes[certificate.valueRange])
                // ApplicationCertificate_t: version and flags (4), key X‖Y (64), certificate
                // version (4), then the signature of those 72 bytes by the bootloader's key.
                let certified = SHA256.hash(data: value[0..<72])
                guard let certSignature = try? P256.Signing.ECDSASignature(rawRepresentation: value[72..<136]),
                      key.isValidSignature(certSignature, for: certified) else {
                    throw GBLError("\(file) a GBL file whose certificate (at byte \(certificate.offset)) is not signed by the given key (--gbl-key): "
                                   + "the device's bootloader would refuse it; give the key the bootloader's certificate holds, or sign the GBL with a certificate that key signed")
                }
                guard let certKey = try? P256.Signing.PublicKey(rawRepresentation: value[4..<68]) else {
                    throw damaged("the key in its certificate (at byte \(certificate.offset)) is not a P-256 point")
                }
                signer = certKey
                through = "the key of its certificate (which the given key signed)"
            }
            guard let rs = try? P256.Signing.ECDSASignature(rawRepresentation: bytes[signature.valueRange]),
                  signer.isValidSignature(rs, for: digest) else {
                throw GBLError("\(file) a GBL file whose signature does not verify with \(through) (--gbl-key): it was signed with another key, or changed after signing; "
                               + "the device's bootloader would refuse it (BOOTLOADER_ERROR_PARSER_SIGNATURE): give the key its bootloader holds, or sign it again")
            }
            checked = true
        }

        var contents: [String] = []
        if encrypted {
            contents.append("encrypted data (what it carries is readable by the device only)")
        }
        if tags.contains(where: { $0.id == .versionDependency }) { contents.append("version dependency") }
        if se != nil { contents.append("SE upgrade") }
        if bootloader != nil { contents.append("bootloader") }
        if application != nil {
            var text = "application"
            let compressed = [(GBLTag.ID.progLZ4, "LZ4"), (GBLTag.ID.progLZMA, "LZMA")].filter { pair in tags.contains { $0.id == pair.0 } }.map(\.1)
            if !compressed.isEmpty {
                text += " (\(compressed.joined(separator: " and "))-compressed: the bootloader must be built to decompress it)"
            }
            if tags.contains(where: { [GBLTag.ID.delta, .deltaLZ4, .deltaLZMA].contains($0.id) }) {
                text += " (a delta: the device rebuilds it from the application it runs)"
            }
            contents.append(text)
        }
        if tags.contains(where: { $0.id == .metadata }) { contents.append("metadata") }
        if tags.contains(where: { $0.id == .certificate }) { contents.append("certificate") }

        self.bytes = bytes
        self.applicationVersion = appVersion
        self.productID = product
        self.applicationType = appType
        self.isEncrypted = encrypted
        self.isSigned = signature != nil
        self.signatureChecked = checked
        self.contents = contents
        self.bootloaderVersion = bootloader.map { Self.le32(bytes, $0.offset + 8) }
        self.seUpgradeVersion = se.map { Self.le32(bytes, $0.offset + 12) }
        self.tags = tags
    }

    /// The lengths the parser reads each tag with: a tag whose length differs is misread (the
    /// parser reads a fixed number of bytes and takes what follows for the next tag), or its value
    /// does not fit the parser's buffer.
    static func checkLength(_ tag: GBLTag, in bytes: [UInt8], damaged: (String, Bool) -> GBLError) throws(GBLError) {
        let name = "\(tag.id) at byte \(tag.offset)"
        func exactly(_ size: Int, _ what: String) throws(GBLError) {
            guard tag.length == size else { throw damaged("\(name) says it holds \(tag.length) bytes; it holds \(size) (\(what))", false) }
        }
        func atLeast(_ size: Int, _ what: String) throws(GBLError) {
            guard tag.length >= size else { throw damaged("\(name) holds \(tag.length) bytes, fewer than its \(size)-byte \(what)", false) }
        }
        switch tag.id {
        case .encryptionInit: try exactly(16, "the cipher text's length and a 12-byte nonce")
        case .certificate: try exactly(136, "an ApplicationCertificate_t: version, key, certificate version, signature")
        case .signature: try exactly(64, "an ECDSA P-256 signature: r and s")
        case .end: try exactly(4, "the file's CRC-32")
        case .application:
            guard (1...parserBuffer).contains(tag.length) else {
                throw damaged("\(name) says it holds \(tag.length) bytes; the bootloader reads it whole into its \(parserBuffer)-byte buffer "
                              + "(an ApplicationData_t is 28: type, version, capabilities, product id)", false)
            }
        case .bootloader: try atLeast(8, "header (bootloader version, address)")
        case .seUpgrade: try atLeast(8, "header (blob size, SE version)")
        case .prog, .eraseProg: try atLeast(4, "flash address")
        case .versionDependency:
            guard tag.length > 0, tag.length % 8 == 0 else {
                throw damaged("\(name) holds \(tag.length) bytes, not a whole number of 8-byte statements", false)
            }
            for at in stride(from: tag.offset + 8, to: tag.end, by: 8) {
                let image = bytes[at]
                let statement = bytes[at + 1]
                let comparison = statement & 0x0E
                let connective = (statement >> 4) & 0x0E
                guard (1...3).contains(image), comparison <= 8, connective <= 2 else {
                    throw damaged("\(name) has a statement at byte \(at) (image type \(image), statement 0x\(String(statement, radix: 16))) the bootloader cannot evaluate", false)
                }
            }
        default: break
        }
    }

    static func le32(_ b: [UInt8], _ at: Int) -> UInt32 {
        UInt32(b[at]) | UInt32(b[at + 1]) << 8 | UInt32(b[at + 2]) << 16 | UInt32(b[at + 3]) << 24
    }
}
