import DBus
import GATT
import Logging
import Synchronization

/// A link to one device through BlueZ (doc/org.bluez.Device.rst, doc/org.bluez.GattCharacteristic.rst).
///
/// - Notifications: `StartNotify`, then `PropertiesChanged(Value)` on the characteristic's path.
/// - Write with response: `WriteValue(value, {type: request})`; `submitWrite` runs it in a task
///   whose completion is queued as `.writeCompleted`.
/// - Write without response: on the `AcquireWrite` socket (one datagram per packet) when the
///   central's write path allows it and BlueZ grants it, else `WriteValue(value, {type: command})`.
/// - Link loss: `Device1.Connected` = false, `InterfacesRemoved` of the device or its services,
///   a hung-up write socket, bluetoothd leaving the bus, or the bus connection closing each queue
///   one `.disconnected(.linkLost)`.
public final class BlueZConnection: GATTConnection {
    public let peer: String
    public let clock: any MonotonicClock
    let bus: DBusConnection
    let adapterPath: String
    let devicePath: String
    let writePath: BlueZCentral.WritePath
    let logger: Logger
    let events = CentralEventQueue()

    /// What the device's signals have said so far; connect waits on it.
    struct DeviceState: Sendable {
        var deviceKnown = false
        var connected = false
        var servicesResolved = false
        /// Count of GattService1 objects added below the device since the watch started.
        var servicesAdded = 0
    }
    let state = Watched(DeviceState())

    private struct Link {
        /// Set once connect finished: from then on link losses become events.
        var armed = false
        /// Device1.Connect was sent: a failed or cancelled connect must undo it.
        var connecting = false
        var down = false
        var local = false
        var subscriptions: [DBusSubscriptionID] = []
        var sockets: [String: CentralWriteSocket] = [:]
        /// Characteristics where AcquireWrite was refused: use WriteValue.
        var noSocket: Set<String> = []
        var nextTicket: UInt64 = 0
        /// The last submitted write: the next one starts when it is done.
        var lastSubmitted: Task<Void, Never>?
    }
    private let link = Mutex(Link())

    /// Whether we pair this link ourselves (`pair`), and what the stack did by itself.
    private let consented = Mutex(false)
    private let stack = Watched<StackPairing?>(nil)

    /// How long `transportWrite(.withoutResponse)` waits for room on the write socket.
    static let writableTimeout: Duration = .seconds(10)
    /// Timeout of one GATT D-Bus call (BlueZ's own ATT transaction timeout is 30 s).
    static let callTimeout: Duration = .seconds(30)

    init(bus: DBusConnection, peer: String, adapterPath: String, devicePath: String,
         writePath: BlueZCentral.WritePath, clock: any MonotonicClock, logger: Logger) {
        self.bus = bus
        self.peer = peer
        self.adapterPath = adapterPath
        self.devicePath = devicePath
        self.writePath = writePath
        self.clock = clock
        self.logger = logger
    }

    // MARK: Watching the device

    /// Subscribes to everything that concerns the device, before anything is read, so no change
    /// is missed: its properties and its characteristics' values, objects added and removed, and
    /// bluetoothd's bus name. Handlers run on the bus connection's queue in arrival order, which
    /// keeps notifications and the disconnect in order.
    func watch() async throws {
        let properties = try await bus.subscribe(.propertiesChanged(sender: BlueZ.service, pathNamespace: devicePath)) { [weak self] signal in
            self?.propertiesChanged(signal)
        }
        remember(properties)
        let objects = try await bus.subscribe(.objectManager(sender: BlueZ.service, path: "/")) { [weak self] signal in
            self?.objectsChanged(signal)
        }
        remember(objects)
        let owner = try await bus.subscribe(DBusMatchRule(
            sender: "org.freedesktop.DBus", path: "/org/freedesktop/DBus", interface: "org.freedesktop.DBus",
            member: "NameOwnerChanged", arg0: BlueZ.service))
        remember(owner.id)
        // The stream ends when the bus connection closes; its signals say bluetoothd left.
        Task { [weak self] in
            for await signal in owner.signals {
                if signal.arguments.count == 3, signal.arguments[2].string == "" {
                    self?.lost("bluetoothd left the bus")
                }
            }
            self?.lost("the D-Bus connection to bluetoothd was closed")
        }
    }

