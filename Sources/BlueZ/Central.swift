import DBus
import GATT
import Logging
import Synchronization
#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// A `GATTCentral` on a BlueZ adapter, through bluetoothd's D-Bus API.
///
/// Which bus: the system bus, or the address in the environment variable
/// `OTAFLASH_DBUS_ADDRESS` when it is set (``BlueZCentral/busAddressEnvironment``) — tests use it
/// to point otaflash at a private `dbus-daemon` where a fake `org.bluez` runs.
///
/// Every `scan` and `connect` opens its own private D-Bus connection; a `BlueZConnection` keeps
/// its connection until `disconnect()`.
public struct BlueZCentral: GATTCentral {
    /// How write-without-response packets reach bluetoothd.
    public enum WritePath: String, Sendable, CaseIterable {
        /// `GattCharacteristic1.AcquireWrite`: one datagram per packet on a socket, no D-Bus round
        /// trip; falls back to `writeValue` when BlueZ refuses (NotSupported, NotPermitted, Failed).
        case acquireWrite = "acquire-write"
        /// `GattCharacteristic1.WriteValue` with `type` = `command`: one D-Bus call per packet.
        case writeValue = "write-value"
    }

    /// The environment variable that overrides the bus address (for tests on a private bus).
    public static let busAddressEnvironment = "OTAFLASH_DBUS_ADDRESS"
    /// The system bus's default address (D-Bus specification, "Well-known Message Bus Instances").
    public static let systemBusAddress = "unix:path=/var/run/dbus/system_bus_socket"

    /// The adapter's name (`hci0`), or nil for the first powered one.
    public let adapter: String?
    public let writePath: WritePath
    /// The D-Bus address used.
    public let busAddress: String
    public let clock: any MonotonicClock
    let logger: Logger
    /// The user did not ask for pairing (no --pair): each link registers an agent that refuses
    /// the pairings bluetoothd's stack starts by itself and reports them (`StackPairing`).
    public var refusesStackPairing = false

    /// - Parameters:
    ///   - adapter: `hciN`; nil picks the first powered adapter (doc/org.bluez.Adapter.rst, "Powered").
    ///   - writePath: how write-without-response packets are sent.
    ///   - busAddress: a D-Bus address; nil reads `OTAFLASH_DBUS_ADDRESS`, then
    ///     `DBUS_SYSTEM_BUS_ADDRESS`, then uses the system bus socket.
    public init(adapter: String? = nil, writePath: WritePath = .acquireWrite, busAddress: String? = nil,
                logger: Logger = Logger(label: "otaflash.bluez")) {
        self.adapter = adapter
        self.writePath = writePath
        self.busAddress = busAddress ?? Self.environmentBusAddress()
        self.clock = SystemClock()
        self.logger = logger
    }

    static func environmentBusAddress() -> String {
        for name in [busAddressEnvironment, "DBUS_SYSTEM_BUS_ADDRESS"] {
            if let value = getenv(name), value.pointee != 0 { return String(cString: value) }
        }
        return systemBusAddress
    }

    // MARK: Bus and adapter

    func openBus() async throws(GATTError) -> DBusConnection {
        do {
            return try await DBusConnection.connect(address: busAddress, timeout: .seconds(5))
        } catch {
            throw BlueZErrors.mapBusConnect(error, address: busAddress)
        }
    }

    static func managedObjects(_ bus: DBusConnection, timeout: Duration = .seconds(10)) async throws(GATTError) -> DBusManagedObjects {
        do {
            return try await bus.getManagedObjects(destination: BlueZ.service, path: "/", timeout: timeout)
        } catch {
            throw BlueZErrors.map(error, "listing BlueZ's objects (GetManagedObjects on org.bluez)", timeout: timeout)
        }
    }

