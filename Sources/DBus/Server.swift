internal import CDBus

/// An incoming method call, as seen by a method handler.
public struct DBusMethodCall: Sendable {
    /// Unique name of the caller (nil on a peer-to-peer connection).
    public var sender: String?
    /// The object path the call was sent to (below the exported path for a fallback object).
    public var path: String
    /// The interface named in the call; D-Bus allows calls without one (spec, "METHOD_CALL").
    public var interface: String?
    public var member: String
    /// Signature of `arguments`, e.g. `"a{sv}"`.
    public var signature: String
    public var arguments: [DBusValue]

    /// For calling handlers directly, e.g. in tests; `signature` is derived from `arguments`.
    public init(sender: String? = nil, path: String, interface: String?, member: String, arguments: [DBusValue] = []) {
        self.sender = sender
        self.path = path
        self.interface = interface
        self.member = member
        self.signature = arguments.map(\.signature).joined()
        self.arguments = arguments
    }
}

/// Handles a method call and returns the reply's arguments, or throws to send an error reply.
///
/// A thrown ``DBusError`` becomes an error reply with its name and message (so a GATT server can
/// answer `org.bluez.Error.NotPermitted`); any other error becomes `org.freedesktop.DBus.Error.Failed`.
public typealias DBusMethodHandler = @Sendable (DBusMethodCall) async throws -> [DBusValue]

/// Validates and applies a remote `Properties.Set`; throw to refuse it.
public typealias DBusPropertySetter = @Sendable (_ property: String, _ value: DBusValue) async throws -> Void

/// One interface of an exported object: its methods and its properties.
public struct DBusInterface: Sendable {
    public var name: String
    /// Method handlers by member name.
    public var methods: [String: DBusMethodHandler]
    /// Current property values, served by `org.freedesktop.DBus.Properties`. Change them with
    /// ``DBusConnection/updateProperty(path:interface:name:value:emitChanged:)``.
    public var properties: [String: DBusValue]
    /// Properties a remote `Properties.Set` may change.
    public var writableProperties: Set<String>
    /// Consulted before a remote `Set` is applied; nil accepts any value of a writable property.
    public var propertySetter: DBusPropertySetter?
    /// Signal names, listed in introspection data only.
    public var signals: [String]

    public init(
        name: String, methods: [String: DBusMethodHandler] = [:], properties: [String: DBusValue] = [:],
        writableProperties: Set<String> = [], propertySetter: DBusPropertySetter? = nil, signals: [String] = []
    ) {
        self.name = name
        self.methods = methods
        self.properties = properties
        self.writableProperties = writableProperties
        self.propertySetter = propertySetter
        self.signals = signals
    }
}

/// `a{oa{sa{sv}}}` as a dictionary: object path → interface → property → value.
public typealias DBusManagedObjects = [String: [String: [String: DBusValue]]]

/// How calls to one exported object are run.
public enum DBusCallOrdering: Sendable {
    /// One at a time, in arrival order: a handler starts when the previous one has replied.
    /// Keeps e.g. consecutive GATT `WriteValue` calls in order.
    case serial
    /// One at a time in arrival order across every object exported with the same `group`: a
    /// GATT application whose characteristics share one ATT bearer (a command must not overtake
    /// the data written before it to another characteristic).
    case serialGroup(String)
    /// Each call runs in its own task as soon as it arrives.
    case concurrent
}

extension DBusConnection {
    struct ExportedObject {
        var interfaces: [String: DBusInterface]
        var fallback: Bool
        var ordering: DBusCallOrdering
    }

    /// The key whose tail a call to an object with `ordering` waits for; nil: it waits for none.
    static func chain(_ ordering: DBusCallOrdering?, path: String) -> String? {
        switch ordering {
        case .serial?: "object " + path
        case .serialGroup(let group)?: "group " + group
        case .concurrent?, nil: nil
        }
    }

    /// A received method call whose handler has not replied yet; holds one message reference.
    ///
    /// `@unchecked Sendable` only so the actor's nonisolated `deinit` may release it: the message
    /// is otherwise used on the connection's queue, and `dbus_message_unref` is thread-safe
    /// (libdbus keeps message refcounts atomic).
    struct IncomingCall: @unchecked Sendable {
        let message: OpaquePointer
    }

