import GATT
import OTA
import OTAWire

/// Nordic Secure DFU (nRF5 SDK bootloaders) as an `OTAProfile`: service 0xFE59 with its control
/// point and packet characteristics, driven by `NordicDFUEngine`. One profile sends one image of
/// a package (its init packet and firmware); a combined package is one session per image.
public struct NordicDFUProfile: OTAProfile {
    public typealias Engine = NordicDFUEngine

    /// The name `--protocol` takes.
    public static let name = "nordic-dfu"

    /// The init packet sent before the firmware the session is given.
    public let initPacket: [UInt8]
    /// Receipts, pipelining and retries; its timeouts come from the session's `EngineConfig`.
    public let dfuConfig: NordicDFUConfig

    public init(initPacket: [UInt8] = [], dfuConfig: NordicDFUConfig = NordicDFUConfig()) {
        self.initPacket = initPacket
        self.dfuConfig = dfuConfig
    }

    /// The profile for one image of a package.
    public init(image: DFUPackage.Image, dfuConfig: NordicDFUConfig = NordicDFUConfig()) {
        self.init(initPacket: image.initPacket.bytes, dfuConfig: dfuConfig)
    }

    public var name: String { Self.name }
    public var serviceUUID: BluetoothUUID { SecureDFUService.serviceUUID }
    public var imageFormats: Set<ImageFormat.Kind> { [.nordicDFUPackage] }
    public var imageCheck: String { "checks the whole image's SHA-256 against the signed init packet" }
    /// The bootloader starts the application, which has no Secure DFU version to read.
    public var reportsFirmwareVersion: Bool { false }

    public func attach(to connection: any GATTConnection, device: String,
                       discoveryTimeout: Duration) async throws(OTAError) -> AttachedLink<NordicDFULink> {
        do {
            let (control, packet) = try await withTimeout(discoveryTimeout, clock: connection.clock, "discovering the Secure DFU service") { () async throws(GATTError) in
                let service = try await connection.discoverService(SecureDFUService.serviceUUID, name: "Secure DFU")
                let control = try service.requireCharacteristic(SecureDFUService.controlPointUUID, name: "DFU control point")
                let packet = try service.requireCharacteristic(SecureDFUService.packetUUID, name: "DFU packet")
                try control.require(.write, for: "writing requests to the DFU control point")
                try control.require(.notify, for: "notifications from the DFU control point")
                try packet.require(.writeWithoutResponse, for: "streaming to the DFU packet characteristic with write without response")
                return (control, packet)
            }
            try await connection.setNotifications(true, for: control)
            return AttachedLink(characteristics: [.control: control, .data: packet],
                                peer: NordicDFULink(keepsWriteOrder: connection.keepsWriteOrder),
                                summary: DeviceSummary(protocolName: name, state: .bootloader,
                                                       stateText: "a Secure DFU bootloader: it says where a transfer stands once one begins"))
        } catch {
            throw OTAError.from(error, device: device)
        }
    }

    /// A packet carries as much of the init packet or firmware as one write takes (ATT MTU − 3, at
    /// most 510 bytes: `ATTWriteLimit`), with no header.
    public func chunkSize(mtu: Int) -> Int { ATTWriteLimit.value(mtu: mtu) }

    public func makeEngine(image: FirmwareImage, config: EngineConfig) -> NordicDFUEngine {
        var dfu = dfuConfig
        dfu.commandRetries = config.commandRetries
        dfu.maxRecoveries = config.maxRecoveries
        dfu.replyTimeout = config.replyTimeout
        dfu.validationTimeout = max(config.verifyTimeout, config.activateTimeout)
        return NordicDFUEngine(initPacket: initPacket, firmware: image, config: dfu)
    }
}
