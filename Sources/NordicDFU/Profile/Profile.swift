import GATT
import OTA
import OTAWire

/// Nordic Secure DFU (nRF5 SDK bootloaders) as an `OTAProfile`: service 0xFE59 with its control
/// point and packet characteristics, driven by `NordicDFUEngine`. One profile sends one image of
/// a package (its init packet and firmware); a combined package is one session per image.
public struct NordicDFUProfile: OTAProfile {
    public typealias Engine = NordicDFUTransfer

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
                                summary: DeviceSummary(protocolName: name, state: "bootloader"))
        } catch {
            throw OTAError.from(error, device: device)
        }
    }

    /// A packet carries as much of the init packet or firmware as one write takes (ATT MTU − 3, at
    /// most 510 bytes: `ATTWriteLimit`), with no header.
    public func chunkSize(mtu: Int) -> Int { ATTWriteLimit.value(mtu: mtu) }

    public func makeEngine(image: FirmwareImage, config: EngineConfig) -> NordicDFUTransfer {
        var dfu = dfuConfig
        dfu.commandRetries = config.commandRetries
        dfu.maxRecoveries = config.maxRecoveries
        dfu.replyTimeout = config.replyTimeout
        dfu.validationTimeout = max(config.verifyTimeout, config.activateTimeout)
        return NordicDFUTransfer(NordicDFUEngine(initPacket: initPacket, firmware: image, config: dfu))
    }
}

/// What `NordicDFUProfile.attach` learns of a link for the engine.
public struct NordicDFULink: Sendable, Hashable {
    /// Control point and packet writes reach the bootloader in the order they were made
    /// (`GATTConnection.keepsWriteOrder`), so an object's packets may follow CREATE at once.
    public var keepsWriteOrder: Bool

    public init(keepsWriteOrder: Bool) {
        self.keepsWriteOrder = keepsWriteOrder
    }
}

/// `NordicDFUEngine` behind the protocol-neutral `TransferEngine` contract: its requests become
/// control point writes with response, the init packet's packets writes to the packet
/// characteristic without response, and the firmware's packets `.data` steps.
public struct NordicDFUTransfer: TransferEngine {
    public private(set) var core: NordicDFUEngine
    /// `core.stats.bytesResent` when each connection began.
    private var resentAtConnect: [Int] = []

    public init(_ core: NordicDFUEngine) { self.core = core }

    /// Sending the init packet and selecting the data object count as beginning; the last
    /// EXECUTE, while the bootloader checks the image's hash, as verifying.
    public var phase: TransferPhase {
        switch core.phase {
        case .idle: .idle
        case .preparing, .sendingInitPacket, .selectingData: .beginning
        case .sendingFirmware:
            core.commandInFlight == .execute && core.furthestAgreed == core.firmware.size ? .verifying : .streaming
        case .done: .done
        case .failed: .failed
        }
    }

    public var failedIn: TransferPhase? {
        switch core.failedIn {
        case nil: nil
        case .idle?: .idle
        case .preparing?, .sendingInitPacket?, .selectingData?: .beginning
        case .sendingFirmware?: core.finalExecuteUnconfirmed ? .verifying : .streaming
        case .done?: .done
        case .failed?: .failed
        }
    }

    public var currentTimeout: Duration { core.currentTimeout }
    public var isAwaitingReply: Bool { core.isAwaitingReply }
    public var sent: Int { core.sent }
    public var acked: Int { core.acked }
    public var ackedCRC: UInt32 { core.ackedCRC }
    public var highWater: Int { core.highWater }
    public var furthestAgreed: Int { core.furthestAgreed }
    public var chunkSize: Int { core.chunkSize }

    public var stats: TransferStats {
        let s = core.stats
        var out = TransferStats()
        out.bytesSent = s.bytesSent
        out.bytesResent = s.bytesResent
        out.packets = s.packets
        out.checkpoints = s.receipts + s.checksumRequests
        out.rewinds = s.tailsResent
        out.rollbacks = s.objectsRecreated
        out.restarts = s.restarts
        out.commandRetries = s.commandRetries
        out.resumedFrom = s.resumedFrom
        out.resentPerConnection = resentAtConnect.indices.map { i in
            (i + 1 < resentAtConnect.count ? resentAtConnect[i + 1] : s.bytesResent) - resentAtConnect[i]
        }
        out.resumeResends = s.resumeResends
        return out
    }

    public mutating func seed(confirmedOffset: Int, crc: UInt32) {
        core.seed(confirmedOffset: confirmedOffset, crc: crc)
    }

    public mutating func handle(_ event: TransferEvent<NordicDFULink>) -> [TransferAction] {
        let mapped: NordicDFUEngine.Event
        switch event {
        case .connected(let link, let mtu):
            resentAtConnect.append(core.stats.bytesResent)
            mapped = .connected(mtu: mtu, keepsWriteOrder: link.keepsWriteOrder)
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
        case .data(let type, let offset, let bytes) where type == .data: .data(offset: offset, count: bytes.count)
        case .data(_, _, let bytes): .write(TransferWrite(Array(bytes), to: .data, withResponse: false))
        case .command(let request): .write(TransferWrite(request.encoded))
        case .idle: .idle
        }
    }

    public func dataPacket(offset: Int, count: Int) -> [UInt8] {
        Array(core.firmware.bytes[offset..<(offset + count)])
    }
}