    static let propertiesInterface = "org.freedesktop.DBus.Properties"
    static let objectManagerInterface = "org.freedesktop.DBus.ObjectManager"
    static let introspectableInterface = "org.freedesktop.DBus.Introspectable"
    static let peerInterface = "org.freedesktop.DBus.Peer"

    // MARK: Exporting

    /// Exports an object at `path`.
    ///
    /// - Parameters:
    ///   - fallback: also handle calls to any path below `path` that has no object of its own
    ///     (libdbus's "fallback" registration, `dbus_connection_register_fallback`).
    ///   - ordering: whether calls to this object run one at a time (default) or concurrently.
    ///
    /// `org.freedesktop.DBus.Properties` and `Introspectable` are provided automatically. If an
    /// object manager (``addObjectManager(at:)``) is an ancestor, it emits `InterfacesAdded`.
    public func export(
        path: String, interfaces: [DBusInterface], fallback: Bool = false, ordering: DBusCallOrdering = .serial
    ) throws {
        try DBusValidation.objectPath(path)
        var byName: [String: DBusInterface] = [:]
        for interface in interfaces {
            try Self.validate(interface)
            byName[interface.name] = interface
        }
        _ = try requireConnection()
        let previous = objects[path]
        // The placeholder that addObjectManager(at:) leaves at its root may be replaced.
        if let previous, !(previous.interfaces.isEmpty && objectManagers.contains(path)) {
            throw DBusError(
                name: "org.freedesktop.DBus.Error.ObjectPathInUse", message: "an object is already exported at \(path)")
        }
        objects[path] = ExportedObject(
            interfaces: byName, fallback: fallback, ordering: ordering)
        if let manager = managerRoot(for: path), !byName.isEmpty {
            try? emitSignal(
                path: manager, interface: Self.objectManagerInterface, member: "InterfacesAdded",
                arguments: [.objectPath(path), Self.interfacesValue(byName)])
        }
    }

    private static func validate(_ interface: DBusInterface) throws(DBusError) {
        try DBusValidation.interface(interface.name)
        for name in interface.methods.keys { try DBusValidation.member(name) }
        for name in interface.signals { try DBusValidation.member(name) }
        for (name, value) in interface.properties {
            try DBusValidation.member(name)
            try Marshal.validate([value])
        }
    }

    /// Removes the object at `path`; its object manager emits `InterfacesRemoved`. Calls already
    /// running still get their replies.
    public func unexport(path: String) {
        guard let object = objects.removeValue(forKey: path) else { return }
        // An object's own chain ends with it; a group's serves the group's other objects.
        if case .serial = object.ordering, let chain = Self.chain(.serial, path: path) { callTails[chain] = nil }
        if objectManagers.contains(path) {
            objectManagers.remove(path)
        }
        if let manager = managerRoot(for: path), !object.interfaces.isEmpty {
            try? emitSignal(
                path: manager, interface: Self.objectManagerInterface, member: "InterfacesRemoved",
                arguments: [.objectPath(path), .strings(object.interfaces.keys.sorted())])
        }
    }

    /// Serves `org.freedesktop.DBus.ObjectManager` at `path`: `GetManagedObjects` lists every
    /// exported object below it, and exporting/unexporting below it emits
    /// `InterfacesAdded`/`InterfacesRemoved` (spec, "org.freedesktop.DBus.ObjectManager").
    ///
    /// BlueZ's `GattManager1.RegisterApplication` and `LEAdvertisingManager1` read the
    /// application's objects this way.
    public func addObjectManager(at path: String) throws {
        try DBusValidation.objectPath(path)
        _ = try requireConnection()
        objectManagers.insert(path)
        if objects[path] == nil {
            objects[path] = ExportedObject(interfaces: [:], fallback: false, ordering: .serial)
        }
    }

    /// The nearest object manager strictly above `path`.
    private func managerRoot(for path: String) -> String? {
        var candidate = Self.parent(of: path)
        while let current = candidate {
            if objectManagers.contains(current) { return current }
            candidate = Self.parent(of: current)
        }
        return nil
    }

    static func parent(of path: String) -> String? {
        guard path != "/" else { return nil }
        guard let slash = path.lastIndex(of: "/") else { return nil }
        return slash == path.startIndex ? "/" : String(path[..<slash])
    }

    static func isBelow(_ path: String, _ root: String) -> Bool {
        root == "/" ? path != "/" : path.hasPrefix(root + "/")
    }

