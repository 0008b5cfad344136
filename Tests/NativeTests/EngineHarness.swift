import GATT
import Native
import OTA
import OTAWire
import Testing

// Tools for driving `OTAEngine` by hand: device replies built with the wire encoders, a
// deterministic image, and a well-behaved device that answers every command.

typealias Event = TransferEvent<DeviceInfo>
typealias Action = TransferAction

// Expectations in the protocol's own terms: a command is the write of its encoding to the control
// point, a device reply a control point notification.
extension TransferAction {
    static func send(_ request: ControlRequest) -> TransferAction { .write(TransferWrite(request.encoded)) }
}

extension TransferStep {
    static func command(_ request: ControlRequest) -> TransferStep { .write(TransferWrite(request.encoded)) }
}

extension TransferEvent where Peer == DeviceInfo {
    static func connected(info: DeviceInfo, mtu: Int) -> TransferEvent { .connected(info, mtu: mtu) }
    static func notification(_ bytes: [UInt8]) -> TransferEvent { .notification(.control, bytes) }
}

/// The command a control point write carries (nil for anything else).
func controlRequest(_ write: TransferWrite) -> ControlRequest? {
    guard write.role == .control, write.withResponse else { return nil }
    return try? ControlRequest(decoding: write.bytes)
}

/// Replies and events a device sends, as the bytes it would notify.
enum Device {
    static func begin(offset: Int, crc: UInt32, status: OTAStatus = .success) -> Event {
        response(.begin, status, .position(offset: UInt32(offset), crc: crc))
    }

    static func beginRefused(_ status: OTAStatus) -> Event { response(.begin, status, .none) }

    static func checkpoint(_ status: OTAStatus, offset: Int, crc: UInt32) -> Event {
        response(.checkpoint, status, .position(offset: UInt32(offset), crc: crc))
    }

    static func status(state: DeviceState = .receiving, offset: Int, crc: UInt32, image: FirmwareImage) -> Event {
        response(.status, .success, .status(.init(state: state, offset: UInt32(offset), crc: crc,
                                                  imageSize: UInt32(image.size), imageCRC: image.crc32)))
    }

    static func verify(_ status: OTAStatus, crc: UInt32) -> Event { response(.verify, status, .computedCRC(crc)) }

    static func activate(_ status: OTAStatus = .success) -> Event { response(.activate, status, .none) }

    static func gap(offset: Int, crc: UInt32) -> Event {
        .notification(DeviceEvent.gap(expectedOffset: UInt32(offset), crc: crc).encoded)
    }

    static func response(_ op: OTAOpcode, _ status: OTAStatus, _ payload: ControlResponse.Payload) -> Event {
        .notification(ControlResponse(opcode: op, status: status, payload: payload).encoded)
    }

    static func info(slot: Int = 1 << 20, protocolVersion: UInt8 = OTAProtocol.version) -> DeviceInfo {
        DeviceInfo(protocolVersion: protocolVersion, state: .idle, maxImageSize: UInt32(slot),
                   firmwareVersion: FirmwareVersion(major: 1, minor: 0, patch: 0), received: 0, pendingImageSize: 0)
    }
}

/// CRC32 of `image[0..<offset]`, computed from scratch.
func crc(_ image: FirmwareImage, upTo offset: Int) -> UInt32 {
    CRC32.checksum(image.bytes[0..<offset])
}

func beginRequest(_ image: FirmwareImage, restart: Bool) -> ControlRequest {
    .begin(.init(imageSize: UInt32(image.size), imageCRC: image.crc32, version: FirmwareVersion(packed: 0), restart: restart))
}

extension TransferAction {
    var failure: OTAError? {
        if case .failed(let e) = self { return e }
        return nil
    }

    var request: ControlRequest? {
        if case .write(let w) = self { return controlRequest(w) }
        return nil
    }
}

extension OTAEngine {
    /// Pulls stream steps until the engine goes idle.
    mutating func streamUntilIdle(limit: Int = 1_000_000) -> [TransferStep] {
        var steps: [TransferStep] = []
        while steps.count < limit {
            let step = nextStreamStep()
            if step == .idle { return steps }
            steps.append(step)
        }
        Issue.record("the engine never went idle")
        return steps
    }

