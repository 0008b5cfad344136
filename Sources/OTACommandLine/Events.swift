import ArgumentParser

/// One line of `--json` output. docs/EVENTS.md documents every conforming type, key by key; a test
/// checks that the two agree.
///
/// A line is the type's stored properties in declaration order, after `"event": name`. Property
/// names become snake_case keys (`resumeOffset` → `resume_offset`), and a nil optional is written
/// as `null`, so every line of an event has the same keys.
public protocol JSONEvent: Encodable, Sendable {
    /// The value of the line's `"event"` key.
    static var name: String { get }
}

extension JSONEvent {
    /// The event as an ordered JSON object, `"event"` first.
    public var json: JSON {
        guard case .object(let fields) = EventEncoder.encode(self) else { return .object([("event", .string(Self.name))]) }
        return .object([("event", .string(Self.name))] + fields)
    }

    /// The event as one JSON Lines line (without the newline).
    public var line: String { json.text }
}

/// How a run or one device of it ended.
public enum EventResult: String, CaseIterable, Encodable, Sendable {
    case ok
    /// `--skip-if-version`: the device already ran that version; nothing was sent.
    case skipped
    case error
}

/// The `done` event of a command: how it ended, with the command's own keys before the error's.
public protocol CommandDone: JSONEvent {
    /// A successful ending, every optional key null.
    init()
    var result: EventResult { get set }
    var exitCode: Int { get set }
    var error: String? { get set }
    var message: String? { get set }
}

extension CommandDone {
    /// A command that failed: its exit code, the code's name and the one line that explains it.
    public init(failure: CLIFailure) {
        self.init()
        result = .error
        exitCode = Int(failure.code.rawValue)
        error = failure.code.name
        message = failure.message
    }
}

/// A JSON value for event lines (`JSONEvent` encodes into it); keys keep their order so `"event"` comes first.
public enum JSON: Sendable, Equatable {
    case string(String)
    case int(Int)
    case double(Double)
    case bool(Bool)
    case null
    case object([(String, JSON)])
    case array([JSON])

    public static func == (a: JSON, b: JSON) -> Bool { a.text == b.text }

    public var text: String {
        switch self {
        case .string(let s): return JSON.quote(s)
        case .int(let i): return String(i)
        case .double(let d):
            guard d.isFinite else { return "null" }
            return String(format: "%.3f", d).replacingOccurrences(of: #"\.?0+$"#, with: "", options: .regularExpression)
        case .bool(let b): return b ? "true" : "false"
        case .null: return "null"
        case .object(let fields): return "{" + fields.map { JSON.quote($0.0) + ":" + $0.1.text }.joined(separator: ",") + "}"
        case .array(let items): return "[" + items.map(\.text).joined(separator: ",") + "]"
        }
    }

    public static func quote(_ s: String) -> String {
        var out = "\""
        for scalar in s.unicodeScalars {
            switch scalar {
            case "\"": out += "\\\""
            case "\\": out += "\\\\"
            case "\n": out += "\\n"
            case "\r": out += "\\r"
            case "\t": out += "\\t"
            case _ where scalar.value < 0x20: out += String(format: "\\u%04x", scalar.value)
            default: out.unicodeScalars.append(scalar)
            }
        }
        return out + "\""
    }
}

// MARK: encoding

/// Encodes a value into an ordered `JSON` object: keys in the order the value encodes them (for
/// synthesized conformances, declaration order), camelCase names as snake_case keys, and nil
/// optionals as `null` rather than left out.
public struct EventEncoder {
    /// A value being built; containers write into it, `json` reads the result.
    final class Node {
        var value: JSON = .null
        var fields: [(String, Node)]?
        var items: [Node]?

        var json: JSON {
            if let fields { return .object(fields.map { ($0.0, $0.1.json) }) }
            if let items { return .array(items.map(\.json)) }
            return value
        }

        func field(_ key: some CodingKey) -> Node {
            let child = Node()
            fields = (fields ?? []) + [(EventEncoder.snakeCase(key.stringValue), child)]
            return child
        }

        func item() -> Node {
            let child = Node()
            items = (items ?? []) + [child]
            return child
        }
    }

    /// The JSON of `value`. Events are plain structs of numbers, strings and optionals, which
    /// cannot fail to encode; a value that does throws is written as `null`.
    public static func encode(_ value: some Encodable) -> JSON {
        let node = Node()
        do {
            try value.encode(to: NodeEncoder(node: node))
        } catch {
            return .null
        }
        return node.json
    }

