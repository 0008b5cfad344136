/// Little-endian reading of a received value. Every multi-byte field of the protocol is little-endian
/// (docs/PROTOCOL.md, "Byte order").
///
/// Each read checks the bytes it takes: a value too short for a field throws `ShortRead` (which
/// says which field and how short), so a decoder needs no length check of its own that could
/// disagree with its reads, and a malformed value is an error, never a trap.
/// Inlinable: the engines and device models decode every packet through it, from other modules.
@frozen public struct ByteReader {
    @usableFromInline let bytes: ArraySlice<UInt8>
    @usableFromInline var index: Int

    /// A field that runs past the end of the value.
    public struct ShortRead: Error, Sendable, Hashable, CustomStringConvertible {
        /// Where the field starts, counted from the reader's first byte.
        public let offset: Int
        /// The field's size.
        public let size: Int
        /// The bytes the value has from `offset` on.
        public let available: Int

        public init(offset: Int, size: Int, available: Int) {
            self.offset = offset
            self.size = size
            self.available = available
        }

        public var description: String {
            "a \(size)-byte field at offset \(offset) runs past the end (\(available) byte\(available == 1 ? "" : "s") left)"
        }
    }

    @inlinable public init(_ bytes: ArraySlice<UInt8>) {
        self.bytes = bytes
        self.index = bytes.startIndex
    }

    @inlinable public init(_ bytes: [UInt8]) { self.init(bytes[...]) }

    /// Bytes not read yet.
    @inlinable public var remaining: Int { bytes.endIndex - index }
    /// Bytes read so far.
    @inlinable public var consumed: Int { index - bytes.startIndex }

    @inlinable func take(_ size: Int) throws(ShortRead) {
        guard remaining >= size else { throw ShortRead(offset: consumed, size: size, available: remaining) }
    }

    @inlinable public mutating func u8() throws(ShortRead) -> UInt8 {
        try take(1)
        defer { index += 1 }
        return bytes[index]
    }

    @inlinable public mutating func u16() throws(ShortRead) -> UInt16 {
        try take(2)
        defer { index += 2 }
        return UInt16(bytes[index]) | UInt16(bytes[index + 1]) << 8
    }

    @inlinable public mutating func u32() throws(ShortRead) -> UInt32 {
        try take(4)
        defer { index += 4 }
        return UInt32(bytes[index]) | UInt32(bytes[index + 1]) << 8
            | UInt32(bytes[index + 2]) << 16 | UInt32(bytes[index + 3]) << 24
    }

    /// Everything not read yet (possibly nothing).
    @inlinable public mutating func rest() -> ArraySlice<UInt8> {
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
