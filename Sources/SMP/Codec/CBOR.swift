/// A CBOR data item (RFC 8949).
///
/// SMP's messages carry integers up to 64 bits, byte and text strings, arrays, maps, booleans and
/// null. A device may still send any well-formed item where a field does not need it, so floats
/// and the other simple values (`undefined` among them) have cases of their own; tags leave no
/// case, the decoder keeps their content (RFC 8949 §3.4: a tag only qualifies its item). How an
/// item was encoded (indefinite lengths, longer heads than needed, key order) is not kept either:
/// the encoder writes every item canonically (`CBOREncoder`).
///
/// Equality is CBOR's, not Swift's: text strings compare by their UTF-8 bytes (Swift's `String`
/// equates canonically equivalent text that CBOR keeps apart as map keys), and floats by their
/// bits, so a NaN equals itself and -0.0 is not 0.0.
public enum CBOR: Sendable {
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
    /// A half, single or double precision float, held exactly (a half or single float is a
    /// `Double` with the same value, NaN payloads included).
    case float(Double)
    /// A simple value other than false, true and null: 0...19, `undefined` (23) and 32...255, the
    /// values the decoder makes. 20...22 encode as false, true and null; 24...31 are no simple
    /// values at all (RFC 8949 §3.3): the encoder writes them as 0xf8 n, which decoders refuse.
    case simple(UInt8)

    /// `undefined` (simple value 23).
    public static let undefined = CBOR.simple(23)

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
        case .float: "a floating-point number"
        case .simple(23): "undefined"
        case .simple: "a simple value"
        }
    }
}

extension CBOR: Hashable {
    public static func == (a: CBOR, b: CBOR) -> Bool {
        switch (a, b) {
        case (.unsigned(let x), .unsigned(let y)), (.negative(let x), .negative(let y)): x == y
        case (.bytes(let x), .bytes(let y)): x == y
        case (.text(let x), .text(let y)): x.utf8.elementsEqual(y.utf8)
        case (.array(let x), .array(let y)): x == y
        case (.map(let x), .map(let y)): x == y
        case (.bool(let x), .bool(let y)): x == y
        case (.null, .null): true
        case (.float(let x), .float(let y)): x.bitPattern == y.bitPattern
        case (.simple(let x), .simple(let y)): x == y
        default: false
        }
    }

    public func hash(into hasher: inout Hasher) {
        switch self {
        case .unsigned(let n): hasher.combine(0 as UInt8); hasher.combine(n)
        case .negative(let n): hasher.combine(1 as UInt8); hasher.combine(n)
        case .bytes(let b): hasher.combine(2 as UInt8); hasher.combine(b)
        case .text(let s):
            hasher.combine(3 as UInt8)
            hasher.combine(s.utf8.count)
            for byte in s.utf8 { hasher.combine(byte) }
        case .array(let a): hasher.combine(4 as UInt8); hasher.combine(a)
        case .map(let m): hasher.combine(5 as UInt8); hasher.combine(m)
        case .bool(let b): hasher.combine(6 as UInt8); hasher.combine(b)
        case .null: hasher.combine(7 as UInt8)
        case .float(let d): hasher.combine(8 as UInt8); hasher.combine(d.bitPattern)
        case .simple(let v): hasher.combine(9 as UInt8); hasher.combine(v)
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
        case .float(let d): d.isNaN ? "NaN" : d.isInfinite ? (d < 0 ? "-Infinity" : "Infinity") : "\(d)"
        case .simple(23): "undefined"
        case .simple(let n): "simple(\(n))"
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
        case .float(let d): appendFloat(d, to: &out)
        case .simple(let n): out += n < 24 ? [0xE0 | n] : [0xF8, n]
        }
    }