    // MARK: Properties of exported objects

    /// Changes a property of an exported object and, by default, emits `PropertiesChanged`
    /// (how a GATT server sends notifications through BlueZ).
    public func updateProperty(
        path: String, interface: String, name: String, value: DBusValue, emitChanged: Bool = true
    ) throws {
        try Marshal.validate([value])
        guard objects[path]?.interfaces[interface] != nil else {
            throw DBusError(name: DBusError.Name.unknownInterface, message: "\(path) has no interface \(interface)")
        }
        objects[path]?.interfaces[interface]?.properties[name] = value
        if emitChanged {
            try emitPropertiesChanged(path: path, interface: interface, changed: [name: value])
        }
    }

    /// The current value of a property of an exported object.
    public func exportedProperty(path: String, interface: String, name: String) -> DBusValue? {
        objects[path]?.interfaces[interface]?.properties[name]
    }

    // MARK: Dispatching calls

    private func lookupObject(_ path: String) -> (path: String, object: ExportedObject)? {
        if let object = objects[path] { return (path, object) }
        var candidate = Self.parent(of: path)
        while let current = candidate {
            if let object = objects[current], object.fallback { return (current, object) }
            candidate = Self.parent(of: current)
        }
        return nil
    }

    func handleMethodCall(_ message: OpaquePointer) -> DBusHandlerResult {
        guard let rawPath = dbus_message_get_path(message), let rawMember = dbus_message_get_member(message) else {
            return DBUS_HANDLER_RESULT_NOT_YET_HANDLED
        }
        let path = String(cString: rawPath)
        let member = String(cString: rawMember)
        let interface = dbus_message_get_interface(message).map { String(cString: $0) }

        if interface == Self.introspectableInterface || (interface == nil && member == "Introspect") {
            guard member == "Introspect", let xml = introspect(path) else {
                return DBUS_HANDLER_RESULT_NOT_YET_HANDLED
            }
            replyNow(to: message, .success([.string(xml)]))
            return DBUS_HANDLER_RESULT_HANDLED
        }
        // libdbus answers org.freedesktop.DBus.Peer itself.
        if interface == Self.peerInterface { return DBUS_HANDLER_RESULT_NOT_YET_HANDLED }

        guard let (objectPath, object) = lookupObject(path) else { return DBUS_HANDLER_RESULT_NOT_YET_HANDLED }
        let signature = dbus_message_get_signature(message).map { String(cString: $0) } ?? ""
        var call = DBusMethodCall(
            sender: dbus_message_get_sender(message).map { String(cString: $0) },
            path: path, interface: interface, member: member, arguments: Marshal.read(message))
        call.signature = signature
        // Arguments that reach no handler still own duplicated descriptors.
        let discardArguments = { if signature.contains("h") { Marshal.closeDescriptors(in: call.arguments) } }

        if interface == Self.propertiesInterface {
            handleProperties(call, message: message, objectPath: objectPath, object: object)
            return DBUS_HANDLER_RESULT_HANDLED
        }
        if interface == Self.objectManagerInterface {
            discardArguments()
            if member == "GetManagedObjects", objectManagers.contains(objectPath) {
                replyNow(to: message, .success([managedObjectsValue(below: objectPath)]))
            } else {
                replyNow(to: message, .failure(DBusError(
                    name: DBusError.Name.unknownMethod, message: "no \(member) on \(path)")))
            }
            return DBUS_HANDLER_RESULT_HANDLED
        }

        let handler: DBusMethodHandler?
        if let interface {
            guard let implementation = object.interfaces[interface] else {
                discardArguments()
                replyNow(to: message, .failure(DBusError(
                    name: DBusError.Name.unknownInterface, message: "\(path) has no interface \(interface)")))
                return DBUS_HANDLER_RESULT_HANDLED
            }
            handler = implementation.methods[member]
        } else {
            handler = object.interfaces.keys.sorted().lazy.compactMap { object.interfaces[$0]?.methods[member] }.first
        }
        guard let handler else {
            discardArguments()
            replyNow(to: message, .failure(DBusError(
                name: DBusError.Name.unknownMethod,
                message: "no method \(member) on \(interface ?? "any interface") at \(path)")))
            return DBUS_HANDLER_RESULT_HANDLED
        }
        run(handler, call: call, message: message, objectPath: objectPath)
        return DBUS_HANDLER_RESULT_HANDLED
    }

