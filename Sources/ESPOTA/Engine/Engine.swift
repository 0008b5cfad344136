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

/// Espressif's BLE OTA as a pure state machine (esp-iot-solution's `ble_ota` and `ble_ota_raw`
/// components and the example applications that hand them a flash task).
///
/// One START with the image's length, then the image in 4 KiB sectors, each as packets written
/// without response to RECV_FW: data packets numbered from 0, an empty one after them, and the
/// last (0xFF) with the sector's CRC16. The empty packet is there for NimBLE's component, which
/// takes a last packet whatever came before it: a lost data packet is seen only by the packet
/// after it, and a lost empty packet costs nothing.
///
/// The device ACKs each sector once it passed it to its ring buffer; when its flash task falls
/// behind, its host task blocks and the ACKs come late. The engine streams ahead: a `ble_ota_raw`
/// device announces in START's ACK (byte 6) how many sectors it buffers, and the engine keeps that
/// many un-ACKed; a device that announces nothing gets `window` sectors, and each sector's last
/// packet waits until every earlier sector is ACKed (older components keep the bytes of packets
/// of other sectors).
///
/// A NACK stops the stream. The packets in flight reach the device first (the link keeps their
/// order), and each may get a NACK of its own: the engine waits until they are through (a quiet
/// time of about twice the time they take), then sends the sector the device wants whole from
/// packet 0, alone, and streams again only after its ACK. NACKs that name another sector, or come
/// before that sector's last packet went out again, are stale. No last packet goes out for a sector
/// whose packets did not all go out in that attempt. ACKs count the bytes sector by sector.
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
    /// The most sectors a `ble_ota_raw` device may announce.
    public static let maximumWindow = 64
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

    /// After a NACK: what the engine does until the sector the device wants is ACKed.
    enum Recovery: Sendable, Hashable {
        /// Nothing goes out while the packets in flight reach the device; `quiet`: the first
        /// timeout passed, the next ends the wait.
        case draining(wanted: Int, quiet: Bool)
        /// `wanted` goes out alone, from packet 0; the stream waits for its ACK.
        case resending(wanted: Int)

        var wanted: Int {
            switch self {
            case .draining(let w, _), .resending(let w): w
            }
        }
    }

    struct Stream: Sendable {
        /// The sector being sent and the offset in it of the next data packet. Every sector from
        /// `acked` up to `sector` went out whole in its current attempt.
        var sector = 0
        var position = 0
        /// The empty packet after the data packets of `sector` went out.
        var sentinelSent = false
        /// Sectors the device has taken (an ACK of sector s says it holds 0…s).
        var acked = 0
        /// Sectors up to here went out whole at least once (their last packet went out).
        var sentWhole = 0
        var recovery: Recovery?
        /// The ACK of sector `acked` timed out once: its successor's last packet goes out anyway
        /// (an ACK lost on the way; the successor's ACK then covers both).
        var released = false
    }

    let image: FirmwareImage
    let config: EngineConfig
    /// Sectors un-ACKed at most for a device that announces no window (1: the reference app's
    /// strategy, one sector then its ACK).
    public let window: Int
    /// Each sector's CRC16, sent at the end of its last packet.
    let sectorCRCs: [UInt16]
    let sectorCount: Int
    private(set) var state: State = .idle
    private var packetData = 0
    private var host: ESPOTAHost?
    /// The window the device announced in START's ACK (`ble_ota_raw`).
    private(set) var deviceWindow: Int?
    private var tally = ResendTally()
    private var ackedCRCValue = CRC32()
    private var ackedBytes = 0
    private var recoveries = 0
    private var failedPhase: TransferPhase?
    private var noted: [String] = []
    // Time, as the session tells it: the interval between ACKs, to time a drain.
    private var now = Duration.zero
    private var lastACKAt: Duration?
    private var sectorInterval = Duration.milliseconds(300)

    /// Whether a window the device announces replaces `window` (false: the reference central,
    /// which ignores it).
    public let honoursDeviceWindow: Bool

    public init(image: FirmwareImage, config: EngineConfig, window: Int = ESPOTAEngine.defaultWindow, honoursDeviceWindow: Bool = true) {
        self.image = image
        self.config = config
        self.window = min(Self.maximumWindow, max(1, window))
        self.honoursDeviceWindow = honoursDeviceWindow
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

    /// Sectors kept un-ACKed at most on this connection.
    public var effectiveWindow: Int { honoursDeviceWindow ? deviceWindow ?? window : window }

    public var currentTimeout: Duration {
        switch state {
        case .awaitingRestart: return config.verifyTimeout
        // `ble_ota_raw`'s begin hook erases what the image takes before it answers START.
        case .starting: return config.replyTimeout + .milliseconds(500) * ((image.size + 0xFFFF) / 0x10000)
        case .streaming(let s):
            if case .draining? = s.recovery { return drainTime(s) }
            return config.replyTimeout
        default: return config.replyTimeout
        }
    }

    /// About twice the time the sectors in flight take to reach the device, at least 200 ms.
    private func drainTime(_ s: Stream) -> Duration {
        let inFlight = max(1, s.sector - s.acked + 1)
        return min(config.replyTimeout, max(.milliseconds(200), sectorInterval * (2 * inFlight)))
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
    public var notes: [String] { noted }

    public mutating func observe(time: Duration) { now = time }

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
            return fail(OTAError(.protocolError, "the device rejected START (status \(answer.status)): it took a START earlier on this boot (Bluedroid's ble_ota and ble_ota_raw refuse a second one), or ble_ota_raw's esp_ota_begin failed (an image larger than its OTA partition)",
                                 hint: resetHint))
        }
        if let w = answer.sectorWindow {
            deviceWindow = min(Self.maximumWindow, Int(w))
            noted.append("the device announces a window of \(deviceWindow ?? 1) sector\(deviceWindow == 1 ? "" : "s") (ble_ota_raw): up to that many go out un-ACKed")
        }
        lastACKAt = now
        state = .streaming(Stream())
        return []
    }

    /// Whether the device keeps the bytes of packets of other sectors (Bluedroid's `ble_ota`):
    /// after a NACK, what it writes is corrupt.
    private var collectsOtherSectors: Bool { host == .bluedroid && deviceWindow == nil }

    private mutating func sectorAnswer(_ value: [UInt8]) -> [TransferAction] {
        guard case .streaming(var stream) = state, let answer = try? ESPSectorAck(decoding: value) else { return [] }
        let sector = Int(answer.sector)
        if answer.status == .success {
            // ACKs come in order: one for sector s says the device holds every sector up to s.
            // One for a sector whose last packet never went out is not ours.
            guard sector >= stream.acked, sector < stream.sentWhole else { return [] }
            if case .draining(let wanted, _)? = stream.recovery, wanted == sector, host == .nimble, deviceWindow == nil {
                // NimBLE's ble_ota emptied its buffer at the NACK that wants this sector and took
                // the last packet after it: a short sector, handed to the application.
                return fail(OTAError(.protocolError, "the device took sector \(sector) short: a packet refused just before its last packet emptied the sector, and NimBLE's ble_ota took the last packet all the same; its application now waits for bytes that will not come (\(ackedBytes) of \(image.size) bytes acknowledged whole)",
                                     hint: resetHint))
            }
            return took(&stream, sectors: sector + 1)
        }
        let wanted = Int(answer.expected ?? answer.sector)
        // A packet of a sector the device already took: stale (NimBLE reset the sector it was
        // collecting, and refuses that sector's last packet itself).
        guard sector >= stream.acked else { return [] }
        guard wanted <= sectorCount else {
            return fail(OTAError(.protocolError, "the device asked for sector \(wanted) (\(answer.status)) of an image of \(sectorCount) sectors", hint: resetHint))
        }
        // A sector already ACKed: a NACK of a packet from before the resend that was ACKed (the
        // device cannot go back without a restart, which drops the link).
        guard wanted >= stream.acked else { return [] }
        if wanted > stream.acked {
            // It took every sector before the one it wants: ACKs lost on the way.
            guard wanted <= stream.sentWhole else {
                return fail(OTAError(.protocolError, "the device says it holds \(wanted) sectors, more than went out whole (\(stream.sentWhole)): it took a short sector and waits for bytes that will not come",
                                     hint: resetHint))
            }
            let actions = took(&stream, sectors: wanted)
            guard case .streaming(let advanced) = state else { return actions }
            stream = advanced
        }
        if let recovery = stream.recovery {
            switch recovery {
            case .draining(let w, _) where wanted == w:
                return []
            case .draining(_, let quiet):
                stream.recovery = .draining(wanted: wanted, quiet: quiet)
                state = .streaming(stream)
                return []
            case .resending(let w):
                // Only the answer to the resent sector's last packet ends the attempt; `ble_ota_raw`
                // answers each packet out of sequence (status 3) and keeps the sector.
                let ended = sector == w && stream.sector > w && answer.status != .lengthError
                guard ended else { return [] }
            }
        }
        if collectsOtherSectors {
            return fail(OTAError(.protocolError, "the device refused a packet of sector \(answer.sector) (\(answer.status), it wants sector \(wanted)): Bluedroid's ble_ota keeps such packets in the sector it collects and checks no CRC, so the image it writes is now corrupt",
                                 hint: resetHint))
        }
        return recover(&stream, wanted: wanted, why: "\(answer.status)", drain: true)
    }

    /// The device took sectors up to `sectors`: counts their bytes, and streams on from there.
    private mutating func took(_ stream: inout Stream, sectors: Int) -> [TransferAction] {
        let end = min(image.size, sectors * ESPOTAService.sectorSize)
        if end > ackedBytes { ackedCRCValue.update(image.bytes[ackedBytes..<end]) }
        ackedBytes = max(ackedBytes, end)
        let newly = sectors - stream.acked
        stream.acked = sectors
        stream.released = false
        if let last = lastACKAt, newly > 0 {
            let interval = (now - last) / newly
            sectorInterval = (sectorInterval * 3 + interval) / 4
        }
        lastACKAt = now
        if let recovery = stream.recovery, recovery.wanted < sectors {
            stream.recovery = nil
            // Whatever went out after the NACK was refused: the stream goes on from here.
            if case .draining = recovery {
                stream.sector = sectors
                stream.position = 0
                stream.sentinelSent = false
            }
        }
        recoveries = 0
        tally.stats.checkpoints += 1
        if stream.sector < sectors {
            stream.sector = sectors
            stream.position = 0
            stream.sentinelSent = false
        }
        if stream.acked == sectorCount {
            state = .awaitingRestart(extended: false)
            return []
        }
        state = .streaming(stream)
        return []
    }

    /// Stops the stream for `wanted`: after a quiet time for what is in flight (`drain`), or at
    /// once, it goes out again alone from packet 0.
    private mutating func recover(_ stream: inout Stream, wanted: Int, why: String, drain: Bool) -> [TransferAction] {
        recoveries += 1
        guard recoveries <= config.maxRecoveries else {
            return fail(OTAError(.protocolError, "the device refused sector \(wanted) \(recoveries) times in a row (\(why)); \(ackedBytes) of \(image.size) bytes acknowledged",
                                 hint: resetHint))
        }
        tally.stats.rewinds += 1
        stream.released = false
        if drain {
            stream.recovery = .draining(wanted: wanted, quiet: false)
        } else {
            resend(&stream, wanted)
        }
        state = .streaming(stream)
        return []
    }

    private func resend(_ stream: inout Stream, _ wanted: Int) {
        stream.recovery = .resending(wanted: wanted)
        stream.sector = wanted
        stream.position = 0
        stream.sentinelSent = false
    }

    private mutating func timedOut() -> [TransferAction] {
        switch state {
        case .starting:
            return fail(OTAError(.timeout, "the device did not answer START within \(currentTimeout.seconds) s",
                                 hint: "it may have taken it all the same; " + resetHint))
        case .streaming(var stream):
            switch stream.recovery {
            case .draining(let wanted, false)?:
                // The wait ran from before the NACK: a quiet time of its own from now.
                stream.recovery = .draining(wanted: wanted, quiet: true)
                state = .streaming(stream)
                return []
            case .draining(let wanted, true)?:
                resend(&stream, wanted)
                state = .streaming(stream)
                return []
            case .resending?:
                break
            case nil:
                if heldLastPacket(stream), !stream.released {
                    stream.released = true
                    state = .streaming(stream)
                    return []
                }
                if stream.sector > stream.acked {
                    // A last packet, or its ACK, lost: the sector again alone (a device that took
                    // it names the next one in its NACK).
                    return recover(&stream, wanted: stream.acked, why: "no ACK", drain: false)
                }
            }
            return fail(OTAError(.timeout, "the device did not acknowledge sector \(stream.acked) of \(sectorCount) within \(config.replyTimeout.seconds) s (\(ackedBytes) of \(image.size) bytes acknowledged)",
                                 hint: "it never ACKs, or its flash task stopped; " + resetHint))
        case .awaitingRestart(extended: false):
            state = .awaitingRestart(extended: true)
            return []
        case .awaitingRestart:
            let caveat = collectsOtherSectors
                ? " (Bluedroid's ble_ota checks neither packet order nor sector CRC: a write command lost on the way ends so too)" : ""
            return fail(OTAError(.verifyFailed, "the device acknowledged every byte of the \(image.size)-byte image, sector by sector, but did not restart within \(config.verifyTimeout.seconds) s: its application took every byte and refused the image (esp_ota_end found it corrupt, or it is for another chip or partition layout)\(caveat); it says nothing else",
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
            if stream.sector == sectorCount, stream.recovery == nil || stream.recovery == .resending(wanted: sectorCount - 1) {
                // Every sector went out whole, no NACK open: where the ACK of the last one was lost,
                // the device restarts just so. Nothing here tells that from a link lost before the
                // device took the last packet.
                return fail(OTAError(.notConfirmed, "sent and executed, not confirmed: every sector of the \(image.size)-byte image went out and the device ACKed \(ackedBytes) bytes; then \(reason) before the ACK of the last sector, as when the device restarts into the new image and that ACK was lost",
                                     hint: "check what the device runs (its version) before anything else; if it still runs the old image, " + resetHint))
            }
            return fail(OTAError(.connection, "\(reason) at sector \(stream.sector) of \(sectorCount) (\(ackedBytes) of \(image.size) bytes acknowledged): Espressif's BLE OTA cannot resume; nothing was booted",
                                 hint: resetHint))
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

    /// Whether the next packet is a sector's last one, held for the ACK of an earlier sector (a
    /// device that announced no window).
    private func heldLastPacket(_ s: Stream) -> Bool {
        deviceWindow == nil && s.sector < sectorCount && s.sector > s.acked && isLast(s)
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

    /// Whether the empty packet is due: after the data packets of a sector that has some.
    private func sentinelDue(_ s: Stream) -> Bool {
        s.position > 0 && !s.sentinelSent && packetCount(sector: s.sector, position: s.position) == sectorLength(s.sector) - s.position
    }

    private func isLast(_ s: Stream) -> Bool {
        !sentinelDue(s) && packetCount(sector: s.sector, position: s.position) == sectorLength(s.sector) - s.position
    }

    public mutating func nextStreamStep() -> TransferStep {
        guard case .streaming(var stream) = state else { return .idle }
        switch stream.recovery {
        case .draining?: return .idle
        case .resending(let wanted)? where stream.sector > wanted: return .idle
        default: break
        }
        guard stream.sector < sectorCount, stream.sector < stream.acked + effectiveWindow else { return .idle }
        if heldLastPacket(stream), !stream.released { return .idle }
        let offset = stream.sector * ESPOTAService.sectorSize + stream.position
        if sentinelDue(stream) {
            stream.sentinelSent = true
            state = .streaming(stream)
            tally.streamed(offset: offset, count: 0)
            return .data(offset: offset, count: 0)
        }
        let count = packetCount(sector: stream.sector, position: stream.position)
        tally.streamed(offset: offset, count: count)
        stream.position += count
        let last = stream.position == sectorLength(stream.sector)
        if last {
            stream.sector += 1
            stream.sentWhole = max(stream.sentWhole, stream.sector)
            stream.position = 0
            stream.sentinelSent = false
        }
        state = .streaming(stream)
        // A sector's last packet goes out as a write step: the session then waits for its ACK
        // from this packet on (a data packet does not restart the reply timeout).
        return last ? .write(TransferWrite(dataPacket(offset: offset, count: count), to: .data, withResponse: false))
            : .data(offset: offset, count: count)
    }

    /// The packet carrying `image[offset..<offset+count]`: a data packet, the sector's last one
    /// (with its CRC16), or with `count` 0 the empty packet after a sector's data packets.
    public func dataPacket(offset: Int, count: Int) -> [UInt8] {
        let sector = offset / ESPOTAService.sectorSize
        let position = offset % ESPOTAService.sectorSize
        let last = count > 0 && position + count == sectorLength(sector)
        // Every data packet before `position` is a full one.
        let sequence: UInt8 = last ? ESPSectorPacket.lastSequence : UInt8(truncatingIfNeeded: (position + packetData - 1) / max(1, packetData))
        var out: [UInt8] = []
        ESPSectorPacket.encode(sector: UInt16(truncatingIfNeeded: sector), sequence: sequence, data: image.bytes[offset..<(offset + count)],
                               crc: last ? sectorCRCs[sector] : nil, into: &out)
        return out
    }
}
