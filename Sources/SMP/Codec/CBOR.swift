/// A CBOR data item (RFC 8949) of the subset SMP carries: integers up to 64 bits, byte and text
/// strings, arrays, maps, booleans and null.
///
/// Floats, tags, `undefined` and other simple values have no place in MCUmgr's messages, so the
/// decoder refuses them rather than carrying values nobody reads. Maps keep no order: the encoder
/// writes them canonically (`CBOREncoder`), and the decoder accepts any order, since Zephyr's
/// zcbor writes fields in the order of its source.
public enum CBOR: Hashable, Sendable {
    /// Major type 0: 0 ... 2^64-1.
    case unsigned(UInt64)
    /// Major type 1: the integer `-1 - n`, so -1 ... -2^64.
    case negative(UInt64)
    case bytes([UInt8])
    /// Valid UTF-8 (the decoder checks).
    case text(String)
    case array([CBOR])
    /// Keys are unique; the decoder refuses a map that repeats one.
    case map([CBOR: CBOR])
    case bool(Bool)
    case null

    /// An integer of any sign, in -2^64 ... 2^64-1 (any `Int`, `Int64` or `UInt64`).
    public static func int<T: BinaryInteger>(_ value: T) -> CBOR {
        value >= 0 ? .unsigned(UInt64(value)) : .negative(UInt64(~value))
    }

    /// The value as a `UInt64`, when it is a non-negative integer.
    public var uint64: UInt64? {
        if case .unsigned(let n) = self { return n }
        return nil
    }

    /// The value as an `Int64`, when it is an integer in that range.
    public var int64: Int64? {
        switch self {
        case .unsigned(let n): n <= UInt64(Int64.max) ? Int64(n) : nil
        case .negative(let n): n <= UInt64(Int64.max) ? -1 - Int64(n) : nil
        default: nil
        }
    }

    public var bool: Bool? {
        if case .bool(let b) = self { return b }
        return nil
    }

    public var text: String? {
        if case .text(let s) = self { return s }
        return nil
    }

    public var byteString: [UInt8]? {
        if case .bytes(let b) = self { return b }
        return nil
    }

    public var array: [CBOR]? {
        if case .array(let a) = self { return a }
        return nil
    }

    public var map: [CBOR: CBOR]? {
        if case .map(let m) = self { return m }
        return nil
    }

    /// The value under a text key, when this is a map that has it.
    public subscript(key: String) -> CBOR? { map?[.text(key)] }

    /// The item in canonical encoding.
    public var encoded: [UInt8] {
        var out: [UInt8] = []
        CBOREncoder.append(self, to: &out)
        return out
    }

    /// What kind of item this is, for error messages: "a text string", "a map", ...
    public var kindName: String {
        switch self {
        case .unsigned, .negative: "an integer"
        case .bytes: "a byte string"
        case .text: "a text string"
        case .array: "an array"
        case .map: "a map"
        case .bool: "a boolean"
        case .null: "null"
        }
    }
}

extension CBOR: ExpressibleByIntegerLiteral, ExpressibleByStringLiteral, ExpressibleByBooleanLiteral,
    ExpressibleByArrayLiteral, ExpressibleByDictionaryLiteral, ExpressibleByNilLiteral
{
    public init(integerLiteral value: Int) { self = .int(value) }
    public init(stringLiteral value: String) { self = .text(value) }
    public init(booleanLiteral value: Bool) { self = .bool(value) }
    public init(arrayLiteral elements: CBOR...) { self = .array(elements) }
    public init(nilLiteral: ()) { self = .null }

    /// A map literal; a repeated key keeps its last value.
    public init(dictionaryLiteral elements: (CBOR, CBOR)...) {
        self = .map(Dictionary(elements, uniquingKeysWith: { _, last in last }))
    }
}

