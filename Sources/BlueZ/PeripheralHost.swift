import DBus
import GATT
#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// Why peripheral mode could not start or keep serving. `kind` picks the exit code.
public struct PeripheralError: Error, Sendable, CustomStringConvertible {
    public enum Kind: Sendable, Hashable {
        /// bluetoothd missing, no such adapter, adapter off, registration refused.
        case bluetoothUnavailable
        /// D-Bus policy refused a call (not root, not in the bluetooth group).
        case permission
    }

    public var kind: Kind
    public var message: String

    public init(_ kind: Kind, _ message: String) {
        self.kind = kind
        self.message = message
    }

    public var description: String { message }

    /// Maps a D-Bus failure of `operation` to one line.
    public static func from(_ error: any Error, _ operation: String) -> PeripheralError {
        if let error = error as? PeripheralError { return error }
        guard let error = error as? DBusError else {
            return PeripheralError(.bluetoothUnavailable, "\(operation) failed: \(error)")
        }
        if BlueZErrors.isStackMissing(error) { return PeripheralError(.bluetoothUnavailable, BlueZErrors.stackMessage(error)) }
        switch error.name {
        case "org.freedesktop.DBus.Error.AccessDenied", "org.bluez.Error.NotAuthorized":
            return PeripheralError(.permission, "D-Bus denied \(operation) (\(error.description)): run otaflash as root or add your user to the bluetooth group")
        default:
            if error.isTimeout { return PeripheralError(.bluetoothUnavailable, "\(operation): bluetoothd did not answer in time") }
            return PeripheralError(.bluetoothUnavailable, "\(operation) failed: \(error.description)")
        }
    }
}

