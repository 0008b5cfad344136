internal import CDBus

/// Checks for every string that is handed to libdbus.
///
/// libdbus treats an invalid object path, name, signature or non-UTF-8 string passed to its
/// public API as a programming error: its `_dbus_return_if_fail` checks print a warning and, by
/// default, abort the process (see `dbus_message_new_method_call` and
/// `dbus_message_iter_append_basic` in the libdbus reference). Every string is therefore checked
/// here with libdbus's own validators (`dbus_validate_*`, `dbus_signature_validate*`) and rejected
/// with a thrown ``DBusError/invalidArgument(_:)``.
public enum DBusValidation {
    /// Throws unless `path` is a valid object path (spec: "Valid Object Paths").
    public static func objectPath(_ path: String) throws(DBusError) {
        try check(path, kind: "object path", dbus_validate_path)
    }

    /// Throws unless `name` is a valid interface name (spec: "Interface names").
    public static func interface(_ name: String) throws(DBusError) {
        try check(name, kind: "interface name", dbus_validate_interface)
    }

    /// Throws unless `name` is a valid member (method or signal) name (spec: "Member names").
    public static func member(_ name: String) throws(DBusError) {
        try check(name, kind: "member name", dbus_validate_member)
    }

    /// Throws unless `name` is a valid unique or well-known bus name (spec: "Bus names").
    public static func busName(_ name: String) throws(DBusError) {
        try check(name, kind: "bus name", dbus_validate_bus_name)
    }

    /// Throws unless `name` is a valid error name (spec: "Error names": same rules as interfaces).
    public static func errorName(_ name: String) throws(DBusError) {
        try check(name, kind: "error name", dbus_validate_error_name)
    }

    /// Throws unless `string` can be sent as a D-Bus string: valid UTF-8 without NUL
    /// (spec: "Basic types": STRING must be valid UTF-8 and must not contain nul bytes).
    public static func string(_ string: String) throws(DBusError) {
        let ok = !string.utf8.contains(0) && string.withCString { dbus_validate_utf8($0, nil) != 0 }
        if !ok {
            throw .invalidArgument("string is not valid D-Bus UTF-8 (embedded NUL?): \(string.debugDescription)")
        }
    }

    /// Throws unless `signature` is a valid signature of zero or more complete types
    /// (`dbus_signature_validate`; at most 255 bytes and 32 nested arrays/structs).
    public static func signature(_ signature: String) throws(DBusError) {
        try noNul(signature, kind: "signature")
        var error = CDBus.DBusError()
        dbus_error_init(&error)
        defer { dbus_error_free(&error) }
        if dbus_signature_validate(signature, &error) == 0 {
            throw .invalidArgument("invalid signature \(signature.debugDescription): \(cMessage(error))")
        }
    }

    /// Throws unless `signature` is exactly one complete type (`dbus_signature_validate_single`),
    /// as required for array elements and variant contents.
    public static func singleCompleteType(_ signature: String) throws(DBusError) {
        try noNul(signature, kind: "signature")
        var error = CDBus.DBusError()
        dbus_error_init(&error)
        defer { dbus_error_free(&error) }
        if dbus_signature_validate_single(signature, &error) == 0 {
            throw .invalidArgument(
                "\(signature.debugDescription) is not a single complete type: \(cMessage(error))")
        }
    }

    private static func noNul(_ value: String, kind: String) throws(DBusError) {
        if value.utf8.contains(0) {
            throw .invalidArgument("\(kind) contains a NUL byte: \(value.debugDescription)")
        }
    }

    private static func check(
        _ value: String, kind: String,
        _ validator: (UnsafePointer<CChar>?, UnsafeMutablePointer<CDBus.DBusError>?) -> dbus_bool_t
    ) throws(DBusError) {
        try noNul(value, kind: kind)
        var error = CDBus.DBusError()
        dbus_error_init(&error)
        defer { dbus_error_free(&error) }
        if validator(value, &error) == 0 {
            throw .invalidArgument("invalid \(kind) \(value.debugDescription): \(cMessage(error))")
        }
    }

    private static func cMessage(_ error: CDBus.DBusError) -> String {
        error.message.map { String(cString: $0) } ?? "rejected by libdbus"
    }
}
