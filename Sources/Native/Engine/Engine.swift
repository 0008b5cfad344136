import GATT
import OTA
import OTAWire

/// The central side of the protocol as a pure state machine: events in, actions out, no I/O and
/// no clock. `OTASession` drives it over a `GATTConnection`; tests drive it directly.
///
/// Rules (docs/PROTOCOL.md, "Central behaviour"):
/// - BEGIN, then stream data packets of `mtu - 3 - 4` bytes with write without response.
/// - After every `checkpointInterval` bytes, send CHECKPOINT(offset, CRC) with response, keeping at
///   most one command in flight; stop streaming when the next checkpoint is due and the previous
///   one is unanswered.
/// - When the device reports a position (a checkpoint reply, a GAP event, BEGIN's or STATUS's reply)
///   whose CRC matches the local CRC of that prefix, continue from there; when it does not match,
///   make the device roll back to its last committed checkpoint; when that fails too, restart.
/// - VERIFY after the last checkpoint; ACTIVATE only after VERIFY reported the image's own CRC.
public struct OTAEngine: TransferEngine {
    public typealias Peer = DeviceInfo

    /// The native protocol's own tunables (the shared ones are `EngineConfig`).
    public struct Settings: Sendable, Hashable {
        /// Bytes between two checkpoints. One checkpoint may be in flight while the next interval
        /// streams, so at most two intervals are ever unacknowledged (the "checkpoint window").
        /// The default is chosen by measurement: docs/PROTOCOL.md, "Choosing the checkpoint interval".
        public var checkpointInterval: Int
        /// The version the image carries, sent in BEGIN; the device reports it after activation.
        public var imageVersion: FirmwareVersion?

        public static let defaultCheckpointInterval = 16 * 1024

        public init(checkpointInterval: Int = Settings.defaultCheckpointInterval, imageVersion: FirmwareVersion? = nil) {
            self.checkpointInterval = checkpointInterval
            self.imageVersion = imageVersion
        }

        /// The most data the engine lets out beyond the last acknowledged checkpoint.
        public var window: Int { 2 * checkpointInterval }
    }

    /// A command awaiting its reply, and how often it was sent.
    struct Command: Sendable {
        var request: ControlRequest
        var attempts = 1
    }

    /// Where the engine stands, with what holds only there.
    enum State: Sendable {
        case idle
        /// BEGIN in flight: the first of a connection, or one that starts the transfer over.
        case beginning(Command)
        /// Streaming, with the checkpoint (or the STATUS asked after it) in flight, if any.
        /// `heldByGap`: a GAP event arrived while it was in flight; the stream waits for its reply.
        case streaming(Command?, heldByGap: Bool)
        /// VERIFY in flight, or STATUS after it; `verifyTimedOut`: VERIFY went unanswered and the
        /// STATUS that followed tells whether it passed.
        case verifying(Command, verifyTimedOut: Bool)
        case activating(Command)
        /// `confirmedByInfo`: after an unconfirmed activation the device's info showed it runs this image.
        case done(confirmedByInfo: Bool)
        /// `activationUnconfirmed`: the link dropped after ACTIVATE was sent and before its reply.
        case failed(in: TransferPhase, activationUnconfirmed: Bool)
    }

    public let image: FirmwareImage
    public let config: EngineConfig
    public let settings: Settings
    private(set) var state = State.idle
    private var tally = ResendTally()
    public private(set) var chunkSize = 0
    public private(set) var deviceInfo: DeviceInfo?

    private var prefix: PrefixCRC
    /// Next offset to send and the CRC of everything before it.
    public private(set) var sent = 0
    private var runningCRC = CRC32()
    /// The last checkpoint the device confirmed.
    public private(set) var acked = 0
    /// Offset of the most recent checkpoint sent.
    private var lastCheckpoint = 0
    private var recoveries = 0
    /// The checkpoint interval in use: halved after a CRC rollback (corruption is caught sooner
    /// and costs less), doubled back after each clean checkpoint, never above the configured one.
    public private(set) var currentInterval: Int
    /// The furthest position the device reported with a CRC that matched the image: what the
    /// session's stall timer watches.
    public private(set) var furthestAgreed = 0

