internal import CDBus

#if canImport(Glibc)
import Glibc
private let closeDescriptor = Glibc.close
#elseif canImport(Musl)
import Musl
private let closeDescriptor = Musl.close
#endif

/// Converts between ``DBusValue`` and message bodies through `DBusMessageIter`.
///
/// The variadic `dbus_message_append_args`/`dbus_message_get_args` are not callable from Swift, so
/// both directions walk the body with the iterator API (libdbus reference, "DBusMessage":
/// `dbus_message_iter_append_basic`, `dbus_message_iter_open_container`,
/// `dbus_message_iter_get_basic`, `dbus_message_iter_recurse`). Values are fully validated before
/// the first append, because libdbus aborts on a malformed value instead of returning an error.
enum Marshal {
    /// Spec, "Valid Signatures": at most 32 nested arrays and 32 nested structs; libdbus also bounds
    /// the total depth including variants at 64 when it validates a received body.
    static let maxArrayDepth = 32
    static let maxStructDepth = 32
    static let maxTotalDepth = 64

    /// Basic type codes: the only types allowed as dictionary keys (spec, "Container types").
    static let basicSignatures: Set<String> = ["y", "b", "n", "q", "i", "u", "x", "t", "d", "s", "o", "g", "h"]

    // MARK: Validation

    /// Throws unless every value can be marshalled as-is.
    static func validate(_ values: [DBusValue]) throws(DBusError) {
        var bodySignature = ""
        for value in values {
            try validate(value, arrays: 0, structs: 0, total: 0)
            bodySignature += value.signature
        }
        try DBusValidation.signature(bodySignature)
    }

    private static func validate(_ value: DBusValue, arrays: Int, structs: Int, total: Int) throws(DBusError) {
        if arrays > maxArrayDepth || structs > maxStructDepth || total > maxTotalDepth {
            throw .invalidArgument("value nests containers deeper than D-Bus allows")
        }
        switch value {
        case .byte, .bool, .int16, .uint16, .int32, .uint32, .int64, .uint64, .double:
            return
        case .string(let s):
            try DBusValidation.string(s)
        case .objectPath(let p):
            try DBusValidation.objectPath(p)
        case .signature(let g):
            try DBusValidation.signature(g)
        case .unixFD(let fd):
            if fd < 0 { throw .invalidArgument("invalid file descriptor \(fd)") }
        case .array(let element, let elements):
            try DBusValidation.singleCompleteType(element)
            if element.hasPrefix("{") {
                throw .invalidArgument("use .dictionary for arrays of dict entries")
            }
            // DBUS_MAXIMUM_ARRAY_LENGTH (64 MiB); libdbus aborts on a longer fixed array.
            if elements.count > 67_108_864 {
                throw .invalidArgument("array longer than the D-Bus maximum of 64 MiB")
            }
            for item in elements {
                let sig = item.signature
                if sig != element {
                    throw .invalidArgument("array of \(element) contains a \(sig) element")
                }
                try validate(item, arrays: arrays + 1, structs: structs, total: total + 1)
            }
        case .dictionary(let key, let valueSig, let entries):
            guard basicSignatures.contains(key) else {
                throw .invalidArgument("dictionary key type \(key.debugDescription) is not a basic type")
            }
            try DBusValidation.singleCompleteType(valueSig)
            for (k, v) in entries {
                if k.signature != key {
                    throw .invalidArgument("dictionary with \(key) keys contains a \(k.signature) key")
                }
                if v.signature != valueSig {
                    throw .invalidArgument("dictionary with \(valueSig) values contains a \(v.signature) value")
                }
                try validate(k, arrays: arrays + 1, structs: structs + 1, total: total + 2)
                try validate(v, arrays: arrays + 1, structs: structs + 1, total: total + 2)
            }
        case .struct(let fields):
            if fields.isEmpty { throw .invalidArgument("a struct needs at least one field") }
            for field in fields {
                try validate(field, arrays: arrays, structs: structs + 1, total: total + 1)
            }
        case .variant(let inner):
            try validate(inner, arrays: arrays, structs: structs, total: total + 1)
        }
        if value.signature.utf8.count > 255 {
            throw .invalidArgument("signature longer than 255 bytes")
        }
    }

    // MARK: Writing

    /// Validates `values`, then appends them to the body of `message`.
    static func append(_ values: [DBusValue], to message: OpaquePointer) throws(DBusError) {
        try validate(values)
        var iter = DBusMessageIter()
        dbus_message_iter_init_append(message, &iter)
        for value in values where !write(value, into: &iter) {
            throw DBusError(name: DBusError.Name.noMemory, message: "libdbus could not append a value")
        }
    }

    private static func appendBasic<T>(_ iter: inout DBusMessageIter, _ type: Int32, _ value: T) -> Bool {
        withUnsafePointer(to: value) { dbus_message_iter_append_basic(&iter, type, $0) != 0 }
    }

