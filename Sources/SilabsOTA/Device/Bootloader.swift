import OTAWire

/// What the Gecko bootloader's GBL parser concludes of the bytes in a storage slot (application
/// OTA DFU: `bootloader_initVerifyImage` / `bootloader_continueVerifyImage`) or of what the
/// AppLoader received (at 0x03), as the device models need it: the tag structure walked from the
/// header tag to the end tag, the end tag's CRC-32 over every byte before its value, a signature
/// tag where the device requires signed images, and the application's version. The device side
/// of the check, written from the bootloader's error codes (`btl_errorcode.h`), not from
/// otaflash's own GBL reader.
public struct SilabsBootloaderCheck: Sendable, Hashable {
    public enum Outcome: Sendable, Hashable {
        /// The image checks out: it is the first `length` bytes (what follows the end tag is ignored).
        case valid(length: Int, applicationVersion: UInt32?)
        /// BOOTLOADER_ERROR_PARSER_CRC.
        case crc(String)
        /// BOOTLOADER_ERROR_PARSER_UNEXPECTED / _UNKNOWN_TAG / _EOF: not a whole GBL.
        case parse(String)
        /// BOOTLOADER_ERROR_PARSER_SIGNATURE: no signature where secure boot requires one.
        case signature(String)

        public var isValid: Bool { if case .valid = self { true } else { false } }
    }

    static let headerTag: UInt32 = 0x03A6_17EB
    static let applicationTag: UInt32 = 0xF40A_0AF4
    static let signatureTag: UInt32 = 0xF70A_0AF7
    static let endTag: UInt32 = 0xFC04_04FC

    /// Checks `bytes`; `requiresSignature`: the bootloader's secure boot wants a signature tag.
    public static func check(_ bytes: [UInt8], requiresSignature: Bool) -> Outcome {
        func word(_ at: Int) -> UInt32? {
            guard at >= 0, at + 4 <= bytes.count else { return nil }
            return UInt32(bytes[at]) | UInt32(bytes[at + 1]) << 8 | UInt32(bytes[at + 2]) << 16 | UInt32(bytes[at + 3]) << 24
        }
        guard word(0) == headerTag else { return .parse("no GBL header tag") }
        var at = 0
        var version: UInt32?
        var signed = false
        while true {
            guard let tag = word(at), let length = word(at + 4) else { return .parse("the GBL ends at byte \(at) without its end tag") }
            guard Int(length) <= bytes.count - at - 8 else { return .parse("tag 0x\(String(tag, radix: 16)) at byte \(at) runs past the end") }
            switch tag {
            case endTag:
                guard length == 4, let crc = word(at + 8) else { return .parse("an end tag of \(length) bytes") }
                let computed = CRC32.checksum(bytes[0..<(at + 8)])
                guard computed == crc else {
                    return .crc("the end tag's CRC-32 is 0x\(hex32(crc)); the bytes give 0x\(hex32(computed))")
                }
                if requiresSignature, !signed { return .signature("no signature tag, and the bootloader requires signed images") }
                return .valid(length: at + 12, applicationVersion: version)
            case applicationTag where length >= 28:
                version = word(at + 12)
            case signatureTag:
                signed = true
            default:
                break
            }
            at += 8 + Int(length)
        }
    }
}