    /// Connects and accepts BEGIN at `offset` (the device's CRC of that prefix).
    mutating func connectAndBegin(mtu: Int = 247, slot: Int = 1 << 20, resumeAt offset: Int = 0) {
        let first = handle(.connected(info: Device.info(slot: slot), mtu: mtu))
        #expect(first.count == 1 && first.first?.request?.opcode == .begin, "expected BEGIN, got \(first)")
        let actions = handle(Device.begin(offset: offset, crc: crc(image, upTo: offset)))
        #expect(actions.isEmpty, "BEGIN at \(offset) should start streaming, got \(actions)")
        #expect(phase == .streaming)
    }
}

extension TransferStep {
    var data: (offset: Int, count: Int)? {
        if case .data(let o, let c) = self { return (o, c) }
        return nil
    }

    var command: ControlRequest? {
        if case .write(let w) = self { return controlRequest(w) }
        return nil
    }
}

/// What a transfer with a well-behaved device looked like.
struct Transcript {
    var packets: [(offset: Int, count: Int)] = []
    /// Every command the engine sent, in order (stream checkpoints and actions alike).
    var commands: [ControlRequest] = []
    /// Times a command was issued while another was still unanswered.
    var overlappingCommands = 0
    /// Largest `sent - acked` seen.
    var maxUnacknowledged = 0
    /// `sent` each time the stream stopped with a checkpoint unanswered.
    var stallPoints: [(sent: Int, lastCheckpoint: Int)] = []
    var outcome: Action?
    var stats: TransferStats?

    var checkpointOffsets: [Int] {
        commands.compactMap { if case .checkpoint(let o, _) = $0 { Int(o) } else { nil } }
    }

    /// How often each image byte was sent.
    func coverage(size: Int) -> [Int] {
        var seen = [Int](repeating: 0, count: size)
        for p in packets { for i in p.offset..<(p.offset + p.count) { seen[i] += 1 } }
        return seen
    }
}

/// Runs a whole transfer against a device that receives everything and answers each command only
/// when the engine has nothing left to send (the slowest replies the engine must tolerate).
func runCleanTransfer(_ image: FirmwareImage, config: EngineConfig = EngineConfig(), settings: OTAEngine.Settings = .init(),
                      mtu: Int = 247, resumeAt resume: Int = 0) -> Transcript {
    var engine = OTAEngine(image: image, config: config, settings: settings)
    var t = Transcript()
    var pending: ControlRequest?
    var received = resume
    var lastCheckpoint = 0

    func issue(_ request: ControlRequest) {
        if pending != nil { t.overlappingCommands += 1 }
        pending = request
        t.commands.append(request)
    }

    var actions = engine.handle(.connected(info: Device.info(), mtu: mtu))
    var rounds = 0
    while rounds < 100_000 {
        rounds += 1
        for action in actions {
            switch action {
            case .write: if let r = action.request { issue(r) }
            case .finished, .failed:
                t.outcome = action
                t.stats = engine.stats
                return t
            }
        }
        for step in engine.streamUntilIdle() {
            switch step {
            case .data(let offset, let count):
                t.packets.append((offset, count))
                if offset == received { received += count }
            case .write:
                guard let r = step.command else { continue }
                issue(r)
                if case .checkpoint(let o, _) = r { lastCheckpoint = Int(o) }
            case .idle: break
            }
            t.maxUnacknowledged = max(t.maxUnacknowledged, engine.sent - engine.acked)
        }
        guard let request = pending else {
            Issue.record("the engine went idle with nothing in flight (phase \(engine.phase))")
            return t
        }
        if case .checkpoint = request { t.stallPoints.append((engine.sent, lastCheckpoint)) }
        pending = nil
        let reply: Event
        switch request {
        case .begin: reply = Device.begin(offset: resume, crc: crc(image, upTo: resume))
        case .checkpoint(let offset, let c):
            let o = Int(offset)
            #expect(c == crc(image, upTo: o), "checkpoint at \(o) carries a wrong CRC")
            reply = o <= received ? Device.checkpoint(.success, offset: o, crc: c)
                                  : Device.checkpoint(.gap, offset: received, crc: crc(image, upTo: received))
        case .verify: reply = Device.verify(.success, crc: CRC32.checksum(image.bytes))
        case .activate: reply = Device.activate()
        case .status: reply = Device.status(offset: received, crc: crc(image, upTo: received), image: image)
        case .abort: reply = Device.response(.abort, .success, .none)
        }
        actions = engine.handle(reply)
    }
    Issue.record("the transfer did not finish")
    return t
}
