import DBus
import GATT

/// Names from BlueZ's D-Bus API (doc/org.bluez.Adapter.rst, doc/org.bluez.Device.rst,
/// doc/org.bluez.GattService.rst, doc/org.bluez.GattCharacteristic.rst).
enum BlueZ {
    static let service = "org.bluez"
    static let adapter = "org.bluez.Adapter1"
    static let device = "org.bluez.Device1"
    static let gattService = "org.bluez.GattService1"
    static let gattCharacteristic = "org.bluez.GattCharacteristic1"
    static let properties = "org.freedesktop.DBus.Properties"
    static let objectManager = "org.freedesktop.DBus.ObjectManager"

    /// `/org/bluez/hci0/dev_AA_BB_CC_DD_EE_FF` (doc/org.bluez.Device.rst, "Object path").
    static func devicePath(adapterPath: String, address: DeviceAddress) -> String {
        adapterPath + "/dev_" + address.description.replacing(":", with: "_")
    }

    /// `hci0` from `/org/bluez/hci0`.
    static func adapterName(_ path: String) -> String {
        path.split(separator: "/").last.map(String.init) ?? path
    }

    /// True when `path` is `parent` or below it.
    static func isBelow(_ path: String, _ parent: String) -> Bool {
        path == parent || path.hasPrefix(parent + "/")
    }
}

/// What one `Device1` object says about a device (doc/org.bluez.Device.rst, "Properties").
struct DeviceRecord: Sendable {
    var address: DeviceAddress
    var name: String?
    var rssi: Int?
    var uuids: [BluetoothUUID]

    init?(_ properties: [String: DBusValue]) {
        guard let text = properties["Address"]?.string, let address = DeviceAddress(text) else { return nil }
        self.address = address
        name = properties["Name"]?.string ?? properties["Alias"]?.string
        rssi = properties["RSSI"]?.integer
        uuids = (properties["UUIDs"]?.strings ?? []).compactMap(BluetoothUUID.init)
    }

    /// Applies a `PropertiesChanged` of `Device1`.
    mutating func apply(_ changed: [String: DBusValue]) {
        if let name = changed["Name"]?.string { self.name = name }
        else if name == nil, let alias = changed["Alias"]?.string { name = alias }
        if let rssi = changed["RSSI"]?.integer { self.rssi = rssi }
        if let uuids = changed["UUIDs"]?.strings { self.uuids = uuids.compactMap(BluetoothUUID.init) }
    }

    var advertisement: Advertisement {
        Advertisement(address: address, name: name, rssi: rssi, serviceUUIDs: uuids)
    }
}

extension DBusSignal {
    /// The `(interface, changed)` of a `PropertiesChanged` signal (D-Bus specification,
    /// "org.freedesktop.DBus.Properties").
    var propertiesChanged: (interface: String, changed: [String: DBusValue])? {
        guard interface == BlueZ.properties, member == "PropertiesChanged", arguments.count >= 2,
              let name = arguments[0].string, let changed = arguments[1].vardict else { return nil }
        return (name, changed)
    }

    /// The `(path, interfaces)` of `InterfacesAdded`.
    var interfacesAdded: (path: String, interfaces: [String: [String: DBusValue]])? {
        guard interface == BlueZ.objectManager, member == "InterfacesAdded", arguments.count >= 2,
              let path = arguments[0].objectPath, let entries = arguments[1].dictionary else { return nil }
        var interfaces: [String: [String: DBusValue]] = [:]
        for (key, value) in entries {
            if let name = key.string { interfaces[name] = value.vardict ?? [:] }
        }
        return (path, interfaces)
    }

    /// The `(path, interfaces)` of `InterfacesRemoved`.
    var interfacesRemoved: (path: String, interfaces: [String])? {
        guard interface == BlueZ.objectManager, member == "InterfacesRemoved", arguments.count >= 2,
              let path = arguments[0].objectPath, let names = arguments[1].strings else { return nil }
        return (path, names)
    }
}

/// The GATT database of one device as BlueZ exports it: `GattService1` objects below the device
/// path and their `GattCharacteristic1` children (doc/org.bluez.GattService.rst,
/// doc/org.bluez.GattCharacteristic.rst). Object paths are the ids.
func gattServices(in objects: DBusManagedObjects, devicePath: String) -> [GATTService] {
    var services: [GATTService] = []
    let below = objects.filter { $0.key.hasPrefix(devicePath + "/") }
    for (path, interfaces) in below.sorted(by: { $0.key < $1.key }) {
        guard let service = interfaces[BlueZ.gattService],
              service["Primary"]?.bool ?? true,
              let uuidText = service["UUID"]?.string, let uuid = BluetoothUUID(uuidText) else { continue }
        var characteristics: [GATTCharacteristic] = []
        for (charPath, charInterfaces) in below.sorted(by: { $0.key < $1.key }) {
            guard let c = charInterfaces[BlueZ.gattCharacteristic],
                  (c["Service"]?.objectPath ?? parentPath(charPath)) == path,
                  let text = c["UUID"]?.string, let charUUID = BluetoothUUID(text) else { continue }
            characteristics.append(GATTCharacteristic(
                uuid: charUUID, properties: CharacteristicProperties(bluezFlags: c["Flags"]?.strings ?? []), id: charPath))
        }
        services.append(GATTService(uuid: uuid, characteristics: characteristics, id: path))
    }
    return services
}

func parentPath(_ path: String) -> String {
    guard let slash = path.lastIndex(of: "/"), slash != path.startIndex else { return "/" }
    return String(path[..<slash])
}
