import Crypto
import Foundation
import OTA

// A stand-in for the GBL parser (issue 35 item 3), which replaces this file: the header tag's
// magic and the application tag's version, nothing more.

/// A Silicon Labs GBL file, as far as the protocol needs it.
public struct GBLFile: Sendable, Equatable {
    public let bytes: [UInt8]
    public let applicationVersion: UInt32?
    public let productID: [UInt8]?
    public let isEncrypted: Bool
    public let isSigned: Bool
    public let signatureChecked: Bool
    public let contents: [String]

    static let headerTag: UInt32 = 0x03A6_17EB
    static let applicationTag: UInt32 = 0xF40A_0AF4

    public init(parsing bytes: [UInt8], key: P256.Signing.PublicKey? = nil) throws(GBLError) {
        func word(_ at: Int) -> UInt32? {
            guard at >= 0, at + 4 <= bytes.count else { return nil }
            return UInt32(bytes[at]) | UInt32(bytes[at + 1]) << 8 | UInt32(bytes[at + 2]) << 16 | UInt32(bytes[at + 3]) << 24
        }
        guard word(0) == Self.headerTag, let headerLength = word(4), headerLength >= 8, let type = word(12) else {
            throw GBLError(description: "is not a GBL file: it does not start with the GBL header tag 0x03A617EB")
        }
        var version: UInt32?
        var product: [UInt8]?
        var at = 8 + Int(headerLength)
        while let tag = word(at), let length = word(at + 4), at + 8 + Int(length) <= bytes.count {
            if tag == Self.applicationTag, length >= 28 {
                version = word(at + 12)
                product = Array(bytes[(at + 20)..<(at + 36)])
            }
            at += 8 + Int(length)
        }
        self.bytes = bytes
        applicationVersion = version
        productID = product
        isEncrypted = type & 0x1 != 0
        isSigned = type & 0x100 != 0
        signatureChecked = false
        contents = ["GBL"] + (version.map { ["application 0x" + String($0, radix: 16)] } ?? [])
    }

    public static func publicKey(file path: String) throws(GBLError) -> P256.Signing.PublicKey {
        do {
            return try P256.Signing.PublicKey(pemRepresentation: String(contentsOfFile: path, encoding: .utf8))
        } catch {
            throw GBLError(description: "\(path): not a P-256 public key in PEM (\(error))")
        }
    }
}

public struct GBLError: Error, Sendable, Equatable, CustomStringConvertible {
    public let description: String
}

extension ImageFormat.Kind {
    public static let gbl = ImageFormat.Kind("gbl")
}

extension ImageFormat.Detector {
    public static let gbl = ImageFormat.Detector(kind: .gbl, detect: { head, _ in
        starts(head, [0xEB, 0x17, 0xA6, 0x03]) ? ImageFormat(.gbl, "a Silicon Labs GBL file") : nil
    }, refusal: { format, _ in
        "is \(format.description), sent over Silicon Labs' Bluetooth OTA (`--protocol silabs-ota` or `auto`)"
    })
}
