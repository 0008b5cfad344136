/// A typed D-Bus value: one complete type of the D-Bus type system.
///
/// Mirrors the type codes of the D-Bus specification ("Type System"). Containers keep their
/// element signature so that empty arrays and dictionaries still marshal with the right type.
/// Values are plain Sendable data; they never refer to a libdbus message.
///
/// Unix file descriptors (`h`): a received `.unixFD` is a descriptor duplicated for the receiver by
/// libdbus (`dbus_message_iter_get_basic` returns a new fd), so the receiver owns it and must close
/// it. A sent `.unixFD` is duplicated into the message, so the sender keeps ownership of its own.
/// Descriptors that reach no receiver (calls answered with an error by this library, signals no
/// subscription matched) are closed; a signal delivered to several subscriptions shares its
/// descriptors between them.
public enum DBusValue: Sendable, Hashable {
    case byte(UInt8)
    case bool(Bool)
    case int16(Int16)
    case uint16(UInt16)
    case int32(Int32)
    case uint32(UInt32)
    case int64(Int64)
    case uint64(UInt64)
    case double(Double)
    case string(String)
    case objectPath(String)
    case signature(String)
    case unixFD(Int32)
    /// An array whose elements all have `elementSignature` (one complete type, e.g. `"y"`).
    case array(elementSignature: String, [DBusValue])
    /// An array of dict entries, `a{kv}`: the key signature must be a basic type.
    case dictionary(keySignature: String, valueSignature: String, [DBusValue: DBusValue])
    /// A struct `( ... )`: at least one field.
    case `struct`([DBusValue])
    /// A variant `v`: carries its own signature on the wire.
    indirect case variant(DBusValue)

    /// The D-Bus signature of this value, e.g. `"a{sv}"`.
    public var signature: String {
        switch self {
        case .byte: "y"
        case .bool: "b"
        case .int16: "n"
        case .uint16: "q"
        case .int32: "i"
        case .uint32: "u"
        case .int64: "x"
        case .uint64: "t"
        case .double: "d"
        case .string: "s"
        case .objectPath: "o"
        case .signature: "g"
        case .unixFD: "h"
        case .array(let element, _): "a" + element
        case .dictionary(let key, let value, _): "a{" + key + value + "}"
        case .struct(let fields): "(" + fields.map(\.signature).joined() + ")"
        case .variant: "v"
        }
    }
}

// MARK: - Building values

extension DBusValue {
    /// `ay` from raw bytes.
    public static func bytes<S: Sequence>(_ bytes: S) -> DBusValue where S.Element == UInt8 {
        .array(elementSignature: "y", bytes.map { .byte($0) })
    }

    /// `as` from strings.
    public static func strings<S: Sequence>(_ strings: S) -> DBusValue where S.Element == String {
        .array(elementSignature: "s", strings.map { .string($0) })
    }

    /// `ao` from object paths.
    public static func objectPaths<S: Sequence>(_ paths: S) -> DBusValue where S.Element == String {
        .array(elementSignature: "o", paths.map { .objectPath($0) })
    }

    /// `a{sv}`, the usual options/properties dictionary; each value is wrapped in a variant
    /// unless it already is one.
    public static func vardict(_ entries: [String: DBusValue]) -> DBusValue {
        var dict: [DBusValue: DBusValue] = [:]
        for (key, value) in entries {
            if case .variant = value {
                dict[.string(key)] = value
            } else {
                dict[.string(key)] = .variant(value)
            }
        }
        return .dictionary(keySignature: "s", valueSignature: "v", dict)
    }
}

// MARK: - Reading values

extension DBusValue {
    /// The value inside any number of variant wrappers.
    public var unwrapped: DBusValue {
        var value = self
        while case .variant(let inner) = value { value = inner }
        return value
    }

    /// The string of a `s` value (looking through variants).
    public var string: String? {
        if case .string(let s) = unwrapped { return s }
        return nil
    }

    /// The path of an `o` value (looking through variants).
    public var objectPath: String? {
        if case .objectPath(let s) = unwrapped { return s }
        return nil
    }

    public var bool: Bool? {
        if case .bool(let v) = unwrapped { return v }
        return nil
    }

    public var byte: UInt8? {
        if case .byte(let v) = unwrapped { return v }
        return nil
    }

    public var int16: Int16? {
        if case .int16(let v) = unwrapped { return v }
        return nil
    }

