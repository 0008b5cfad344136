/// A bounds-checked reader of the protobuf wire format, enough for the init packet (dfu-cc.proto):
/// varints, length-delimited fields, and skipping fixed32/fixed64 fields it does not know.
///
/// Every read is bounds-checked and returns an error on bad bytes; nothing traps. Groups (wire
/// types 3 and 4, unused since proto2) are refused.
struct ProtobufReader {
    enum WireType: UInt8 {
        case varint = 0, fixed64 = 1, lengthDelimited = 2, fixed32 = 5
    }

    struct Field {
        let number: UInt32
        let value: Value
    }

    enum Value {
        case varint(UInt64)
        case bytes(ArraySlice<UInt8>)
        case fixed
    }

    private let bytes: ArraySlice<UInt8>
    private var index: Int

    init(_ bytes: ArraySlice<UInt8>) {
        self.bytes = bytes
        self.index = bytes.startIndex
    }

    var isAtEnd: Bool { index >= bytes.endIndex }

    /// The next field, or nil at the end of the message.
    mutating func next() throws(ProtobufError) -> Field? {
        guard !isAtEnd else { return nil }
        let key = try varint()
        guard key >> 3 <= UInt64(UInt32.max >> 3), key >> 3 != 0 else { throw ProtobufError("field number \(key >> 3) is out of range") }
        let number = UInt32(key >> 3)
        guard let type = WireType(rawValue: UInt8(key & 7)) else {
            throw ProtobufError("field \(number) has unsupported wire type \(key & 7)")
        }
        switch type {
        case .varint:
            return Field(number: number, value: .varint(try varint()))
        case .lengthDelimited:
            let length = try varint()
            guard length <= UInt64(bytes.endIndex - index) else {
                throw ProtobufError("field \(number) claims \(length) bytes, only \(bytes.endIndex - index) remain")
            }
            let start = index
            index += Int(length)
            return Field(number: number, value: .bytes(bytes[start..<index]))
        case .fixed32, .fixed64:
            let size = type == .fixed32 ? 4 : 8
            guard bytes.endIndex - index >= size else { throw ProtobufError("field \(number) is cut short") }
            index += size
            return Field(number: number, value: .fixed)
        }
    }

    /// A base-128 varint of at most 10 bytes whose value fits 64 bits.
    private mutating func varint() throws(ProtobufError) -> UInt64 {
        var result: UInt64 = 0
        var shift: UInt64 = 0
        while true {
            guard index < bytes.endIndex else { throw ProtobufError("varint runs past the end") }
            let byte = bytes[index]
            index += 1
            if shift == 63, byte > 1 { throw ProtobufError("varint overflows 64 bits") }
            result |= UInt64(byte & 0x7F) << shift
            if byte & 0x80 == 0 { return result }
            shift += 7
            guard shift <= 63 else { throw ProtobufError("varint is longer than 10 bytes") }
        }
    }
}

extension ProtobufReader.Field {
    func uint32() throws(ProtobufError) -> UInt32 {
        guard case .varint(let v) = value else { throw ProtobufError("field \(number) should be a varint") }
        guard v <= UInt64(UInt32.max) else { throw ProtobufError("field \(number) value \(v) does not fit 32 bits") }
        return UInt32(v)
    }

    /// Any non-zero varint is true, as protobuf and nanopb (the bootloader's decoder,
    /// `pb_decode_bool`) read it.
    func bool() throws(ProtobufError) -> Bool {
        guard case .varint(let v) = value else { throw ProtobufError("field \(number) should be a bool") }
        return v != 0
    }

    func message() throws(ProtobufError) -> ArraySlice<UInt8> {
        guard case .bytes(let b) = value else { throw ProtobufError("field \(number) should be length-delimited") }
        return b
    }
}

/// Writes the protobuf wire format: what the init packet decoder reads, for tests and models.
struct ProtobufWriter {
    private(set) var bytes: [UInt8] = []

    mutating func varint(_ field: UInt32, _ value: UInt64) {
        raw(UInt64(field) << 3)
        raw(value)
    }

    mutating func bytes(_ field: UInt32, _ value: some Collection<UInt8>) {
        raw(UInt64(field) << 3 | 2)
        raw(UInt64(value.count))
        bytes += value
    }

    /// A bare varint, for packed repeated fields.
    mutating func rawVarint(_ value: UInt64) { raw(value) }

    private mutating func raw(_ value: UInt64) {
        var v = value
        while v >= 0x80 {
            bytes.append(UInt8(truncatingIfNeeded: v) | 0x80)
            v >>= 7
        }
        bytes.append(UInt8(v))
    }
}

/// Bytes that are not the protobuf message they should be.
struct ProtobufError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}