    /// Runs a handler in a task and replies when it finishes; `.serial` objects chain the tasks.
    private func run(_ handler: @escaping DBusMethodHandler, call: DBusMethodCall, message: OpaquePointer, objectPath: String) {
        let id = nextID()
        dbus_message_ref(message)
        incomingCalls[id] = IncomingCall(message: message)
        let chain = Self.chain(objects[objectPath]?.ordering, path: objectPath)
        let previous = chain.flatMap { callTails[$0] }
        let task = Task { [weak self] in
            await previous?.value
            let result: Result<[DBusValue], any Error>
            do {
                result = .success(try await handler(call))
            } catch {
                result = .failure(error)
            }
            await self?.finishIncoming(id, result)
        }
        if let chain { callTails[chain] = task }
    }

    /// Runs `work` as one more link of the chain of calls to the objects exported with
    /// `.serialGroup(group)`: after the handlers queued before it (and their replies), before
    /// the calls that arrive later. For work that must keep its place among those calls, such
    /// as data a GATT application reads from a socket rather than from a method call.
    public func enqueue(inGroup group: String, _ work: @escaping @Sendable () async -> Void) {
        guard let chain = Self.chain(.serialGroup(group), path: "") else { return }
        let previous = callTails[chain]
        callTails[chain] = Task {
            await previous?.value
            await work()
        }
    }

    private func finishIncoming(_ id: UInt64, _ result: Result<[DBusValue], any Error>) {
        guard let call = incomingCalls.removeValue(forKey: id) else { return }
        defer { dbus_message_unref(call.message) }
        replyNow(to: call.message, result)
    }

    /// Sends a method return or error reply, unless the caller asked for none
    /// (NO_REPLY_EXPECTED flag, `dbus_message_get_no_reply`).
    private func replyNow(to message: OpaquePointer, _ result: Result<[DBusValue], any Error>) {
        guard !closed, dbus_message_get_no_reply(message) == 0 else { return }
        var reply: OpaquePointer?
        switch result {
        case .success(let values):
            reply = dbus_message_new_method_return(message)
            if let built = reply {
                do {
                    try Marshal.append(values, to: built)
                } catch {
                    dbus_message_unref(built)
                    reply = Self.errorReply(to: message, DBusError.failed("handler returned an invalid value: \(error)"))
                }
            }
        case .failure(let error):
            reply = Self.errorReply(to: message, error)
        }
        guard let reply else { return }
        defer { dbus_message_unref(reply) }
        try? send(reply)
    }

    /// Builds an error reply; names and messages are validated so a bad one cannot abort libdbus.
    private static func errorReply(to message: OpaquePointer, _ error: any Error) -> OpaquePointer? {
        var name = DBusError.Name.failed
        var text: String
        if let error = error as? DBusError {
            text = error.message
            if (try? DBusValidation.errorName(error.name)) != nil {
                name = error.name
            } else {
                text = "invalid error name \(error.name.debugDescription): \(error.message)"
            }
        } else if error is CancellationError {
            text = "the handler was cancelled"
        } else {
            text = String(describing: error)
        }
        if (try? DBusValidation.string(text)) == nil { text = "error message was not valid UTF-8" }
        return dbus_message_new_error(message, name, text)
    }

    // MARK: org.freedesktop.DBus.Properties

