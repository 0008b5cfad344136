import GATT
import OTA
import OTAWire

/// otaflash's own protocol (docs/PROTOCOL.md): the OTA service with its control point, data and
/// info characteristics, driven by `OTAEngine`.
public struct NativeProfile: OTAProfile {
    public typealias Engine = NativeEngine

    public init() {}

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
                      state: info.state.description, slotSize: Int(info.maxImageSize))
    }

    public func chunkSize(mtu: Int) -> Int { OTAProtocol.chunkSize(mtu: mtu) }

    public func makeEngine(image: FirmwareImage, config: EngineConfig) -> NativeEngine {
        NativeEngine(OTAEngine(image: image, config: config))
    }
}

/// `OTAEngine` behind the protocol-neutral `TransferEngine` contract: it maps the neutral events
/// to the engine's own and its commands to control point writes. Per data packet it adds one
/// switch and nothing else.
public struct NativeEngine: TransferEngine {
    public private(set) var core: OTAEngine

    public init(_ core: OTAEngine) { self.core = core }

    public var phase: TransferPhase { core.phase }
    public var failedIn: TransferPhase? { core.failedIn }
    public var currentTimeout: Duration { core.currentTimeout }
    public var isAwaitingReply: Bool { core.commandInFlight != nil }
    public var sent: Int { core.sent }
    public var acked: Int { core.acked }
    public var ackedCRC: UInt32 { core.ackedCRC }
    public var highWater: Int { core.highWater }
    public var furthestAgreed: Int { core.furthestAgreed }
    public var chunkSize: Int { core.chunkSize }
    public var stats: TransferStats { core.stats }

    public mutating func seed(confirmedOffset: Int, crc: UInt32) {
        core.seed(confirmedOffset: confirmedOffset, crc: crc)
    }

    public mutating func handle(_ event: TransferEvent<DeviceInfo>) -> [TransferAction] {
        let mapped: OTAEngine.Event
        switch event {
        case .connected(let info, let mtu): mapped = .connected(info: info, mtu: mtu)
        case .notification(let role, let bytes):
            guard role == .control else { return [] }
            mapped = .notification(bytes)
        case .commandFailed(let error): mapped = .commandFailed(error)
        case .timeout: mapped = .timeout
        case .disconnected(let reason): mapped = .disconnected(reason)
        }
        return core.handle(mapped).map { action in
            switch action {
            case .send(let request): .write(TransferWrite(request.encoded))
            case .finished: .finished
            case .failed(let error): .failed(error)
            }
        }
    }

    public mutating func nextStreamStep() -> TransferStep {
        switch core.nextStreamStep() {
        case .data(let offset, let count): .data(offset: offset, count: count)
        case .command(let request): .write(TransferWrite(request.encoded))
        case .idle: .idle
        }
    }

    public func dataPacket(offset: Int, count: Int) -> [UInt8] {
        DataPacket.encode(offset: UInt32(offset), payload: core.image.bytes[offset..<(offset + count)])
    }
}