    public init(image: FirmwareImage, config: EngineConfig = EngineConfig(), settings: Settings = Settings()) {
        self.image = image
        self.config = config
        self.settings = settings
        self.prefix = PrefixCRC(image: image.bytes)
        self.currentInterval = settings.checkpointInterval
    }

    /// The smallest interval the engine shrinks to.
    static let minimumInterval = 1024

    /// Takes a confirmed position from a journal: the CRC of the image up to `offset`. Only a
    /// shortcut for later CRC checks; the device's own reply still decides where streaming starts.
    public mutating func seed(confirmedOffset offset: Int, crc: UInt32) {
        prefix.record(offset: offset, crc: crc)
    }

    public var phase: TransferPhase {
        switch state {
        case .idle: .idle
        case .beginning: .beginning
        case .streaming: .streaming
        case .verifying: .verifying
        case .activating: .activating
        case .done: .done
        case .failed: .failed
        }
    }

    public var failedIn: TransferPhase? {
        if case .failed(let phase, _) = state { return phase }
        return nil
    }

    public var stats: TransferStats { tally.stats }
    /// Highest offset ever sent (for counting resends).
    public var highWater: Int { tally.highWater }

    /// The link dropped after ACTIVATE was sent and before its reply arrived.
    public var activationUnconfirmed: Bool {
        if case .failed(_, true) = state { return true }
        return false
    }

    /// The device's info showed it already runs this image after an unconfirmed activation.
    public var activationConfirmedByInfo: Bool {
        if case .done(true) = state { return true }
        return false
    }

    /// The CRC of the image up to the last confirmed checkpoint.
    public var ackedCRC: UInt32 { prefix.crc(upTo: acked) ?? 0 }

    /// The command in flight, if any.
    private var command: Command? {
        switch state {
        case .beginning(let c), .verifying(let c, _), .activating(let c): c
        case .streaming(let c, _): c
        case .idle, .done, .failed: nil
        }
    }

    /// The command awaiting its reply, if any.
    public var commandInFlight: ControlRequest? { command?.request }

    public var isAwaitingReply: Bool { command != nil }

    public var isFinished: Bool { phase == .done || phase == .failed }

    /// How long to wait for the command in flight. A version 2 device that erases as data arrives
    /// may be erasing every unit of a window before it gets to a CHECKPOINT or STATUS: their
    /// timeout grows by that much (docs/PROTOCOL.md, "Device timing").
    public var currentTimeout: Duration {
        switch command?.request {
        case .verify?: config.verifyTimeout
        case .activate?: config.activateTimeout
        case .checkpoint?, .status?: config.replyTimeout + eraseAllowance
        default: config.replyTimeout
        }
    }

    /// The erase time of one window's units plus one, for a version 2 device without erase-ahead.
    var eraseAllowance: Duration {
        guard let flash = deviceInfo?.flash, !flash.erasesAhead, flash.eraseTimeMs > 0 else { return .zero }
        let units = checkpointStride(interval: settings.checkpointInterval) * 2 / Int(flash.eraseUnit) + 1
        return .milliseconds(units * Int(flash.eraseTimeMs))
    }

    /// The protocol version the device's info value named: BEGIN carries it.
    private var protocolVersion: UInt8 { deviceInfo?.protocolVersion ?? OTAProtocol.version }

    /// The erase unit of a version 2 device, 1 otherwise: checkpoints fall on its multiples.
    private var eraseUnit: Int { Int(deviceInfo?.flash?.eraseUnit ?? 1) }

    /// The distance between checkpoints: `interval`, at least a chunk, rounded up to the erase unit.
    private func checkpointStride(interval: Int) -> Int {
        let unit = eraseUnit
        let stride = max(interval, chunkSize)
        return (stride + unit - 1) / unit * unit
    }

    public func dataPacket(offset: Int, count: Int) -> [UInt8] {
        DataPacket.encode(offset: UInt32(offset), payload: image.bytes[offset..<(offset + count)])
    }

    // MARK: Events

