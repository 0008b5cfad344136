import GATT
import OTA
import OTADevice
import OTAWire
import Simulator
import Synchronization
import Testing

// A second protocol, written only against the contracts (profile, engine, device model), runs
// through the shared session and the simulator: nothing native is involved.
//
// The "sink" protocol: START (0x01, size LE32) is answered 0x01 + bytes held LE32; raw data packets
// follow on the data characteristic, the device notifying a receipt (0x03 + bytes held) every
// 1 KiB; FINISH (0x02) is answered 0x02 + CRC32 of what it holds.

private enum Sink {
    static let service = BluetoothUUID(uint16: 0xFFE0)
    static let control = BluetoothUUID(uint16: 0xFFE1)
    static let data = BluetoothUUID(uint16: 0xFFE2)
    static let receiptInterval = 1024

    static func le32(_ v: Int) -> [UInt8] { (0..<4).map { UInt8(truncatingIfNeeded: v >> (8 * $0)) } }
    static func le32(_ b: ArraySlice<UInt8>) -> Int { b.reversed().reduce(0) { $0 << 8 | Int($1) } }
}

/// The sink device: it keeps what it received across link losses and drops the link once when
/// it has received `dropAt` bytes.
private struct SinkModel: PeripheralModel {
    var held: [UInt8] = []
    var dropAt: Int?
    /// FINISH is taken and never answered.
    var silentAtFinish = false
    /// The byte at this offset is stored inverted (a flash that does not keep it).
    var corruptAt: Int?
    /// Every connection attempt is refused (a device out of range).
    var unreachable = false
    /// The link drops at every START: the device never moves forward.
    var dropsEveryStart = false

    var services: [PeripheralService] {
        [PeripheralService(Sink.service, [PeripheralCharacteristic(Sink.control, [.write, .notify]),
                                          PeripheralCharacteristic(Sink.data, [.writeWithoutResponse])])]
    }
    var advertisedServices: [BluetoothUUID] { [Sink.service] }
    var availableAt: Duration { .zero }
    func refusesConnection(after connections: Int) -> Bool { unreachable }
    func read(_ characteristic: BluetoothUUID) -> [UInt8]? { nil }

    mutating func write(_ bytes: [UInt8], to characteristic: BluetoothUUID, withResponse: Bool,
                        from central: String?, at now: Duration) -> PeripheralWriteResult {
        func notify(_ value: [UInt8]) -> PeripheralWriteResult {
            PeripheralWriteResult(reply: .success(at: now), outputs: [PeripheralTimed(at: now, .notify(Sink.control, value))])
        }
        if characteristic == Sink.data {
            let before = held.count
            held += bytes
            if let corruptAt, (before..<held.count).contains(corruptAt) { held[corruptAt] = ~held[corruptAt] }
            if let drop = dropAt, held.count >= drop {
                dropAt = nil
                return PeripheralWriteResult(reply: .success(at: now), outputs: [PeripheralTimed(at: now, .dropLink(reason: "injected"))])
            }
            guard held.count / Sink.receiptInterval > before / Sink.receiptInterval else {
                return PeripheralWriteResult(reply: .success(at: now), outputs: [])
            }
            return notify([0x03] + Sink.le32(held.count))
        }
        switch bytes.first {
        case 0x01 where dropsEveryStart:
            return PeripheralWriteResult(reply: .success(at: now), outputs: [PeripheralTimed(at: now, .dropLink(reason: "injected"))])
        case 0x01: return notify([0x01] + Sink.le32(held.count))
        case 0x02 where silentAtFinish: return PeripheralWriteResult(reply: .success(at: now), outputs: [])
        case 0x02: return notify([0x02] + Sink.le32(Int(CRC32.checksum(held))))
        default: return PeripheralWriteResult(reply: .failure(ATTError(rawValue: 0x81), "writing the control point"), outputs: [])
        }
    }

    mutating func wake(_ token: UInt64, at now: Duration) -> [PeripheralTimed] { [] }
    mutating func linkDropped(central: String?) {}
}

