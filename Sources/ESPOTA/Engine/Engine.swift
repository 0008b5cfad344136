import GATT
import OTA
import OTAWire

/// Which Bluetooth host the device's component runs on, as far as the GATT table tells.
public enum ESPOTAHost: String, Sendable, Hashable {
    /// `nimble_ota.c`: no Device Information Service.
    case nimble
    /// `ble_ota.c`: a Device Information Service beside the OTA service.
    case bluedroid
}

/// What the profile learns of the device on a connection.
public struct ESPOTALink: Sendable, Hashable {
    public var host: ESPOTAHost
    public init(host: ESPOTAHost) { self.host = host }
}

/// Espressif's BLE OTA as a pure state machine (esp-iot-solution's `ble_ota` component and the
/// example application that hands it a flash task).
///
/// One START with the image's length, then the image in 4 KiB sectors, each as packets written
/// without response to RECV_FW. The device ACKs each sector once it passed it to its two-sector ring
/// buffer; when its flash task falls behind, its host task blocks and the ACKs come late. So the
/// engine streams the next sector's packets before the ACK arrives, keeps at most `window`
/// sectors un-ACKed, and holds each sector's last packet (the one that completes it on the
/// device) until every earlier sector is ACKed: a refused sector then never has a completed
/// sector behind it in flight, which the device would take in its place. A NACK (status 1 or 2)
/// rewinds to the sector the device asks for.
///
/// The update ends without STOP: once the device holds START's length, its application checks
/// the image (`esp_ota_end`), sets the boot partition and restarts. The link dropping after the
/// last ACK is the success; no restart within `verifyTimeout` is a refusal, which the device does
/// not report otherwise. `esp_ota_begin` runs once per boot and a second START corrupts what
/// the application writes, so there is no resume: a link lost after START, or a refusal, ends
/// the run with the reset the device needs, and the engine never sends START twice.
public struct ESPOTAEngine: TransferEngine {
    public typealias Peer = ESPOTALink

    /// Sectors un-ACKed at most by default: the one being ACKed, and the next one's packets.
    public static let defaultWindow = 2
    /// Packets the device takes: ATT MTU − 3 for the write, − 3 for the sector header.
    public static func packetData(mtu: Int) -> Int { max(0, ATTWriteLimit.value(mtu: mtu) - ESPSectorPacket.headerSize) }

    enum State: Sendable {
        case idle
        /// START written, its ACK awaited.
        case starting
        case streaming(Stream)
        /// Every sector ACKed; the restart awaited. `extended`: the wait already ran into the
        /// reply timeout of the last packet once and was given `verifyTimeout` from then.
        case awaitingRestart(extended: Bool)
        case done
        case failed(in: TransferPhase)
    }

    struct Stream: Sendable {
        /// The sector being sent and the offset in it of the next packet.
        var sector = 0
        var position = 0
        /// Sectors the device has taken (it ACKs in order: an ACK of sector s says it holds 0…s).
        var acked = 0
        /// The sector a NACK asked for, until it is ACKed: NACKs of the packets still in flight
        /// ask for it again and are not new refusals.
        var rewoundTo: Int?
        /// The ACK of sector `acked` timed out once: its successor's last packet goes out anyway
        /// (an ACK lost on the way; the successor's ACK then covers both).
        var released = false
        /// The CRC16 of what went out since the last sector's last packet: what a NimBLE device
        /// collected from the packets in flight behind a sector it refused.
        var tail: UInt16 = 0
        /// Before the sector a NimBLE device asked for is sent again: a last packet whose CRC
        /// cannot match what it collected meanwhile, so that it empties its buffer (and refuses
        /// it with a CRC error, which is expected and not a new refusal).
        var flush: [UInt8]?
        var expectedCRCError: Int?
    }

    let image: FirmwareImage
    let config: EngineConfig
    /// Sectors un-ACKed at most (1: the reference app's strategy, one sector then its ACK).
    public let window: Int
    /// Each sector's CRC16, sent at the end of its last packet.
    let sectorCRCs: [UInt16]
    let sectorCount: Int
    private(set) var state: State = .idle
    private var packetData = 0
    private var host: ESPOTAHost?
    private var tally = ResendTally()
    private var ackedCRCValue = CRC32()
    private var ackedBytes = 0
    private var recoveries = 0
    private var failedPhase: TransferPhase?

