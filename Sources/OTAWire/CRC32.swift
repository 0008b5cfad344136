internal import OTAZlib

/// CRC-32 (ISO-HDLC, as zlib and Nordic DFU compute it), over zlib's `crc32`.
///
/// zlib takes a 32-bit length, so large buffers are fed in pieces.
public struct CRC32: Sendable, Hashable {
    public private(set) var value: UInt32

    public init(value: UInt32 = 0) { self.value = value }

    public mutating func update(_ bytes: UnsafeRawBufferPointer) {
        guard var base = bytes.baseAddress?.assumingMemoryBound(to: UInt8.self) else { return }
        var remaining = bytes.count
        var crc = UInt(value)
        while remaining > 0 {
            let n = min(remaining, 1 << 30)
            crc = OTAZlib.crc32(crc, base, UInt32(n))
            base += n
            remaining -= n
        }
        value = UInt32(truncatingIfNeeded: crc)
    }

    public mutating func update(_ bytes: [UInt8]) {
        bytes.withUnsafeBytes { update($0) }
    }

    public mutating func update(_ bytes: ArraySlice<UInt8>) {
        bytes.withUnsafeBytes { update($0) }
    }

    public static func checksum(_ bytes: [UInt8]) -> UInt32 {
        var c = CRC32()
        c.update(bytes)
        return c.value
    }

    public static func checksum(_ bytes: ArraySlice<UInt8>) -> UInt32 {
        var c = CRC32()
        c.update(bytes)
        return c.value
    }
}

/// The protocol's way of printing a CRC: 8 lowercase hex digits.
public func hex32(_ value: UInt32) -> String {
    let s = String(value, radix: 16)
    return String(repeating: "0", count: 8 - s.count) + s
}

