import GATT
import OTA
import OTAWire

/// The SMP central as a pure state machine (events in, writes out; no I/O, no clock).
///
/// Upload (image group, command 1): the first request carries the length, the file's SHA-256
/// and the image number; the server's answer says where it stands (0 for a new upload, its
/// offset when it holds part of the same file), and the upload goes on from there. Then up to
/// `window` requests are kept in flight, each as large as the server's buffer takes in whole
/// writes (`frameLimit`), each frame split into ATT writes without response; every answer's `off`
/// is the server's checkpoint. An answer at another offset than the request's end means the
/// server dropped or refused data: the requests in flight are forgotten (their answers are
/// ignored by sequence number) and the upload goes on from the server's offset.
///
/// Then it verifies: the image states must list, for the image number, a slot whose hash is the
/// image's (the device computed it over what it holds); nothing is marked unless it does. Then
/// it marks the image for test (or confirms it) and resets the device. A lost link resumes the
/// upload through the server's offset on the next connection.
///
/// An upload the server checked and found wrong (`match` false, or no slot with the image's hash)
/// is sent again from offset 0 once (`maxStartOvers`, within `maxRecoveries`), as smpmgr and
/// mcumgr users do by hand: the server starts a new upload at a first request once the last one
/// finished. If that fails too, the failure is resumable, so a retry (`--retries`) sends it anew.
///
/// While it waits on the first upload request (the server erases its slot before it answers), it
/// says so in `notes` at each timeout, before it asks again.
public struct SMPEngine: TransferEngine {
    public typealias Peer = SMPLink

    /// Requests in flight at most, by default: Zephyr's default is 4 SMP buffers.
    public static let defaultMaxWindow = 4
    /// How long the first upload request may take: a server erases its slot before answering
    /// (Zephyr's `img_mgmt_upload` erases the image's length before it writes the first chunk
    /// and answers; 20-40 s for a 1 MiB slot on nRF52/nRF5340). smpclient and Nordic's Android
    /// library allow 40 s; this leaves room for a 40 s erase and the chunk's own write.
    public static let firstRequestTimeout: Duration = .seconds(45)
    /// How often an upload the server found wrong is sent again from 0 on this run.
    public static let maxStartOvers = 1

    public let image: FirmwareImage
    public let config: EngineConfig
    public let settings: SMPUploadSettings

    /// A request that is not an upload chunk, awaiting its answer.
    struct Command: Sendable {
        var sequence: UInt8
        var request: SMPRequest
    }

    /// A busy (or out of memory) answer to the one request in flight: the engine waits
    /// `busyBackoff` (`waiting`), then asks again from the server's offset (the timeout path,
    /// counted as a retry); when the retries run out, the refusal is the error.
    struct Busy: Sendable {
        var refusal: SMPDeviceError
        var waiting: Bool
    }

    /// Where the engine stands, with what holds only there.
    enum State: Sendable {
        case idle
        /// `--restart`: the slot erase in flight, before the first upload request.
        case erasing(Command)
        /// The first upload request (with the file's length and SHA-256) in flight: its answer
        /// says where the server's upload stands.
        case opening(Busy?)
        case streaming(Busy?)
        /// The image state read in flight: does a slot hold the image's hash?
        case verifying(Command)
        /// Marking the image, then the reset, in flight.
        case activating(Command)
        /// The device answered the reset (or dropped the link after it): MCUboot swaps the image
        /// in, or refuses it and runs the old one. The next connection's image states say which.
        case rebooting
        /// `confirmAfterCheck`: the new image runs; the echo, then the confirm, in flight.
        case checking(Command)
        case done
        case failed(in: TransferPhase)
    }

    var state = State.idle
    var tally = ResendTally()
    /// Next offset to send.
    public internal(set) var sent = 0
    /// The server's offset, from its last answer in order.
    public internal(set) var acked = 0
    public private(set) var chunkSize = 0
    /// Requests in flight at most on this connection.
    public internal(set) var window = 1
    /// The frame size limit on this connection: the server's `buf_size` (or `maxFrame`), down to
    /// whole ATT writes.
    public private(set) var frameLimit = 0
    /// What the session reports, each once, as it happens: the server ran out of buffers and the
    /// upload went on with one request in flight (once per run; a device with one buffer, or none
    /// reported, is described by the profile's `device_info` instead); the first upload request
    /// went unanswered and is asked again; the upload goes again from 0; the server gave no `match`.
    public internal(set) var notes: [String] = []
    /// Whether the server reported `match` for the finished upload (nil: it did not say).
    public internal(set) var serverMatch: Bool?
    /// Uploads sent again from 0 after the server found one wrong.
    public internal(set) var startOvers = 0
    var toldBusy = false