    private func handleProperties(
        _ call: DBusMethodCall, message: OpaquePointer, objectPath: String, object: ExportedObject
    ) {
        func fail(_ name: String, _ text: String) {
            replyNow(to: message, .failure(DBusError(name: name, message: text)))
        }
        let args = call.arguments
        switch call.member {
        case "Get":
            guard args.count == 2, case .string(let interfaceName) = args[0], case .string(let property) = args[1]
            else { return fail(DBusError.Name.invalidArgs, "Get expects (ss)") }
            guard let interface = object.interfaces[interfaceName] else {
                return fail(DBusError.Name.unknownInterface, "\(call.path) has no interface \(interfaceName)")
            }
            guard let value = interface.properties[property] else {
                return fail(DBusError.Name.unknownProperty, "\(interfaceName) has no property \(property)")
            }
            replyNow(to: message, .success([.variant(value)]))
        case "GetAll":
            guard args.count == 1, case .string(let interfaceName) = args[0]
            else { return fail(DBusError.Name.invalidArgs, "GetAll expects (s)") }
            if let interface = object.interfaces[interfaceName] {
                replyNow(to: message, .success([.vardict(interface.properties)]))
            } else if interfaceName.isEmpty || interfaceName.hasPrefix("org.freedesktop.DBus.") {
                replyNow(to: message, .success([.vardict([:])]))
            } else {
                fail(DBusError.Name.unknownInterface, "\(call.path) has no interface \(interfaceName)")
            }
        case "Set":
            guard args.count == 3, case .string(let interfaceName) = args[0], case .string(let property) = args[1],
                case .variant(let value) = args[2]
            else { return fail(DBusError.Name.invalidArgs, "Set expects (ssv)") }
            guard let interface = object.interfaces[interfaceName] else {
                return fail(DBusError.Name.unknownInterface, "\(call.path) has no interface \(interfaceName)")
            }
            guard interface.properties[property] != nil else {
                return fail(DBusError.Name.unknownProperty, "\(interfaceName) has no property \(property)")
            }
            guard interface.writableProperties.contains(property) else {
                return fail(DBusError.Name.propertyReadOnly, "\(interfaceName).\(property) is read-only")
            }
            let setter = interface.propertySetter
            let path = objectPath
            let handler: DBusMethodHandler = { [weak self] _ in
                try await setter?(property, value)
                try await self?.updateProperty(path: path, interface: interfaceName, name: property, value: value)
                return []
            }
            run(handler, call: call, message: message, objectPath: objectPath)
        default:
            fail(DBusError.Name.unknownMethod, "no method \(call.member) on \(Self.propertiesInterface)")
        }
    }

    // MARK: org.freedesktop.DBus.ObjectManager

    static func interfacesValue(_ interfaces: [String: DBusInterface]) -> DBusValue {
        var entries: [DBusValue: DBusValue] = [:]
        for (name, interface) in interfaces {
            entries[.string(name)] = .vardict(interface.properties)
        }
        return .dictionary(keySignature: "s", valueSignature: "a{sv}", entries)
    }

    private func managedObjectsValue(below root: String) -> DBusValue {
        var entries: [DBusValue: DBusValue] = [:]
        for (path, object) in objects where Self.isBelow(path, root) && !object.interfaces.isEmpty {
            entries[.objectPath(path)] = Self.interfacesValue(object.interfaces)
        }
        return .dictionary(keySignature: "o", valueSignature: "a{sa{sv}}", entries)
    }

    /// Calls `GetManagedObjects` on a remote object manager, e.g. `org.bluez` at `/`.
    public func getManagedObjects(
        destination: String, path: String = "/", timeout: Duration = .seconds(25)
    ) async throws -> DBusManagedObjects {
        let reply = try await call(
            destination: destination, path: path, interface: Self.objectManagerInterface,
            member: "GetManagedObjects", timeout: timeout)
        guard let root = reply.first?.dictionary else {
            throw DBusError.failed("GetManagedObjects returned \(reply.first?.signature ?? "nothing")")
        }
        var result: DBusManagedObjects = [:]
        for (pathValue, interfacesValue) in root {
            guard let objectPath = pathValue.objectPath, let interfaces = interfacesValue.dictionary else { continue }
            var decoded: [String: [String: DBusValue]] = [:]
            for (nameValue, properties) in interfaces {
                if let name = nameValue.string { decoded[name] = properties.vardict ?? [:] }
            }
            result[objectPath] = decoded
        }
        return result
    }

    // MARK: Client-side Properties

    /// `org.freedesktop.DBus.Properties.Get`, with the variant unwrapped.
    public func getProperty(
        destination: String, path: String, interface: String, name: String, timeout: Duration = .seconds(25)
    ) async throws -> DBusValue {
        try DBusValidation.interface(interface)
        let reply = try await call(
            destination: destination, path: path, interface: Self.propertiesInterface, member: "Get",
            arguments: [.string(interface), .string(name)], timeout: timeout)
        guard let value = reply.first else { throw DBusError.failed("Properties.Get returned nothing") }
        return value.unwrapped
    }

    /// `org.freedesktop.DBus.Properties.GetAll`, with the variants unwrapped.
    public func getAllProperties(
        destination: String, path: String, interface: String, timeout: Duration = .seconds(25)
    ) async throws -> [String: DBusValue] {
        try DBusValidation.interface(interface)
        let reply = try await call(
            destination: destination, path: path, interface: Self.propertiesInterface, member: "GetAll",
            arguments: [.string(interface)], timeout: timeout)
        guard let properties = reply.first?.vardict else {
            throw DBusError.failed("Properties.GetAll returned \(reply.first?.signature ?? "nothing")")
        }
        return properties
    }