    public mutating func handle(_ event: TransferEvent<DeviceInfo>) -> [TransferAction] {
        switch event {
        case .connected(let info, let mtu):
            return start(info: info, mtu: mtu)
        case .notification(let role, let bytes):
            guard role == .control else { return [] }
            return handleNotification(bytes)
        case .commandFailed(let error):
            // A write that failed because the link is gone: the disconnect event follows.
            if error.code == .notConnected { return [] }
            // A device serving another central refuses our writes with ATT 0x89 (docs/PROTOCOL.md,
            // "One transfer at a time").
            if error.attError == ATTError(rawValue: 0x89) {
                return fail(OTAError(.protocolError, "the device is busy with another central's transfer",
                                     hint: "wait for it to finish, then run the same command again", resumable: true, cause: error))
            }
            // The device wants pairing: sending again cannot help.
            if error.code == .notAuthorized || error.code == .permissionDenied {
                return fail(OTAError.from(error, device: "the device"))
            }
            return retryCommand(after: "\(error)", failingWith: .connection, cause: error)
        case .timeout:
            return handleTimeout()
        case .disconnected(let reason):
            switch state {
            case .done, .failed:
                return []
            case .activating:
                // The device may reboot into the new image before its reply reaches us. VERIFY
                // passed, so the image is good; the reply is what we lack. On the next connection
                // the info value's running-image CRC tells whether it took effect.
                state = .failed(in: .activating, activationUnconfirmed: true)
                return [.failed(OTAError(.connection, "\(reason) while activating: the image was verified, but activation was not confirmed",
                                         hint: "run the same command again: it checks what the device runs before sending anything", resumable: true))]
            case .idle, .beginning, .streaming, .verifying:
                let where_ = acked > 0 ? " (\(acked) of \(image.size) bytes confirmed)" : ""
                return fail(OTAError(.connection, "\(reason)\(where_)", hint: "run the same command again to resume", resumable: true))
            }
        }
    }

    /// Starts, or after a link loss restarts, the protocol on a fresh connection. Keeps what the
    /// engine knows of the image (confirmed CRCs, what was sent) so a resume re-sends only what the
    /// device lacks.
    private mutating func start(info: DeviceInfo, mtu: Int) -> [TransferAction] {
        if case .done = state { return [] }
        let activationUnconfirmed = self.activationUnconfirmed
        deviceInfo = info
        state = .idle
        tally.connectionBegan(streamAt: sent)
        guard OTAProtocol.versions.contains(info.protocolVersion) else {
            return fail(OTAError(.incompatibleDevice, "device speaks OTA protocol version \(info.protocolVersion); this otaflash speaks versions \(OTAProtocol.versions.lowerBound) to \(OTAProtocol.versions.upperBound)",
                                 hint: "update otaflash, or flash the device with firmware whose OTA service speaks one of these"))
        }
        if activationUnconfirmed, config.activate, info.activeImageCRC == image.crc32 {
            // The device booted this image: the update is done, nothing is sent again.
            state = .done(confirmedByInfo: true)
            return [.finished]
        }
        guard image.size <= Int(info.maxImageSize) else {
            return fail(OTAError(.imageTooLarge, "image is \(image.size) bytes but the device's slot holds \(info.maxImageSize) bytes; build a smaller image or use a device with a larger slot"))
        }
        guard mtu >= OTAProtocol.minimumMTU else {
            return fail(OTAError(.incompatibleDevice, "the link reports ATT MTU \(mtu), below the minimum of \(OTAProtocol.minimumMTU) every BLE link supports; the transport is misbehaving"))
        }
        chunkSize = OTAProtocol.chunkSize(mtu: mtu)
        return begin(restart: config.restart && stats.resumedFrom.isEmpty)
    }

    private mutating func handleNotification(_ bytes: [UInt8]) -> [TransferAction] {
        guard let note = try? ControlNotification(decoding: bytes) else { return [] }
        switch note {
        case .event(.gap(let offset, let crc)):
            guard case .streaming(let command, _) = state else { return [] }
            if let command {
                state = .streaming(command, heldByGap: true)
                return []
            }
            return reconcile(offset: Int(offset), crc: crc, deviceRolledBack: false)
        case .response(let response):
            guard let flight = command, flight.request.opcode == response.opcode else { return [] }  // stale
            return handleResponse(response, to: flight.request)
        }
    }