    public init(image: FirmwareImage, config: EngineConfig, window: Int = ESPOTAEngine.defaultWindow) {
        self.image = image
        self.config = config
        self.window = max(1, window)
        let size = ESPOTAService.sectorSize
        sectorCount = (image.size + size - 1) / size
        sectorCRCs = (0..<sectorCount).map { s in CRC16.checksum(image.bytes[(s * size)..<min(image.size, (s + 1) * size)]) }
    }

    // MARK: What the session reads

    public var phase: TransferPhase {
        switch state {
        case .idle: .idle
        case .starting: .beginning
        case .streaming: .streaming
        case .awaitingRestart: .verifying
        case .done: .done
        case .failed: .failed
        }
    }

    public var failedIn: TransferPhase? { failedPhase }

    public var currentTimeout: Duration {
        if case .awaitingRestart = state { return config.verifyTimeout }
        return config.replyTimeout
    }

    public var isAwaitingReply: Bool {
        switch state {
        case .starting, .streaming, .awaitingRestart: true
        default: false
        }
    }

    public var sent: Int {
        switch state {
        case .streaming(let s): min(image.size, s.sector * ESPOTAService.sectorSize + s.position)
        case .awaitingRestart, .done: image.size
        default: 0
        }
    }

    public var acked: Int { ackedBytes }
    public var ackedCRC: UInt32 { ackedCRCValue.value }
    public var highWater: Int { tally.highWater }
    public var furthestAgreed: Int { ackedBytes }
    public var chunkSize: Int { packetData }
    public var stats: TransferStats { tally.stats }

    public mutating func seed(confirmedOffset: Int, crc: UInt32) {
        // Nothing to resume: a device holds an update only until it restarts.
    }

    // MARK: Events

    public mutating func handle(_ event: TransferEvent<ESPOTALink>) -> [TransferAction] {
        switch event {
        case .connected(let peer, let mtu):
            return connected(peer, mtu: mtu)
        case .notification(.control, let value):
            return commandAnswer(value)
        case .notification(.data, let value):
            return sectorAnswer(value)
        case .notification:
            return []
        case .commandFailed(let error):
            guard case .starting = state else { return [] }
            return fail(OTAError(.protocolError, "the device refused START with \(error.message)",
                                 hint: resetHint, cause: error))
        case .timeout:
            return timedOut()
        case .disconnected(let reason):
            return disconnected(reason)
        }
    }

    private var resetHint: String {
        "the device takes one START per boot: reset it (power cycle, or the reset button) before the next try"
    }

    private mutating func connected(_ peer: ESPOTALink, mtu: Int) -> [TransferAction] {
        guard case .idle = state else {
            // The supervisor never reconnects after START (every failure since is final); this
            // guard is what makes a second START on one boot impossible all the same.
            return fail(OTAError(.connection, "connected again after START: Espressif's BLE OTA cannot resume, and a second START on this boot would corrupt the image",
                                 hint: resetHint))
        }
        host = peer.host
        packetData = Self.packetData(mtu: mtu)
        guard packetData >= 3 else {
            return fail(OTAError(.incompatibleDevice, "an ATT MTU of \(mtu) leaves no room for a sector packet"))
        }
        tally.connectionBegan(streamAt: 0)
        state = .starting
        return [.write(TransferWrite(ESPCommand.start(length: UInt32(image.size)).encoded, to: .control, withResponse: true))]
    }

    private mutating func commandAnswer(_ value: [UInt8]) -> [TransferAction] {
        guard case .starting = state, let answer = try? ESPCommandAck(decoding: value), answer.command == ESPCommand.start(length: 0).id else {
            return []
        }
        guard answer.accepted else {
            return fail(OTAError(.protocolError, "the device rejected START (status \(answer.status)): it took a START earlier on this boot (Bluedroid's component refuses a second one)",
                                 hint: resetHint))
        }
        state = .streaming(Stream())
        return []
    }

