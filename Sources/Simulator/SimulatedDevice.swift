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
    /// False: the device does not expose the OTA service (e.g. it runs a firmware without it).
    public var hasOTAService: Bool
    /// Properties of the data characteristic; remove `.writeWithoutResponse` to model a broken table.
    public var dataProperties: CharacteristicProperties
    /// How long a CHECKPOINT ahead of its data is held for it (`DeviceModel.Timing`). Nil, the
    /// default, answers `gap` at once: the simulated link never reorders writes.
    public var holdEarlyCheckpoint: Duration?

    public init(address: DeviceAddress = DeviceAddress("C0:FF:EE:00:00:01")!, name: String = "otaflash-sim",
                rssi: Int = -50, slotSize: Int = 1 << 20, firmwareVersion: FirmwareVersion = FirmwareVersion(major: 1, minor: 0, patch: 0),
                manufacturer: String = "otaflash", model: String = "simulated-peripheral",
                link: LinkModel = .default, faults: FaultPlan = .none, hasOTAService: Bool = true,
                dataProperties: CharacteristicProperties = [.writeWithoutResponse], holdEarlyCheckpoint: Duration? = nil) {
        self.address = address
        self.name = name
        self.rssi = rssi
        self.slotSize = slotSize
        self.firmwareVersion = firmwareVersion
        self.manufacturer = manufacturer
        self.model = model
        self.link = link
        self.faults = faults
        self.hasOTAService = hasOTAService
        self.dataProperties = dataProperties
        self.holdEarlyCheckpoint = holdEarlyCheckpoint
    }

    /// The device's timing: it boots a new image two connection intervals after its ACTIVATE
    /// reply, time enough for the reply to go out.
    var timing: DeviceModel.Timing {
        DeviceModel.Timing(holdEarlyCheckpoint: holdEarlyCheckpoint, bootDelay: link.timed ? link.connectionInterval * 2 : .zero)
    }
}

/// A simulated peripheral that outlives its connections: its flash and transfer state persist
/// across disconnects and reboots, as a real device's do.
public final class SimulatedDevice: Sendable {
    public let config: SimulatedDeviceConfig
    let state: Mutex<DeviceState>

    struct DeviceState {
        var model: DeviceModel
        var connections = 0
        var connected = false
    }

    public convenience init(_ config: SimulatedDeviceConfig) {
        self.init(config, restoring: OTATarget(slotSize: config.slotSize, firmwareVersion: config.firmwareVersion))
    }

    /// A device that continues from a saved state (see `saveState`), e.g. across runs of a tool.
    public init(_ config: SimulatedDeviceConfig, restoring target: OTATarget) {
        self.config = config
        state = Mutex(DeviceState(model: DeviceModel(device: FaultyDevice(target: target, faults: config.faults), timing: config.timing)))
    }

    /// The OTA state machine, for inspection by tests and tools.
    public var target: OTATarget { state.withLock { $0.model.target } }

    /// The image most recently activated, if any.
    public var activatedImage: [UInt8]? { state.withLock { $0.model.target.lastActivation?.image } }

    public var firmwareVersion: FirmwareVersion { state.withLock { $0.model.target.firmwareVersion } }

    /// Number of connections accepted so far.
    public var connectionCount: Int { state.withLock { $0.connections } }

    public var advertisement: Advertisement {
        Advertisement(address: config.address, name: config.name, rssi: config.rssi,
                      serviceUUIDs: config.hasOTAService ? [OTAProtocol.serviceUUID] : [])
    }

    /// The GATT table, with attribute handles as characteristic ids.
    var services: [GATTService] {
        var out: [GATTService] = []
        if config.hasOTAService {
            out.append(GATTService(uuid: OTAProtocol.serviceUUID, characteristics: [
                GATTCharacteristic(uuid: OTAProtocol.controlPointUUID, properties: [.write, .notify], id: Handle.controlPoint),
                GATTCharacteristic(uuid: OTAProtocol.dataUUID, properties: config.dataProperties, id: Handle.data),
                GATTCharacteristic(uuid: OTAProtocol.infoUUID, properties: [.read], id: Handle.info),
            ], id: "0x0010"))
        }
        out.append(GATTService(uuid: DeviceInformationService.serviceUUID, characteristics: [
            GATTCharacteristic(uuid: DeviceInformationService.manufacturerNameUUID, properties: [.read], id: Handle.manufacturer),
            GATTCharacteristic(uuid: DeviceInformationService.modelNumberUUID, properties: [.read], id: Handle.model),
            GATTCharacteristic(uuid: DeviceInformationService.firmwareRevisionUUID, properties: [.read], id: Handle.firmwareRevision),
        ], id: "0x0020"))
        return out
    }

    enum Handle {
        static let controlPoint = "0x0012"
        static let data = "0x0015"
        static let info = "0x0017"
        static let manufacturer = "0x0022"
        static let model = "0x0024"
        static let firmwareRevision = "0x0026"
    }

    func readValue(_ id: String) -> [UInt8]? {
        state.withLock { s in
            switch id {
            case Handle.info: s.model.target.info.encoded
            case Handle.manufacturer: Array(config.manufacturer.utf8)
            case Handle.model: Array(config.model.utf8)
            case Handle.firmwareRevision: Array(s.model.target.firmwareVersion.description.utf8)
            default: nil
            }
        }
    }
}