    /// The reply to the command in flight: every case moves the engine to its next state.
    private mutating func handleResponse(_ r: ControlResponse, to request: ControlRequest) -> [TransferAction] {
        switch (request, r.status, r.payload) {
        case (.begin, .success, .position(let offset, let crc)):
            tally.resumed(from: Int(offset))
            state = .streaming(nil, heldByGap: false)
            return reconcile(offset: Int(offset), crc: crc, deviceRolledBack: false)

        case (.checkpoint(let offset, _), .success, .position(let devOffset, let crc)) where devOffset == offset:
            if Int(offset) > furthestAgreed { furthestAgreed = Int(offset); recoveries = 0 }
            acked = Int(offset)
            currentInterval = min(settings.checkpointInterval, currentInterval * 2)
            prefix.record(offset: acked, crc: crc)
            state = .streaming(nil, heldByGap: false)
            return afterProgress()

        case (.checkpoint, .gap, .position(let offset, let crc)),
             (.checkpoint, .success, .position(let offset, let crc)):
            state = .streaming(nil, heldByGap: false)
            return reconcile(offset: Int(offset), crc: crc, deviceRolledBack: false)

        case (.checkpoint, .crcMismatch, .position(let offset, let crc)):
            state = .streaming(nil, heldByGap: false)
            tally.stats.rollbacks += 1
            currentInterval = max(min(Self.minimumInterval, settings.checkpointInterval), currentInterval / 2)
            return reconcile(offset: Int(offset), crc: crc, deviceRolledBack: true)

        case (.status, .success, .status(let s)):
            guard s.state == .receiving || s.state == .verified, s.imageSize == UInt32(image.size), s.imageCRC == image.crc32 else {
                return restartTransfer(because: "the device no longer holds this transfer (state \(s.state))")
            }
            if case .verifying(_, let timedOut) = state {
                // The device verified this image (it enters `verified` only when its CRC matched):
                // only VERIFY's reply was lost.
                if s.state == .verified { return verified() }
                if Int(s.offset) == image.size {
                    guard !timedOut else { return verifyTimeout() }
                    return send(.verify, as: { .verifying($0, verifyTimedOut: false) })
                }
                // The device lost confirmed data (a reboot): send what it lacks, then verify again.
            }
            state = .streaming(nil, heldByGap: false)
            return reconcile(offset: Int(s.offset), crc: s.crc, deviceRolledBack: false)

        case (.verify, .success, .computedCRC(let crc)) where crc == image.crc32:
            return verified()

        case (.verify, .success, .computedCRC(let crc)), (.verify, .crcMismatch, .computedCRC(let crc)):
            return fail(OTAError(.verifyFailed, "device rejected the image at verify: it computed CRC32 \(hex32(crc)), the image's is \(hex32(image.crc32)); nothing was activated. Run again with --restart to send the whole image anew"))

        case (.verify, .incomplete, _):
            // The device lost data it had confirmed (e.g. a reboot): ask where it stands.
            return send(.status, as: { .verifying($0, verifyTimedOut: false) })

        case (.activate, .success, _):
            state = .done(confirmedByInfo: false)
            return [.finished]

        default:
            let what = "\(request.opcode) was refused: \(r.status)"
            switch r.status {
            case .imageTooLarge:
                return fail(OTAError(.imageTooLarge, "\(what); the image (\(image.size) bytes) does not fit the device's slot"))
            case .busy:
                return fail(OTAError(.protocolError, "\(what); another central is updating this device, wait for it to finish", resumable: true))
            case .unsupportedProtocol:
                return fail(OTAError(.incompatibleDevice, "\(what); update otaflash or the device's OTA service"))
            case .invalidState where request.opcode == .checkpoint || request.opcode == .verify:
                return restartTransfer(because: "the device dropped the transfer (\(r.status))")
            default:
                return fail(OTAError(.protocolError, "\(what)"))
            }
        }
    }

