import GATT
import OTADevice
import OTAWire
import Synchronization

/// What a simulated peripheral is: its identity, GATT table, flash and link, and its faults.
public struct SimulatedDeviceConfig: Sendable {
    public var address: DeviceAddress
    public var name: String
    public var rssi: Int
    public var slotSize: Int
    public var firmwareVersion: FirmwareVersion
    public var manufacturer: String
    public var model: String
    public var link: LinkModel
    public var faults: FaultPlan
    /// What the device requires of the link before it serves its characteristics.
    public var security: LinkSecurity = .none
    /// With `security` `.authenticate`: the passkey the device expects (passkey entry); nil:
    /// the device pairs by numeric comparison, which the central must confirm.
    public var passkey: UInt32?

    /// The serial number its Device Information Service reports: `SIM` and the address's digits.
    public var serialNumber: String { "SIM" + address.description.filter { $0 != ":" } }
    /// False: the device's advertisement carries no service UUID (mcumgr's Mynewt `smp_svr`
    /// sample advertises only its name), so a scan cannot tell what it speaks without connecting.
    public var advertisesServices: Bool = true

    public init(address: DeviceAddress = DeviceAddress(0xC0, 0xFF, 0xEE, 0x00, 0x00, 0x01), name: String = "otaflash-sim",
                rssi: Int = -50, slotSize: Int = 1 << 20, firmwareVersion: FirmwareVersion = FirmwareVersion(major: 1, minor: 0, patch: 0),
                manufacturer: String = "otaflash", model: String = "simulated-peripheral",
                link: LinkModel = .default, faults: FaultPlan = .none) {
        self.address = address
        self.name = name
        self.rssi = rssi
        self.slotSize = slotSize
        self.firmwareVersion = firmwareVersion
        self.manufacturer = manufacturer
        self.model = model
        self.link = link
        self.faults = faults
    }

    /// From a device's last answer to its reboot into a new image: two connection intervals, time
    /// enough for the answer to go out.
    public var bootDelay: Duration { link.timed ? link.connectionInterval * 2 : .zero }
}

/// A simulated peripheral that outlives its connections: its flash and transfer state persist
/// across disconnects and reboots, as a real device's do.
///
/// It hosts any protocol's device model (`PeripheralModel`): the model says what the device
/// exposes and does, the device gives its characteristics handles and the link carries out the
/// model's timed outputs.
public final class SimulatedDevice: Sendable {
    public let config: SimulatedDeviceConfig
    let state: Mutex<DeviceState>

    struct DeviceState {
        var model: any PeripheralModel
        var connections = 0
        var connected = false
        /// The bond the central holds with the device: what re-encrypting with it reaches.
        var bond: LinkSecurity = .none
        /// The model's GATT table, and that table with attribute handles as characteristic ids.
        var tableSource: [PeripheralService]
        var table: [GATTService]

        init(model: any PeripheralModel) {
            self.model = model
            tableSource = model.services
            table = SimulatedDevice.table(tableSource)
        }

        /// The table a new connection discovers: the model's, which may have changed while the
        /// device was away (an application that rebooted into its bootloader).
        mutating func currentTable() -> [GATTService] {
            let source = model.services
            if source != tableSource {
                tableSource = source
                table = SimulatedDevice.table(source)
            }
            return table
        }
    }

    /// A device running `model`, another protocol's device among them. Of `config`, only the
    /// identity (address, name, RSSI) and the link apply; the model brings the rest, and may move
    /// the device to another address or name (`PeripheralModel.currentAddress`).
    public init(_ config: SimulatedDeviceConfig, model: any PeripheralModel) {
        self.config = config
        state = Mutex(DeviceState(model: model))
    }

    /// Attribute handles as BLE servers lay them out: each service at a multiple of 0x10 from
    /// 0x0010, each characteristic's value handle three after the previous one.
    static func table(_ services: [PeripheralService]) -> [GATTService] {
        services.enumerated().map { index, service in
            let base = 0x10 * (index + 1)
            let characteristics = service.characteristics.enumerated().map { offset, c in
                GATTCharacteristic(uuid: c.uuid, properties: c.properties, id: handle(base + 2 + 3 * offset))
            }
            return GATTService(uuid: service.uuid, characteristics: characteristics, id: handle(base))
        }
    }

    private static func handle(_ value: Int) -> String {
        let hex = String(value, radix: 16)
        return "0x" + String(repeating: "0", count: max(0, 4 - hex.count)) + hex
    }

    /// The hosted model, when it is an `M`.
    public func model<M: PeripheralModel>(as type: M.Type) -> M? {
        state.withLock { $0.model as? M }
    }

    /// Number of connections accepted so far.
    public var connectionCount: Int { state.withLock { $0.connections } }

    /// The address the device answers at now: the configured one unless the model moved it.
    public var address: DeviceAddress {
        state.withLock { $0.model.currentAddress } ?? config.address
    }

    public var advertisement: Advertisement {
        let (address, name, services) = state.withLock { s in
            (s.model.currentAddress ?? config.address, s.model.advertisedName ?? config.name, s.model.advertisedServices)
        }
        return Advertisement(address: address, name: name, rssi: config.rssi, serviceUUIDs: config.advertisesServices ? services : [])
    }

    /// Whether a scan at `now` hears the device: not while it is away (rebooting).
    func isAdvertising(at now: Duration) -> Bool {
        state.withLock { $0.model.availableAt <= now }
    }
}

extension [GATTService] {
    /// The characteristic with handle `id`.
    func characteristic(id: String) -> GATTCharacteristic? {
        for service in self {
            if let c = service.characteristics.first(where: { $0.id == id }) { return c }
        }
        return nil
    }
}