    var prefix: PrefixCRC
    private var maxWrite = 20
    private var reassembler = SMPReassembler()
    private var sequence: UInt8 = 0
    /// Upload requests in flight, by sequence number: the offset their data ends at.
    var inFlight: [UInt8: Int] = [:]
    /// Segments of frames to write, in order.
    var queue: [[UInt8]] = []
    var queueHead = 0
    var retries = 0
    /// The frame size for the upload's requests after the first, picked on the link.
    var probe: SMPFrameProbe?
    private var probeWrite = 0
    /// The session's clock at the last event (the probe times answers with it).
    var now = Duration.zero
    /// How long to wait before asking a busy server again.
    public var busyBackoff: Duration { min(config.replyTimeout, .seconds(1)) }
    /// The hash the image is marked with: the MCUboot hash, or for an image that is not an MCUboot
    /// image, what the device reports for the slot it wrote.
    var markHash: [UInt8]?
    /// The image states the device reported when it attached: what a refusal is explained with.
    var states: SMPImageStates?
    /// The version the device reverts to when the checked image is not confirmed.
    var revertTo: String?
    /// The state writes of the marking so far: companions marked (1…count), then this image (count + 1).
    var marking = 0
    /// MCUboot's mode, from the first connection that reported it.
    public internal(set) var bootloader: SMPBootloaderInfo?

    public init(image: FirmwareImage, config: EngineConfig, settings: SMPUploadSettings) {
        self.image = image
        self.config = config
        self.settings = settings
        markHash = settings.imageHash
        prefix = PrefixCRC(image: image.bytes)
    }

    public var phase: TransferPhase {
        switch state {
        case .idle: .idle
        case .erasing, .opening: .beginning
        case .streaming: .streaming
        case .verifying: .verifying
        case .activating, .rebooting, .checking: .activating
        case .done: .done
        case .failed: .failed
        }
    }

    public var failedIn: TransferPhase? {
        if case .failed(let phase) = state { return phase }
        return nil
    }

    public var stats: TransferStats { tally.stats }
    public var highWater: Int { tally.highWater }

    /// The request in flight that is not an upload chunk.
    var command: Command? {
        switch state {
        case .erasing(let c), .verifying(let c), .activating(let c), .checking(let c): c
        case .idle, .opening, .streaming, .rebooting, .done, .failed: nil
        }
    }

    /// The busy answer being waited out or retried, while the upload goes on.
    var busy: Busy? {
        switch state {
        case .opening(let b), .streaming(let b): b
        default: nil
        }
    }

    var waitingOutBusy: Bool { busy?.waiting == true }

    public var currentTimeout: Duration {
        if waitingOutBusy { return busyBackoff }
        switch state {
        case .erasing: return max(config.replyTimeout, Self.firstRequestTimeout)
        case .opening:
            // The first request is asked again once after a reply timeout (a server busy erasing
            // queues it and answers both; one that lost the first starts erasing now), then the
            // erase is waited for: the whole wait stays under a minute.
            return retries == 0 && config.commandRetries > 0 ? config.replyTimeout : max(config.replyTimeout, Self.firstRequestTimeout)
        case .verifying: return config.verifyTimeout
        case .activating, .rebooting: return max(config.replyTimeout, config.activateTimeout)
        case .idle, .streaming, .checking, .done, .failed: return config.replyTimeout
        }
    }

    /// The server's offset when it answered the first request: 0 for a new upload (the first
    /// chunk then went to it), where it stood for a resumed one.
    public var resumeOffset: Int { stats.resumedFrom.last ?? 0 }

    public var isAwaitingReply: Bool { command != nil || !inFlight.isEmpty || waitingOutBusy || isRebooting }
    var isRebooting: Bool { if case .rebooting = state { true } else { false } }
    /// After the reset: the next connection's image states say whether MCUboot swapped the image in.
    public var awaitsNextConnection: Bool { isRebooting }
    public var ackedCRC: UInt32 { prefix.crc(upTo: acked) ?? 0 }
    /// The frame size the probe settled on (nil while it runs, or without one).
    public var probedFrame: Int? { probe?.chosen }

    public mutating func observe(time: Duration) { now = time }
    /// The bytes the device confirmed over the run's uploads: one sent again from 0 counts on from
    /// where the last one ended, so the stall budget sees its progress.
    public var furthestAgreed: Int { agreedBefore + acked }
    /// What the uploads before the last start-over reached.
    var agreedBefore = 0