    /// The adapter to use: `--adapter hciN`, else the first powered one (by path).
    func resolveAdapter(_ objects: DBusManagedObjects) throws(GATTError) -> String {
        let adapters = objects.filter { $0.value[BlueZ.adapter] != nil }.keys.sorted()
        let names = adapters.map(BlueZ.adapterName)
        if let adapter {
            guard !adapter.isEmpty, adapter.allSatisfy({ $0.isLetter || $0.isNumber || $0 == "_" }) else {
                throw GATTError(.adapterUnavailable, "invalid adapter name '\(adapter)': expected a name like hci0")
            }
            let path = "/org/bluez/\(adapter)"
            guard let properties = objects[path]?[BlueZ.adapter] else {
                let available = names.isEmpty ? "none found" : "available: " + names.joined(separator: ", ")
                throw GATTError(.adapterUnavailable, "Bluetooth adapter \(adapter) not found (\(available)): check `bluetoothctl list` and pass --adapter with one of them")
            }
            guard properties["Powered"]?.bool == true else {
                throw GATTError(.adapterUnavailable, "Bluetooth adapter \(adapter) is powered off: \(BlueZErrors.powerOnHint(adapter))")
            }
            return path
        }
        guard !adapters.isEmpty else {
            throw GATTError(.adapterUnavailable, "no Bluetooth adapter found by bluetoothd: plug one in or unblock it (`rfkill unblock bluetooth`), then check `bluetoothctl list`")
        }
        guard let powered = adapters.first(where: { objects[$0]?[BlueZ.adapter]?["Powered"]?.bool == true }) else {
            let which = names.count == 1 ? "Bluetooth adapter \(names[0]) is" : "every Bluetooth adapter (\(names.joined(separator: ", "))) is"
            throw GATTError(.adapterUnavailable, "\(which) powered off: \(BlueZErrors.powerOnHint(names[0]))")
        }
        return powered
    }

    /// Checks that bluetoothd answers and the adapter is there and powered, without scanning or
    /// connecting: a batch asks once before it starts, instead of failing every device alike.
    public func checkAvailable() async throws(GATTError) {
        let bus = try await openBus()
        let objects: DBusManagedObjects
        do {
            objects = try await Self.managedObjects(bus)
        } catch {
            await bus.close()
            throw error
        }
        await bus.close()
        _ = try resolveAdapter(objects)
    }

    // MARK: Scan

    /// Discovers LE devices for `timeout` (doc/org.bluez.Adapter.rst, "SetDiscoveryFilter",
    /// "StartDiscovery", "StopDiscovery"). Devices come from `InterfacesAdded`/`PropertiesChanged`
    /// during the scan plus what BlueZ already knew; `StopDiscovery` is always sent.
    public func scan(filter: ScanFilter, timeout: Duration) async throws(GATTError) -> [Advertisement] {
        let bus = try await openBus()
        let subscriptions = Mutex<[DBusSubscriptionID]>([])
        defer {
            let ids = subscriptions.withLock { $0 }
            Task {
                for id in ids { await bus.unsubscribe(id) }
                await bus.close()
            }
        }
        let adapterPath = try resolveAdapter(try await Self.managedObjects(bus))
        let adapterName = BlueZ.adapterName(adapterPath)
        let seen = SeenDevices()
        do {
            let ids = try await subscribeDevices(bus, adapterPath: adapterPath, seen: seen)
            subscriptions.withLock { $0 = ids }
        } catch {
            throw BlueZErrors.map(error, "watching for devices on \(adapterName)")
        }
        // Devices BlueZ already knows (the subscription is live, so nothing falls in between).
        let known = try await Self.managedObjects(bus)
        record(known, adapterPath: adapterPath, into: seen)

        try await discover(bus, adapterPath: adapterPath, uuids: filter.serviceUUIDs) { () async throws(GATTError) in
            let end = clock.now + timeout
            var round = 0
            while clock.now < end {
                do {
                    try await clock.sleep(until: min(end, clock.now + Self.rediscoverEvery))
                } catch {
                    throw GATTError(.failed, "scanning on \(adapterName) was cancelled")
                }
                if clock.now < end { await restartDiscovery(bus, adapterPath: adapterPath, uuids: filter.serviceUUIDs, round: round) }
                round += 1
            }
        }
        // Properties as they stand now (RSSI and names that arrived last).
        if let final = try? await Self.managedObjects(bus) { record(final, adapterPath: adapterPath, into: seen) }
        let ads = seen.withLock { $0.values.map(\.advertisement) }.filter(filter.matches)
        logger.debug("scan finished", metadata: ["adapter": "\(adapterName)", "seen": "\(seen.withLock { $0.count })", "matched": "\(ads.count)"])
        return ads.sorted { ($0.rssi ?? Int.min, $1.address.description) > ($1.rssi ?? Int.min, $0.address.description) }
    }

