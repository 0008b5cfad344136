/// A D-Bus error: a dotted error name and a human-readable message.
///
/// Error replies on the bus carry exactly this pair (D-Bus specification, "Message Types: ERROR":
/// the ERROR_NAME header field plus an optional first string argument), so remote failures such as
/// `org.bluez.Error.NotPermitted` arrive unchanged and callers can switch on `name`. Errors raised
/// locally (invalid input, timeouts, a closed connection) use the standard
/// `org.freedesktop.DBus.Error.*` names so they can be handled the same way.
public struct DBusError: Error, Sendable, Hashable, CustomStringConvertible {
    /// The error name, e.g. `org.freedesktop.DBus.Error.UnknownMethod`.
    public var name: String
    /// The message that came with the error; may be empty.
    public var message: String

    public init(name: String, message: String = "") {
        self.name = name
        self.message = message
    }

    public var description: String {
        message.isEmpty ? name : "\(name): \(message)"
    }

    /// Standard error names from the D-Bus specification and `dbus-protocol.h`.
    public enum Name {
        public static let failed = "org.freedesktop.DBus.Error.Failed"
        public static let invalidArgs = "org.freedesktop.DBus.Error.InvalidArgs"
        public static let noReply = "org.freedesktop.DBus.Error.NoReply"
        public static let timeout = "org.freedesktop.DBus.Error.Timeout"
        public static let timedOut = "org.freedesktop.DBus.Error.TimedOut"
        public static let disconnected = "org.freedesktop.DBus.Error.Disconnected"
        public static let noMemory = "org.freedesktop.DBus.Error.NoMemory"
        public static let unknownMethod = "org.freedesktop.DBus.Error.UnknownMethod"
        public static let unknownObject = "org.freedesktop.DBus.Error.UnknownObject"
        public static let unknownInterface = "org.freedesktop.DBus.Error.UnknownInterface"
        public static let unknownProperty = "org.freedesktop.DBus.Error.UnknownProperty"
        public static let propertyReadOnly = "org.freedesktop.DBus.Error.PropertyReadOnly"
        public static let serviceUnknown = "org.freedesktop.DBus.Error.ServiceUnknown"
        public static let nameHasNoOwner = "org.freedesktop.DBus.Error.NameHasNoOwner"
        public static let notSupported = "org.freedesktop.DBus.Error.NotSupported"
        /// The bus started the service's executable and it exited before taking its name.
        public static let spawnChildExited = "org.freedesktop.DBus.Error.Spawn.ChildExited"
        /// The prefix of every service activation failure the bus reports itself
        /// (`Spawn.ExecFailed`, `Spawn.ChildExited`, `Spawn.ChildSignaled`, `Spawn.ServiceNotFound`, …;
        /// `dbus-protocol.h`, `DBUS_ERROR_SPAWN_*`).
        public static let spawnPrefix = "org.freedesktop.DBus.Error.Spawn."
        /// The prefix of the errors systemd returns when the bus hands activation to it and the
        /// unit is missing, masked or fails (`org.freedesktop.systemd1.NoSuchUnit`, …).
        public static let systemdPrefix = "org.freedesktop.systemd1."
    }

    /// Input rejected before it reached libdbus (bad name, path, signature or string).
    public static func invalidArgument(_ message: String) -> DBusError {
        DBusError(name: Name.invalidArgs, message: message)
    }

    /// The connection is closed or was dropped by the peer.
    public static func disconnected(_ message: String = "connection is closed") -> DBusError {
        DBusError(name: Name.disconnected, message: message)
    }

    static func failed(_ message: String) -> DBusError {
        DBusError(name: Name.failed, message: message)
    }

    /// True for `InvalidArgs`, which is also what local validation throws.
    public var isInvalidArgument: Bool { name == Name.invalidArgs }

    /// True when no reply arrived in time.
    ///
    /// libdbus turns an expired pending call into a `NoReply` error reply
    /// (`dbus_connection_send_with_reply`); services may also answer `Timeout`/`TimedOut`.
    public var isTimeout: Bool {
        name == Name.noReply || name == Name.timeout || name == Name.timedOut
    }

    /// True when the bus could not start the destination service on demand (D-Bus specification,
    /// "Message Bus Starting Services (Activation)"): a `Spawn.*` error, a systemd unit error, or
    /// an activation that timed out ("Failed to activate service 'x': timed out").
    public var isActivationFailure: Bool {
        name.hasPrefix(Name.spawnPrefix) || name.hasPrefix(Name.systemdPrefix)
            || (isTimeout && message.hasPrefix("Failed to activate service"))
    }

    /// True when the connection went away.
    public var isDisconnected: Bool { name == Name.disconnected }
}