    public mutating func seed(confirmedOffset: Int, crc: UInt32) {
        // The server decides where the upload stands; a journal entry only saves hashing.
        if prefix.crc(upTo: confirmedOffset) == crc { prefix.record(offset: confirmedOffset, crc: crc) }
    }

    public func dataPacket(offset: Int, count: Int) -> [UInt8] {
        Array(image.bytes[offset..<(offset + count)])
    }

    // MARK: Events

    public mutating func handle(_ event: TransferEvent<SMPLink>) -> [TransferAction] {
        switch event {
        case .connected(let link, let mtu):
            return start(link, mtu: mtu)
        case .notification(_, let bytes):
            guard phase != .done, phase != .failed else { return [] }
            let frames: [SMPFrame]
            do {
                frames = try reassembler.append(bytes)
            } catch {
                return fail(OTAError(.protocolError, "the device sent an SMP answer otaflash cannot read: \(error)", cause: error))
            }
            var actions: [TransferAction] = []
            for frame in frames {
                actions += answer(frame)
                if phase == .failed || phase == .done { break }
            }
            return actions
        case .commandFailed(let error):
            return fail(OTAError(.protocolError, "an SMP write failed: \(error.message)", cause: error))
        case .timeout:
            return timedOut()
        case .disconnected(let reason):
            guard phase != .done, phase != .failed, phase != .idle else { return [] }
            probe?.decide()
            inFlight = [:]
            queue = []
            queueHead = 0
            if case .reset? = command?.request {
                // The device resets as soon as it answered; the answer may not have made it.
                state = .rebooting
            }
            if isRebooting { return [.failed(rebootError)] }
            if case .checking(let c) = state {
                return fail(checkFailed("the link dropped while it was asked for an SMP \(c.request.command) (\(reason)), as when the application crashes and the device resets"))
            }
            let held = acked > 0 ? " (\(acked) of \(image.size) bytes held by the device)" : ""
            return fail(OTAError(.connection, "\(reason)\(held)", hint: "run the same command again to resume", resumable: true))
        }
    }

    private mutating func start(_ link: SMPLink, mtu: Int) -> [TransferAction] {
        guard phase != .done else { return [] }
        let rebooted = isRebooting
        let wasChecking = phase == .verifying || phase == .activating
        state = .idle
        guard !image.bytes.isEmpty else {
            return fail(OTAError(.image, "\(image.source): the image is empty; nothing to send"))
        }
        maxWrite = ATTWriteLimit.value(mtu: mtu)
        states = link.states ?? states
        let firstReport = bootloader == nil && link.bootloader != nil
        bootloader = link.bootloader ?? bootloader
        reassembler.reset()
        inFlight = [:]
        queue = []
        queueHead = 0
        retries = 0
        tally.connectionBegan(streamAt: sent)
        if let parameters = link.parameters, parameters.bufferSize > 0 {
            frameLimit = Int(parameters.bufferSize)
            let count = max(1, Int(parameters.bufferCount))
            window = min(count, max(1, settings.maxWindow))
        } else {
            // An older server that does not say: smpclient's fallback, one write per request.
            frameLimit = maxWrite
            window = 1
        }
        reassembler = SMPReassembler(maxFrameSize: SMPHeader.size + Int(UInt16.max))
        if let limit = settings.maxFrame { frameLimit = min(frameLimit, max(0, limit)) }
        // Frames of whole writes: a frame's short last write costs a link-layer packet for little
        // data (384-byte buffers at MTU 185: 182 + 182 + 20), so a frame keeps to the most whole
        // writes its buffer holds (364 bytes there).
        if settings.maxFrame == nil, frameLimit > maxWrite { frameLimit -= frameLimit % maxWrite }
        chunkSize = Self.firstRequest(settings: settings, size: image.size, data: []).maxDataSize(frameLimit: frameLimit)
        guard chunkSize > 0, SMPImageUpload(offset: UInt64(image.size), data: []).maxDataSize(frameLimit: frameLimit) > 0 else {
            if link.parameters == nil {
                // An older server (mcumgr) does not say its buffer: one write per request, and
                // at this MTU one write cannot hold an upload request.
                return fail(OTAError(.incompatibleDevice, "the device does not report its SMP buffer (an older SMP server), so each request must fit one write, and at ATT MTU \(mtu) a write (\(frameLimit) bytes) cannot hold an upload request",
                                     hint: "connect with a larger ATT MTU (the device's and the adapter's), or enable the MCUmgr parameters command on the device (CONFIG_MCUMGR_GRP_OS_MCUMGR_PARAMS)"))
            }
            return fail(OTAError(.incompatibleDevice, "the device's SMP buffer (\(frameLimit) bytes) cannot hold an upload request",
                                 hint: "raise CONFIG_MCUMGR_TRANSPORT_NETBUF_SIZE on the device"))
        }
        if settings.maxFrame == nil, settings.probeFrames, let parameters = link.parameters {
            // A frame picked on an earlier connection of the same MTU stays; otherwise probe.
            let candidates = SMPFrameProbe.candidates(bufferSize: Int(parameters.bufferSize), maxWrite: maxWrite)
            if let chosen = probe?.chosen, probeWrite == maxWrite, candidates.contains(chosen) {
                probe = SMPFrameProbe(deciding: chosen)
            } else {
                let image = image
                probe = SMPFrameProbe(candidates: candidates, window: window, remaining: image.size - acked) {
                    SMPImageUpload(offset: UInt64(image.size), data: []).maxDataSize(frameLimit: $0)
                }
            }
            probeWrite = maxWrite
        } else {
            probe = nil
        }
        if rebooted { return booted(link.states) }
        if firstReport, let refusal = modeRefusal() { return fail(refusal) }
        if wasChecking || acked == image.size, acked > 0 {
            tally.resumed(from: acked)
            return verify()
        }
        // The first request opens (or, with the same file, resumes) the server's upload.
        sent = 0
        if config.restart, stats.connections == 1 {
            // The server resumes an upload of the same file: erase its slot to start over.
            // img_mgmt numbers image N's slots 2N and 2N + 1; nil is image 0's upload slot.
            let slot = settings.imageNumber == 0 ? nil : settings.imageNumber * 2 + 1
            return send(.imageErase(slot: slot), as: { .erasing($0) })
        }
        state = .opening(nil)
        return sendChunk(at: 0)
    }