    private mutating func sectorAnswer(_ value: [UInt8]) -> [TransferAction] {
        guard case .streaming(var stream) = state, let answer = try? ESPSectorAck(decoding: value) else { return [] }
        let sector = Int(answer.sector)
        if answer.status == .success {
            // ACKs come in order: one for sector s says the device holds every sector up to s. One
            // for a sector never completed (0xFFFF, or past what was sent) is not ours.
            guard sector >= stream.acked, sector < stream.sector || (sector == stream.sector && stream.position == 0) else { return [] }
            advance(&stream, to: sector + 1)
            if stream.acked == sectorCount {
                state = .awaitingRestart(extended: false)
                return []
            }
            state = .streaming(stream)
            return []
        }
        let wanted = Int(answer.expected ?? answer.sector)
        if answer.status == .crcError, stream.expectedCRCError == wanted {
            stream.expectedCRCError = nil
            state = .streaming(stream)
            return []
        }
        guard wanted < sectorCount else {
            return fail(OTAError(.protocolError, "the device asked for sector \(wanted) (\(answer.status)) of an image of \(sectorCount) sectors", hint: resetHint))
        }
        // A wrong-sector NACK asking for the sector already rewound to answers a packet that was
        // in flight; a CRC error is the end of an attempt at that sector, and always a new one.
        if answer.status != .crcError, stream.rewoundTo == wanted { return [] }
        guard host != .bluedroid else {
            // Bluedroid's component collects the packets of other sectors into the one it wants
            // and checks no CRC: what it writes from now on is corrupt.
            return fail(OTAError(.protocolError, "the device refused a packet of sector \(answer.sector) (\(answer.status), it wants sector \(wanted)): a Bluedroid device keeps such packets in the sector it collects and checks no CRC, so the image it writes is now corrupt",
                                 hint: resetHint))
        }
        recoveries += 1
        guard recoveries <= config.maxRecoveries else {
            return fail(OTAError(.protocolError, "the device refused sector \(wanted) \(recoveries) times in a row (\(answer.status))", hint: resetHint))
        }
        tally.stats.rewinds += 1
        if wanted < stream.acked { retreat(&stream, to: wanted) }
        stream.sector = wanted
        stream.position = 0
        stream.rewoundTo = wanted
        stream.released = false
        var flush: [UInt8] = []
        ESPSectorPacket.encode(sector: UInt16(wanted), sequence: ESPSectorPacket.lastSequence, data: [], crc: ~stream.tail, into: &flush)
        stream.flush = flush
        stream.tail = 0
        state = .streaming(stream)
        return []
    }

    private mutating func advance(_ stream: inout Stream, to sectors: Int) {
        let end = min(image.size, sectors * ESPOTAService.sectorSize)
        if end > ackedBytes { ackedCRCValue.update(image.bytes[ackedBytes..<end]) }
        ackedBytes = max(ackedBytes, end)
        stream.acked = sectors
        stream.released = false
        if let r = stream.rewoundTo, r < sectors { stream.rewoundTo = nil }
        recoveries = 0
        tally.stats.checkpoints += 1
        if stream.sector < sectors {
            stream.sector = sectors
            stream.position = 0
        }
    }

    private mutating func retreat(_ stream: inout Stream, to sector: Int) {
        stream.acked = sector
        ackedBytes = sector * ESPOTAService.sectorSize
        ackedCRCValue = CRC32()
        ackedCRCValue.update(image.bytes[0..<ackedBytes])
    }

    private mutating func timedOut() -> [TransferAction] {
        switch state {
        case .starting:
            return fail(OTAError(.timeout, "the device did not answer START within \(config.replyTimeout.seconds) s",
                                 hint: "it may have taken it all the same; " + resetHint))
        case .streaming(var stream):
            if heldLastPacket(stream), !stream.released {
                stream.released = true
                state = .streaming(stream)
                return []
            }
            return fail(OTAError(.timeout, "the device did not acknowledge sector \(stream.acked) of \(sectorCount) within \(config.replyTimeout.seconds) s (\(ackedBytes) of \(image.size) bytes acknowledged)",
                                 hint: "it never ACKs, or its flash task stopped; " + resetHint))
        case .awaitingRestart(extended: false):
            state = .awaitingRestart(extended: true)
            return []
        case .awaitingRestart:
            return fail(OTAError(.verifyFailed, "every sector of the \(image.size)-byte image was acknowledged, but the device did not restart within \(config.verifyTimeout.seconds) s: its application refused the image (esp_ota_end found it corrupt, or for another chip or partition layout), and says nothing else",
                                 hint: "reset the device (power cycle) and run the same command again; if it refuses again, check the image with `esptool image-info` and that it was built for this device"))
        default:
            return []
        }
    }

