/// A Bluetooth UUID, stored in its 128-bit form.
///
/// 16- and 32-bit SIG-assigned UUIDs expand onto the Bluetooth base UUID
/// `0000xxxx-0000-1000-8000-00805F9B34FB` (Core Spec Vol 3, Part B, 2.5.1), so
/// `BluetoothUUID("180A")` and `BluetoothUUID("0000180a-0000-1000-8000-00805f9b34fb")` are equal.
/// The canonical text form is lower case, as BlueZ prints it in its `UUID` properties.
public struct BluetoothUUID: Hashable, Sendable, CustomStringConvertible, Comparable {
    /// The 16 bytes, most significant first (the order of the text form).
    public let bytes: [UInt8]

    private static let baseTail: [UInt8] = [0x00, 0x00, 0x10, 0x00, 0x80, 0x00, 0x00, 0x80, 0x5F, 0x9B, 0x34, 0xFB]

    /// Parses `xxxx`, `xxxxxxxx` or the dashed 36-character form; nil for anything else.
    public init?(_ text: String) {
        let hex = text.filter { $0 != "-" }
        let dashes = text.count - hex.count
        guard hex.allSatisfy(\.isHexDigit) else { return nil }
        switch (hex.count, dashes) {
        case (4, 0):
            guard let v = UInt16(hex, radix: 16) else { return nil }
            self.init(uint16: v)
        case (8, 0):
            guard let v = UInt32(hex, radix: 16) else { return nil }
            self.init(uint32: v)
        case (32, 4):
            let parts = text.split(separator: "-", omittingEmptySubsequences: false).map(\.count)
            guard parts == [8, 4, 4, 4, 12] else { return nil }
            var out = [UInt8]()
            out.reserveCapacity(16)
            var i = hex.startIndex
            while i < hex.endIndex {
                let j = hex.index(i, offsetBy: 2)
                guard let b = UInt8(hex[i..<j], radix: 16) else { return nil }
                out.append(b)
                i = j
            }
            self.init(bytes: out)
        default:
            return nil
        }
    }

    public init(uint16 value: UInt16) {
        self.init(uint32: UInt32(value))
    }

    public init(uint32 value: UInt32) {
        bytes = [UInt8(value >> 24), UInt8((value >> 16) & 0xFF), UInt8((value >> 8) & 0xFF), UInt8(value & 0xFF)]
            + Self.baseTail
    }

    /// Builds a UUID from 16 bytes in text order; traps on another count (a programming error).
    public init(bytes: [UInt8]) {
        precondition(bytes.count == 16, "a 128-bit UUID has 16 bytes")
        self.bytes = bytes
    }

    /// The 16-bit short form, when this UUID sits on the Bluetooth base.
    public var shortValue: UInt16? {
        guard bytes[0] == 0, bytes[1] == 0, Array(bytes[4...]) == Self.baseTail else { return nil }
        return UInt16(bytes[2]) << 8 | UInt16(bytes[3])
    }

    public var description: String {
        let hex = bytes.map { b -> String in
            let s = String(b, radix: 16)
            return s.count == 1 ? "0" + s : s
        }.joined()
        let c = Array(hex)
        return String(c[0..<8]) + "-" + String(c[8..<12]) + "-" + String(c[12..<16]) + "-"
            + String(c[16..<20]) + "-" + String(c[20..<32])
    }

    public static func < (lhs: BluetoothUUID, rhs: BluetoothUUID) -> Bool {
        lhs.bytes.lexicographicallyPrecedes(rhs.bytes)
    }
}

extension BluetoothUUID: ExpressibleByStringLiteral {
    /// For compile-time constants only; a malformed literal is a programming error.
    public init(stringLiteral value: String) {
        guard let uuid = BluetoothUUID(value) else { preconditionFailure("malformed UUID literal \(value)") }
        self = uuid
    }
}
