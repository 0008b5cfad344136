internal import CDBus

/// Which signals to receive: the subset of D-Bus match rule keys used by BlueZ clients.
///
/// The rule is sent to the bus with `org.freedesktop.DBus.AddMatch` so that the bus routes the
/// signals here (spec, "Match Rules"), and the same rule is applied again locally so that each
/// subscription only sees its own signals even when several rules overlap.
public struct DBusMatchRule: Sendable, Hashable {
    /// Unique or well-known bus name of the sender. A well-known name is followed to its
    /// current owner (via `GetNameOwner` and `NameOwnerChanged`), as the bus does.
    public var sender: String?
    /// Exact object path.
    public var path: String?
    /// The path itself or anything below it (`path_namespace`).
    public var pathNamespace: String?
    public var interface: String?
    public var member: String?
    /// The first argument must be this string, e.g. the interface name of `PropertiesChanged`.
    public var arg0: String?

    public init(
        sender: String? = nil, path: String? = nil, pathNamespace: String? = nil,
        interface: String? = nil, member: String? = nil, arg0: String? = nil
    ) {
        self.sender = sender
        self.path = path
        self.pathNamespace = pathNamespace
        self.interface = interface
        self.member = member
        self.arg0 = arg0
    }

    /// `org.freedesktop.DBus.Properties.PropertiesChanged`, optionally for one interface.
    public static func propertiesChanged(
        sender: String? = nil, path: String? = nil, pathNamespace: String? = nil, interface: String? = nil
    ) -> DBusMatchRule {
        DBusMatchRule(
            sender: sender, path: path, pathNamespace: pathNamespace,
            interface: "org.freedesktop.DBus.Properties", member: "PropertiesChanged", arg0: interface)
    }

    /// `org.freedesktop.DBus.ObjectManager.InterfacesAdded` / `InterfacesRemoved` (both when
    /// `member` is nil) emitted by the object manager at `path`.
    public static func objectManager(sender: String? = nil, path: String? = nil, member: String? = nil)
        -> DBusMatchRule
    {
        DBusMatchRule(sender: sender, path: path, interface: "org.freedesktop.DBus.ObjectManager", member: member)
    }

    func validate() throws(DBusError) {
        if let sender { try DBusValidation.busName(sender) }
        if let path { try DBusValidation.objectPath(path) }
        if let pathNamespace { try DBusValidation.objectPath(pathNamespace) }
        if path != nil && pathNamespace != nil {
            throw .invalidArgument("a match rule cannot have both path and pathNamespace")
        }
        if let interface { try DBusValidation.interface(interface) }
        if let member { try DBusValidation.member(member) }
        if let arg0 { try DBusValidation.string(arg0) }
    }

    /// The textual rule for `AddMatch`/`RemoveMatch`.
    ///
    /// Values are single-quoted; a quote inside a value is written as `'\''` (spec, "Match Rules").
    var ruleString: String {
        func quoted(_ value: String) -> String {
            "'" + value.split(separator: "'", omittingEmptySubsequences: false).joined(separator: "'\\''") + "'"
        }
        var parts = ["type='signal'"]
        if let sender { parts.append("sender=" + quoted(sender)) }
        if let path { parts.append("path=" + quoted(path)) }
        if let pathNamespace { parts.append("path_namespace=" + quoted(pathNamespace)) }
        if let interface { parts.append("interface=" + quoted(interface)) }
        if let member { parts.append("member=" + quoted(member)) }
        if let arg0 { parts.append("arg0=" + quoted(arg0)) }
        return parts.joined(separator: ",")
    }

    func matches(_ signal: DBusSignal, senderOwner: String?) -> Bool {
        if let sender, signal.sender != sender, signal.sender == nil || signal.sender != senderOwner {
            return false
        }
        if let path, signal.path != path { return false }
        if let pathNamespace {
            let ok =
                pathNamespace == "/" || signal.path == pathNamespace
                || signal.path.hasPrefix(pathNamespace + "/")
            if !ok { return false }
        }
        if let interface, signal.interface != interface { return false }
        if let member, signal.member != member { return false }
        if let arg0 {
            guard case .string(let first)? = signal.arguments.first, first == arg0 else { return false }
        }
        return true
    }
}

/// A received signal.
public struct DBusSignal: Sendable, Hashable {
    /// Unique name of the sending connection (nil on a peer-to-peer connection).
    public var sender: String?
    public var path: String
    public var interface: String
    public var member: String
    public var arguments: [DBusValue]