/// The sink central: a pure engine over the neutral contracts.
/// Also the engine of the registry tests' stand-in profiles.
struct SinkEngine: TransferEngine {
    let image: FirmwareImage
    let config: EngineConfig
    private(set) var phase = TransferPhase.idle
    private(set) var failedIn: TransferPhase?
    private(set) var isAwaitingReply = false
    private(set) var sent = 0
    private(set) var acked = 0
    private(set) var furthestAgreed = 0
    private(set) var chunkSize = 0
    private var tally = ResendTally()
    var stats: TransferStats { tally.stats }

    init(image: FirmwareImage, config: EngineConfig) {
        self.image = image
        self.config = config
    }
    var highWater: Int { tally.highWater }
    var currentTimeout: Duration { config.replyTimeout }
    var ackedCRC: UInt32 { CRC32.checksum(image.bytes[0..<acked]) }

    mutating func seed(confirmedOffset: Int, crc: UInt32) {}

    mutating func handle(_ event: TransferEvent<Void>) -> [TransferAction] {
        switch event {
        case .connected(_, let mtu):
            chunkSize = mtu - 3
            tally.connectionBegan(streamAt: sent)
            phase = .beginning
            isAwaitingReply = true
            return [.write(TransferWrite([0x01] + Sink.le32(image.size)))]
        case .notification(let role, let value) where role == .control && value.count == 5:
            let number = Sink.le32(value[1...])
            switch value[0] {
            case 0x01:
                isAwaitingReply = false
                tally.resumed(from: number)
                sent = number
                acked = number
                phase = .streaming
                return []
            case 0x03:
                acked = number
                furthestAgreed = max(furthestAgreed, number)
                return []
            case 0x02:
                isAwaitingReply = false
                guard UInt32(number) == image.crc32 else { return fail(OTAError(.verifyFailed, "the sink holds CRC \(number)")) }
                phase = .done
                return [.finished]
            default:
                return []
            }
        case .notification:
            return []
        case .commandFailed(let error):
            return fail(OTAError.from(error, device: "the sink"))
        case .timeout:
            return fail(OTAError(.timeout, "the sink did not answer", resumable: true))
        case .disconnected(let reason):
            isAwaitingReply = false
            return fail(OTAError(.connection, "\(reason)", resumable: true))
        }
    }

    mutating func nextStreamStep() -> TransferStep {
        guard phase == .streaming else { return .idle }
        guard sent < image.size else {
            // FINISH follows the last packet.
            phase = .verifying
            isAwaitingReply = true
            return .write(TransferWrite([0x02]))
        }
        let offset = sent
        let count = min(chunkSize, image.size - sent)
        sent += count
        tally.streamed(offset: offset, count: count)
        return .data(offset: offset, count: count)
    }

    func dataPacket(offset: Int, count: Int) -> [UInt8] { Array(image.bytes[offset..<(offset + count)]) }

    private mutating func fail(_ error: OTAError) -> [TransferAction] {
        failedIn = phase
        phase = .failed
        return [.failed(error)]
    }
}

private struct SinkProfile: OTAProfile {
    var name: String { "sink" }
    var serviceUUID: BluetoothUUID { Sink.service }
    var imageFormats: Set<ImageFormat.Kind> { [.rawBinary] }

    func attach(to connection: any GATTConnection, device: String,
                discoveryTimeout: Duration) async throws(OTAError) -> AttachedLink<Void> {
        do {
            let service = try await connection.discoverService(Sink.service, name: "sink")
            let control = try service.requireCharacteristic(Sink.control, name: "control")
            let data = try service.requireCharacteristic(Sink.data, name: "data")
            try await connection.setNotifications(true, for: control)
            return AttachedLink(characteristics: [.control: control, .data: data], peer: (),
                                summary: DeviceSummary(protocolName: name, state: .idle, stateText: "ready"))
        } catch {
            throw OTAError.from(error, device: device)
        }
    }

    func chunkSize(mtu: Int) -> Int { mtu - 3 }
    func makeEngine(image: FirmwareImage, config: EngineConfig) -> SinkEngine { SinkEngine(image: image, config: config) }
}

private final class EventLog: Sendable {
    let events = Mutex<[SessionEvent]>([])
}

@Suite struct SecondProtocolTests {
    static let image = testImage(20_000, seed: 7)

