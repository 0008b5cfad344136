/// A Bluetooth device address, `AA:BB:CC:DD:EE:FF`.
public struct DeviceAddress: Hashable, Sendable, CustomStringConvertible {
    /// Upper-case, colon-separated: the form BlueZ uses in `Device1.Address` and object paths.
    public let description: String

    /// The six bytes, most significant first.
    public let bytes: [UInt8]

    /// Accepts six colon- or dash-separated hex pairs, in either case; nil otherwise. Only ASCII
    /// digits count (`Character.isHexDigit` also takes their fullwidth forms).
    public init?(_ text: String) {
        let parts = text.split(separator: text.contains("-") ? "-" : ":", omittingEmptySubsequences: false)
        let bytes = parts.compactMap { part in part.count == 2 && part.allSatisfy({ $0.isASCII && $0.isHexDigit }) ? UInt8(part, radix: 16) : nil }
        guard parts.count == 6, bytes.count == 6 else { return nil }
        self.init(bytes[0], bytes[1], bytes[2], bytes[3], bytes[4], bytes[5])
    }

    /// The address of these six bytes, most significant first.
    public init(_ b0: UInt8, _ b1: UInt8, _ b2: UInt8, _ b3: UInt8, _ b4: UInt8, _ b5: UInt8) {
        bytes = [b0, b1, b2, b3, b4, b5]
        let digits = Array("0123456789ABCDEF")
        description = bytes.map { String([digits[Int($0 >> 4)], digits[Int($0 & 0x0F)]]) }.joined(separator: ":")
    }
}

/// Characteristic properties, named as BlueZ names them in `GattCharacteristic1.Flags`.
public struct CharacteristicProperties: OptionSet, Hashable, Sendable, CustomStringConvertible {
    public let rawValue: UInt16
    public init(rawValue: UInt16) { self.rawValue = rawValue }

    public static let broadcast = CharacteristicProperties(rawValue: 1 << 0)
    public static let read = CharacteristicProperties(rawValue: 1 << 1)
    public static let writeWithoutResponse = CharacteristicProperties(rawValue: 1 << 2)
    public static let write = CharacteristicProperties(rawValue: 1 << 3)
    public static let notify = CharacteristicProperties(rawValue: 1 << 4)
    public static let indicate = CharacteristicProperties(rawValue: 1 << 5)
    public static let authenticatedSignedWrites = CharacteristicProperties(rawValue: 1 << 6)
    public static let reliableWrite = CharacteristicProperties(rawValue: 1 << 7)
    public static let encryptWrite = CharacteristicProperties(rawValue: 1 << 8)
    public static let encryptRead = CharacteristicProperties(rawValue: 1 << 9)

    /// BlueZ flag string for each property (doc/org.bluez.GattCharacteristic.rst, "Flags").
    public static let bluezFlags: [(CharacteristicProperties, String)] = [
        (.broadcast, "broadcast"), (.read, "read"), (.writeWithoutResponse, "write-without-response"),
        (.write, "write"), (.notify, "notify"), (.indicate, "indicate"),
        (.authenticatedSignedWrites, "authenticated-signed-writes"), (.reliableWrite, "reliable-write"),
        (.encryptWrite, "encrypt-write"), (.encryptRead, "encrypt-read"),
    ]

    /// Parses BlueZ's `Flags`; unknown flags (e.g. `secure-write`) are ignored.
    public init(bluezFlags flags: [String]) {
        var p: CharacteristicProperties = []
        for (property, name) in Self.bluezFlags where flags.contains(name) { p.insert(property) }
        self = p
    }

    public var bluezFlagNames: [String] {
        Self.bluezFlags.filter { contains($0.0) }.map(\.1)
    }

    public var description: String { bluezFlagNames.joined(separator: ",") }
}

/// How a value is written (ATT Write Request or Write Command).
public enum WriteType: String, Sendable, Hashable {
    /// ATT Write Request: the peer acknowledges; BlueZ `WriteValue` option `type` = `request`.
    case withResponse
    /// ATT Write Command: no acknowledgement; BlueZ `type` = `command`.
    case withoutResponse

    /// The property a characteristic must have for this write type.
    public var requiredProperty: CharacteristicProperties {
        self == .withResponse ? .write : .writeWithoutResponse
    }
}

/// A characteristic found by discovery.
public struct GATTCharacteristic: Hashable, Sendable, CustomStringConvertible {
    public let uuid: BluetoothUUID
    public let properties: CharacteristicProperties
    /// The transport's handle for it: a D-Bus object path for BlueZ, an attribute handle in the simulator.
    public let id: String

    public init(uuid: BluetoothUUID, properties: CharacteristicProperties, id: String) {
        self.uuid = uuid
        self.properties = properties
        self.id = id
    }

