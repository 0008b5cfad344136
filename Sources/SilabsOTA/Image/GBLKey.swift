import Crypto
import Foundation

extension GBLFile {
    /// Reads the public key a GBL's signature is checked with (`--gbl-key`), in the forms
    /// Simplicity Commander writes it: the PEM public key of `commander util genkey --type
    /// ecc-p256 --pubkey FILE` (SubjectPublicKeyInfo; the private key's PEM is taken too, for its
    /// public half), the token file of `--tokenfile FILE` (`MFG_SIGNED_BOOTLOADER_KEY_X : <64 hex>`
    /// and `..._Y`, what is written to the device), or the raw point: X‖Y (64 bytes) or 0x04‖X‖Y
    /// (65 bytes).
    ///
    /// - Throws: `GBLError` for a file that cannot be read or holds no P-256 public key.
    public static func publicKey(file path: String) throws(GBLError) -> P256.Signing.PublicKey {
        let url = URL(fileURLWithPath: path)
        let size = (try? FileManager.default.attributesOfItem(atPath: path))?[.size] as? Int
        guard let size else {
            throw GBLError("--gbl-key \(path): no such file, or it cannot be read; give the public key the device's bootloader holds (a PEM file from `commander util genkey --type ecc-p256 --pubkey`)")
        }
        guard size <= 64 << 10 else {
            throw GBLError("--gbl-key \(path) is \(size) bytes, too large for a key file; give the public key the device's bootloader holds (a PEM file from `commander util genkey --type ecc-p256 --pubkey`)")
        }
        guard let data = try? Data(contentsOf: url) else {
            throw GBLError("--gbl-key \(path) cannot be read; check its permissions")
        }
        return try publicKey(bytes: Array(data), name: path)
    }

    /// Reads a public key from a key file's bytes (`publicKey(file:)`'s forms); `name` names it in
    /// the refusal.
    public static func publicKey(bytes: [UInt8], name: String = "the key") throws(GBLError) -> P256.Signing.PublicKey {
        if bytes.count == 64, let key = try? P256.Signing.PublicKey(rawRepresentation: bytes) { return key }
        if bytes.count == 65, bytes[0] == 0x04, let key = try? P256.Signing.PublicKey(x963Representation: bytes) { return key }
        let text = String(decoding: bytes, as: UTF8.self)
        if text.contains("-----BEGIN") {
            if let key = try? P256.Signing.PublicKey(pemRepresentation: text) { return key }
            if let key = try? P256.Signing.PrivateKey(pemRepresentation: text) { return key.publicKey }
        }
        if let key = tokenKey(text) { return key }
        throw GBLError("--gbl-key \(name) holds no ECDSA P-256 public key otaflash reads: give the PEM public key (`commander util genkey --type ecc-p256 --pubkey FILE`), "
                       + "its token file (`--tokenfile FILE`: MFG_SIGNED_BOOTLOADER_KEY_X and _Y), or the raw 64-byte X and Y")
    }

    /// The key of a Simplicity Commander token file: `MFG_SIGNED_BOOTLOADER_KEY_X : <hex>` and
    /// `MFG_SIGNED_BOOTLOADER_KEY_Y : <hex>`, 32 bytes each, big-endian; comment lines start with '#'.
    static func tokenKey(_ text: String) -> P256.Signing.PublicKey? {
        var x: [UInt8]?
        var y: [UInt8]?
        for line in text.split(whereSeparator: \.isNewline) {
            let trimmed = line.trimmingCharacters(in: .whitespaces)
            guard !trimmed.hasPrefix("#"), let colon = trimmed.firstIndex(where: { $0 == ":" || $0 == "=" }) else { continue }
            let name = trimmed[..<colon].trimmingCharacters(in: .whitespaces).uppercased()
            let value = hexBytes(trimmed[trimmed.index(after: colon)...].trimmingCharacters(in: .whitespaces))
            if name.hasSuffix("SIGNED_BOOTLOADER_KEY_X") { x = value }
            if name.hasSuffix("SIGNED_BOOTLOADER_KEY_Y") { y = value }
        }
        guard let x, let y, x.count == 32, y.count == 32 else { return nil }
        return try? P256.Signing.PublicKey(rawRepresentation: x + y)
    }

    static func hexBytes(_ text: String) -> [UInt8]? {
        let digits = Array((text.hasPrefix("0x") || text.hasPrefix("0X") ? String(text.dropFirst(2)) : text).utf8)
        guard digits.count % 2 == 0 else { return nil }
        func nibble(_ c: UInt8) -> UInt8? {
            switch c {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): c - UInt8(ascii: "0")
            case UInt8(ascii: "a")...UInt8(ascii: "f"): c - UInt8(ascii: "a") + 10
            case UInt8(ascii: "A")...UInt8(ascii: "F"): c - UInt8(ascii: "A") + 10
            default: nil
            }
        }
        var out: [UInt8] = []
        out.reserveCapacity(digits.count / 2)
        for i in stride(from: 0, to: digits.count, by: 2) {
            guard let high = nibble(digits[i]), let low = nibble(digits[i + 1]) else { return nil }
            out.append(high << 4 | low)
        }
        return out
    }
}