    private func record(_ objects: DBusManagedObjects, adapterPath: String, into seen: SeenDevices) {
        for (path, interfaces) in objects where path.hasPrefix(adapterPath + "/") {
            guard let properties = interfaces[BlueZ.device], var device = DeviceRecord(properties) else { continue }
            seen.withLock { s in
                if let old = s[path] {
                    if device.rssi == nil { device.rssi = old.rssi }
                    if device.name == nil { device.name = old.name }
                }
                s[path] = device
            }
        }
    }

    /// Follows `Device1` objects under the adapter: `InterfacesAdded` and `PropertiesChanged`.
    private func subscribeDevices(_ bus: DBusConnection, adapterPath: String, seen: SeenDevices) async throws -> [DBusSubscriptionID] {
        let added = try await bus.subscribe(.objectManager(sender: BlueZ.service, path: "/", member: "InterfacesAdded")) { signal in
            guard let (path, interfaces) = signal.interfacesAdded, path.hasPrefix(adapterPath + "/"),
                  let properties = interfaces[BlueZ.device], let device = DeviceRecord(properties) else { return }
            seen.withLock { $0[path] = device }
        }
        let changed = try await bus.subscribe(.propertiesChanged(sender: BlueZ.service, pathNamespace: adapterPath, interface: BlueZ.device)) { signal in
            guard let (_, changed) = signal.propertiesChanged else { return }
            seen.withLock { s in s[signal.path]?.apply(changed) }
        }
        return [added, changed]
    }

    /// LE only, devices with one of `uuids` (any when empty), no repeated reports.
    static func discoveryFilter(_ uuids: [BluetoothUUID]) -> [String: DBusValue] {
        var filter: [String: DBusValue] = ["Transport": .string("le"), "DuplicateData": .bool(false)]
        if !uuids.isEmpty { filter["UUIDs"] = .strings(uuids.map(\.description)) }
        return filter
    }

    /// How often the scan is restarted while a scan goes on. The kernel asks the controller to
    /// filter duplicate advertising reports, so an advertiser is reported once per scan enable;
    /// a report that arrives before the kernel marks discovery active, or before bluetoothd has
    /// the answer to its start command (src/adapter.c drops reports while its `discovering` is
    /// false), is lost, and that device would stay unseen for the rest of the scan (seen with
    /// btvirt's controllers, which report at once, scripts/bluez-vm/README.md "Pitfalls").
    /// Enabling the scan again has it reported again.
    public static let rediscoverEvery: Duration = .seconds(2)

    /// Restarts the scan, two ways in turn (`round` counts the restarts):
    /// - even rounds: a second client of ours starts and stops a discovery of its own with
    ///   `Transport` "auto". Each changes the filter bluetoothd merges from its clients, and
    ///   bluetoothd restarts the scan for it while its own discovery stays on, so the report that
    ///   comes at once after the restart is kept (src/adapter.c, `update_discovery_filter`,
    ///   `start_discovery_timeout`). An adapter without BR/EDR merges the same filter, and nothing
    ///   is restarted;
    /// - odd rounds: StopDiscovery, the filter again (bluetoothd drops a client's filter with its
    ///   discovery) and StartDiscovery, which restarts any adapter but ends bluetoothd's
    ///   discovery in between.
    /// Failures are only logged (the scan goes on with what it has).
    private func restartDiscovery(_ bus: DBusConnection, adapterPath: String, uuids: [BluetoothUUID], round: Int) async {
        let adapterName = BlueZ.adapterName(adapterPath)
        func call(_ bus: DBusConnection, _ member: String, _ arguments: [DBusValue] = []) async -> Bool {
            do {
                _ = try await bus.call(destination: BlueZ.service, path: adapterPath, interface: BlueZ.adapter,
                                       member: member, arguments: arguments, timeout: .seconds(5))
                return true
            } catch {
                logger.debug("restarting discovery: \(member) failed", metadata: ["adapter": "\(adapterName)", "error": "\(error)"])
                return false
            }
        }
        if round % 2 == 0, let second = try? await openBus() {
            var filter = Self.discoveryFilter(uuids)
            filter["Transport"] = .string("auto")
            if await call(second, "SetDiscoveryFilter", [.vardict(filter)]), await call(second, "StartDiscovery") {
                _ = await call(second, "StopDiscovery")
            }
            await second.close()
            return
        }
        _ = await call(bus, "StopDiscovery")
        _ = await call(bus, "SetDiscoveryFilter", [.vardict(Self.discoveryFilter(uuids))])
        _ = await call(bus, "StartDiscovery")
    }