    /// Write without response when the characteristic allows it, else write with response.
    public var preferredWriteType: WriteType? {
        if properties.contains(.writeWithoutResponse) { return .withoutResponse }
        if properties.contains(.write) { return .withResponse }
        return nil
    }

    /// Throws `GATTError.notPermitted` naming the characteristic and the missing property.
    public func require(_ property: CharacteristicProperties, for operation: String) throws(GATTError) {
        guard properties.contains(property) else {
            throw GATTError(.notPermitted,
                            "\(operation) is not permitted on characteristic \(uuid): it lacks the "
                                + "'\(property.description)' property (it has '\(properties.description)')")
        }
    }

    public var description: String { "\(uuid) [\(properties)]" }
}

/// A primary service and its characteristics.
public struct GATTService: Hashable, Sendable {
    public let uuid: BluetoothUUID
    public let characteristics: [GATTCharacteristic]
    public let id: String

    public init(uuid: BluetoothUUID, characteristics: [GATTCharacteristic], id: String) {
        self.uuid = uuid
        self.characteristics = characteristics
        self.id = id
    }

    public func characteristic(_ uuid: BluetoothUUID) -> GATTCharacteristic? {
        characteristics.first { $0.uuid == uuid }
    }

    /// The characteristic with this UUID, or a `characteristicNotFound` error naming it and the service.
    public func requireCharacteristic(_ uuid: BluetoothUUID, name: String) throws(GATTError) -> GATTCharacteristic {
        guard let c = characteristic(uuid) else {
            throw GATTError(.characteristicNotFound, "service \(self.uuid) has no \(name) characteristic \(uuid)")
        }
        return c
    }
}

/// What a scan saw of one device.
public struct Advertisement: Sendable, Hashable {
    public var address: DeviceAddress
    public var name: String?
    public var rssi: Int?
    public var serviceUUIDs: [BluetoothUUID]

    public init(address: DeviceAddress, name: String?, rssi: Int?, serviceUUIDs: [BluetoothUUID]) {
        self.address = address
        self.name = name
        self.rssi = rssi
        self.serviceUUIDs = serviceUUIDs
    }
}

/// Which advertisements a scan keeps.
public struct ScanFilter: Sendable, Hashable {
    public var serviceUUIDs: [BluetoothUUID]
    public var namePrefix: String?
    public var minimumRSSI: Int?

    public init(serviceUUIDs: [BluetoothUUID] = [], namePrefix: String? = nil, minimumRSSI: Int? = nil) {
        self.serviceUUIDs = serviceUUIDs
        self.namePrefix = namePrefix
        self.minimumRSSI = minimumRSSI
    }

    public func matches(_ ad: Advertisement) -> Bool {
        if !serviceUUIDs.isEmpty, !serviceUUIDs.contains(where: ad.serviceUUIDs.contains) { return false }
        if let prefix = namePrefix, !(ad.name ?? "").hasPrefix(prefix) { return false }
        if let floor = minimumRSSI, (ad.rssi ?? Int.min) < floor { return false }
        return true
    }
}

/// Why a link went down.
public enum DisconnectReason: Sendable, Hashable, CustomStringConvertible {
    /// We asked for it.
    case local
    /// The peer or the link went away (supervision timeout, peer reset, adapter off...).
    case linkLost(String)

    public var description: String {
        switch self {
        case .local: "disconnected by us"
        case .linkLost(let why): "link lost: \(why)"
        }
    }
}

/// An identifier for a write submitted with `GATTConnection.submitWrite`.
public struct WriteTicket: Hashable, Sendable {
    public let rawValue: UInt64
    public init(_ rawValue: UInt64) { self.rawValue = rawValue }
}

/// Something the peer or the link did. One ordered queue carries all of them, so that a
/// notification sent just before a disconnect is never seen after it.
public enum GATTEvent: Sendable {
    case notification(characteristicID: String, value: [UInt8])
    /// Completion of a write submitted with `submitWrite`.
    case writeCompleted(WriteTicket, GATTError?)
    case disconnected(DisconnectReason)
    /// The central's own stack paired (or tried to pair) with the peer without being asked to,
    /// because the peer refused an operation for want of security (see `StackPairing`).
    case stackPairing(StackPairing)
}

/// What one ATT write can carry, whatever the protocol above it.
public enum ATTWriteLimit {
    /// ATT header bytes of a write (opcode + handle): a write carries at most `mtu - 3` bytes.
    public static let overhead = 3
    /// The longest value one write may carry. An attribute value is at most 512 bytes (Core Spec
    /// Vol 3, Part F, 3.2.9), and BlueZ 5.66 counts the 2-byte handle against that limit and
    /// silently drops longer write commands, so a write carries at most 510.
    public static let maximumValue = 510

    /// The longest value one write carries at ATT MTU `mtu`: `min(mtu - 3, 510)`.
    public static func value(mtu: Int) -> Int { max(0, min(mtu - overhead, maximumValue)) }
}
