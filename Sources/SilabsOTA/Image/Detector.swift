import OTA
import OTAWire

extension ImageFormat.Kind {
    /// A Silicon Labs GBL file (Gecko Bootloader image format 3), sent over Silicon Labs'
    /// Bluetooth OTA DFU as it is.
    public static let gbl = ImageFormat.Kind("gbl")
}

extension ImageFormat.Detector {
    /// Every file that starts with the GBL header tag's id (0x03A617EB, little-endian), whether
    /// its header checks out (length 8, major version 3) or not, and every file that starts with
    /// another GBL tag's id (a GBL whose header is missing): a damaged GBL is refused as one,
    /// naming the damage, rather than sent as a raw binary. The tag ids are words no vector table
    /// starts with (an initial stack pointer in RAM).
    public static let gbl = ImageFormat.Detector(kind: .gbl, detect: { head, _ in
        let limit = ImageFormat.SizeLimit(bytes: GBLFile.maximumSize, what: "GBL files")
        guard head.count >= 4 else { return nil }
        let id = GBLTag.ID(rawValue: GBLFile.le32(head, 0))
        guard id == .header else {
            guard let rule = id.rule else { return nil }
            return ImageFormat(.gbl, "a damaged Silicon Labs GBL file (it starts with the \(rule.name) tag, not the header tag)", limit: limit)
        }
        guard head.count >= 16 else {
            return ImageFormat(.gbl, "a file that starts with the GBL header tag but is shorter than it", limit: limit)
        }
        let length = GBLFile.le32(head, 4)
        let version = GBLFile.le32(head, 8)
        if length != 8 {
            return ImageFormat(.gbl, "a damaged Silicon Labs GBL file (its header tag says it holds \(length) bytes, not 8)", limit: limit)
        }
        if version & 0xFF00_0000 != GBLFile.majorVersion {
            return ImageFormat(.gbl, "a Silicon Labs GBL file of version 0x\(hex32(version)), which no Gecko Bootloader parses (it takes major version 3)", limit: limit)
        }
        let type = GBLFile.le32(head, 12)
        let kinds = [(GBLFile.encryptedFlag, "encrypted"), (GBLFile.signedFlag, "signed")].filter { type & $0.0 != 0 }.map(\.1)
        return ImageFormat(.gbl, "a Silicon Labs GBL file" + (kinds.isEmpty ? "" : " (\(kinds.joined(separator: ", ")))"), limit: limit)
    }, refusal: { format, _ in
        "is \(format.description), sent over Silicon Labs' Bluetooth OTA (`--protocol silabs-ota` or `auto`)"
    })
}

extension ImageFormat.Hint {
    /// A Simplicity Studio build's Motorola S-record output (`.s37`): the GBL is made from it.
    public static let silabsS37 = ImageFormat.Hint { format, _, name in
        guard format.kind == .srecord, name.lowercased().hasSuffix(".s37") else { return nil }
        return "is \(format.description) (a Simplicity Studio build's output), not a GBL file; Silicon Labs' OTA sends GBL files: "
            + GBLFile.howToMake(from: name)
    }
}

extension GBLFile {
    /// The words that say how to make a GBL from `fileName` (an application's .s37, .hex or .bin):
    /// `commander gbl create NAME.gbl --app FILE`, with `--sign` and `--encrypt` where the
    /// device's bootloader enforces them.
    public static func howToMake(from fileName: String = "app.s37") -> String {
        let base = ImageFormat.baseName(of: fileName)
        return "make one with `commander gbl create \(base).gbl --app \(fileName)` (add `--sign signing-key.pem` and `--encrypt encryption-key.txt` "
            + "where the bootloader enforces signed or encrypted upgrades) and pass \(base).gbl"
    }

    /// The 16-byte magic of an application's `ApplicationProperties_t` (`APPLICATION_PROPERTIES_MAGIC`,
    /// `application_properties.h`), which Simplicity Studio's builds link into every application.
    public static let applicationPropertiesMagic: [UInt8] = [
        0x13, 0xB7, 0x79, 0xFA, 0xC9, 0x25, 0xDD, 0xB7, 0xAD, 0xF3, 0xCF, 0xE0, 0xF1, 0xB6, 0x14, 0xB8,
    ]

    /// Whether `bytes` (a raw binary or decoded HEX image) hold a Silicon Labs application's
    /// `ApplicationProperties_t`: a file to make a GBL from, not to send.
    public static func isSilabsApplication(_ bytes: some Collection<UInt8>) -> Bool {
        let magic = applicationPropertiesMagic
        var matched = 0
        for byte in bytes {
            matched = byte == magic[matched] ? matched + 1 : (byte == magic[0] ? 1 : 0)
            if matched == magic.count { return true }
        }
        return false
    }
}