    public init(sender: String?, path: String, interface: String, member: String, arguments: [DBusValue]) {
        self.sender = sender
        self.path = path
        self.interface = interface
        self.member = member
        self.arguments = arguments
    }
}

/// Identifies a signal subscription, for ``DBusConnection/unsubscribe(_:)``.
public struct DBusSubscriptionID: Sendable, Hashable {
    let rawValue: UInt64
}

/// A subscription delivering signals through an `AsyncStream`.
///
/// The stream finishes on ``DBusConnection/unsubscribe(_:)`` or when the connection closes;
/// ending the iteration (or cancelling the iterating task) also unsubscribes.
public struct DBusSignalSubscription: Sendable {
    public let id: DBusSubscriptionID
    public let signals: AsyncStream<DBusSignal>
}

extension DBusConnection {
    struct Subscription {
        let rule: DBusMatchRule
        let deliver: @Sendable (DBusSignal) -> Void
        let finish: @Sendable () -> Void
        /// Whether AddMatch was sent and must be undone.
        var addedMatch: Bool
    }

    struct TrackedName {
        var owner: String?
        var references: Int
    }

    /// Subscribes to signals matching `rule`; the returned stream yields them in arrival order.
    ///
    /// When this returns, the bus has accepted the match (the `AddMatch` reply arrived), so a
    /// signal emitted afterwards is delivered.
    public func subscribe(
        _ rule: DBusMatchRule,
        bufferingPolicy: AsyncStream<DBusSignal>.Continuation.BufferingPolicy = .unbounded
    ) async throws -> DBusSignalSubscription {
        let (stream, continuation) = AsyncStream.makeStream(of: DBusSignal.self, bufferingPolicy: bufferingPolicy)
        let id = try await addSubscription(
            rule,
            deliver: { continuation.yield($0) },
            finish: { continuation.finish() })
        continuation.onTermination = { [weak self] _ in
            Task { await self?.unsubscribe(id) }
        }
        return DBusSignalSubscription(id: id, signals: stream)
    }

    /// Subscribes with a handler called on the connection's queue for each matching signal.
    ///
    /// The handler must return quickly; hand work off to a task if it needs to wait.
    @discardableResult
    public func subscribe(
        _ rule: DBusMatchRule, handler: @escaping @Sendable (DBusSignal) -> Void
    ) async throws -> DBusSubscriptionID {
        try await addSubscription(rule, deliver: handler, finish: {})
    }

    private func addSubscription(
        _ rule: DBusMatchRule,
        deliver: @escaping @Sendable (DBusSignal) -> Void,
        finish: @escaping @Sendable () -> Void
    ) async throws -> DBusSubscriptionID {
        try rule.validate()
        _ = try requireConnection()
        let raw = nextID()
        let onBus = uniqueName != nil
        // Registered before AddMatch is awaited, so nothing routed meanwhile is lost.
        subscriptions[raw] = Subscription(rule: rule, deliver: deliver, finish: finish, addedMatch: onBus)
        do {
            if onBus {
                if let sender = rule.sender { try await trackName(sender) }
                _ = try await busCall("AddMatch", [.string(rule.ruleString)])
            }
        } catch {
            if subscriptions.removeValue(forKey: raw) != nil, onBus, let sender = rule.sender {
                await untrackName(sender)
            }
            throw error
        }
        return DBusSubscriptionID(rawValue: raw)
    }

    /// Ends a subscription: its stream finishes and the match is removed from the bus.
    public func unsubscribe(_ id: DBusSubscriptionID) async {
        guard let subscription = subscriptions.removeValue(forKey: id.rawValue) else { return }
        subscription.finish()
        guard subscription.addedMatch, !closed else { return }
        _ = try? await busCall("RemoveMatch", [.string(subscription.rule.ruleString)])
        if let sender = subscription.rule.sender { await untrackName(sender) }
    }

    /// Ends a stream subscription.
    public func unsubscribe(_ subscription: DBusSignalSubscription) async {
        await unsubscribe(subscription.id)
    }

    private static func needsOwnerTracking(_ name: String) -> Bool {
        !name.hasPrefix(":") && name != "org.freedesktop.DBus"
    }