    /// What the stack did by itself on this link; queued as an event each time it says more.
    func stackPaired(_ report: StackPairing) {
        guard !consented.withLock({ $0 }) else { return }
        var merged: StackPairing?
        stack.update { s in
            let next = s.map { $0.merged(with: report) } ?? report
            if next != s { merged = next }
            s = next
        }
        guard let merged else { return }
        logger.debug("the stack paired by itself", metadata: ["device": "\(peer)", "what": "\(merged)"])
        events.push(.stackPairing(merged))
    }

    public var stackPairing: StackPairing? { stack.value }

    /// We pair this link ourselves (`Device1.Pair`): what follows is no pairing of the stack's own.
    func consentToPairing() { consented.withLock { $0 = true } }

    /// A setup call (ReadValue, StartNotify) whose ATT request the device refused for want of
    /// security is held by bluetoothd while its stack pairs by itself, and fails only when that
    /// pairing does (or the link drops). Once the stack has asked something nobody answers
    /// (`refuseStackPairing`), the call's fate is known: it fails then, as not authorized.
    private func setupCall(_ characteristic: GATTCharacteristic, _ member: String, _ arguments: [DBusValue] = [],
                           operation: String) async throws(GATTError) -> [DBusValue] {
        let race = FirstOf<Result<[DBusValue], GATTError>>()
        let call = Task {
            do throws(GATTError) { race.offer(.success(try await gattCall(characteristic, member, arguments, operation: operation))) } catch {
                race.offer(.failure(error))
            }
        }
        let watcher = Task { [stack] in
            guard await stack.wait(timeout: Self.callTimeout, until: { $0?.asked != nil }) else { return }
            race.offer(.failure(GATTError(.notAuthorized, "\(operation): refused for want of pairing")))
        }
        let result = await race.value
        watcher.cancel()
        _ = call
        return try result.get()
    }

    /// Registers an agent that refuses every pairing request (bluetoothd's default one when no
    /// other agent is registered) for as long as this link's bus connection lives (bluetoothd
    /// drops an agent whose client leaves), and routes its reports about this device here. Best
    /// effort: without it, a bond the stack makes by itself is still seen (`Paired`).
    func refuseStackPairing() async {
        StackPairingReports.watch(devicePath) { [weak self] question in
            self?.stackPaired(StackPairing(bonded: false, asked: question))
        }
        let agent = BlueZAgent(bus: bus, path: "/org/otaflash/refusing_agent/" + BlueZ.adapterName(devicePath),
                               policy: BlueZAgent.Policy(refusesStackPairing: true), logger: logger)
        do {
            try await agent.register()
        } catch {
            logger.debug("no refusing agent", metadata: ["device": "\(peer)", "error": "\(error)"])
        }
    }

    private func remember(_ id: DBusSubscriptionID) {
        link.withLock { $0.subscriptions.append(id) }
    }

    private func propertiesChanged(_ signal: DBusSignal) {
        guard let (interface, changed) = signal.propertiesChanged else { return }
        if signal.path == devicePath, interface == BlueZ.device {
            if let connected = changed["Connected"]?.bool {
                state.update { $0.connected = connected }
                if !connected { lost("\(peer) disconnected") }
            }
            if let resolved = changed["ServicesResolved"]?.bool {
                state.update { $0.servicesResolved = resolved }
            }
            // Keys stored for a device otaflash did not pair: the stack paired by itself
            // (doc/org.bluez.Device.rst, "Paired", "Bonded").
            if changed["Paired"]?.bool == true || changed["Bonded"]?.bool == true {
                stackPaired(StackPairing(bonded: true))
            }
        } else if interface == BlueZ.gattCharacteristic, let value = changed["Value"]?.bytes {
            guard link.withLock({ $0.armed && !$0.down }) else { return }
            events.push(.notification(characteristicID: signal.path, value: value))
        }
    }

    private func objectsChanged(_ signal: DBusSignal) {
        if let (path, interfaces) = signal.interfacesAdded {
            if path == devicePath, interfaces[BlueZ.device] != nil { state.update { $0.deviceKnown = true } }
            if path.hasPrefix(devicePath + "/"), interfaces[BlueZ.gattService] != nil { state.update { $0.servicesAdded += 1 } }
        } else if let (path, interfaces) = signal.interfacesRemoved {
            if path == devicePath, interfaces.contains(BlueZ.device) {
                state.update { $0.connected = false }
                lost("BlueZ removed \(peer)")
            } else if path.hasPrefix(devicePath + "/"), interfaces.contains(BlueZ.gattService) {
                lost("BlueZ removed the services of \(peer)")
            }
        }
    }

