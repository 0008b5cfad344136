internal import CDBus
import Dispatch
#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// A connection to a D-Bus message bus (or a peer), isolated to its own serial queue.
///
/// The actor's executor is a private `DispatchQueue` which also runs libdbus's watches, timeouts
/// and dispatching (see `EventLoop`), so libdbus is only ever used from one serial context and
/// replies are handled as soon as their socket is readable, without a polling thread. Only
/// Sendable decoded values leave the actor; libdbus pointers never do.
///
/// Connections are private (`dbus_connection_open_private`): each `DBusConnection` owns its
/// socket, registers with the bus itself (`Hello`) and must be closed with ``close()``; dropping
/// the last reference closes it too.
public actor DBusConnection {
    nonisolated let executor: DBusQueueExecutor
    nonisolated let loop: EventLoop

    public nonisolated var unownedExecutor: UnownedSerialExecutor {
        executor.asUnownedSerialExecutor()
    }

    /// The unique bus name assigned by the bus (`:1.42`), or nil for a peer connection.
    public private(set) var uniqueName: String?
    var closed = false
    private var lastID: UInt64 = 0

    var pendingCalls: [UInt64: PendingCall] = [:]
    var subscriptions: [UInt64: Subscription] = [:]
    var trackedNames: [String: TrackedName] = [:]
    var objects: [String: ExportedObject] = [:]
    var objectManagers: Set<String> = []
    var incomingCalls: [UInt64: IncomingCall] = [:]
    /// The last queued handler of each serial chain (`ExportedObject.chain`).
    var callTails: [String: Task<Void, Never>] = [:]

    struct PendingCall {
        let pending: OpaquePointer
        let continuation: CheckedContinuation<[DBusValue], any Error>
    }

    private init(label: String) {
        executor = DBusQueueExecutor(label: label)
        loop = EventLoop(queue: executor.queue)
    }

    deinit {
        // Nothing else can reach the actor now. Signal consumers must not wait forever, and the
        // libdbus connection has to be closed on its queue.
        for subscription in subscriptions.values { subscription.finish() }
        // Calls whose handlers are still running will never be answered (message refcounts are
        // atomic in libdbus, so this is safe off the queue).
        for call in incomingCalls.values { dbus_message_unref(call.message) }
        if !closed {
            let loop = self.loop
            loop.queue.async { loop.close() }
        }
    }

    func nextID() -> UInt64 {
        lastID &+= 1
        return lastID
    }

    // MARK: Connecting

    /// Well-known addresses (D-Bus specification, "Well-known Message Bus Instances").
    public enum Bus: Sendable {
        /// `DBUS_SYSTEM_BUS_ADDRESS`, else `unix:path=/var/run/dbus/system_bus_socket`.
        case system
        /// `DBUS_SESSION_BUS_ADDRESS` (required).
        case session
    }

    /// Connects to the system or session bus and registers with it.
    public static func connect(to bus: Bus, timeout: Duration = .seconds(10)) async throws -> DBusConnection {
        let environment = bus == .system ? "DBUS_SYSTEM_BUS_ADDRESS" : "DBUS_SESSION_BUS_ADDRESS"
        if let value = getenv(environment), value.pointee != 0 {
            return try await connect(address: String(cString: value), timeout: timeout)
        }
        guard bus == .system else {
            throw DBusError(name: DBusError.Name.failed, message: "DBUS_SESSION_BUS_ADDRESS is not set")
        }
        return try await connect(address: "unix:path=/var/run/dbus/system_bus_socket", timeout: timeout)
    }

    /// Connects to a D-Bus server address such as `unix:path=/run/dbus/system_bus_socket`.
    ///
    /// - Parameter registerWithBus: send `Hello` (required by a message bus before anything else,
    ///   spec "Message Bus Messages"); pass false for a direct peer-to-peer connection.
    public static func connect(
        address: String, registerWithBus: Bool = true, timeout: Duration = .seconds(10)
    ) async throws -> DBusConnection {
        try DBusValidation.string(address)
        let connection = DBusConnection(label: "dbus.connection")
        try await connection.open(address: address, registerWithBus: registerWithBus, timeout: timeout)
        return connection
    }

    private func open(address: String, registerWithBus: Bool, timeout: Duration) async throws {
        var error = CDBus.DBusError()
        dbus_error_init(&error)
        defer { dbus_error_free(&error) }
        // Connecting a local socket is immediate; authentication continues asynchronously.
        guard let raw = dbus_connection_open_private(address, &error) else {
            closed = true
            throw DBusError(cError: error, fallback: "could not connect to \(address)")
        }
        do {
            try loop.install(raw, owner: self)
        } catch {
            closed = true
            throw error
        }
        guard registerWithBus else { return }
        do {
            let reply = try await call(
                destination: "org.freedesktop.DBus", path: "/org/freedesktop/DBus",
                interface: "org.freedesktop.DBus", member: "Hello", timeout: timeout)
            guard let name = reply.first?.string else { throw DBusError.failed("Hello returned no name") }
            uniqueName = name
            // Lets libdbus answer dbus_bus_get_unique_name like a dbus_bus_register'ed connection.
            if let connection = loop.connection { _ = dbus_bus_set_unique_name(connection, name) }
        } catch {
            close()
            throw error
        }
    }

    /// True until the connection is closed locally or by the peer.
    public var isConnected: Bool {
        guard !closed, let connection = loop.connection else { return false }
        return dbus_connection_get_is_connected(connection) != 0
    }

    /// Closes the connection: pending calls fail with `Disconnected`, signal streams finish,
    /// exported objects disappear. Calling it again does nothing.
    public func close() {
        guard !closed else { return }
        closed = true
        let calls = pendingCalls
        pendingCalls = [:]
        for call in calls.values {
            dbus_pending_call_cancel(call.pending)
            dbus_pending_call_unref(call.pending)
            call.continuation.resume(throwing: DBusError.disconnected())
        }
        let subs = subscriptions
        subscriptions = [:]
        for subscription in subs.values { subscription.finish() }
        let incoming = incomingCalls
        incomingCalls = [:]
        for call in incoming.values { dbus_message_unref(call.message) }
        objects = [:]
        objectManagers = []
        trackedNames = [:]
        loop.close()
    }

    func requireConnection() throws(DBusError) -> OpaquePointer {
        guard !closed, let connection = loop.connection else { throw DBusError.disconnected() }
        return connection
    }

    // MARK: Incoming messages

    /// Routes one incoming message; called by the libdbus filter on the connection's queue.
    func handleIncoming(_ message: OpaquePointer) -> DBusHandlerResult {
        switch dbus_message_get_type(message) {
        case DBUS_MESSAGE_TYPE_SIGNAL:
            if dbus_message_is_signal(message, "org.freedesktop.DBus.Local", "Disconnected") != 0 {
                // Not from inside dispatch: closing releases the connection being dispatched.
                loop.queue.async { [weak self] in self?.assumeIsolated { $0.close() } }
                return DBUS_HANDLER_RESULT_NOT_YET_HANDLED
            }
            deliverSignal(message)
            return DBUS_HANDLER_RESULT_NOT_YET_HANDLED
        case DBUS_MESSAGE_TYPE_METHOD_CALL:
            return handleMethodCall(message)
        default:
            return DBUS_HANDLER_RESULT_NOT_YET_HANDLED
        }
    }

    // MARK: Method calls

    /// Calls a method and waits for its reply.
    ///
    /// Every call has a timeout: when it expires libdbus completes the call with a
    /// `org.freedesktop.DBus.Error.NoReply` error (`dbus_connection_send_with_reply`), thrown here as
    /// a ``DBusError`` with ``DBusError/isTimeout`` set. Cancelling the calling task cancels the
    /// pending call (`dbus_pending_call_cancel`) and throws `CancellationError`. An error reply is
    /// thrown as a ``DBusError`` with the remote error name and message.
    ///
    /// - Parameter destination: the bus name to call; nil on a peer-to-peer connection.
    /// - Returns: the reply's arguments.
    public func call(
        destination: String?, path: String, interface: String?, member: String,
        arguments: [DBusValue] = [], timeout: Duration = .seconds(25)
    ) async throws -> [DBusValue] {
        if let destination { try DBusValidation.busName(destination) }
        try DBusValidation.objectPath(path)
        if let interface { try DBusValidation.interface(interface) }
        try DBusValidation.member(member)
        try Marshal.validate(arguments)
        let connection = try requireConnection()
        guard let message = dbus_message_new_method_call(destination, path, interface, member) else {
            throw DBusError(name: DBusError.Name.noMemory, message: "dbus_message_new_method_call failed")
        }
        defer { dbus_message_unref(message) }
        try Marshal.append(arguments, to: message)
        return try await sendWithReply(message, on: connection, timeout: timeout)
    }

    private func sendWithReply(
        _ message: OpaquePointer, on connection: OpaquePointer, timeout: Duration
    ) async throws -> [DBusValue] {
        let id = nextID()
        let milliseconds = Self.milliseconds(timeout)
        let loop = self.loop
        return try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { continuation in
                if Task.isCancelled {
                    continuation.resume(throwing: CancellationError())
                    return
                }
                var pending: OpaquePointer?
                // pending stays NULL when the connection is already disconnected, or when unix
                // fds are sent on a connection that cannot carry them.
                guard dbus_connection_send_with_reply(connection, message, &pending, milliseconds) != 0,
                    let pending
                else {
                    continuation.resume(throwing: DBusError.disconnected(
                        "cannot send: the connection is closed or cannot carry unix fds"))
                    return
                }
                let token = Unmanaged.passRetained(PendingToken(loop: loop, id: id)).toOpaque()
                guard dbus_pending_call_set_notify(pending, pendingCallNotify, token, pendingTokenRelease) != 0
                else {
                    Unmanaged<PendingToken>.fromOpaque(token).release()
                    dbus_pending_call_cancel(pending)
                    dbus_pending_call_unref(pending)
                    continuation.resume(throwing: DBusError(name: DBusError.Name.noMemory, message: "out of memory"))
                    return
                }
                pendingCalls[id] = PendingCall(pending: pending, continuation: continuation)
                if dbus_pending_call_get_completed(pending) != 0 { completeCall(id) }
            }
        } onCancel: {
            loop.queue.async { [weak self] in self?.assumeIsolated { $0.cancelCall(id) } }
        }
    }

    static func milliseconds(_ duration: Duration) -> Int32 {
        let (seconds, attoseconds) = duration.components
        let ms = Double(seconds) * 1000 + Double(attoseconds) / 1e15
        // At least 1 ms: 0 and negative values mean "default" or "infinite" to libdbus.
        return Int32(min(max(ms.rounded(.up), 1), Double(CDBUS_TIMEOUT_INFINITE - 1)))
    }

    /// Resumes the caller of a finished pending call (from `dbus_pending_call_set_notify`).
    func completeCall(_ id: UInt64) {
        guard let call = pendingCalls.removeValue(forKey: id) else { return }
        let reply = dbus_pending_call_steal_reply(call.pending)
        dbus_pending_call_unref(call.pending)
        guard let reply else {
            call.continuation.resume(throwing: DBusError.failed("pending call completed without a reply"))
            return
        }
        defer { dbus_message_unref(reply) }
        if dbus_message_get_type(reply) == DBUS_MESSAGE_TYPE_ERROR {
            var error = DBusError(errorReply: reply)
            // When the peer goes away libdbus completes every pending call with a NoReply error
            // (as if it had timed out); report that as what it is.
            if error.name == DBusError.Name.noReply, let connection = loop.connection,
                dbus_connection_get_is_connected(connection) == 0
            {
                error = DBusError.disconnected("the connection was closed by the peer")
            }
            call.continuation.resume(throwing: error)
        } else {
            call.continuation.resume(returning: Marshal.read(reply))
        }
    }

    private func cancelCall(_ id: UInt64) {
        guard let call = pendingCalls.removeValue(forKey: id) else { return }
        dbus_pending_call_cancel(call.pending)
        dbus_pending_call_unref(call.pending)
        call.continuation.resume(throwing: CancellationError())
    }

    /// Sends a message that expects no reply.
    func send(_ message: OpaquePointer) throws(DBusError) {
        let connection = try requireConnection()
        guard dbus_connection_send(connection, message, nil) != 0 else {
            throw DBusError(name: DBusError.Name.noMemory, message: "dbus_connection_send failed")
        }
    }

    // MARK: Bus names

    /// Flags of `org.freedesktop.DBus.RequestName` (spec, "org.freedesktop.DBus.RequestName").
    public struct NameFlags: OptionSet, Sendable {
        public let rawValue: UInt32
        public init(rawValue: UInt32) { self.rawValue = rawValue }
        public static let allowReplacement = NameFlags(rawValue: 0x1)
        public static let replaceExisting = NameFlags(rawValue: 0x2)
        public static let doNotQueue = NameFlags(rawValue: 0x4)
    }

    /// Replies of `RequestName`.
    public enum RequestNameReply: UInt32, Sendable {
        case primaryOwner = 1
        case inQueue = 2
        case exists = 3
        case alreadyOwner = 4
    }

    /// Asks the bus for a well-known name.
    public func requestName(
        _ name: String, flags: NameFlags = [.doNotQueue], timeout: Duration = .seconds(10)
    ) async throws -> RequestNameReply {
        try DBusValidation.busName(name)
        let reply = try await busCall("RequestName", [.string(name), .uint32(flags.rawValue)], timeout: timeout)
        guard let code = reply.first?.uint32, let result = RequestNameReply(rawValue: code) else {
            throw DBusError.failed("unexpected RequestName reply \(reply)")
        }
        return result
    }

    /// Gives a well-known name back to the bus.
    public func releaseName(_ name: String, timeout: Duration = .seconds(10)) async throws {
        try DBusValidation.busName(name)
        _ = try await busCall("ReleaseName", [.string(name)], timeout: timeout)
    }

    func busCall(_ member: String, _ arguments: [DBusValue], timeout: Duration = .seconds(10)) async throws
        -> [DBusValue]
    {
        try await call(
            destination: "org.freedesktop.DBus", path: "/org/freedesktop/DBus",
            interface: "org.freedesktop.DBus", member: member, arguments: arguments, timeout: timeout)
    }
}