    /// The shortest of half, single and double precision that holds `d` exactly, NaN payloads
    /// included (RFC 8949 §4.1, preferred serialization).
    static func appendFloat(_ d: Double, to out: inout [UInt8]) {
        let bits = d.bitPattern
        let sign = bits >> 63
        let fraction = bits & (1 << 52 - 1)
        if d.isNaN || d.isInfinite {
            // The payload narrows when the bits it would lose are zero.
            if fraction & (1 << 42 - 1) == 0 {
                appendBigEndian(0xF9, sign << 15 | 0x7C00 | fraction >> 42, bytes: 2, to: &out)
            } else if fraction & (1 << 29 - 1) == 0 {
                appendBigEndian(0xFA, sign << 31 | 0x7F80_0000 | fraction >> 29, bytes: 4, to: &out)
            } else {
                appendBigEndian(0xFB, bits, bytes: 8, to: &out)
            }
        } else if Double(Float16(d)).bitPattern == bits {
            appendBigEndian(0xF9, UInt64(Float16(d).bitPattern), bytes: 2, to: &out)
        } else if Double(Float(d)).bitPattern == bits {
            appendBigEndian(0xFA, UInt64(Float(d).bitPattern), bytes: 4, to: &out)
        } else {
            appendBigEndian(0xFB, bits, bytes: 8, to: &out)
        }
    }