    /// Runs `body` with discovery on: SetDiscoveryFilter(Transport le, UUIDs, DuplicateData
    /// false), StartDiscovery, then StopDiscovery whatever happened (in a task of its own, so a
    /// cancelled caller still stops it).
    func discover(_ bus: DBusConnection, adapterPath: String, uuids: [BluetoothUUID],
                  _ body: () async throws(GATTError) -> Void) async throws(GATTError) {
        let adapterName = BlueZ.adapterName(adapterPath)
        do {
            _ = try await bus.call(destination: BlueZ.service, path: adapterPath, interface: BlueZ.adapter,
                                   member: "SetDiscoveryFilter", arguments: [.vardict(Self.discoveryFilter(uuids))], timeout: .seconds(10))
            _ = try await bus.call(destination: BlueZ.service, path: adapterPath, interface: BlueZ.adapter,
                                   member: "StartDiscovery", timeout: .seconds(10))
        } catch {
            let mapped = BlueZErrors.map(error, "starting discovery on \(adapterName)", timeout: .seconds(10))
            if mapped.code == .adapterUnavailable {
                throw GATTError(.adapterUnavailable, "Bluetooth adapter \(adapterName) is not ready for discovery (\((error as? DBusError)?.description ?? "\(error)")): \(BlueZErrors.powerOnHint(adapterName))")
            }
            throw mapped
        }
        let stop = { [logger] in
            await Task {
                do {
                    _ = try await bus.call(destination: BlueZ.service, path: adapterPath, interface: BlueZ.adapter,
                                           member: "StopDiscovery", timeout: .seconds(5))
                } catch {
                    logger.debug("StopDiscovery failed", metadata: ["adapter": "\(adapterName)", "error": "\(error)"])
                }
            }.value
        }
        do {
            try await body()
        } catch {
            await stop()
            throw error
        }
        await stop()
    }

    // MARK: Connect

    /// Connects to a device and waits until its GATT services are exported.
    ///
    /// doc/org.bluez.Device.rst, "Connect": a device BlueZ does not know yet is first looked for
    /// with a short LE scan (within `timeout`). The `Connect` reply plus `Properties.Get(Connected)`
    /// count as connected — the `Connected` PropertiesChanged signal does not always come — and
    /// then `ServicesResolved` is awaited (subscribed before it is read, so the change cannot slip
    /// between) and the object tree is read again, since the objects may be exported after it.
    public func connect(to address: DeviceAddress, timeout: Duration) async throws(GATTError) -> any GATTConnection {
        let deadline = clock.now + timeout
        let bus = try await openBus()
        do {
            return try await connect(bus, address: address, timeout: timeout, deadline: deadline)
        } catch {
            await bus.close()
            throw error
        }
    }

    private func connect(_ bus: DBusConnection, address: DeviceAddress, timeout: Duration, deadline: Duration) async throws(GATTError) -> BlueZConnection {
        let adapterPath = try resolveAdapter(try await Self.managedObjects(bus))
        let adapterName = BlueZ.adapterName(adapterPath)
        let devicePath = BlueZ.devicePath(adapterPath: adapterPath, address: address)
        let link = BlueZConnection(bus: bus, peer: address.description, adapterPath: adapterPath,
                                   devicePath: devicePath, writePath: writePath, clock: clock, logger: logger)
        do {
            try await link.watch()
        } catch {
            throw BlueZErrors.map(error, "watching \(address) on \(adapterName)")
        }
        if refusesStackPairing { await link.refuseStackPairing() }
        do {
            try await establish(link, bus: bus, address: address, timeout: timeout, deadline: deadline)
            return link
        } catch {
            await link.abandon()
            throw error
        }
    }