    private static func ownerRule(_ name: String) -> DBusMatchRule {
        DBusMatchRule(
            sender: "org.freedesktop.DBus", path: "/org/freedesktop/DBus", interface: "org.freedesktop.DBus",
            member: "NameOwnerChanged", arg0: name)
    }

    /// Follows the owner of a well-known name, so that signals (whose sender field is always a
    /// unique name) can be matched against a rule naming the well-known name.
    private func trackName(_ name: String) async throws {
        guard Self.needsOwnerTracking(name) else { return }
        if var tracked = trackedNames[name] {
            tracked.references += 1
            trackedNames[name] = tracked
            return
        }
        trackedNames[name] = TrackedName(owner: nil, references: 1)
        _ = try await busCall("AddMatch", [.string(Self.ownerRule(name).ruleString)])
        do {
            let owner = try await busCall("GetNameOwner", [.string(name)]).first?.string
            // A NameOwnerChanged that arrived meanwhile is newer than this answer.
            if var tracked = trackedNames[name], tracked.owner == nil {
                tracked.owner = owner
                trackedNames[name] = tracked
            }
        } catch let error as DBusError where error.name == DBusError.Name.nameHasNoOwner {
            // Not running yet; NameOwnerChanged will tell.
        }
    }

    private func untrackName(_ name: String) async {
        guard Self.needsOwnerTracking(name), var tracked = trackedNames[name] else { return }
        tracked.references -= 1
        if tracked.references > 0 {
            trackedNames[name] = tracked
            return
        }
        trackedNames[name] = nil
        _ = try? await busCall("RemoveMatch", [.string(Self.ownerRule(name).ruleString)])
    }

    /// Hands a received signal to every subscription whose rule matches.
    func deliverSignal(_ message: OpaquePointer) {
        guard !subscriptions.isEmpty || !trackedNames.isEmpty,
            let path = dbus_message_get_path(message),
            let interface = dbus_message_get_interface(message),
            let member = dbus_message_get_member(message)
        else { return }
        let signal = DBusSignal(
            sender: dbus_message_get_sender(message).map { String(cString: $0) },
            path: String(cString: path), interface: String(cString: interface),
            member: String(cString: member), arguments: Marshal.read(message))

        if signal.sender == "org.freedesktop.DBus", signal.interface == "org.freedesktop.DBus",
            signal.member == "NameOwnerChanged", signal.arguments.count == 3,
            let name = signal.arguments[0].string, var tracked = trackedNames[name]
        {
            let newOwner = signal.arguments[2].string ?? ""
            tracked.owner = newOwner.isEmpty ? nil : newOwner
            trackedNames[name] = tracked
        }

        var delivered = false
        for (_, subscription) in subscriptions.sorted(by: { $0.key < $1.key }) {
            let owner = subscription.rule.sender.flatMap { trackedNames[$0]?.owner }
            if subscription.rule.matches(signal, senderOwner: owner) {
                subscription.deliver(signal)
                delivered = true
            }
        }
        if !delivered { Marshal.closeDescriptors(in: signal.arguments) }
    }

    /// Emits a signal from `path` (spec, "SIGNAL"); broadcast unless `destination` is given.
    public func emitSignal(
        path: String, interface: String, member: String, arguments: [DBusValue] = [],
        destination: String? = nil
    ) throws {
        try DBusValidation.objectPath(path)
        try DBusValidation.interface(interface)
        try DBusValidation.member(member)
        if let destination { try DBusValidation.busName(destination) }
        try Marshal.validate(arguments)
        _ = try requireConnection()
        guard let message = dbus_message_new_signal(path, interface, member) else {
            throw DBusError(name: DBusError.Name.noMemory, message: "dbus_message_new_signal failed")
        }
        defer { dbus_message_unref(message) }
        if let destination, dbus_message_set_destination(message, destination) == 0 {
            throw DBusError(name: DBusError.Name.noMemory, message: "dbus_message_set_destination failed")
        }
        try Marshal.append(arguments, to: message)
        try send(message)
    }

    /// Emits `org.freedesktop.DBus.Properties.PropertiesChanged` for `interface` at `path`.
    public func emitPropertiesChanged(
        path: String, interface: String, changed: [String: DBusValue], invalidated: [String] = []
    ) throws {
        try DBusValidation.interface(interface)
        try emitSignal(
            path: path, interface: "org.freedesktop.DBus.Properties", member: "PropertiesChanged",
            arguments: [.string(interface), .vardict(changed), .strings(invalidated)])
    }
}
