import Crypto
import OTAWire

extension GBLFile {
    /// An application tag's value (`ApplicationData_t`, 28 bytes).
    public struct ApplicationData: Sendable, Equatable {
        /// `APPLICATION_TYPE_*` bits; 0x20 is `APPLICATION_TYPE_BLUETOOTH_APP`.
        public var type: UInt32
        public var version: UInt32
        public var capabilities: UInt32
        public var productID: [UInt8]

        public init(type: UInt32 = 0x20, version: UInt32, capabilities: UInt32 = 0, productID: [UInt8] = [UInt8](repeating: 0, count: 16)) {
            self.type = type
            self.version = version
            self.capabilities = capabilities
            self.productID = productID
        }

        public var bytes: [UInt8] {
            var out: [UInt8] = []
            out.appendLE(type)
            out.appendLE(version)
            out.appendLE(capabilities)
            return out + Array(productID.prefix(16)) + [UInt8](repeating: 0, count: max(0, 16 - productID.count))
        }
    }

    /// One tag: id, length, value.
    public static func tag(_ id: GBLTag.ID, _ value: [UInt8]) -> [UInt8] {
        var out: [UInt8] = []
        out.appendLE(id.rawValue)
        out.appendLE(UInt32(value.count))
        return out + value
    }

    /// A header tag: version 3.0 (0x03000000) and the type flags.
    public static func headerTag(type: UInt32 = 0, version: UInt32 = 0x0300_0000) -> [UInt8] {
        var value: [UInt8] = []
        value.appendLE(version)
        value.appendLE(type)
        return tag(.header, value)
    }

    /// `tags` signed with `key` (the signature tag over their SHA-256) and closed with the end tag.
    public static func closed(_ tags: [UInt8], signingKey: P256.Signing.PrivateKey? = nil) -> [UInt8] {
        var out = tags
        if let signingKey, let signature = try? signingKey.signature(for: SHA256.hash(data: out)) {
            out += tag(.signature, Array(signature.rawRepresentation))
        }
        out.appendLE(GBLTag.ID.end.rawValue)
        out.appendLE(UInt32(4))
        out.appendLE(CRC32.checksum(out))
        return out
    }

    /// A GBL as `commander gbl create --app` writes one: the header, the application tag, one
    /// prog tag holding `body` at `address`, then the signature (with `signingKey`) and the end
    /// tag. For the simulated device, tests and the soak; scripts/make-silabs-sample writes the
    /// committed samples the same way.
    public static func build(application: ApplicationData = ApplicationData(version: 1), address: UInt32 = 0x0800_6000, body: [UInt8],
                             signingKey: P256.Signing.PrivateKey? = nil) -> [UInt8] {
        var prog: [UInt8] = []
        prog.appendLE(address)
        let tags = headerTag(type: signingKey == nil ? 0 : signedFlag) + tag(.application, application.bytes) + tag(.prog, prog + body)
        return closed(tags, signingKey: signingKey)
    }
}