    /// The device says it holds `offset` bytes with CRC `crc` (the engine streams, nothing in
    /// flight). Continue from there if that matches the image; otherwise make it roll back, and
    /// restart when even that disagrees.
    private mutating func reconcile(offset: Int, crc: UInt32, deviceRolledBack: Bool) -> [TransferAction] {
        guard offset <= image.size, let local = prefix.crc(upTo: offset) else {
            return restartTransfer(because: "the device reports offset \(offset), beyond the image")
        }
        if local == crc {
            if offset > furthestAgreed {
                // The device holds more than ever before: progress, so earlier recoveries are forgiven.
                furthestAgreed = offset
                recoveries = 0
            } else if offset < sent {
                // Data was lost again below anything new: a rewind that confirms nothing counts, so a
                // device that drops or refuses every packet ends in an error instead of a loop.
                guard bumpRecoveries() else { return tooManyRecoveries() }
            }
            if offset < sent { tally.stats.rewinds += 1 }
            sent = offset
            runningCRC = CRC32(value: crc)
            if acked > offset { acked = offset }
            // Count the next interval from the last confirmed point, so a checkpoint follows soon.
            lastCheckpoint = acked
            if offset == image.size, acked == offset { return afterProgress() }
            return []
        }
        if deviceRolledBack || offset == 0 {
            return restartTransfer(because: "the device's data disagrees with the image at offset \(offset)")
        }
        guard bumpRecoveries() else { return tooManyRecoveries() }
        // Make the device compare against our CRC at its own offset: it rolls back on mismatch.
        return send(.checkpoint(offset: UInt32(offset), crc: local), as: { .streaming($0, heldByGap: false) })
    }

    /// VERIFY passed: the device computed the image's own CRC.
    private mutating func verified() -> [TransferAction] {
        guard config.activate else {
            state = .done(confirmedByInfo: false)
            return [.finished]
        }
        return send(.activate, as: { .activating($0) })
    }

    private mutating func verifyTimeout() -> [TransferAction] {
        fail(OTAError(.timeout, "the device did not finish verifying the image within \(config.verifyTimeout.seconds) s; nothing was activated",
                      hint: "raise --verify-timeout for a slow flash, or run the same command again to resume", resumable: true))
    }

    private mutating func begin(restart: Bool) -> [TransferAction] {
        let request = ControlRequest.begin(.init(protocolVersion: protocolVersion, imageSize: UInt32(image.size), imageCRC: image.crc32,
                                                 version: settings.imageVersion ?? FirmwareVersion(packed: 0), restart: restart))
        return send(request, as: { .beginning($0) })
    }

    private mutating func restartTransfer(because reason: String) -> [TransferAction] {
        guard bumpRecoveries() else { return tooManyRecoveries() }
        tally.stats.restarts += 1
        sent = 0
        acked = 0
        lastCheckpoint = 0
        runningCRC = CRC32()
        return begin(restart: true)
    }

    private mutating func bumpRecoveries() -> Bool {
        recoveries += 1
        return recoveries <= config.maxRecoveries
    }

    private mutating func tooManyRecoveries() -> [TransferAction] {
        fail(OTAError(.protocolError, "the device confirmed no new data in \(config.maxRecoveries) recoveries in a row (\(stats.rewinds) rewinds after lost data, \(stats.rollbacks) rollbacks after corrupted data, \(stats.restarts) restarts); check the link and the device's flash", resumable: false))
    }

    /// After a confirmed position: verify when everything is confirmed.
    private mutating func afterProgress() -> [TransferAction] {
        guard acked == image.size, sent == image.size, case .streaming(nil, _) = state else { return [] }
        return send(.verify, as: { .verifying($0, verifyTimedOut: false) })
    }

    private mutating func handleTimeout() -> [TransferAction] {
        guard let flight = command else { return [] }
        if case .verify = flight.request {
            // The device is still reading its flash back, or its reply was lost. Asking again
            // would start it over; STATUS (one reply timeout) tells which, so the phase ends
            // within --verify-timeout plus one command's retries.
            tally.stats.commandRetries += 1
            state = .verifying(Command(request: .status, attempts: flight.attempts + 1), verifyTimedOut: true)
            return [.write(TransferWrite(ControlRequest.status.encoded))]
        }
        return retryCommand(after: "no reply to \(flight.request.opcode) within \(currentTimeout.seconds) s", failingWith: .timeout)
    }