    public var uint16: UInt16? {
        if case .uint16(let v) = unwrapped { return v }
        return nil
    }

    public var int32: Int32? {
        if case .int32(let v) = unwrapped { return v }
        return nil
    }

    public var uint32: UInt32? {
        if case .uint32(let v) = unwrapped { return v }
        return nil
    }

    public var int64: Int64? {
        if case .int64(let v) = unwrapped { return v }
        return nil
    }

    public var uint64: UInt64? {
        if case .uint64(let v) = unwrapped { return v }
        return nil
    }

    public var double: Double? {
        if case .double(let v) = unwrapped { return v }
        return nil
    }

    /// The descriptor of an `h` value; see the type documentation for ownership.
    public var unixFD: Int32? {
        if case .unixFD(let v) = unwrapped { return v }
        return nil
    }

    /// Any integer type widened to `Int`, for fields whose exact width varies between services.
    public var integer: Int? {
        switch unwrapped {
        case .byte(let v): Int(v)
        case .int16(let v): Int(v)
        case .uint16(let v): Int(v)
        case .int32(let v): Int(v)
        case .uint32(let v): Int(v)
        case .int64(let v): Int(v)
        case .uint64(let v): Int(exactly: v)
        default: nil
        }
    }

    /// The elements of an array (looking through variants).
    public var array: [DBusValue]? {
        if case .array(_, let elements) = unwrapped { return elements }
        return nil
    }

    /// The bytes of an `ay` value.
    public var bytes: [UInt8]? {
        guard case .array(let element, let elements) = unwrapped, element == "y" else { return nil }
        var out: [UInt8] = []
        out.reserveCapacity(elements.count)
        for case .byte(let b) in elements { out.append(b) }
        return out
    }

    /// The strings of an `as` or `ao` value.
    public var strings: [String]? {
        guard case .array(_, let elements) = unwrapped else { return nil }
        var out: [String] = []
        out.reserveCapacity(elements.count)
        for element in elements {
            switch element {
            case .string(let s), .objectPath(let s): out.append(s)
            default: return nil
            }
        }
        return out
    }

    /// The entries of a dictionary (looking through variants).
    public var dictionary: [DBusValue: DBusValue]? {
        if case .dictionary(_, _, let entries) = unwrapped { return entries }
        return nil
    }

    /// A dictionary with string keys (`a{s…}`), values unwrapped from their variants.
    ///
    /// This is the shape of option dictionaries and of `Properties.GetAll` results.
    public var vardict: [String: DBusValue]? {
        guard case .dictionary(let key, _, let entries) = unwrapped, key == "s" else { return nil }
        var out: [String: DBusValue] = [:]
        for (k, v) in entries {
            if case .string(let name) = k { out[name] = v.unwrapped }
        }
        return out
    }

    /// The fields of a struct (looking through variants).
    public var fields: [DBusValue]? {
        if case .struct(let fields) = unwrapped { return fields }
        return nil
    }

    /// Looks up a string key in an `a{s…}` dictionary, unwrapping a variant value.
    public subscript(key: String) -> DBusValue? {
        guard case .dictionary(let keySig, _, let entries) = unwrapped, keySig == "s" else { return nil }
        return entries[.string(key)]?.unwrapped
    }
}

extension DBusValue: CustomStringConvertible {
    public var description: String {
        switch self {
        case .byte(let v): "\(v)"
        case .bool(let v): "\(v)"
        case .int16(let v): "\(v)"
        case .uint16(let v): "\(v)"
        case .int32(let v): "\(v)"
        case .uint32(let v): "\(v)"
        case .int64(let v): "\(v)"
        case .uint64(let v): "\(v)"
        case .double(let v): "\(v)"
        case .string(let v): v.debugDescription
        case .objectPath(let v): "o\(v.debugDescription)"
        case .signature(let v): "g\(v.debugDescription)"
        case .unixFD(let v): "fd(\(v))"
        case .array(_, let elements): "[" + elements.map(\.description).joined(separator: ", ") + "]"
        case .dictionary(_, _, let entries):
            "{" + entries.map { "\($0.key): \($0.value)" }.sorted().joined(separator: ", ") + "}"
        case .struct(let fields): "(" + fields.map(\.description).joined(separator: ", ") + ")"
        case .variant(let inner): "<\(inner)>"
        }
    }
}