/// The BlueZ side of peripheral mode: the bus connection, the chosen adapter, and the link
/// operations a device needs (drop a central, power-cycle the radio, watch connections).
public actor PeripheralHost {
    /// Overrides the bus address (tests point it at a private dbus-daemon with a stand-in BlueZ).
    public static let busAddressEnvironment = "OTAFLASH_DBUS_ADDRESS"
    public static let systemBusAddress = "unix:path=/var/run/dbus/system_bus_socket"
    static let adapterInterface = "org.bluez.Adapter1"
    static let deviceInterface = "org.bluez.Device1"

    public nonisolated let connection: DBusConnection
    /// `hciN`.
    public nonisolated let adapter: String
    /// `/org/bluez/hciN`.
    public nonisolated let adapterPath: String
    /// The adapter's Bluetooth address, as BlueZ reports it.
    public nonisolated let address: String?

    private init(connection: DBusConnection, adapter: String, address: String?) {
        self.connection = connection
        self.adapter = adapter
        self.adapterPath = "/org/bluez/\(adapter)"
        self.address = address
    }

    /// `OTAFLASH_DBUS_ADDRESS`, else `DBUS_SYSTEM_BUS_ADDRESS`, else the system bus socket.
    public static func defaultBusAddress() -> String {
        for name in [busAddressEnvironment, "DBUS_SYSTEM_BUS_ADDRESS"] {
            if let value = getenv(name), value.pointee != 0 { return String(cString: value) }
        }
        return systemBusAddress
    }

    /// Connects to the bus and picks the adapter: `adapter` (`hciN`) or, when nil, the first
    /// powered one (doc/org.bluez.Adapter.rst, "Powered"). The adapter must be powered and offer
    /// `GattManager1` and `LEAdvertisingManager1`.
    public static func open(adapter: String?, busAddress: String = defaultBusAddress()) async throws -> PeripheralHost {
        let connection: DBusConnection
        do {
            connection = try await DBusConnection.connect(address: busAddress, timeout: .seconds(10))
        } catch {
            if let e = error as? DBusError, e.name == "org.freedesktop.DBus.Error.AccessDenied" {
                throw PeripheralError.from(e, "connecting to the D-Bus system bus")
            }
            throw PeripheralError(.bluetoothUnavailable, "cannot connect to the D-Bus system bus at \(busAddress) (\(error)): is dbus running?")
        }
        do {
            let objects: DBusManagedObjects
            do {
                objects = try await connection.getManagedObjects(destination: "org.bluez", path: "/", timeout: .seconds(10))
            } catch {
                throw PeripheralError.from(error, "listing BlueZ adapters")
            }
            let adapters = objects.filter { $0.value[adapterInterface] != nil }
                .map { (name: String($0.key.split(separator: "/").last ?? ""), path: $0.key, interfaces: $0.value) }
                .sorted { $0.path < $1.path }
            guard !adapters.isEmpty else {
                throw PeripheralError(.bluetoothUnavailable, "bluetoothd has no Bluetooth adapter")
            }
            let chosen: (name: String, path: String, interfaces: [String: [String: DBusValue]])
            if let adapter {
                guard let found = adapters.first(where: { $0.name == adapter }) else {
                    throw PeripheralError(.bluetoothUnavailable, "no adapter \(adapter); bluetoothd has \(adapters.map(\.name).joined(separator: ", "))")
                }
                guard found.interfaces[adapterInterface]?["Powered"]?.bool == true else {
                    throw PeripheralError(.bluetoothUnavailable, "adapter \(adapter) is powered off: power it on with `bluetoothctl select <its address>` and `bluetoothctl power on`")
                }
                chosen = found
            } else {
                guard let found = adapters.first(where: { $0.interfaces[adapterInterface]?["Powered"]?.bool == true }) else {
                    throw PeripheralError(.bluetoothUnavailable, "no powered Bluetooth adapter (\(adapters.map(\.name).joined(separator: ", ")) \(adapters.count == 1 ? "is" : "are") off): power one on with `bluetoothctl power on`")
                }
                chosen = found
            }
            for (interface, what) in [(PeripheralApplication.managerInterface, "GATT server applications"),
                                      (PeripheralAdvertisement.managerInterface, "LE advertising")]
            where chosen.interfaces[interface] == nil {
                throw PeripheralError(.bluetoothUnavailable, "adapter \(chosen.name) does not offer \(interface): it cannot host \(what)")
            }
            return PeripheralHost(connection: connection, adapter: chosen.name,
                                  address: chosen.interfaces[adapterInterface]?["Address"]?.string)
        } catch {
            await connection.close()
            throw error
        }
    }

    /// Drops the link to `device` (a `Device1` path) with `Device1.Disconnect`
    /// (doc/org.bluez.Device.rst); when that fails or no device is known, power-cycles the
    /// adapter, which drops every link. Returns what was done.
    @discardableResult
    public func dropLink(device: String?) async -> String {
        if let device {
            do {
                _ = try await connection.call(destination: "org.bluez", path: device, interface: Self.deviceInterface,
                                              member: "Disconnect", timeout: .seconds(5))
                return "disconnected \(device)"
            } catch {
                let cycled = await powerCycle()
                return "Device1.Disconnect failed (\(error)); \(cycled)"
            }
        }
        return await powerCycle()
    }

    /// Sets the adapter's `Powered` to false, then true again.
    public func powerCycle() async -> String {
        do {
            try await connection.setProperty(destination: "org.bluez", path: adapterPath, interface: Self.adapterInterface,
                                             name: "Powered", value: .bool(false), timeout: .seconds(5))
            try await connection.setProperty(destination: "org.bluez", path: adapterPath, interface: Self.adapterInterface,
                                             name: "Powered", value: .bool(true), timeout: .seconds(5))
            return "power-cycled \(adapter)"
        } catch {
            return "power-cycling \(adapter) failed: \(error)"
        }
    }

    /// Calls `handler(devicePath, connected)` whenever bluetoothd reports a `Device1.Connected`
    /// change below this adapter (`PropertiesChanged` on `org.bluez.Device1`).
    public func watchConnections(_ handler: @escaping @Sendable (String, Bool) -> Void) async throws {
        try await connection.subscribe(.propertiesChanged(sender: "org.bluez", pathNamespace: adapterPath, interface: Self.deviceInterface)) { signal in
            guard signal.arguments.count >= 2, let changed = signal.arguments[1].vardict,
                  let connected = changed["Connected"]?.bool else { return }
            handler(signal.path, connected)
        }
    }

    public func close() async {
        await connection.close()
    }
}