    private func remaining(_ deadline: Duration) -> Duration { max(.zero, deadline - clock.now) }

    private func establish(_ link: BlueZConnection, bus: DBusConnection, address: DeviceAddress,
                           timeout: Duration, deadline: Duration) async throws(GATTError) {
        let adapterName = BlueZ.adapterName(link.adapterPath)
        let devicePath = link.devicePath
        var objects = try await Self.managedObjects(bus)
        if objects[devicePath]?[BlueZ.device] == nil {
            logger.debug("device unknown to BlueZ; scanning for it", metadata: ["device": "\(address)"])
            try await discover(bus, adapterPath: link.adapterPath, uuids: []) { () async throws(GATTError) in
                var round = 0
                while remaining(deadline) > .zero {
                    if await link.state.wait(timeout: min(remaining(deadline), Self.rediscoverEvery), until: { $0.deviceKnown }) { return }
                    if remaining(deadline) > .zero { await restartDiscovery(bus, adapterPath: link.adapterPath, uuids: [], round: round) }
                    round += 1
                }
            }
            objects = try await Self.managedObjects(bus)
            guard objects[devicePath]?[BlueZ.device] != nil else {
                throw GATTError(.deviceNotFound, "device \(address) not found on \(adapterName) within \(formatSeconds(timeout)) of scanning")
            }
        }

        // Connect (doc/org.bluez.Device.rst): returns once the link is up, or an error.
        let connectTimeout = max(remaining(deadline), .milliseconds(1))
        link.connectIssued()
        do {
            _ = try await bus.call(destination: BlueZ.service, path: devicePath, interface: BlueZ.device,
                                   member: "Connect", timeout: connectTimeout)
        } catch let error as DBusError where error.name == BlueZErrorName.alreadyConnected {
            logger.debug("already connected", metadata: ["device": "\(address)"])
        } catch {
            if let error = error as? DBusError, error.isTimeout {
                // Cancels the pending connection attempt (Disconnect aborts a Connect in progress).
                _ = try? await bus.call(destination: BlueZ.service, path: devicePath, interface: BlueZ.device,
                                        member: "Disconnect", timeout: .seconds(2))
            }
            throw BlueZErrors.mapConnect(error, device: address.description, adapter: adapterName, timeout: timeout)
        }
        guard try await link.readDeviceFlag("Connected") else {
            throw GATTError(.connectFailed, "connecting to \(address) on \(adapterName) failed: Connect returned but the device is not connected")
        }
        link.state.update { $0.connected = true }

        // ServicesResolved (doc/org.bluez.Device.rst): the watch is live, so read, then wait.
        if try await link.readDeviceFlag("ServicesResolved") { link.state.update { $0.servicesResolved = true } }
        let resolved = await link.state.wait(timeout: remaining(deadline)) { $0.servicesResolved || !$0.connected }
        guard link.state.value.connected else {
            throw GATTError(.connectFailed, "connecting to \(address) on \(adapterName) failed: the device disconnected while its services were being resolved")
        }
        objects = try await Self.managedObjects(bus)
        var services = gattServices(in: objects, devicePath: devicePath)
        if services.isEmpty {
            // ServicesResolved can come before the objects are exported: give them a moment.
            let added = link.state.value.servicesAdded
            let grace = min(remaining(deadline), .seconds(2))
            if await link.state.wait(timeout: grace, until: { $0.servicesAdded > added }) {
                objects = try await Self.managedObjects(bus)
                services = gattServices(in: objects, devicePath: devicePath)
            }
        }
        if !resolved {
            guard !services.isEmpty else {
                throw GATTError(.timeout, "services of \(address) were not resolved within \(formatSeconds(timeout)) of connecting on \(adapterName)")
            }
            logger.debug("ServicesResolved never became true; using the exported services", metadata: ["device": "\(address)"])
        }
        link.arm(services: services)
        logger.debug("connected", metadata: ["device": "\(address)", "adapter": "\(adapterName)", "services": "\(services.count)"])
    }
}

/// Devices a scan saw, by object path.
final class SeenDevices: Sendable {
    private let devices = Mutex<[String: DeviceRecord]>([:])
    func withLock<R>(_ body: (inout [String: DeviceRecord]) -> R) -> R { devices.withLock { body(&$0) } }
}
