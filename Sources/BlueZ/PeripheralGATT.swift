import DBus
import GATT

/// What BlueZ tells a GATT server about one read or write: the options dictionary of
/// `GattCharacteristic1.ReadValue(a{sv})` / `WriteValue(ay, a{sv})`
/// (BlueZ doc/org.bluez.GattCharacteristic.rst, "Characteristic Methods"; 5.66: doc/gatt-api.txt).
///
/// BlueZ 5.66 fills `device`, `link`, `mtu` and, when non-zero, `offset` (src/gatt-database.c,
/// `append_options`). It passes no `type`, so a server cannot tell a write command from a write
/// request; what it can rely on is the characteristic the write went to.
public struct GATTServerRequest: Sendable, Hashable {
    /// The `Device1` object path of the central that read or wrote, e.g.
    /// `/org/bluez/hci1/dev_AA_BB_CC_DD_EE_FF`. Nil when BlueZ did not say.
    public var device: String?
    /// The ATT MTU of that central's link.
    public var mtu: Int?
    /// Offset into the value (long reads and prepared writes).
    public var offset: Int
    /// `LE` or `BR/EDR`.
    public var link: String?

    public init(device: String? = nil, mtu: Int? = nil, offset: Int = 0, link: String? = nil) {
        self.device = device
        self.mtu = mtu
        self.offset = offset
        self.link = link
    }

    /// Reads the options dictionary; unknown keys are ignored.
    ///
    /// - Throws: `org.bluez.Error.InvalidOffset` when `offset` is not an integer in 0...65535
    ///   (ATT offsets are 16-bit; BlueZ sends a `q`), so a malformed request is refused instead of
    ///   reaching a value with it.
    public init(options: DBusValue?) throws(DBusError) {
        let dict = options?.vardict ?? [:]
        device = dict["device"]?.objectPath ?? dict["device"]?.string
        mtu = dict["mtu"]?.integer
        link = dict["link"]?.string
        if let given = dict["offset"] {
            guard let value = given.integer, (0...Int(UInt16.max)).contains(value) else {
                throw GATTServerError.invalidOffset("offset \(given.unwrapped) is not an ATT offset (0-65535)")
            }
            offset = value
        } else {
            offset = 0
        }
    }

    /// The options as BlueZ sends them (for tests that stand in for bluetoothd).
    public var options: DBusValue {
        var entries: [String: DBusValue] = [:]
        if let device { entries["device"] = .objectPath(device) }
        if let mtu { entries["mtu"] = .uint16(UInt16(clamping: mtu)) }
        if offset != 0 { entries["offset"] = .uint16(UInt16(clamping: offset)) }
        if let link { entries["link"] = .string(link) }
        return .vardict(entries)
    }
}

/// Errors a GATT server returns to BlueZ, which turns them into ATT error responses
/// (src/gatt-database.c, `dbus_error_to_att_ecode`).
public enum GATTServerError {
    public static let failedName = "org.bluez.Error.Failed"
    public static let notPermittedName = "org.bluez.Error.NotPermitted"
    public static let invalidOffsetName = "org.bluez.Error.InvalidOffset"
    public static let notSupportedName = "org.bluez.Error.NotSupported"

    /// `org.bluez.Error.Failed`: ATT error 0x80 ("application error"), unless `message` is a
    /// number 0x80–0x9F, which BlueZ (5.52 and later) sends as that application error code.
    public static func failed(_ message: String) -> DBusError {
        DBusError(name: failedName, message: message)
    }

    /// An ATT application error (Core Spec Vol 3, Part F, 3.4.1.1: 0x80–0x9F are defined by the
    /// application), as `org.bluez.Error.Failed` with the code as its message.
    public static func application(_ code: UInt8) -> DBusError {
        precondition((0x80...0x9F).contains(code), "ATT application errors are 0x80-0x9F")
        return DBusError(name: failedName, message: "0x" + String(code, radix: 16))
    }

    /// `org.bluez.Error.NotPermitted`: write/read not permitted.
    public static func notPermitted(_ message: String) -> DBusError {
        DBusError(name: notPermittedName, message: message)
    }

    /// `org.bluez.Error.InvalidOffset`.
    public static func invalidOffset(_ message: String) -> DBusError {
        DBusError(name: invalidOffsetName, message: message)
    }
}

/// One characteristic of a GATT application: a UUID, its `Flags`, and what happens when a central
/// reads, writes or subscribes (BlueZ doc/org.bluez.GattCharacteristic.rst, "Characteristic
/// Properties": `Flags` values such as `read`, `write`, `write-without-response`, `notify`).
public struct PeripheralCharacteristic: Sendable {
    public typealias ReadHandler = @Sendable (GATTServerRequest) async throws -> [UInt8]
    public typealias WriteHandler = @Sendable ([UInt8], GATTServerRequest) async throws -> Void
    public typealias NotifyHandler = @Sendable (_ enabled: Bool) async -> Void