    fileprivate func run(_ model: SinkModel, reconnect: ReconnectPolicy, config: EngineConfig = EngineConfig(),
                         address: DeviceAddress? = nil) async throws -> (OTAResult, SimulatedDevice, [SessionEvent]) {
        let device = SimulatedDevice(SimulatedDeviceConfig(), model: model)
        let central = SimulatedCentral(devices: [device], clock: VirtualClock())
        let session = OTASession(central: central, address: address ?? device.config.address, image: Self.image,
                                 config: config, profile: SinkProfile(), reconnect: reconnect)
        let log = EventLog()
        let result = try await session.run { event in log.events.withLock { $0.append(event) } }
        return (result, device, log.events.withLock { $0 })
    }

    @Test func theSessionDrivesAProtocolItKnowsOnlyThroughTheContracts() async throws {
        let (result, device, events) = try await run(SinkModel(), reconnect: .never)
        #expect(device.model(as: SinkModel.self)?.held == Self.image.bytes)
        #expect(result.chunkSize == 244)
        #expect(result.stats.packets == (Self.image.size + 243) / 244)
        #expect(result.firmwareBefore == nil)
        let summary = events.compactMap { event -> DeviceSummary? in
            if case .deviceInfo(_, let info) = event { return info } else { return nil }
        }
        #expect(summary == [DeviceSummary(protocolName: "sink", state: .idle, stateText: "ready")])
        #expect(events.contains { if case .verifying = $0 { true } else { false } })
    }

    @Test func theSharedSupervisorResumesItAfterALinkLoss() async throws {
        let (result, device, events) = try await run(SinkModel(dropAt: 9_000), reconnect: ReconnectPolicy(seed: 3))
        let held = try #require(device.model(as: SinkModel.self)?.held)
        #expect(held == Self.image.bytes)
        #expect(result.stats.connections == 2)
        let resumedAt = try #require(result.stats.resumedFrom.last)
        #expect(result.stats.resumedFrom.first == 0)
        #expect(resumedAt >= 9_000)
        #expect(events.contains { if case .reconnecting = $0 { true } else { false } })
    }

    // The session's own rules, held with a protocol of the tests' own: they are the core's, not a
    // protocol's.

    /// The thrown `OTAError` of a run that must fail, with the virtual time it took.
    fileprivate func failure(_ model: SinkModel, reconnect: ReconnectPolicy = .never, config: EngineConfig = EngineConfig(),
                             address: DeviceAddress? = nil) async -> OTAError? {
        do {
            _ = try await run(model, reconnect: reconnect, config: config, address: address)
            Issue.record("the run succeeded")
            return nil
        } catch let error as OTAError {
            return error
        } catch {
            Issue.record("not an OTAError: \(error)")
            return nil
        }
    }

    @Test(.timeLimit(.minutes(1))) func aDeviceThatNeverAnswersFinishEndsTheRunAtItsReplyTimeout() async {
        var config = EngineConfig()
        config.replyTimeout = .seconds(2)
        let error = await failure(SinkModel(silentAtFinish: true), config: config)
        #expect(error?.code == .timeout)
    }

    @Test func bytesTheDeviceDidNotKeepFailTheWholeImageCheck() async {
        let error = await failure(SinkModel(corruptAt: 12_345))
        #expect(error?.code == .verifyFailed)
    }

    @Test(.timeLimit(.minutes(1))) func aDeviceThatDropsEveryLinkWithoutProgressEndsWithinTheReconnectWindow() async {
        let error = await failure(SinkModel(dropsEveryStart: true), reconnect: ReconnectPolicy(window: .seconds(5), seed: 9))
        #expect(error?.code == .connection)
        #expect(error?.resumable == true)
    }

    @Test(.timeLimit(.minutes(1))) func aDeviceOutOfReachIsAConnectionFailureWithinTheWindow() async {
        let error = await failure(SinkModel(unreachable: true), reconnect: ReconnectPolicy(window: .seconds(3), seed: 4))
        #expect(error != nil)
        #expect(error?.code != .verifyFailed)
    }

    @Test func anAddressNoDeviceHasIsDeviceNotFound() async {
        let error = await failure(SinkModel(), address: DeviceAddress("00:11:22:33:44:55"))
        #expect(error?.code == .deviceNotFound)
    }
}
