import DBus
import GATT

/// An LE advertisement registered through `org.bluez.LEAdvertisingManager1`
/// (BlueZ doc/org.bluez.LEAdvertisement.rst and org.bluez.LEAdvertisingManager.rst; 5.66:
/// doc/advertising-api.txt).
///
/// The object exports `org.bluez.LEAdvertisement1` with `Type` "peripheral" (connectable),
/// `Discoverable`, `ServiceUUIDs` and `LocalName`, and a `Release` method that bluetoothd calls when it drops the
/// advertisement on its own (for instance when the adapter powers off). BlueZ builds the
/// advertising data itself: a 128-bit service UUID takes 18 of the 31 bytes, so the name goes into
/// the scan response when it does not fit (src/advertising.c, `generate_scan_rsp`).
public actor PeripheralAdvertisement {
    public static let interface = "org.bluez.LEAdvertisement1"
    public static let managerInterface = "org.bluez.LEAdvertisingManager1"

    public nonisolated let connection: DBusConnection
    public nonisolated let path: String
    public let localName: String?
    public let serviceUUIDs: [BluetoothUUID]
    private var registeredOn: String?
    private var isExported = false
    private var released = false

    public init(connection: DBusConnection, path: String, localName: String?, serviceUUIDs: [BluetoothUUID]) {
        self.connection = connection
        self.path = path
        self.localName = localName
        self.serviceUUIDs = serviceUUIDs
    }

    /// True after bluetoothd called `Release`: the advertisement is gone.
    public var wasReleased: Bool { released }

    public func export() async throws {
        var properties: [String: DBusValue] = [
            "Type": .string("peripheral"),
            "ServiceUUIDs": .strings(serviceUUIDs.map(\.description)),
            // The LE General Discoverable flag, as a device waiting for an update advertises.
            // Without it BlueZ sets no flags on an adapter that is not discoverable, and
            // bluetoothd makes no device object for a report of an unknown advertiser without
            // them that arrives before its own discovery start has completed
            // (src/adapter.c, update_found_devices); a controller reporting once per scan start
            // then hides the device (scripts/bluez-vm/README.md, "Pitfalls").
            "Discoverable": .bool(true),
        ]
        if let localName { properties["LocalName"] = .string(localName) }
        try await connection.export(path: path, interfaces: [
            DBusInterface(name: Self.interface, methods: [
                "Release": { [weak self] _ in
                    await self?.markReleased()
                    return []
                },
            ], properties: properties),
        ])
        isExported = true
    }

    private func markReleased() {
        released = true
        registeredOn = nil
    }

    /// `LEAdvertisingManager1.RegisterAdvertisement(path, {})` on `adapterPath`.
    public func register(on adapterPath: String, timeout: Duration = .seconds(20)) async throws {
        _ = try await connection.call(
            destination: "org.bluez", path: adapterPath, interface: Self.managerInterface, member: "RegisterAdvertisement",
            arguments: [.objectPath(path), .vardict([:])], timeout: timeout)
        registeredOn = adapterPath
        released = false
    }

    /// `LEAdvertisingManager1.UnregisterAdvertisement(path)`, if still registered.
    public func unregister(timeout: Duration = .seconds(5)) async throws {
        guard let adapterPath = registeredOn else { return }
        registeredOn = nil
        _ = try await connection.call(
            destination: "org.bluez", path: adapterPath, interface: Self.managerInterface, member: "UnregisterAdvertisement",
            arguments: [.objectPath(path)], timeout: timeout)
    }

    public func unexport() async {
        guard isExported else { return }
        isExported = false
        await connection.unexport(path: path)
    }
}