    public var uuid: BluetoothUUID
    public var flags: [String]
    public var read: ReadHandler?
    public var write: WriteHandler?
    /// Called on `StartNotify` (true) and `StopNotify` (false).
    public var notifyChanged: NotifyHandler?
    /// Writes come through a socket bluetoothd acquires (`AcquireWrite`, `WriteAcquired`) rather
    /// than one `WriteValue` call each: for a characteristic that takes write commands only, of a
    /// protocol whose writes carry their place (``PeripheralWriteSocket`` says why, and why only
    /// then). `WriteValue` is still answered.
    public var acquiresWrites: Bool

    public init(uuid: BluetoothUUID, flags: [String], read: ReadHandler? = nil, write: WriteHandler? = nil,
                notifyChanged: NotifyHandler? = nil, acquiresWrites: Bool = false) {
        self.uuid = uuid
        self.flags = flags
        self.read = read
        self.write = write
        self.notifyChanged = notifyChanged
        self.acquiresWrites = acquiresWrites
    }
}

/// One service of a GATT application (BlueZ doc/org.bluez.GattService.rst: `UUID`, `Primary`).
public struct PeripheralService: Sendable {
    public var uuid: BluetoothUUID
    public var primary: Bool
    public var characteristics: [PeripheralCharacteristic]

    public init(uuid: BluetoothUUID, primary: Bool = true, characteristics: [PeripheralCharacteristic]) {
        self.uuid = uuid
        self.primary = primary
        self.characteristics = characteristics
    }
}