    static func snakeCase(_ name: String) -> String {
        var out = ""
        for character in name {
            if character.isUppercase {
                out += "_" + character.lowercased()
            } else {
                out.append(character)
            }
        }
        return out
    }

    struct NodeEncoder: Encoder {
        let node: Node
        var codingPath: [any CodingKey] { [] }
        var userInfo: [CodingUserInfoKey: Any] { [:] }

        func container<Key: CodingKey>(keyedBy type: Key.Type) -> KeyedEncodingContainer<Key> {
            if node.fields == nil { node.fields = [] }
            return KeyedEncodingContainer(Keyed(node: node))
        }

        func unkeyedContainer() -> any UnkeyedEncodingContainer {
            if node.items == nil { node.items = [] }
            return Unkeyed(node: node)
        }

        func singleValueContainer() -> any SingleValueEncodingContainer { Single(node: node) }
    }

    /// Numbers and strings land here, whatever container they were encoded through.
    struct Single: SingleValueEncodingContainer {
        let node: Node
        var codingPath: [any CodingKey] { [] }

        private func integer(_ value: some BinaryInteger) {
            node.value = Int(exactly: value).map { .int($0) } ?? .double(Double(value))
        }

        mutating func encodeNil() { node.value = .null }
        mutating func encode(_ value: Bool) { node.value = .bool(value) }
        mutating func encode(_ value: String) { node.value = .string(value) }
        mutating func encode(_ value: Double) { node.value = .double(value) }
        mutating func encode(_ value: Float) { node.value = .double(Double(value)) }
        mutating func encode(_ value: Int) { node.value = .int(value) }
        mutating func encode(_ value: Int8) { integer(value) }
        mutating func encode(_ value: Int16) { integer(value) }
        mutating func encode(_ value: Int32) { integer(value) }
        mutating func encode(_ value: Int64) { integer(value) }
        mutating func encode(_ value: UInt) { integer(value) }
        mutating func encode(_ value: UInt8) { integer(value) }
        mutating func encode(_ value: UInt16) { integer(value) }
        mutating func encode(_ value: UInt32) { integer(value) }
        mutating func encode(_ value: UInt64) { integer(value) }
        mutating func encode<T: Encodable>(_ value: T) throws { try value.encode(to: NodeEncoder(node: node)) }
    }

    struct Keyed<Key: CodingKey>: KeyedEncodingContainerProtocol {
        let node: Node
        var codingPath: [any CodingKey] { [] }

        private func put(_ value: some Encodable, _ key: Key) throws {
            try value.encode(to: NodeEncoder(node: node.field(key)))
        }

        /// A nil optional is written as null: every line of an event has the same keys.
        private func putOptional(_ value: (some Encodable)?, _ key: Key) throws {
            if let value { try put(value, key) } else { node.field(key).value = .null }
        }

        mutating func encodeNil(forKey key: Key) { node.field(key).value = .null }
        mutating func encode(_ value: Bool, forKey key: Key) throws { try put(value, key) }
        mutating func encode(_ value: String, forKey key: Key) throws { try put(value, key) }
        mutating func encode(_ value: Double, forKey key: Key) throws { try put(value, key) }
        mutating func encode(_ value: Float, forKey key: Key) throws { try put(value, key) }
        mutating func encode(_ value: Int, forKey key: Key) throws { try put(value, key) }
        mutating func encode(_ value: Int8, forKey key: Key) throws { try put(value, key) }
        mutating func encode(_ value: Int16, forKey key: Key) throws { try put(value, key) }
        mutating func encode(_ value: Int32, forKey key: Key) throws { try put(value, key) }
        mutating func encode(_ value: Int64, forKey key: Key) throws { try put(value, key) }
        mutating func encode(_ value: UInt, forKey key: Key) throws { try put(value, key) }
        mutating func encode(_ value: UInt8, forKey key: Key) throws { try put(value, key) }
        mutating func encode(_ value: UInt16, forKey key: Key) throws { try put(value, key) }
        mutating func encode(_ value: UInt32, forKey key: Key) throws { try put(value, key) }
        mutating func encode(_ value: UInt64, forKey key: Key) throws { try put(value, key) }
        mutating func encode<T: Encodable>(_ value: T, forKey key: Key) throws { try put(value, key) }

