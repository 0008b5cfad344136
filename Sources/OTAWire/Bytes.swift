/// Little-endian reading of a received value. Every multi-byte field of the protocol is little-endian
/// (docs/PROTOCOL.md, "Byte order").
public struct ByteReader {
    private let bytes: ArraySlice<UInt8>
    private var index: Int

    public init(_ bytes: ArraySlice<UInt8>) {
        self.bytes = bytes
        self.index = bytes.startIndex
    }

    public init(_ bytes: [UInt8]) { self.init(bytes[...]) }

    public var remaining: Int { bytes.endIndex - index }

    public mutating func u8() -> UInt8? {
        guard remaining >= 1 else { return nil }
        defer { index += 1 }
        return bytes[index]
    }

    public mutating func u16() -> UInt16? {
        guard remaining >= 2 else { return nil }
        defer { index += 2 }
        return UInt16(bytes[index]) | UInt16(bytes[index + 1]) << 8
    }

    public mutating func u32() -> UInt32? {
        guard remaining >= 4 else { return nil }
        defer { index += 4 }
        return UInt32(bytes[index]) | UInt32(bytes[index + 1]) << 8
            | UInt32(bytes[index + 2]) << 16 | UInt32(bytes[index + 3]) << 24
    }

    public mutating func rest() -> ArraySlice<UInt8> {
        defer { index = bytes.endIndex }
        return bytes[index...]
    }
}

extension Array where Element == UInt8 {
    @inlinable public mutating func appendLE(_ v: UInt16) {
        append(UInt8(truncatingIfNeeded: v))
        append(UInt8(truncatingIfNeeded: v >> 8))
    }

    @inlinable public mutating func appendLE(_ v: UInt32) {
        append(UInt8(truncatingIfNeeded: v))
        append(UInt8(truncatingIfNeeded: v >> 8))
        append(UInt8(truncatingIfNeeded: v >> 16))
        append(UInt8(truncatingIfNeeded: v >> 24))
    }
}

/// A value from the peer that does not parse as the protocol says.
public struct WireError: Error, Sendable, Hashable, CustomStringConvertible {
    public let description: String
    public init(_ description: String) { self.description = description }
}

public func hexDump(_ bytes: ArraySlice<UInt8>, limit: Int = 24) -> String {
    let shown = bytes.prefix(limit).map { b -> String in
        let s = String(b, radix: 16)
        return s.count == 1 ? "0" + s : s
    }.joined(separator: " ")
    return bytes.count > limit ? shown + " …" : shown
}