/// A GATT application exported on a D-Bus connection, in the shape
/// `GattManager1.RegisterApplication` expects (BlueZ doc/org.bluez.GattManager.rst; 5.66:
/// doc/gatt-api.txt, "GATT Manager hierarchy"): an object manager at `root`, one object per service
/// at `root/serviceN` (`org.bluez.GattService1`), one per characteristic at
/// `root/serviceN/charM` (`org.bluez.GattCharacteristic1`).
///
/// Notifications are sent the way BlueZ's server API defines them: by changing the
/// characteristic's `Value` property, which emits `PropertiesChanged`; bluetoothd forwards it to
/// every central that enabled notifications (src/gatt-database.c, `send_notification_to_devices`).
public actor PeripheralApplication {
    public static let serviceInterface = "org.bluez.GattService1"
    public static let characteristicInterface = "org.bluez.GattCharacteristic1"
    public static let managerInterface = "org.bluez.GattManager1"

    public nonisolated let connection: DBusConnection
    public nonisolated let root: String
    public let services: [PeripheralService]
    /// Object path of each characteristic, by UUID.
    public nonisolated let characteristicPaths: [BluetoothUUID: String]
    /// Some characteristic has its writes acquired (`PeripheralCharacteristic.acquiresWrites`).
    private nonisolated let acquiresAny: Bool
    private var exported: [String] = []
    private var notifying: [String: Bool] = [:]
    private var registeredOn: String?
    /// The write sockets bluetoothd acquired, by characteristic path and central.
    private var acquired: [String: Acquisition] = [:]

    private struct Acquisition {
        let socket: PeripheralWriteSocket
        let request: GATTServerRequest
        let write: PeripheralCharacteristic.WriteHandler
    }

    public init(connection: DBusConnection, root: String, services: [PeripheralService]) {
        self.connection = connection
        self.root = root
        self.services = services
        var paths: [BluetoothUUID: String] = [:]
        for (s, service) in services.enumerated() {
            for (c, characteristic) in service.characteristics.enumerated() {
                paths[characteristic.uuid] = "\(root)/service\(s)/char\(c)"
            }
        }
        characteristicPaths = paths
        acquiresAny = services.contains { $0.characteristics.contains { $0.acquiresWrites && $0.write != nil } }
    }

    /// Exports the object manager, the services and the characteristics.
    public func export() async throws {
        try await connection.addObjectManager(at: root)
        exported.append(root)
        for (s, service) in services.enumerated() {
            let servicePath = "\(root)/service\(s)"
            try await connection.export(path: servicePath, interfaces: [
                DBusInterface(name: Self.serviceInterface, properties: [
                    "UUID": .string(service.uuid.description),
                    "Primary": .bool(service.primary),
                ]),
            ])
            exported.append(servicePath)
            for (c, characteristic) in service.characteristics.enumerated() {
                let path = "\(servicePath)/char\(c)"
                // One chain for the whole application, as one ATT bearer serves it in order: a
                // control point write must not overtake the packets written before it to another
                // characteristic (Secure DFU's packets carry no offset).
                try await connection.export(path: path, interfaces: [characteristicInterface(characteristic, path: path, service: servicePath)],
                                            ordering: .serialGroup(root))
                exported.append(path)
            }
        }
    }

    private func characteristicInterface(_ c: PeripheralCharacteristic, path: String, service: String) -> DBusInterface {
        var methods: [String: DBusMethodHandler] = [:]
        let uuid = c.uuid.description
        if let read = c.read {
            // ReadValue(a{sv} options) -> ay
            methods["ReadValue"] = { call in
                let request = try GATTServerRequest(options: call.arguments.first)
                let value = try await read(request)
                guard request.offset <= value.count else {
                    throw GATTServerError.invalidOffset("offset \(request.offset) is beyond the \(value.count)-byte value of \(uuid)")
                }
                return [.bytes(value[request.offset...])]
            }
        }
        if let write = c.write {
            // WriteValue(ay value, a{sv} options)
            methods["WriteValue"] = { call in
                guard let bytes = call.arguments.first?.bytes else {
                    throw DBusError(name: DBusError.Name.invalidArgs, message: "WriteValue expects (ay, a{sv})")
                }
                let request = try GATTServerRequest(options: call.arguments.dropFirst().first)
                // Values here are written whole; a part at an offset (a prepared write) would be
                // taken for a whole value.
                guard request.offset == 0 else {
                    throw GATTServerError.invalidOffset("\(uuid) takes whole values only, not a part at offset \(request.offset)")
                }
                try await write(bytes, request)
                return []
            }
        }
        if c.acquiresWrites, let write = c.write {
            // AcquireWrite(a{sv} options) -> (h fd, q mtu)
            methods["AcquireWrite"] = { [weak self] call in
                let request = try GATTServerRequest(options: call.arguments.first)
                guard let self else { throw GATTServerError.failed("the application is gone") }
                return try await self.acquireWrite(path: path, request: request, write: write)
            }
        }
        if c.flags.contains("notify") || c.flags.contains("indicate") {
            let changed = c.notifyChanged
            methods["StartNotify"] = { [weak self] _ in
                await self?.setNotifying(path, true)
                await changed?(true)
                return []
            }
            methods["StopNotify"] = { [weak self] _ in
                await self?.setNotifying(path, false)
                await changed?(false)
                return []
            }
        }
        var properties: [String: DBusValue] = [
            "UUID": .string(uuid),
            "Service": .objectPath(service),
            "Flags": .strings(c.flags),
        ]
        if c.acquiresWrites && c.write != nil {
            // Its presence is what tells bluetoothd to call AcquireWrite (src/gatt-database.c, chrc_write_cb).
            properties["WriteAcquired"] = .bool(false)
        }
        if c.flags.contains("notify") || c.flags.contains("indicate") {
            properties["Notifying"] = .bool(false)
            properties["Value"] = .bytes([])
        }
        // Writes waiting in an acquired socket were made before this call reached us: they go
        // first. Then the socket follows the central that called. (Nothing to do, per packet
        // either, in an application that acquires none.)
        guard acquiresAny else {
            return DBusInterface(name: Self.characteristicInterface, methods: methods, properties: properties)
        }
        for (name, handler) in methods {
            let optionsAt = name == "WriteValue" ? 1 : 0
            methods[name] = { [weak self] call in
                await self?.readAcquired()
                let options = call.arguments.count > optionsAt ? call.arguments[optionsAt] : nil
                if let device = (try? GATTServerRequest(options: options))?.device { await self?.follow(device) }
                return try await handler(call)
            }
        }
        return DBusInterface(name: Self.characteristicInterface, methods: methods, properties: properties)
    }

    /// Answers `AcquireWrite`: a new socket pair whose other end goes to bluetoothd in the reply.
    private func acquireWrite(path: String, request: GATTServerRequest,
                              write: @escaping PeripheralCharacteristic.WriteHandler) async throws -> [DBusValue] {
        let key = path + " " + (request.device ?? "")
        if let previous = acquired.removeValue(forKey: key) {
            // bluetoothd asks again when it lost the socket: what it sent there before comes first.
            await deliver(previous.socket.read(), of: previous)
            previous.socket.close()
        }
        let socket: PeripheralWriteSocket
        switch PeripheralWriteSocket.make() {
        case .success(let made): socket = made
        case .failure(let error): throw GATTServerError.failed(error.message)
        }
        acquired[key] = Acquisition(socket: socket, request: request, write: write)
        let (connection, root) = (connection, root)
        socket.start { [weak self] in
            Task { [weak self] in
                await connection.enqueue(inGroup: root) { [weak self] in await self?.readAcquired() }
            }
        }
        // libdbus duplicates the descriptor into the reply; ours closes once the reply is out.
        await connection.enqueue(inGroup: root) { socket.closePeerEnd() }
        return [.unixFD(socket.peerEnd), .uint16(UInt16(clamping: request.mtu ?? 23))]
    }

    /// Hands every write waiting in an acquired socket to its handler, in the order they came.
    /// Runs in the application's chain of calls (a handler's first step, or queued by the socket).
    func readAcquired() async {
        for (key, acquisition) in acquired.sorted(by: { $0.key < $1.key }) {
            let reading = await acquisition.socket.read()
            await deliver(reading, of: acquisition)
            if reading.hungUp {
                acquired[key] = nil
                acquisition.socket.close()
            } else {
                acquisition.socket.resume()
            }
        }
    }

    private func deliver(_ reading: PeripheralWriteSocket.Reading, of acquisition: Acquisition) async {
        // A write command has no reply to carry an error back.
        for value in reading.values { try? await acquisition.write(value, acquisition.request) }
    }

    /// Closes the sockets acquired for another central than `device`. bluetoothd 5.66 keeps one
    /// socket per characteristic for every central (the device it names in `AcquireWrite` is the
    /// one whose write made it acquire), so a socket cannot tell whose writes it carries: it is
    /// handed back when another central calls, and the next write acquires one for its own
    /// central. (BlueZ 5.67 and later acquire per central.)
    func follow(_ device: String) {
        for (key, acquisition) in acquired where acquisition.request.device.map({ $0 != device }) ?? false {
            acquisition.socket.close()
            acquired[key] = nil
        }
    }

    /// Closes the sockets acquired for `device`, whose link went down: what it sent after that is
    /// lost with the link, and a central that connects next gets a socket of its own.
    public func release(device: String) {
        for (key, acquisition) in acquired where acquisition.request.device == device {
            acquisition.socket.close()
            acquired[key] = nil
        }
    }

    /// Closes every acquired socket; bluetoothd acquires again on the next write.
    private func releaseAcquired() {
        for acquisition in acquired.values { acquisition.socket.close() }
        acquired = [:]
    }

    private func setNotifying(_ path: String, _ on: Bool) async {
        guard notifying[path] != on else { return }
        notifying[path] = on
        try? await connection.updateProperty(path: path, interface: Self.characteristicInterface, name: "Notifying", value: .bool(on))
    }

    /// Whether a central has enabled notifications on the characteristic (`StartNotify` seen).
    public func isNotifying(_ uuid: BluetoothUUID) -> Bool {
        characteristicPaths[uuid].flatMap { notifying[$0] } ?? false
    }

    /// Sends a notification: sets `Value` and emits `PropertiesChanged`
    /// (doc/org.bluez.GattCharacteristic.rst, "Value" and "StartNotify").
    public func notify(_ uuid: BluetoothUUID, _ value: [UInt8]) async throws {
        guard let path = characteristicPaths[uuid] else {
            throw DBusError(name: DBusError.Name.unknownObject, message: "no characteristic \(uuid) in this application")
        }
        try await connection.updateProperty(path: path, interface: Self.characteristicInterface, name: "Value", value: .bytes(value))
    }

    /// `GattManager1.RegisterApplication(root, {})` on `adapterPath` (e.g. `/org/bluez/hci1`).
    /// bluetoothd reads the objects with `GetManagedObjects` before it replies.
    public func register(on adapterPath: String, timeout: Duration = .seconds(20)) async throws {
        _ = try await connection.call(
            destination: "org.bluez", path: adapterPath, interface: Self.managerInterface, member: "RegisterApplication",
            arguments: [.objectPath(root), .vardict([:])], timeout: timeout)
        registeredOn = adapterPath
    }

    /// `GattManager1.UnregisterApplication(root)`, if registered.
    public func unregister(timeout: Duration = .seconds(5)) async throws {
        guard let adapterPath = registeredOn else { return }
        registeredOn = nil
        _ = try await connection.call(
            destination: "org.bluez", path: adapterPath, interface: Self.managerInterface, member: "UnregisterApplication",
            arguments: [.objectPath(root)], timeout: timeout)
    }

    /// Removes the exported objects.
    public func unexport() async {
        releaseAcquired()
        for path in exported.reversed() { await connection.unexport(path: path) }
        exported = []
    }
}