extension CBOR: CustomStringConvertible {
    /// CBOR diagnostic notation (RFC 8949 §8), map keys in canonical order.
    public var description: String {
        switch self {
        case .unsigned(let n): String(n)
        case .negative(let n): n == UInt64.max ? "-18446744073709551616" : "-\(n + 1)"
        case .bytes(let b): "h'" + b.map { ($0 < 16 ? "0" : "") + String($0, radix: 16) }.joined() + "'"
        case .text(let s): "\"" + s.unicodeScalars.map { $0 == "\"" || $0 == "\\" ? "\\\($0)" : "\($0)" }.joined() + "\""
        case .array(let a): "[" + a.map(\.description).joined(separator: ", ") + "]"
        case .map(let m):
            "{" + CBOREncoder.canonicalOrder(m).map { "\($0.key): \($0.value)" }.joined(separator: ", ") + "}"
        case .bool(let b): b ? "true" : "false"
        case .null: "null"
        }
    }
}

/// Canonical CBOR: the shortest head for every integer and length, definite lengths, and map
/// keys sorted by their encoded bytes, shorter first, then bytewise (RFC 7049 §3.9, what cbor2's
/// `canonical=True` and smp's messages use).
public enum CBOREncoder {
    public static func encode(_ item: CBOR) -> [UInt8] { item.encoded }

    static func append(_ item: CBOR, to out: inout [UInt8]) {
        switch item {
        case .unsigned(let n): appendHead(major: 0, n, to: &out)
        case .negative(let n): appendHead(major: 1, n, to: &out)
        case .bytes(let b):
            appendHead(major: 2, UInt64(b.count), to: &out)
            out += b
        case .text(let s):
            let utf8 = Array(s.utf8)
            appendHead(major: 3, UInt64(utf8.count), to: &out)
            out += utf8
        case .array(let a):
            appendHead(major: 4, UInt64(a.count), to: &out)
            for element in a { append(element, to: &out) }
        case .map(let m):
            appendHead(major: 5, UInt64(m.count), to: &out)
            for entry in canonicalOrder(m) {
                out += entry.encodedKey
                append(entry.value, to: &out)
            }
        case .bool(let b): out.append(b ? 0xF5 : 0xF4)
        case .null: out.append(0xF6)
        }
    }

    /// The map's entries in canonical order, each with its key's encoding.
    static func canonicalOrder(_ map: [CBOR: CBOR]) -> [(encodedKey: [UInt8], key: CBOR, value: CBOR)] {
        map.map { (encodedKey: $0.key.encoded, key: $0.key, value: $0.value) }.sorted { a, b in
            a.encodedKey.count != b.encodedKey.count ? a.encodedKey.count < b.encodedKey.count
                : a.encodedKey.lexicographicallyPrecedes(b.encodedKey)
        }
    }

    /// The initial byte and argument in the shortest form: inline below 24, then 1, 2, 4 or 8 bytes.
    static func appendHead(major: UInt8, _ n: UInt64, to out: inout [UInt8]) {
        let m = major << 5
        switch n {
        case ..<24: out.append(m | UInt8(n))
        case ...0xFF: out += [m | 24, UInt8(n)]
        case ...0xFFFF: out += [m | 25, UInt8(n >> 8), UInt8(truncatingIfNeeded: n)]
        case ...0xFFFF_FFFF:
            out.append(m | 26)
            for shift in stride(from: 24, through: 0, by: -8) { out.append(UInt8(truncatingIfNeeded: n >> UInt64(shift))) }
        default:
            out.append(m | 27)
            for shift in stride(from: 56, through: 0, by: -8) { out.append(UInt8(truncatingIfNeeded: n >> UInt64(shift))) }
        }
    }

    /// How many bytes the head for `n` takes beyond the initial byte: 0, 1, 2, 4 or 8.
    public static func headExtraBytes(_ n: UInt64) -> Int {
        switch n {
        case ..<24: 0
        case ...0xFF: 1
        case ...0xFFFF: 2
        case ...0xFFFF_FFFF: 4
        default: 8
        }
    }
}