    private static func appendString(_ iter: inout DBusMessageIter, _ type: Int32, _ string: String) -> Bool {
        string.withCString { chars in
            let pointer: UnsafePointer<CChar>? = chars
            return withUnsafePointer(to: pointer) { dbus_message_iter_append_basic(&iter, type, $0) != 0 }
        }
    }

    /// Appends one validated value; false only when libdbus runs out of memory.
    private static func write(_ value: DBusValue, into iter: inout DBusMessageIter) -> Bool {
        switch value {
        case .byte(let v): return appendBasic(&iter, CDBUS_TYPE_BYTE, v)
        case .bool(let v): return appendBasic(&iter, CDBUS_TYPE_BOOLEAN, dbus_bool_t(v ? 1 : 0))
        case .int16(let v): return appendBasic(&iter, CDBUS_TYPE_INT16, v)
        case .uint16(let v): return appendBasic(&iter, CDBUS_TYPE_UINT16, v)
        case .int32(let v): return appendBasic(&iter, CDBUS_TYPE_INT32, v)
        case .uint32(let v): return appendBasic(&iter, CDBUS_TYPE_UINT32, v)
        case .int64(let v): return appendBasic(&iter, CDBUS_TYPE_INT64, v)
        case .uint64(let v): return appendBasic(&iter, CDBUS_TYPE_UINT64, v)
        case .double(let v): return appendBasic(&iter, CDBUS_TYPE_DOUBLE, v)
        case .string(let v): return appendString(&iter, CDBUS_TYPE_STRING, v)
        case .objectPath(let v): return appendString(&iter, CDBUS_TYPE_OBJECT_PATH, v)
        case .signature(let v): return appendString(&iter, CDBUS_TYPE_SIGNATURE, v)
        // libdbus duplicates the descriptor into the message; the caller keeps its own.
        case .unixFD(let v): return appendBasic(&iter, CDBUS_TYPE_UNIX_FD, CInt(v))
        case .array(let element, let elements):
            return container(&iter, CDBUS_TYPE_ARRAY, element) { sub in
                if element == "y" {
                    var raw: [UInt8] = []
                    raw.reserveCapacity(elements.count)
                    for case .byte(let b) in elements { raw.append(b) }
                    return raw.withUnsafeBufferPointer { buffer in
                        let base: UnsafePointer<UInt8>? = buffer.baseAddress ?? UnsafePointer(bitPattern: 1)
                        return withUnsafePointer(to: base) {
                            dbus_message_iter_append_fixed_array(&sub, CDBUS_TYPE_BYTE, $0, Int32(buffer.count)) != 0
                        }
                    }
                }
                for item in elements where !write(item, into: &sub) { return false }
                return true
            }
        case .dictionary(let key, let valueSig, let entries):
            return container(&iter, CDBUS_TYPE_ARRAY, "{" + key + valueSig + "}") { sub in
                for (k, v) in entries {
                    let ok = container(&sub, CDBUS_TYPE_DICT_ENTRY, nil) { entry in
                        write(k, into: &entry) && write(v, into: &entry)
                    }
                    if !ok { return false }
                }
                return true
            }
        case .struct(let fields):
            return container(&iter, CDBUS_TYPE_STRUCT, nil) { sub in
                for field in fields where !write(field, into: &sub) { return false }
                return true
            }
        case .variant(let inner):
            return container(&iter, CDBUS_TYPE_VARIANT, inner.signature) { sub in
                write(inner, into: &sub)
            }
        }
    }

    private static func container(
        _ iter: inout DBusMessageIter, _ type: Int32, _ signature: String?,
        _ body: (inout DBusMessageIter) -> Bool
    ) -> Bool {
        var sub = DBusMessageIter()
        let opened: Bool
        if let signature {
            opened = signature.withCString { dbus_message_iter_open_container(&iter, type, $0, &sub) != 0 }
        } else {
            opened = dbus_message_iter_open_container(&iter, type, nil, &sub) != 0
        }
        guard opened else { return false }
        guard body(&sub) else {
            dbus_message_iter_abandon_container(&iter, &sub)
            return false
        }
        return dbus_message_iter_close_container(&iter, &sub) != 0
    }

    // MARK: Reading

    /// Decodes the whole body of `message`.
    ///
    /// libdbus validated the body when it was received, so every signature here is well formed.
    static func read(_ message: OpaquePointer) -> [DBusValue] {
        var iter = DBusMessageIter()
        guard dbus_message_iter_init(message, &iter) != 0 else { return [] }
        var values: [DBusValue] = []
        while dbus_message_iter_get_arg_type(&iter) != CDBUS_TYPE_INVALID {
            values.append(readValue(&iter))
            dbus_message_iter_next(&iter)
        }
        return values
    }

    /// The first argument if it is a string, without decoding (or duplicating fds of) the rest;
    /// the message text of an ERROR reply.
    static func firstString(_ message: OpaquePointer) -> String? {
        var iter = DBusMessageIter()
        guard dbus_message_iter_init(message, &iter) != 0,
            dbus_message_iter_get_arg_type(&iter) == CDBUS_TYPE_STRING
        else { return nil }
        var basic = DBusBasicValue()
        dbus_message_iter_get_basic(&iter, &basic)
        return basic.str.map { String(cString: $0) }
    }