    private mutating func disconnected(_ reason: DisconnectReason) -> [TransferAction] {
        switch state {
        case .idle:
            // Before START the device holds nothing: reconnecting is safe.
            return [.failed(OTAError(.connection, "\(reason) before START", resumable: true))]
        case .awaitingRestart:
            state = .done
            return [.finished]
        case .starting:
            return fail(OTAError(.connection, "\(reason) right after START", hint: resetHint))
        case .streaming(let stream):
            let lastSent = stream.sector >= sectorCount - 1 && sent == image.size
            let what = lastSent
                ? "\(reason) after the last sector went out but before its ACK: the device may have restarted into the new image; check what it runs, and if it is still the old image, "
                : "\(reason) at sector \(stream.sector) of \(sectorCount) (\(ackedBytes) of \(image.size) bytes acknowledged): Espressif's BLE OTA cannot resume; "
            return fail(OTAError(.connection, what + "nothing was booted", hint: resetHint))
        case .done, .failed:
            return []
        }
    }

    private mutating func fail(_ error: OTAError) -> [TransferAction] {
        failedPhase = phase
        state = .failed(in: phase)
        return [.failed(error)]
    }

    // MARK: Streaming

    /// Whether the next packet is a sector's last one, held for the ACK of an earlier sector.
    private func heldLastPacket(_ s: Stream) -> Bool {
        s.sector < sectorCount && s.sector > s.acked && isLast(sector: s.sector, position: s.position)
    }

    private func sectorLength(_ sector: Int) -> Int {
        min(ESPOTAService.sectorSize, image.size - sector * ESPOTAService.sectorSize)
    }

    /// The bytes of the packet at `position` of `sector`: a full packet while more than a last
    /// packet's worth (its data and the CRC16) remains, else the last packet; never an empty one.
    private func packetCount(sector: Int, position: Int) -> Int {
        let remaining = sectorLength(sector) - position
        return remaining > packetData - 2 ? min(packetData, remaining - 1) : remaining
    }

    private func isLast(sector: Int, position: Int) -> Bool {
        packetCount(sector: sector, position: position) == sectorLength(sector) - position
    }

    public mutating func nextStreamStep() -> TransferStep {
        guard case .streaming(var stream) = state else { return .idle }
        if let flush = stream.flush {
            stream.flush = nil
            stream.expectedCRCError = stream.sector
            state = .streaming(stream)
            return .write(TransferWrite(flush, to: .data, withResponse: false))
        }
        guard stream.sector < sectorCount, stream.sector < stream.acked + window else { return .idle }
        if heldLastPacket(stream), !stream.released { return .idle }
        let count = packetCount(sector: stream.sector, position: stream.position)
        let offset = stream.sector * ESPOTAService.sectorSize + stream.position
        tally.streamed(offset: offset, count: count)
        stream.position += count
        let last = stream.position == sectorLength(stream.sector)
        stream.tail = last ? 0 : CRC16.checksum(image.bytes[offset..<(offset + count)], seed: stream.tail)
        if last {
            stream.sector += 1
            stream.position = 0
        }
        state = .streaming(stream)
        // A sector's last packet goes out as a write step: the session then waits for its ACK
        // from this packet on (a data packet does not restart the reply timeout).
        return last ? .write(TransferWrite(dataPacket(offset: offset, count: count), to: .data, withResponse: false))
            : .data(offset: offset, count: count)
    }

    public func dataPacket(offset: Int, count: Int) -> [UInt8] {
        let sector = offset / ESPOTAService.sectorSize
        let position = offset % ESPOTAService.sectorSize
        let last = position + count == sectorLength(sector)
        let sequence: UInt8 = last ? ESPSectorPacket.lastSequence : UInt8(truncatingIfNeeded: position / max(1, packetData))
        var out: [UInt8] = []
        ESPSectorPacket.encode(sector: UInt16(truncatingIfNeeded: sector), sequence: sequence, data: image.bytes[offset..<(offset + count)],
                               crc: last ? sectorCRCs[sector] : nil, into: &out)
        return out
    }
}
