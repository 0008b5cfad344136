import Crypto
import Foundation

extension NordicDFUBootloader.SignatureCheck {
    /// Why a public key could not be used.
    public struct KeyError: Error, CustomStringConvertible {
        public var description: String
    }

    /// Verification with the ECDSA P-256 public key in `pem` (what `nrfutil keys display
    /// --key pk --format pem` prints, or the private key's PEM, whose public half is used).
    /// nrfutil writes PEM with 76-character lines, which a strict PEM reader refuses: the
    /// base64 body between the armour lines is decoded here.
    public static func verifying(pem: String) throws(KeyError) -> Self {
        let body = pem.split(whereSeparator: \.isNewline).filter { !$0.hasPrefix("-----") }.joined()
        if let der = Data(base64Encoded: body) {
            if let key = try? P256.Signing.PublicKey(derRepresentation: der) {
                return .verify(publicKey: Array(key.derRepresentation))
            }
            if let key = try? P256.Signing.PrivateKey(derRepresentation: der) {
                return .verify(publicKey: Array(key.publicKey.derRepresentation))
            }
        }
        throw KeyError(description: "not an ECDSA P-256 key in PEM form (-----BEGIN PUBLIC KEY----- or EC PRIVATE KEY)")
    }
}