    /// Closes every descriptor in decoded values that will not be handed to anyone, since
    /// decoding gave each one its own duplicate.
    static func closeDescriptors(in values: [DBusValue]) {
        for value in values {
            switch value {
            case .unixFD(let fd): _ = closeDescriptor(fd)
            case .array(_, let elements), .struct(let elements): closeDescriptors(in: elements)
            case .dictionary(_, _, let entries):
                closeDescriptors(in: Array(entries.keys))
                closeDescriptors(in: Array(entries.values))
            case .variant(let inner): closeDescriptors(in: [inner])
            default: continue
            }
        }
    }

    private static func signature(of iter: inout DBusMessageIter) -> String {
        guard let raw = dbus_message_iter_get_signature(&iter) else { return "" }
        defer { dbus_free(raw) }
        return String(cString: raw)
    }

    private static func readValue(_ iter: inout DBusMessageIter) -> DBusValue {
        let type = dbus_message_iter_get_arg_type(&iter)
        switch type {
        case CDBUS_TYPE_ARRAY:
            return readArray(&iter)
        case CDBUS_TYPE_STRUCT, CDBUS_TYPE_DICT_ENTRY:
            var sub = DBusMessageIter()
            dbus_message_iter_recurse(&iter, &sub)
            var fields: [DBusValue] = []
            while dbus_message_iter_get_arg_type(&sub) != CDBUS_TYPE_INVALID {
                fields.append(readValue(&sub))
                dbus_message_iter_next(&sub)
            }
            return .struct(fields)
        case CDBUS_TYPE_VARIANT:
            var sub = DBusMessageIter()
            dbus_message_iter_recurse(&iter, &sub)
            return .variant(readValue(&sub))
        default:
            var basic = DBusBasicValue()
            dbus_message_iter_get_basic(&iter, &basic)
            switch type {
            case CDBUS_TYPE_BYTE: return .byte(basic.byt)
            case CDBUS_TYPE_BOOLEAN: return .bool(basic.bool_val != 0)
            case CDBUS_TYPE_INT16: return .int16(basic.i16)
            case CDBUS_TYPE_UINT16: return .uint16(basic.u16)
            case CDBUS_TYPE_INT32: return .int32(basic.i32)
            case CDBUS_TYPE_UINT32: return .uint32(basic.u32)
            case CDBUS_TYPE_INT64: return .int64(Int64(basic.i64))
            case CDBUS_TYPE_UINT64: return .uint64(UInt64(basic.u64))
            case CDBUS_TYPE_DOUBLE: return .double(basic.dbl)
            case CDBUS_TYPE_STRING: return .string(basic.str.map { String(cString: $0) } ?? "")
            case CDBUS_TYPE_OBJECT_PATH: return .objectPath(basic.str.map { String(cString: $0) } ?? "/")
            case CDBUS_TYPE_SIGNATURE: return .signature(basic.str.map { String(cString: $0) } ?? "")
            // get_basic hands out a dup of the message's descriptor: the receiver owns it.
            case CDBUS_TYPE_UNIX_FD: return .unixFD(basic.fd)
            default: return .string("")
            }
        }
    }

    private static func readArray(_ iter: inout DBusMessageIter) -> DBusValue {
        let full = signature(of: &iter)
        let elementSignature = String(full.dropFirst())
        let elementType = dbus_message_iter_get_element_type(&iter)
        var sub = DBusMessageIter()
        dbus_message_iter_recurse(&iter, &sub)

        if elementType == CDBUS_TYPE_BYTE {
            var base: UnsafePointer<UInt8>? = nil
            var count: Int32 = 0
            dbus_message_iter_get_fixed_array(&sub, &base, &count)
            let bytes = base.map { Array(UnsafeBufferPointer(start: $0, count: Int(count))) } ?? []
            return .array(elementSignature: "y", bytes.map { .byte($0) })
        }

        if elementType == CDBUS_TYPE_DICT_ENTRY {
            // "{kv}": the key is one basic type code, the value the rest.
            let inner = elementSignature.dropFirst().dropLast()
            let keySignature = String(inner.prefix(1))
            let valueSignature = String(inner.dropFirst())
            var entries: [DBusValue: DBusValue] = [:]
            while dbus_message_iter_get_arg_type(&sub) == CDBUS_TYPE_DICT_ENTRY {
                var entry = DBusMessageIter()
                dbus_message_iter_recurse(&sub, &entry)
                let key = readValue(&entry)
                dbus_message_iter_next(&entry)
                entries[key] = readValue(&entry)
                dbus_message_iter_next(&sub)
            }
            return .dictionary(keySignature: keySignature, valueSignature: valueSignature, entries)
        }

        var elements: [DBusValue] = []
        while dbus_message_iter_get_arg_type(&sub) != CDBUS_TYPE_INVALID {
            elements.append(readValue(&sub))
            dbus_message_iter_next(&sub)
        }
        return .array(elementSignature: elementSignature, elements)
    }
}