    /// Queues the one `.disconnected(.linkLost)` (only after connect, and not after our own
    /// disconnect) and closes the write sockets.
    func lost(_ reason: String) {
        let sockets: [CentralWriteSocket]? = link.withLock { l in
            guard l.armed, !l.down, !l.local else { return nil }
            l.down = true
            defer { l.sockets = [:] }
            return Array(l.sockets.values)
        }
        guard let sockets else { return }
        for socket in sockets { socket.close() }
        logger.debug("link lost", metadata: ["device": "\(peer)", "reason": "\(reason)"])
        events.push(.disconnected(.linkLost(reason)))
    }

    /// Connect finished: from now on losses are events. A loss seen meanwhile is queued now.
    func arm(services: [GATTService]) {
        link.withLock { $0.armed = true }
        if !state.value.connected { lost("\(peer) disconnected") }
    }

    func connectIssued() { link.withLock { $0.connecting = true } }

    /// Connect failed or was cancelled: cancel a pending connection attempt (Device1.Disconnect
    /// also aborts a Connect in progress, doc/org.bluez.Device.rst), drop the subscriptions and
    /// the bus. Runs in a task of its own so that a cancelled caller still cleans up.
    func abandon() async {
        let (ids, connecting) = link.withLock { l -> ([DBusSubscriptionID], Bool) in
            l.local = true
            defer { l.subscriptions = [] }
            return (l.subscriptions, l.connecting)
        }
        let bus = self.bus
        let devicePath = self.devicePath
        StackPairingReports.unwatch(devicePath)
        await Task {
            if connecting {
                _ = try? await bus.call(destination: BlueZ.service, path: devicePath, interface: BlueZ.device,
                                        member: "Disconnect", timeout: .seconds(2))
            }
            for id in ids { await bus.unsubscribe(id) }
            await bus.close()
        }.value
    }

    func readDeviceFlag(_ name: String) async throws(GATTError) -> Bool {
        do {
            return try await bus.getProperty(destination: BlueZ.service, path: devicePath, interface: BlueZ.device,
                                             name: name, timeout: .seconds(10)).bool ?? false
        } catch {
            throw BlueZErrors.map(error, "reading \(name) of \(peer)", timeout: .seconds(10))
        }
    }

    private func requireUp(_ operation: @autoclosure () -> String) throws(GATTError) {
        let (down, local) = link.withLock { ($0.down, $0.local) }
        if down || local {
            throw GATTError(.notConnected, "\(operation()): \(peer) is not connected\(local ? " (disconnected by us)" : "")")
        }
    }

    /// One D-Bus call on a characteristic, errors mapped.
    private func gattCall(_ characteristic: GATTCharacteristic, _ member: String, _ arguments: [DBusValue] = [],
                          operation: String) async throws(GATTError) -> [DBusValue] {
        try requireUp(operation)
        do {
            return try await bus.call(destination: BlueZ.service, path: characteristic.id, interface: BlueZ.gattCharacteristic,
                                      member: member, arguments: arguments, timeout: Self.callTimeout)
        } catch {
            var mapped = BlueZErrors.map(error, operation, timeout: Self.callTimeout)
            if link.withLock({ $0.down || $0.local }) {
                mapped = GATTError(.notConnected, "\(operation): \(peer) is not connected")
            }
            throw mapped
        }
    }

    private func describe(_ c: GATTCharacteristic) -> String { "characteristic \(c.uuid) of \(peer)" }

    // MARK: GATTConnection

    /// The primary services below the device and their characteristics, from GetManagedObjects
    /// (doc/org.bluez.GattService.rst, doc/org.bluez.GattCharacteristic.rst).
    public func discoverServices() async throws(GATTError) -> [GATTService] {
        try requireUp("discovering the services of \(peer)")
        let objects = try await BlueZCentral.managedObjects(bus)
        return gattServices(in: objects, devicePath: devicePath)
    }