/// Bytes that are not a CBOR item this decoder accepts.
public struct CBORError: Error, Sendable, Hashable, CustomStringConvertible {
    public enum Kind: Sendable, Hashable {
        /// The input ends inside an item.
        case truncated
        /// Bytes follow the one top-level item.
        case trailingBytes
        /// Additional information 31 (indefinite length or "break").
        case indefiniteLength
        /// Additional information 28, 29 or 30, which RFC 8949 reserves.
        case reservedAdditionalInfo
        /// Major type 7 with a half, single or double float.
        case float
        /// Major type 6.
        case tag
        /// A simple value other than false, true and null (`undefined` among them).
        case unsupportedSimpleValue
        case invalidUTF8
        case duplicateMapKey
        /// Arrays and maps nested deeper than `CBORDecoder.Limits.maxDepth`.
        case tooDeep
        /// More items than `CBORDecoder.Limits.maxItems`.
        case tooManyItems
        /// Input longer than `CBORDecoder.Limits.maxSize`.
        case tooLarge
    }

    public let kind: Kind
    /// Where in the input the problem is.
    public let offset: Int
    public let description: String

    public init(_ kind: Kind, at offset: Int, _ description: String) {
        self.kind = kind
        self.offset = offset
        self.description = description
    }
}

/// A strict CBOR decoder: definite lengths only, no floats or tags, valid UTF-8, unique map keys,
/// exactly one item, within limits on nesting, item count and size.
///
/// Integers and lengths in a longer form than needed are accepted (RFC 8949 §4.2 asks encoders,
/// not decoders, for the shortest form); re-encoding writes them shortest.
public struct CBORDecoder {
    public struct Limits: Sendable, Hashable {
        /// Arrays and maps nest at most this deep (a scalar at the top is depth 0); the decoder
        /// recurses once a level, so values above 256 are taken as 256.
        public var maxDepth: Int
        /// Data items in all, counting every key, value and element.
        public var maxItems: Int
        /// Input bytes.
        public var maxSize: Int

        public init(maxDepth: Int = 16, maxItems: Int = 4096, maxSize: Int = 65_535) {
            self.maxDepth = maxDepth
            self.maxItems = maxItems
            self.maxSize = maxSize
        }

        /// SMP's: a frame's CBOR is at most 65,535 bytes (the header's 16-bit length), and
        /// MCUmgr's deepest message (image state: map, array, map) is depth 3.
        public static let smp = Limits()
    }

    /// Decodes exactly one item from `bytes`.
    public static func decode(_ bytes: some Collection<UInt8>, limits: Limits = .smp) throws(CBORError) -> CBOR {
        let input = Array(bytes)
        guard input.count <= limits.maxSize else {
            throw CBORError(.tooLarge, at: 0, "CBOR of \(input.count) bytes is over the limit of \(limits.maxSize)")
        }
        var decoder = CBORDecoder(input: input, limits: limits)
        let item = try decoder.item(depth: 0)
        guard decoder.index == input.count else {
            throw CBORError(.trailingBytes, at: decoder.index, "\(input.count - decoder.index) bytes follow the CBOR item at offset \(decoder.index)")
        }
        return item
    }

    private let input: [UInt8]
    private let limits: Limits
    private var index = 0
    private var items = 0

    private init(input: [UInt8], limits: Limits) {
        self.input = input
        self.limits = limits
    }

    private var remaining: Int { input.count - index }

    private mutating func byte() throws(CBORError) -> UInt8 {
        guard index < input.count else { throw CBORError(.truncated, at: index, "CBOR ends at offset \(index) inside an item") }
        defer { index += 1 }
        return input[index]
    }

    private mutating func take(_ n: UInt64, what: String) throws(CBORError) -> ArraySlice<UInt8> {
        guard n <= UInt64(remaining) else {
            throw CBORError(.truncated, at: index, "\(what) of \(n) bytes at offset \(index) runs past the end (\(remaining) left)")
        }
        defer { index += Int(n) }
        return input[index..<index + Int(n)]
    }

    private mutating func count(_ n: Int) throws(CBORError) {
        items += n
        guard items <= limits.maxItems else {
            throw CBORError(.tooManyItems, at: index, "CBOR holds more than \(limits.maxItems) items")
        }
    }

