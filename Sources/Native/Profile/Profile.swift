import GATT
import OTA
import OTAWire

/// otaflash's own protocol (docs/PROTOCOL.md): the OTA service with its control point, data and
/// info characteristics, driven by `OTAEngine`.
public struct NativeProfile: OTAProfile {
    public typealias Engine = OTAEngine

    /// The checkpoint interval and the version BEGIN carries.
    public let settings: OTAEngine.Settings

    public init(settings: OTAEngine.Settings = OTAEngine.Settings()) {
        self.settings = settings
    }

    /// The name `--protocol` takes.
    public static let name = "native"

    public var name: String { Self.name }
    public var serviceUUID: BluetoothUUID { OTAProtocol.serviceUUID }
    public var imageFormats: Set<ImageFormat.Kind> { [.rawBinary, .intelHex] }
    public var imageCheck: String { "computes the CRC32 of the whole image" }

    /// The info characteristic's role: read once per connection.
    public static let info = CharacteristicRole("info")

    /// The OTA characteristics of a connected device, checked for the properties the protocol needs.
    public struct Characteristics: Sendable {
        public let controlPoint: GATTCharacteristic
        public let data: GATTCharacteristic
        public let info: GATTCharacteristic
    }

    /// Finds the OTA service and checks each characteristic, naming what is missing.
    public static func discover(on connection: any GATTConnection) async throws(GATTError) -> Characteristics {
        let service = try await connection.discoverService(OTAProtocol.serviceUUID, name: "OTA")
        let cp = try service.requireCharacteristic(OTAProtocol.controlPointUUID, name: "control point")
        let data = try service.requireCharacteristic(OTAProtocol.dataUUID, name: "data")
        let info = try service.requireCharacteristic(OTAProtocol.infoUUID, name: "info")
        try cp.require(.write, for: "writing commands to the control point")
        try cp.require(.notify, for: "notifications from the control point")
        try data.require(.writeWithoutResponse, for: "streaming to the data characteristic with write without response")
        try info.require(.read, for: "reading the info characteristic")
        return Characteristics(controlPoint: cp, data: data, info: info)
    }

    public func attach(to connection: any GATTConnection, device: String,
                       discoveryTimeout: Duration) async throws(OTAError) -> AttachedLink<DeviceInfo> {
        let chars: Characteristics
        let info: DeviceInfo
        do {
            chars = try await withTimeout(discoveryTimeout, clock: connection.clock, "discovering the OTA service") { () async throws(GATTError) in
                try await Self.discover(on: connection)
            }
            try await connection.setNotifications(true, for: chars.controlPoint)
            info = try DeviceInfo(decoding: try await connection.read(chars.info))
        } catch let error as GATTError {
            throw OTAError.from(error, device: device)
        } catch {
            throw OTAError(.protocolError, "\(device) sent an info value otaflash cannot read: \(error)", cause: error)
        }
        return AttachedLink(characteristics: [.control: chars.controlPoint, .data: chars.data, Self.info: chars.info],
                            peer: info, summary: Self.summary(info))
    }

    /// The info value in the terms every protocol reports; a firmware version of 0 is "unknown"
    /// (docs/PROTOCOL.md, "Info value"), as a device flashed without `--image-version` reports.
    public static func summary(_ info: DeviceInfo) -> DeviceSummary {
        DeviceSummary(protocolName: "native", protocolVersion: Int(info.protocolVersion),
                      firmwareVersion: info.firmwareVersion.packed == 0 ? nil : info.firmwareVersion,
                      state: Self.state(info.state), stateText: info.state.description, slotSize: Int(info.maxImageSize))
    }

    /// The device's transfer state in the terms every protocol shares.
    static func state(_ state: DeviceState) -> DeviceSummary.State {
        switch state {
        case .idle: .idle
        case .receiving: .receiving
        case .verified: .verified
        default: .unknown
        }
    }

    public func chunkSize(mtu: Int) -> Int { OTAProtocol.chunkSize(mtu: mtu) }

    public func makeEngine(image: FirmwareImage, config: EngineConfig) -> OTAEngine {
        OTAEngine(image: image, config: config, settings: settings)
    }
}