/// Identifies a pending call for the C notify callback.
private final class PendingToken {
    let loop: EventLoop
    let id: UInt64
    init(loop: EventLoop, id: UInt64) {
        self.loop = loop
        self.id = id
    }
}

private let pendingTokenRelease: DBusFreeFunction = { data in
    if let data { Unmanaged<PendingToken>.fromOpaque(data).release() }
}

/// Runs inside `dbus_connection_dispatch` (or right after `set_notify`), on the connection queue.
private let pendingCallNotify: DBusPendingCallNotifyFunction = { _, data in
    guard let data else { return }
    let token = Unmanaged<PendingToken>.fromOpaque(data).takeUnretainedValue()
    let id = token.id
    token.loop.owner?.assumeIsolated { $0.completeCall(id) }
}

extension DBusError {
    /// From a libdbus `DBusError` filled by a failed call.
    init(cError: CDBus.DBusError, fallback: String) {
        let name = cError.name.map { String(cString: $0) } ?? DBusError.Name.failed
        let message = cError.message.map { String(cString: $0) } ?? fallback
        self.init(name: name, message: message)
    }

    /// From an ERROR message: its error name and first string argument (spec, "ERROR").
    init(errorReply message: OpaquePointer) {
        let name = dbus_message_get_error_name(message).map { String(cString: $0) } ?? DBusError.Name.failed
        self.init(name: name, message: Marshal.firstString(message) ?? "")
    }
}