    /// `GattCharacteristic1.MTU` (BlueZ ≥ 5.62), else the MTU an `AcquireWrite` reported, else 23.
    public func mtu() async throws(GATTError) -> Int {
        try requireUp("reading the MTU of \(peer)")
        if let socket = link.withLock({ $0.sockets.values.first }) { return socket.mtu }
        let objects = try await BlueZCentral.managedObjects(bus)
        let characteristics = objects.filter { $0.key.hasPrefix(devicePath + "/") && $0.value[BlueZ.gattCharacteristic] != nil }
        // One ATT bearer per link, so any characteristic's MTU is the link's.
        if let path = characteristics.keys.sorted().first,
           let mtu = try? await bus.getProperty(destination: BlueZ.service, path: path, interface: BlueZ.gattCharacteristic,
                                                name: "MTU", timeout: .seconds(5)).integer, mtu >= 23 {
            return mtu
        }
        if writePath == .acquireWrite {
            let candidates = gattServices(in: objects, devicePath: devicePath).flatMap(\.characteristics)
                .filter { $0.properties.contains(.writeWithoutResponse) }
            for c in candidates {
                if let socket = await acquire(c) { return socket.mtu }
            }
        }
        logger.debug("MTU unknown (no MTU property, no AcquireWrite); assuming 23", metadata: ["device": "\(peer)"])
        return 23
    }

    /// `ReadValue({})` (doc/org.bluez.GattCharacteristic.rst, "ReadValue").
    public func transportRead(_ characteristic: GATTCharacteristic) async throws(GATTError) -> [UInt8] {
        let reply = try await setupCall(characteristic, "ReadValue", [.vardict([:])], operation: "reading \(describe(characteristic))")
        guard let bytes = reply.first?.bytes else {
            throw GATTError(.failed, "reading \(describe(characteristic)): BlueZ returned \(reply.first?.signature ?? "nothing") instead of bytes")
        }
        return bytes
    }

    public func transportWrite(_ value: [UInt8], to characteristic: GATTCharacteristic, type: WriteType) async throws(GATTError) {
        switch type {
        case .withResponse:
            try await writeValue(value, to: characteristic, type: "request")
        case .withoutResponse:
            try requireUp("writing to \(describe(characteristic))")
            guard let socket = await socket(for: characteristic) else {
                try await writeValue(value, to: characteristic, type: "command")
                return
            }
            while true {
                switch socket.send(value) {
                case .sent:
                    return
                case .hungUp(let why):
                    lost(why)
                    throw GATTError(.notConnected, "writing to \(describe(characteristic)): \(why)")
                case .wouldBlock:
                    switch await socket.waitWritable(timeout: Self.writableTimeout) {
                    case .writable:
                        continue
                    case .hungUp:
                        lost("bluetoothd closed the write socket")
                        throw GATTError(.notConnected, "writing to \(describe(characteristic)): bluetoothd closed the write socket")
                    case .timedOut:
                        throw GATTError(.timeout, "writing to \(describe(characteristic)): the write socket stayed full for \(formatSeconds(Self.writableTimeout))")
                    }
                }
            }
        }
    }

    /// `WriteValue(value, {type})` (doc/org.bluez.GattCharacteristic.rst, "WriteValue").
    private func writeValue(_ value: [UInt8], to characteristic: GATTCharacteristic, type: String) async throws(GATTError) {
        _ = try await gattCall(characteristic, "WriteValue", [.bytes(value), .vardict(["type": .string(type)])],
                               operation: "writing \(describe(characteristic))")
    }

    public func transportTryWriteWithoutResponse(_ value: [UInt8], to characteristic: GATTCharacteristic) throws(GATTError) -> Bool {
        try requireUp("writing to \(describe(characteristic))")
        // Without a socket (not acquired yet, or refused) the async write does the D-Bus call.
        guard let socket = link.withLock({ $0.sockets[characteristic.id] }) else { return false }
        switch socket.send(value) {
        case .sent: return true
        case .wouldBlock: return false
        case .hungUp(let why):
            lost(why)
            throw GATTError(.notConnected, "writing to \(describe(characteristic)): \(why)")
        }
    }

    /// Ordering: a write command already sent with `WriteValue` is answered before this request
    /// is sent, so it goes first. On the AcquireWrite socket, bluetoothd queues the datagrams it
    /// has read ahead of a later request (src/shared/att.c, pick_next_send_op), but datagrams
    /// still unread in the socket may be overtaken; the device then answers CHECKPOINT with a gap
    /// and the central resends from its position.
    public func transportSubmitWrite(_ value: [UInt8], to characteristic: GATTCharacteristic) throws(GATTError) -> WriteTicket {
        try requireUp("writing \(describe(characteristic))")
        // Submitted writes go out one after the other, in submission order: BlueZ answers
        // InProgress to a second request on a characteristic while one is in flight
        // (src/gatt-client.c), and the peer must see commands in the order they were given.
        return link.withLock { l -> WriteTicket in
            l.nextTicket += 1
            let ticket = WriteTicket(l.nextTicket)
            let previous = l.lastSubmitted
            l.lastSubmitted = Task { [weak self] in
                await previous?.value
                guard let self else { return }
                var failure: GATTError?
                do throws(GATTError) {
                    try await self.writeValue(value, to: characteristic, type: "request")
                } catch {
                    failure = error
                }
                self.events.push(.writeCompleted(ticket, failure))
            }
            return ticket
        }
    }