    /// The first request, with `data` empty: sized from it.
    static func firstRequest(settings: SMPUploadSettings, size: Int, data: [UInt8]) -> SMPImageUpload {
        SMPImageUpload.first(image: settings.imageNumber, length: UInt64(size), sha: settings.fileSHA256, data: data, upgrade: settings.upgrade)
    }

    // MARK: Sending

    private mutating func nextSequence() -> UInt8 {
        defer { sequence &+= 1 }
        return sequence
    }

    /// Queues the writes of `request` as the command the state `next` waits for.
    mutating func send(_ request: SMPRequest, as next: (Command) -> State) -> [TransferAction] {
        let seq = nextSequence()
        state = next(Command(sequence: seq, request: request))
        let frame: SMPFrame
        do {
            frame = try request.frame(sequence: seq)
        } catch {
            return fail(OTAError(.internalError, "cannot encode \(request): \(error)"))
        }
        for segment in SMPFraming.segments(frame.encoded, maxWrite: maxWrite) { queue.append(Array(segment)) }
        return []
    }

    /// Builds the upload request at `offset` and queues its writes.
    mutating func sendChunk(at offset: Int) -> [TransferAction] {
        let seq = nextSequence()
        var upload = offset == 0
            ? Self.firstRequest(settings: settings, size: image.size, data: [])
            : SMPImageUpload(offset: UInt64(offset), data: [])
        // The first request keeps to whole writes; the probe sizes the others.
        let opening = if case .opening = state { true } else { false }
        let probed = offset > 0 && !opening ? probe?.nextFrame : nil
        let count = min(upload.maxDataSize(frameLimit: probed ?? frameLimit), image.size - offset)
        upload.data = Array(image.bytes[offset..<(offset + count)])
        let frame: SMPFrame
        do {
            frame = try SMPRequest.imageUpload(upload).frame(sequence: seq)
        } catch {
            return fail(OTAError(.internalError, "cannot encode the upload request at \(offset): \(error)"))
        }
        for segment in SMPFraming.segments(frame.encoded, maxWrite: maxWrite) { queue.append(Array(segment)) }
        inFlight[seq] = offset + count
        if probed != nil { probe?.sent(end: offset + count) }
        sent = offset + count
        tally.streamed(offset: offset, count: count)
        return []
    }

    public mutating func nextStreamStep() -> TransferStep {
        if queueHead == queue.count {
            queue.removeAll(keepingCapacity: true)
            queueHead = 0
            // Refill: another upload request while the window has room.
            guard case .streaming(let busy) = state, busy?.waiting != true, inFlight.count < window, sent < image.size else { return .idle }
            _ = sendChunk(at: sent)
            if phase == .failed { return .idle }
        }
        let segment = queue[queueHead]
        queueHead += 1
        return .write(TransferWrite(segment, to: .data, withResponse: false))
    }
}