    private static func appendBigEndian(_ initial: UInt8, _ n: UInt64, bytes: Int, to out: inout [UInt8]) {
        out.append(initial)
        for shift in stride(from: (bytes - 1) * 8, through: 0, by: -8) { out.append(UInt8(truncatingIfNeeded: n >> UInt64(shift))) }
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
        let extra = headExtraBytes(n)
        guard extra > 0 else { return out.append(major << 5 | UInt8(n)) }
        appendBigEndian(major << 5 | 24 + UInt8(extra.trailingZeroBitCount), n, bytes: extra, to: &out)
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

/// Bytes that are not one well-formed CBOR item within the decoder's limits.
public struct CBORError: Error, Sendable, Hashable, CustomStringConvertible {
    public enum Kind: Sendable, Hashable {
        /// The input ends inside an item.
        case truncated
        /// Bytes follow the one top-level item.
        case trailingBytes
        /// Additional information 31 on an integer or a tag, which have no indefinite-length form.
        case indefiniteLength
        /// A "break" (0xff) outside an indefinite-length item, or where an indefinite-length map
        /// wants the value of its last key (an odd number of items).
        case unexpectedBreak
        /// A chunk of an indefinite-length string that is not a definite-length string of the
        /// same major type.
        case badChunk
        /// Additional information 28, 29 or 30, which RFC 8949 reserves.
        case reservedAdditionalInfo
        /// A simple value below 32 in the two-byte form (0xf8), not well-formed (RFC 8949 §3.3).
        case badSimpleValue
        /// A text string, or a chunk of one, that is not UTF-8.
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

/// A CBOR decoder that takes every well-formed encoding (RFC 8949) and refuses the rest: exactly
/// one item, within limits on nesting, item count and size.
///
/// "Be liberal in what you accept": a device chooses its encoding, and Zephyr (zcbor) and mcumgr
/// (tinycbor) write indefinite-length maps. So the decoder takes definite and indefinite lengths
/// (strings in definite chunks of their own type), heads longer than needed (RFC 8949 §4.2 asks
/// encoders, not decoders, for the shortest form), map keys in any order, tags (the content is
/// kept, the tag number dropped), floats of each precision and every simple value. It refuses
/// what is malformed or invalid: truncated input, trailing bytes, reserved additional information,
/// a misplaced break, a bad chunk, text that is not UTF-8 (each chunk on its own, as RFC 8949
/// §3.2.3 requires), a repeated map key.
///
/// Nothing an input claims is allocated before its bytes are there: every item takes at least one
/// byte, so counts and lengths are checked against the bytes left. Recursion is one level per
/// array or map, bounded by `Limits.maxDepth`; tags and string chunks are read in loops.
public struct CBORDecoder {
    public struct Limits: Sendable, Hashable {
        /// Arrays and maps nest at most this deep (a scalar at the top is depth 0); the decoder
        /// recurses once a level, so values above 256 are taken as 256.
        public var maxDepth: Int
        /// Data items in all, counting every key, value, element and tag (not string chunks).
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

    /// Whether the next byte is a "break", which it consumes; the end of input is truncation, as
    /// an indefinite-length item is still open.
    private mutating func atBreak() throws(CBORError) -> Bool {
        guard index < input.count else {
            throw CBORError(.truncated, at: index, "CBOR ends at offset \(index) inside an indefinite-length item")
        }
        guard input[index] == 0xFF else { return false }
        index += 1
        return true
    }

    /// The argument of a head whose initial byte's low 5 bits are `info` (below 31).
    private mutating func argument(_ info: UInt8, at start: Int) throws(CBORError) -> UInt64 {
        switch info {
        case ..<24: return UInt64(info)
        case 24...27:
            var n: UInt64 = 0
            for _ in 0..<(1 << (info - 24)) { n = n << 8 | UInt64(try byte()) }
            return n
        case 31:
            throw CBORError(.indefiniteLength, at: start, "additional information 31 (0x\(hex(input[start]))) at offset \(start) on an item that has no indefinite length")
        default:
            throw CBORError(.reservedAdditionalInfo, at: start, "reserved additional information \(info) (0x\(hex(input[start]))) at offset \(start)")
        }
    }

    private mutating func item(depth: Int) throws(CBORError) -> CBOR {
        var start = index
        try count(1)
        var initial = try byte()
        // Tags: the number is read and dropped, the next item is the content. A loop, so a run
        // of tags takes no stack; each counts as an item.
        while initial >> 5 == 6 {
            _ = try argument(initial & 0x1F, at: start)
            start = index
            try count(1)
            initial = try byte()
        }
        let major = initial >> 5
        let info = initial & 0x1F
        if major == 7 { return try simpleOrFloat(info, at: start) }
        if info == 31, major >= 2 {
            switch major {
            case 2, 3: return try chunkedString(major: major, at: start)
            default: return try container(major: major, count: nil, depth: depth, at: start)
            }
        }
        let n = try argument(info, at: start)
        switch major {
        case 0: return .unsigned(n)
        case 1: return .negative(n)
        case 2: return .bytes(Array(try take(n, what: "byte string")))
        case 3: return .text(try utf8(take(n, what: "text string"), at: start))
        default: return try container(major: major, count: n, depth: depth, at: start)
        }
    }

    /// Major type 7.
    private mutating func simpleOrFloat(_ info: UInt8, at start: Int) throws(CBORError) -> CBOR {
        switch info {
        case 20: return .bool(false)
        case 21: return .bool(true)
        case 22: return .null
        case 24:
            let value = try byte()
            guard value >= 32 else {
                throw CBORError(.badSimpleValue, at: start, "simple value \(value) in the two-byte form (0xf8 0x\(hex(value))) at offset \(start); below 32 it takes one byte")
            }
            return .simple(value)
        case 25:
            let bits = UInt16(try argument(info, at: start))
            guard bits & 0x7C00 != 0x7C00 else {
                return .float(Double(bitPattern: UInt64(bits >> 15) << 63 | 0x7FF << 52 | UInt64(bits & 0x3FF) << 42))
            }
            return .float(Double(Float16(bitPattern: bits)))
        case 26:
            let bits = UInt32(try argument(info, at: start))
            guard bits & 0x7F80_0000 != 0x7F80_0000 else {
                // Widened by hand: a conversion may quiet a signalling NaN and lose its payload.
                return .float(Double(bitPattern: UInt64(bits >> 31) << 63 | 0x7FF << 52 | UInt64(bits & 0x7F_FFFF) << 29))
            }
            return .float(Double(Float(bitPattern: bits)))
        case 27: return .float(Double(bitPattern: try argument(info, at: start)))
        case 28, 29, 30:
            throw CBORError(.reservedAdditionalInfo, at: start, "reserved additional information \(info) (0x\(hex(input[start]))) at offset \(start)")
        case 31:
            throw CBORError(.unexpectedBreak, at: start, "a \"break\" (0xff) at offset \(start) outside an indefinite-length item")
        default:
            return .simple(info)
        }
    }

    private func utf8(_ raw: ArraySlice<UInt8>, at start: Int) throws(CBORError) -> String {
        guard let s = String(validating: raw, as: UTF8.self) else {
            throw CBORError(.invalidUTF8, at: start, "text string at offset \(start) is not valid UTF-8")
        }
        return s
    }

    /// An indefinite-length byte or text string: definite chunks of its own major type up to a
    /// break. Each text chunk must be UTF-8 on its own, so a character never spans two.
    private mutating func chunkedString(major: UInt8, at start: Int) throws(CBORError) -> CBOR {
        let what = major == 2 ? "byte string" : "text string"
        var joined: [UInt8] = []
        var text = ""
        while try !atBreak() {
            let chunkStart = index
            let head = try byte()
            guard head >> 5 == major, head & 0x1F != 31 else {
                throw CBORError(.badChunk, at: chunkStart, "indefinite-length \(what) at offset \(start) holds 0x\(hex(head)) at offset \(chunkStart), not a definite-length \(what)")
            }
            let chunk = try take(argument(head & 0x1F, at: chunkStart), what: "\(what) chunk")
            if major == 2 { joined += chunk } else { text += try utf8(chunk, at: chunkStart) }
        }
        return major == 2 ? .bytes(joined) : .text(text)
    }

    /// Whether another entry follows: one of the `left` of a definite-length container (nil for
    /// an indefinite one), or anything but a break.
    private mutating func another(_ left: inout UInt64?) throws(CBORError) -> Bool {
        guard let n = left else { return try !atBreak() }
        guard n > 0 else { return false }
        left = n - 1
        return true
    }

    /// An array (major 4) or map (major 5) of `count` entries, or up to a break when nil.
    private mutating func container(major: UInt8, count n: UInt64?, depth: Int, at start: Int) throws(CBORError) -> CBOR {
        let name = major == 4 ? "array" : "map"
        let maxDepth = min(limits.maxDepth, 256)
        guard depth < maxDepth else {
            throw CBORError(.tooDeep, at: start, "CBOR nests deeper than \(maxDepth) levels at offset \(start)")
        }
        if let n {
            // Every item takes at least one byte: a count beyond the bytes left is truncated input,
            // and checking it first keeps a forged count from reserving memory.
            guard n <= UInt64(remaining) / (major == 4 ? 1 : 2) else {
                throw CBORError(.truncated, at: start, "\(name) of \(n) entries at offset \(start) runs past the end (\(remaining) bytes left)")
            }
        }
        var left = n
        if major == 4 {
            var elements: [CBOR] = []
            elements.reserveCapacity(Int(n ?? 0))
            while try another(&left) { elements.append(try item(depth: depth + 1)) }
            return .array(elements)
        }
        var entries: [CBOR: CBOR] = [:]
        entries.reserveCapacity(Int(n ?? 0))
        while try another(&left) {
            let keyOffset = index
            let key = try item(depth: depth + 1)
            if n == nil, try atBreak() {
                throw CBORError(.unexpectedBreak, at: index - 1, "indefinite-length map at offset \(start) ends at offset \(index - 1) after key \(key) without its value")
            }
            let value = try item(depth: depth + 1)
            guard entries.updateValue(value, forKey: key) == nil else {
                throw CBORError(.duplicateMapKey, at: keyOffset, "map key \(key) at offset \(keyOffset) appears twice")
            }
        }
        return .map(entries)
    }
}

/// Lower-case hex with two digits.
func hex(_ byte: UInt8) -> String {
    (byte < 16 ? "0" : "") + String(byte, radix: 16)
}