    /// `StartNotify` / `StopNotify` (doc/org.bluez.GattCharacteristic.rst); values then arrive as
    /// `PropertiesChanged(Value)` on the characteristic's path.
    public func transportSetNotifications(_ enabled: Bool, for characteristic: GATTCharacteristic) async throws(GATTError) {
        _ = try await setupCall(characteristic, enabled ? "StartNotify" : "StopNotify",
                               operation: "\(enabled ? "enabling" : "disabling") notifications on \(describe(characteristic))")
    }

    public func nextEvent(timeout: Duration) async -> GATTEvent? {
        await events.next(timeout: timeout)
    }

    public func pollEvent() -> GATTEvent? {
        events.poll()
    }

    /// `Device1.Disconnect`, closes the write sockets, ends every subscription and the bus
    /// connection, then queues `.disconnected(.local)` (unless the link was already lost).
    public func disconnect() async {
        let taken = link.withLock { l -> ([CentralWriteSocket], [DBusSubscriptionID], Bool)? in
            guard !l.local else { return nil }
            l.local = true
            defer {
                l.sockets = [:]
                l.subscriptions = []
            }
            return (Array(l.sockets.values), l.subscriptions, l.down)
        }
        guard let (sockets, ids, wasDown) = taken else { return }
        StackPairingReports.unwatch(devicePath)
        for socket in sockets { socket.close() }
        if !wasDown {
            do {
                _ = try await bus.call(destination: BlueZ.service, path: devicePath, interface: BlueZ.device,
                                       member: "Disconnect", timeout: .seconds(5))
            } catch {
                logger.debug("Disconnect failed", metadata: ["device": "\(peer)", "error": "\(error)"])
            }
        }
        for id in ids { await bus.unsubscribe(id) }
        // Pending calls (submitted writes) fail now; their completions come after the disconnect
        // and are dropped.
        await bus.close()
        events.push(.disconnected(.local))
    }

    // MARK: AcquireWrite

    /// The write socket for a characteristic, acquiring it on first use when the write path
    /// allows it; nil means use WriteValue.
    private func socket(for characteristic: GATTCharacteristic) async -> CentralWriteSocket? {
        guard writePath == .acquireWrite else { return nil }
        let (existing, refused) = link.withLock { ($0.sockets[characteristic.id], $0.noSocket.contains(characteristic.id)) }
        if let existing { return existing }
        if refused { return nil }
        return await acquire(characteristic)
    }

    /// `AcquireWrite({})` → (fd, mtu) (doc/org.bluez.GattCharacteristic.rst, "AcquireWrite").
    /// NotSupported, NotPermitted or Failed mean this characteristic (or this BlueZ) does not
    /// offer it: remember that and use WriteValue.
    private func acquire(_ characteristic: GATTCharacteristic) async -> CentralWriteSocket? {
        let reply: [DBusValue]
        do {
            reply = try await bus.call(destination: BlueZ.service, path: characteristic.id, interface: BlueZ.gattCharacteristic,
                                       member: "AcquireWrite", arguments: [.vardict([:])], timeout: .seconds(10))
        } catch {
            logger.debug("AcquireWrite refused; writing with WriteValue(type=command)",
                         metadata: ["characteristic": "\(characteristic.uuid)", "error": "\(error)"])
            link.withLock { _ = $0.noSocket.insert(characteristic.id) }
            return nil
        }
        guard reply.count >= 2, let fd = reply[0].unixFD else {
            link.withLock { _ = $0.noSocket.insert(characteristic.id) }
            return nil
        }
        let mtu = reply[1].integer ?? 23
        let socket = CentralWriteSocket(fd: fd, mtu: mtu) { [weak self] in
            self?.lost("bluetoothd hung up the write socket")
        }
        let kept: CentralWriteSocket? = link.withLock { l in
            guard !l.down, !l.local else { return nil }
            if let other = l.sockets[characteristic.id] { return other }
            l.sockets[characteristic.id] = socket
            return socket
        }
        if kept !== socket { socket.close() }
        logger.debug("AcquireWrite", metadata: ["characteristic": "\(characteristic.uuid)", "mtu": "\(mtu)"])
        return kept
    }
}