    /// `org.freedesktop.DBus.Properties.Set`; `value` is wrapped in a variant.
    public func setProperty(
        destination: String, path: String, interface: String, name: String, value: DBusValue,
        timeout: Duration = .seconds(25)
    ) async throws {
        try DBusValidation.interface(interface)
        _ = try await call(
            destination: destination, path: path, interface: Self.propertiesInterface, member: "Set",
            arguments: [.string(interface), .string(name), .variant(value)], timeout: timeout)
    }

    // MARK: org.freedesktop.DBus.Introspectable

    /// Minimal introspection data (spec, "Introspection Data Format"): interfaces with method,
    /// property and signal names (argument lists are not known), plus child nodes, so that tools
    /// such as `busctl tree` can walk the exported objects. Nil when nothing lives at or below `path`.
    private func introspect(_ path: String) -> String? {
        var children = Set<String>()
        for exported in objects.keys where Self.isBelow(exported, path) {
            let rest = exported.dropFirst(path == "/" ? 1 : path.count + 1)
            if let first = rest.split(separator: "/").first { children.insert(String(first)) }
        }
        let object = lookupObject(path)
        if object == nil && children.isEmpty { return nil }

        var xml = """
            <!DOCTYPE node PUBLIC "-//freedesktop//DTD D-BUS Object Introspection 1.0//EN"
             "http://www.freedesktop.org/standards/dbus/1.0/introspect.dtd">
            <node>
             <interface name="org.freedesktop.DBus.Introspectable">
              <method name="Introspect"><arg name="xml_data" type="s" direction="out"/></method>
             </interface>

            """
        if let (objectPath, exported) = object {
            xml += """
                 <interface name="org.freedesktop.DBus.Properties">
                  <method name="Get"><arg name="interface" type="s" direction="in"/><arg name="name" type="s" direction="in"/><arg name="value" type="v" direction="out"/></method>
                  <method name="GetAll"><arg name="interface" type="s" direction="in"/><arg name="properties" type="a{sv}" direction="out"/></method>
                  <method name="Set"><arg name="interface" type="s" direction="in"/><arg name="name" type="s" direction="in"/><arg name="value" type="v" direction="in"/></method>
                  <signal name="PropertiesChanged"><arg type="s"/><arg type="a{sv}"/><arg type="as"/></signal>
                 </interface>

                """
            if objectManagers.contains(objectPath) {
                xml += """
                     <interface name="org.freedesktop.DBus.ObjectManager">
                      <method name="GetManagedObjects"><arg name="objects" type="a{oa{sa{sv}}}" direction="out"/></method>
                      <signal name="InterfacesAdded"><arg type="o"/><arg type="a{sa{sv}}"/></signal>
                      <signal name="InterfacesRemoved"><arg type="o"/><arg type="as"/></signal>
                     </interface>

                    """
            }
            for (name, interface) in exported.interfaces.sorted(by: { $0.key < $1.key }) {
                xml += " <interface name=\"\(name)\">\n"
                for method in interface.methods.keys.sorted() {
                    xml += "  <method name=\"\(method)\"/>\n"
                }
                for signal in interface.signals.sorted() {
                    xml += "  <signal name=\"\(signal)\"/>\n"
                }
                for (property, value) in interface.properties.sorted(by: { $0.key < $1.key }) {
                    let type = Self.xmlEscaped(value.signature)
                    let access = interface.writableProperties.contains(property) ? "readwrite" : "read"
                    xml += "  <property name=\"\(property)\" type=\"\(type)\" access=\"\(access)\"/>\n"
                }
                xml += " </interface>\n"
            }
        }
        for child in children.sorted() {
            xml += " <node name=\"\(child)\"/>\n"
        }
        xml += "</node>\n"
        return xml
    }

    private static func xmlEscaped(_ text: String) -> String {
        var out = ""
        for character in text {
            switch character {
            case "<": out += "&lt;"
            case ">": out += "&gt;"
            case "&": out += "&amp;"
            case "\"": out += "&quot;"
            default: out.append(character)
            }
        }
        return out
    }
}