    /// The command in flight failed or went unanswered: send it again, or ask for STATUS (which
    /// changes nothing on the device) when resending could move its position. When the retries are
    /// used up, fails with `code` (the caller knows whether a reply was missing or a write failed).
    private mutating func retryCommand(after reason: String, failingWith code: OTAError.Code, cause: (any Error)? = nil) -> [TransferAction] {
        guard let flight = command else { return [] }
        guard flight.attempts <= config.commandRetries else {
            if case .verifying(_, true) = state { return verifyTimeout() }
            // A fresh connection often clears a stuck link or peripheral: let the supervisor try.
            return fail(OTAError(code, "\(flight.request.opcode) failed \(flight.attempts) times, last: \(reason)",
                                 hint: "the device may be stalled: power-cycle it and run the same command again to resume",
                                 resumable: true, cause: cause))
        }
        tally.stats.commandRetries += 1
        let request: ControlRequest
        switch flight.request {
        case .checkpoint, .status: request = .status
        default: request = flight.request
        }
        let retry = Command(request: request, attempts: flight.attempts + 1)
        switch state {
        case .beginning: state = .beginning(retry)
        case .streaming(_, let held): state = .streaming(retry, heldByGap: held)
        case .verifying(_, let timedOut): state = .verifying(retry, verifyTimedOut: timedOut)
        case .activating: state = .activating(retry)
        case .idle, .done, .failed: return []
        }
        return [.write(TransferWrite(request.encoded))]
    }

    /// Sends `request` as the command the state `next` waits for.
    private mutating func send(_ request: ControlRequest, as next: (Command) -> State) -> [TransferAction] {
        state = next(Command(request: request))
        return [.write(TransferWrite(request.encoded))]
    }

    private mutating func fail(_ error: OTAError) -> [TransferAction] {
        state = .failed(in: phase, activationUnconfirmed: false)
        return [.failed(error)]
    }

    // MARK: Streaming

    /// The next thing to send while streaming. Call repeatedly until `.idle`.
    public mutating func nextStreamStep() -> TransferStep {
        guard case .streaming(let command, heldByGap: false) = state else { return .idle }
        if eraseUnit > 1 { return nextAlignedStreamStep(idle: command == nil) }
        // Checkpoints fall on chunk boundaries: the next chunk would cross the interval.
        let interval = max(currentInterval, chunkSize)
        let next = min(chunkSize, image.size - sent)
        let due = (next > 0 && sent - lastCheckpoint + next > interval) || (sent == image.size && acked < sent)
        if due, command == nil, sent > lastCheckpoint || (sent == image.size && acked < sent) {
            return checkpoint()
        }
        guard next > 0, sent - lastCheckpoint + next <= interval else { return .idle }
        // The window holds whatever path led here (a STATUS resync can start a fresh interval
        // while older data is still unconfirmed): never more than one window unacknowledged.
        guard sent + next - acked <= max(settings.window, 2 * chunkSize) else { return .idle }
        return emitData(count: next)
    }

    /// Streaming to a version 2 device: a checkpoint goes out at the first packet edge at or past
    /// each multiple of the stride (a multiple of the erase unit), so the device, which commits the
    /// erase-unit boundary at or below a checkpoint, commits that multiple, and packets stay full
    /// (docs/PROTOCOL.md, "Erase-unit boundaries").
    private mutating func nextAlignedStreamStep(idle: Bool) -> TransferStep {
        let stride = checkpointStride(interval: currentInterval)
        let boundary = min(image.size, (lastCheckpoint / stride + 1) * stride)
        let atBoundary = sent >= boundary && sent > lastCheckpoint
        let finalDue = sent == image.size && acked < sent
        if atBoundary || finalDue {
            guard idle else { return .idle }
            return checkpoint()
        }
        let next = min(chunkSize, image.size - sent)
        guard next > 0 else { return .idle }
        guard sent + next - acked <= max(settings.window, 2 * stride) + 2 * chunkSize else { return .idle }
        return emitData(count: next)
    }

    /// A CHECKPOINT for everything sent, as the stream's next step.
    private mutating func checkpoint() -> TransferStep {
        lastCheckpoint = sent
        tally.stats.checkpoints += 1
        let request = ControlRequest.checkpoint(offset: UInt32(sent), crc: runningCRC.value)
        state = .streaming(Command(request: request), heldByGap: false)
        return .write(TransferWrite(request.encoded))
    }

    private mutating func emitData(count: Int) -> TransferStep {
        let offset = sent
        tally.streamed(offset: offset, count: count)
        runningCRC.update(image.bytes[offset..<(offset + count)])
        sent += count
        return .data(offset: offset, count: count)
    }
}
