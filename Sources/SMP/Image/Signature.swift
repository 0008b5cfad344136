import Crypto
import Foundation

extension MCUbootImage {
    /// A key an image's signature is checked against: ECDSA P-256 or Ed25519, the two kinds
    /// otaflash verifies (RSA images are recognised but not verified).
    public enum PublicKey: Sendable {
        case p256(P256.Signing.PublicKey)
        case ed25519(Curve25519.Signing.PublicKey)

        /// The DER prefix of an Ed25519 SubjectPublicKeyInfo (RFC 8410 section 4), before the 32-byte key.
        private static let ed25519PublicPrefix: [UInt8] = [0x30, 0x2A, 0x30, 0x05, 0x06, 0x03, 0x2B, 0x65, 0x70, 0x03, 0x21, 0x00]
        /// The DER prefix of an Ed25519 PKCS#8 private key (RFC 8410 section 7), before the 32-byte seed.
        private static let ed25519PrivatePrefix: [UInt8] = [
            0x30, 0x2E, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2B, 0x65, 0x70, 0x04, 0x22, 0x04, 0x20,
        ]

        /// Reads a PEM key as imgtool writes it: the public key (`imgtool getpub -e pem`), or the
        /// private key of `imgtool keygen` (PKCS#8), whose public part is used.
        ///
        /// - Throws: `MCUbootImageError` `.badSignature` for a key that is neither kind.
        public init(pem: String, source: String = "<key>") throws(MCUbootImageError) {
            let bad = MCUbootImageError(.badSignature, source, "is not an ECDSA P-256 or Ed25519 key in PEM form; give the key from `imgtool keygen -t ecdsa-p256|ed25519` or `imgtool getpub -e pem`")
            let lines = pem.split(whereSeparator: \.isNewline).map { $0.trimmingCharacters(in: .whitespaces) }
            guard let begin = lines.firstIndex(where: { $0.hasPrefix("-----BEGIN ") }),
                  let end = lines[begin...].firstIndex(where: { $0.hasPrefix("-----END ") }),
                  let der = Data(base64Encoded: lines[(begin + 1)..<end].joined()).map(Array.init) else { throw bad }
            if der.count == 44, der.starts(with: Self.ed25519PublicPrefix),
               let key = try? Curve25519.Signing.PublicKey(rawRepresentation: der.suffix(32)) {
                self = .ed25519(key)
            } else if der.count == 48, der.starts(with: Self.ed25519PrivatePrefix),
                      let key = try? Curve25519.Signing.PrivateKey(rawRepresentation: der.suffix(32)) {
                self = .ed25519(key.publicKey)
            } else if let key = try? P256.Signing.PublicKey(derRepresentation: der) {
                self = .p256(key)
            } else if let key = try? P256.Signing.PrivateKey(derRepresentation: der) {
                self = .p256(key.publicKey)
            } else {
                throw bad
            }
        }

        /// The DER SubjectPublicKeyInfo: what imgtool hashes into the KEYHASH TLV.
        public var subjectPublicKeyInfo: [UInt8] {
            switch self {
            case .p256(let key): Array(key.derRepresentation)
            case .ed25519(let key): Self.ed25519PublicPrefix + Array(key.rawRepresentation)
            }
        }

        var name: String {
            switch self {
            case .p256: "ECDSA P-256"
            case .ed25519: "Ed25519"
            }
        }
    }

    /// Checks the image's signature against `key`, as MCUboot's `bootutil_img_validate` would.
    ///
    /// ECDSA P-256 (ECDSASIG, DER) signs the hashed bytes with SHA-256; Ed25519 (ED25519) signs
    /// the image hash, or with `imgtool sign --pure` (SIG_PURE) the hashed bytes. A KEYHASH or
    /// PUBKEY TLV must name the same key.
    ///
    /// - Parameter keyName: how messages name the key (its file).
    /// - Throws: `MCUbootImageError` `.badSignature`.
    public func verifySignature(with key: PublicKey, keyName: String = "the given key") throws(MCUbootImageError) {
        func fail(_ reason: String) -> MCUbootImageError { MCUbootImageError(.badSignature, source, reason) }
        guard let signature else {
            throw fail("is not signed (no signature TLV), but \(keyName) was given; sign it with `imgtool sign -k KEY`")
        }
        let info = key.subjectPublicKeyInfo
        if let keyHash, keyHash != Array(SHA256.hash(data: info)) {
            throw fail("was signed with another key: its KEYHASH is \(Self.hexPrefix(keyHash)), the SHA-256 of \(keyName) is \(Self.hexPrefix(Array(SHA256.hash(data: info)))); give the key it was signed with")
        }
        if let full = tlvs.first(where: { $0.type == .publicKey })?.value, full != info {
            throw fail("was signed with another key: its PUBKEY TLV is not \(keyName); give the key it was signed with")
        }
        let hashed = bytes[0..<hashedSize]
        let valid: Bool
        switch key {
        case .p256(let key):
            guard signature.type == .ecdsaSignature, hashAlgorithm == .sha256 else {
                throw fail("carries \(signature.type) with a \(hashAlgorithm) hash, not an ECDSA P-256 signature with SHA-256; give the key it was signed with")
            }
            // `imgtool sign --pad-sig` pads the DER signature with zeros to 72 bytes (for MCUboot
            // before 1.5), and MCUboot reads the SEQUENCE and ignores what follows it
            // (`bootutil_decode_sig`): so does this, as `imgtool verify` does.
            var der = signature.value
            if der.count > 2, der[0] == 0x30, der[1] < 0x80, Int(der[1]) + 2 < der.count { der = Array(der.prefix(Int(der[1]) + 2)) }
            guard let parsed = try? P256.Signing.ECDSASignature(derRepresentation: der) else {
                throw fail("its ECDSASIG TLV is not a DER-encoded ECDSA signature; the image is corrupt, sign it again")
            }
            valid = key.isValidSignature(parsed, for: hashed)
        case .ed25519(let key):
            switch signature.type {
            case .ed25519: valid = key.isValidSignature(signature.value, for: imageHash)
            case .signaturePure: valid = key.isValidSignature(signature.value, for: hashed)
            default:
                throw fail("carries \(signature.type), not an Ed25519 signature; give the key it was signed with")
            }
        }
        guard valid else {
            throw fail("its \(signature.type) signature does not verify with \(keyName) (\(key.name)); the image was signed by another key or altered after signing")
        }
    }
}