        mutating func encodeIfPresent(_ value: Bool?, forKey key: Key) throws { try putOptional(value, key) }
        mutating func encodeIfPresent(_ value: String?, forKey key: Key) throws { try putOptional(value, key) }
        mutating func encodeIfPresent(_ value: Double?, forKey key: Key) throws { try putOptional(value, key) }
        mutating func encodeIfPresent(_ value: Float?, forKey key: Key) throws { try putOptional(value, key) }
        mutating func encodeIfPresent(_ value: Int?, forKey key: Key) throws { try putOptional(value, key) }
        mutating func encodeIfPresent(_ value: Int8?, forKey key: Key) throws { try putOptional(value, key) }
        mutating func encodeIfPresent(_ value: Int16?, forKey key: Key) throws { try putOptional(value, key) }
        mutating func encodeIfPresent(_ value: Int32?, forKey key: Key) throws { try putOptional(value, key) }
        mutating func encodeIfPresent(_ value: Int64?, forKey key: Key) throws { try putOptional(value, key) }
        mutating func encodeIfPresent(_ value: UInt?, forKey key: Key) throws { try putOptional(value, key) }
        mutating func encodeIfPresent(_ value: UInt8?, forKey key: Key) throws { try putOptional(value, key) }
        mutating func encodeIfPresent(_ value: UInt16?, forKey key: Key) throws { try putOptional(value, key) }
        mutating func encodeIfPresent(_ value: UInt32?, forKey key: Key) throws { try putOptional(value, key) }
        mutating func encodeIfPresent(_ value: UInt64?, forKey key: Key) throws { try putOptional(value, key) }
        mutating func encodeIfPresent<T: Encodable>(_ value: T?, forKey key: Key) throws { try putOptional(value, key) }

        mutating func nestedContainer<NestedKey: CodingKey>(keyedBy keyType: NestedKey.Type, forKey key: Key) -> KeyedEncodingContainer<NestedKey> {
            NodeEncoder(node: node.field(key)).container(keyedBy: keyType)
        }

        mutating func nestedUnkeyedContainer(forKey key: Key) -> any UnkeyedEncodingContainer {
            NodeEncoder(node: node.field(key)).unkeyedContainer()
        }

        mutating func superEncoder() -> any Encoder { NodeEncoder(node: node.field(Named("super"))) }
        mutating func superEncoder(forKey key: Key) -> any Encoder { NodeEncoder(node: node.field(key)) }
    }

    struct Unkeyed: UnkeyedEncodingContainer {
        let node: Node
        var codingPath: [any CodingKey] { [] }
        var count: Int { node.items?.count ?? 0 }

        private func put(_ value: some Encodable) throws { try value.encode(to: NodeEncoder(node: node.item())) }

        mutating func encodeNil() { node.item().value = .null }
        mutating func encode(_ value: Bool) throws { try put(value) }
        mutating func encode(_ value: String) throws { try put(value) }
        mutating func encode(_ value: Double) throws { try put(value) }
        mutating func encode(_ value: Float) throws { try put(value) }
        mutating func encode(_ value: Int) throws { try put(value) }
        mutating func encode(_ value: Int8) throws { try put(value) }
        mutating func encode(_ value: Int16) throws { try put(value) }
        mutating func encode(_ value: Int32) throws { try put(value) }
        mutating func encode(_ value: Int64) throws { try put(value) }
        mutating func encode(_ value: UInt) throws { try put(value) }
        mutating func encode(_ value: UInt8) throws { try put(value) }
        mutating func encode(_ value: UInt16) throws { try put(value) }
        mutating func encode(_ value: UInt32) throws { try put(value) }
        mutating func encode(_ value: UInt64) throws { try put(value) }
        mutating func encode<T: Encodable>(_ value: T) throws { try put(value) }

        mutating func nestedContainer<NestedKey: CodingKey>(keyedBy keyType: NestedKey.Type) -> KeyedEncodingContainer<NestedKey> {
            NodeEncoder(node: node.item()).container(keyedBy: keyType)
        }

        mutating func nestedUnkeyedContainer() -> any UnkeyedEncodingContainer { NodeEncoder(node: node.item()).unkeyedContainer() }
        mutating func superEncoder() -> any Encoder { NodeEncoder(node: node.item()) }
    }

    struct Named: CodingKey {
        let stringValue: String
        init(_ name: String) { stringValue = name }
        init?(stringValue: String) { self.stringValue = stringValue }
        var intValue: Int? { nil }
        init?(intValue: Int) { nil }
    }
}