    /// The argument of a head whose initial byte's low 5 bits are `info`.
    private mutating func argument(_ info: UInt8, at start: Int) throws(CBORError) -> UInt64 {
        switch info {
        case ..<24: return UInt64(info)
        case 24...27:
            var n: UInt64 = 0
            for _ in 0..<(1 << (info - 24)) { n = n << 8 | UInt64(try byte()) }
            return n
        case 31:
            throw CBORError(.indefiniteLength, at: start, "indefinite length (0x\(hex(input[start]))) at offset \(start); SMP uses definite lengths only")
        default:
            throw CBORError(.reservedAdditionalInfo, at: start, "reserved additional information \(info) (0x\(hex(input[start]))) at offset \(start)")
        }
    }

    private mutating func item(depth: Int) throws(CBORError) -> CBOR {
        let start = index
        try count(1)
        let initial = try byte()
        let major = initial >> 5
        let info = initial & 0x1F
        if major == 7 {
            switch info {
            case 20: return .bool(false)
            case 21: return .bool(true)
            case 22: return .null
            case 25, 26, 27:
                throw CBORError(.float, at: start, "a floating-point number (0x\(hex(initial))) at offset \(start); SMP carries no floats")
            case 31:
                throw CBORError(.indefiniteLength, at: start, "a \"break\" (0xff) at offset \(start) outside an indefinite-length item")
            case 28, 29, 30:
                throw CBORError(.reservedAdditionalInfo, at: start, "reserved additional information \(info) (0x\(hex(initial))) at offset \(start)")
            default:
                let what = info == 23 ? "undefined" : "simple value \(info == 24 ? "(1-byte form)" : String(info))"
                throw CBORError(.unsupportedSimpleValue, at: start, "\(what) (0x\(hex(initial))) at offset \(start); SMP uses only false, true and null")
            }
        }
        let n = try argument(info, at: start)
        switch major {
        case 0: return .unsigned(n)
        case 1: return .negative(n)
        case 2: return .bytes(Array(try take(n, what: "byte string")))
        case 3:
            let raw = try take(n, what: "text string")
            guard let s = String(validating: raw, as: UTF8.self) else {
                throw CBORError(.invalidUTF8, at: start, "text string at offset \(start) is not valid UTF-8")
            }
            return .text(s)
        case 4, 5:
            let maxDepth = min(limits.maxDepth, 256)
            guard depth < maxDepth else {
                throw CBORError(.tooDeep, at: start, "CBOR nests deeper than \(maxDepth) levels at offset \(start)")
            }
            // Every item takes at least one byte: a count beyond the bytes left is truncated input,
            // and checking it first keeps a forged count from reserving memory.
            let perEntry: UInt64 = major == 4 ? 1 : 2
            guard n <= UInt64(remaining) / perEntry else {
                throw CBORError(.truncated, at: start, "\(major == 4 ? "array" : "map") of \(n) entries at offset \(start) runs past the end (\(remaining) bytes left)")
            }
            if major == 4 {
                var elements: [CBOR] = []
                elements.reserveCapacity(Int(n))
                for _ in 0..<n { elements.append(try item(depth: depth + 1)) }
                return .array(elements)
            }
            var entries: [CBOR: CBOR] = [:]
            entries.reserveCapacity(Int(n))
            for _ in 0..<n {
                let keyOffset = index
                let key = try item(depth: depth + 1)
                let value = try item(depth: depth + 1)
                guard entries.updateValue(value, forKey: key) == nil else {
                    throw CBORError(.duplicateMapKey, at: keyOffset, "map key \(key) at offset \(keyOffset) appears twice")
                }
            }
            return .map(entries)
        default:
            throw CBORError(.tag, at: start, "tag \(n) at offset \(start); SMP carries no tagged items")
        }
    }
}

/// Lower-case hex with two digits.
func hex(_ byte: UInt8) -> String {
    (byte < 16 ? "0" : "") + String(byte, radix: 16)
}
