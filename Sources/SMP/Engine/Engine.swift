import GATT
import OTA
import OTAWire

/// What the SMP profile read from a device when it attached, for the engine's `.connected`.
public struct SMPLink: Sendable, Hashable {
    /// The server's SMP buffer (`buf_size`, `buf_count`); nil when it did not answer the read
    /// (an older server): one request in flight, each at most one ATT write.
    public var parameters: SMPParameters?
    /// The image states before the upload; nil when not read.
    public var states: SMPImageStates?
    /// MCUboot's mode and downgrade prevention (os_mgmt's bootloader info); nil when the server
    /// does not answer it (an older one): a swap mode is assumed.
    public var bootloader: SMPBootloaderInfo?

    public init(parameters: SMPParameters?, states: SMPImageStates?, bootloader: SMPBootloaderInfo? = nil) {
        self.parameters = parameters
        self.states = states
        self.bootloader = bootloader
    }
}

/// What is uploaded, and what happens once the device holds it.
public struct SMPUploadSettings: Sendable, Hashable {
    /// The image number on a multi-image device (0: the application).
    public var imageNumber: UInt32
    /// SHA-256 of the whole file as uploaded: the upload's `sha`, which identifies it on the
    /// server and lets a new run resume it.
    public var fileSHA256: [UInt8]
    /// The MCUboot image hash (its SHA-256/384/512 TLV): what the device reports for the slot once
    /// it holds the image, and what marks it for test or confirms it. Nil for an image that is
    /// not an MCUboot image: then only the server's own `match` check can verify it.
    public var imageHash: [UInt8]?
    /// After the upload: confirm the image at once (it becomes permanent at the next reset)
    /// instead of marking it for test (MCUboot reverts a test image not confirmed by itself).
    public var confirm: Bool
    /// Reset the device after marking the image (MCUboot then swaps it in).
    public var reset: Bool
    /// The most requests kept in flight, whatever the device's buffer count allows.
    public var maxWindow: Int
    /// The request frame (header and CBOR) at most, exactly as given when the buffer takes it
    /// (no probe, no rounding to whole writes); nil: the engine picks it. `ATTWriteLimit.value(mtu:)`
    /// sends each request in one write, as a client that cannot rely on the server's reassembly does.
    public var maxFrame: Int?
    /// Pick the frame size on the link (`SMPFrameProbe`) when `maxFrame` is nil; false: frames of
    /// the most whole writes the buffer holds.
    public var probeFrames: Bool
    /// Confirm only once the image has run (`--confirm after-check`): mark it for test, reset,
    /// and on the next connection check that it is active and answers an SMP echo; then confirm
    /// it (or, with `holdsConfirm`, finish unconfirmed for the caller's own check). A failed check
    /// leaves it unconfirmed, for MCUboot to revert at the next reset (`checkFailed`).
    public var confirmAfterCheck: Bool
    /// With `confirmAfterCheck`: finish after the echo without confirming; the caller runs its own
    /// check (`--check-command`) and confirms.
    public var holdsConfirm: Bool
    /// The upload's `upgrade` flag: the device refuses an image not newer than the one it runs
    /// (IMG_MGMT_ERR_CURRENT_VERSION_IS_NEWER) before it erases anything.
    public var upgrade: Bool
    /// Upload and verify only: another image of the same update marks it and resets the device
    /// (`SMPMultiImageEngine`, every image but the last).
    public var uploadOnly = false
    /// The other images of the same update, already uploaded: marked, in this order, before this
    /// image, and checked to run after the reset (`SMPMultiImageEngine`, the last image).
    public var companions: [SMPCompanion] = []

    public init(imageNumber: UInt32 = 0, fileSHA256: [UInt8], imageHash: [UInt8]?, confirm: Bool = false, reset: Bool = true,
                maxWindow: Int = SMPEngine.defaultMaxWindow, maxFrame: Int? = nil, probeFrames: Bool = true,
                confirmAfterCheck: Bool = false, holdsConfirm: Bool = false, upgrade: Bool = false) {
        self.probeFrames = probeFrames
        self.upgrade = upgrade
        self.confirmAfterCheck = confirmAfterCheck
        self.holdsConfirm = holdsConfirm
        self.imageNumber = imageNumber
        self.fileSHA256 = fileSHA256
        self.imageHash = imageHash
        self.confirm = confirm
        self.reset = reset
        self.maxWindow = maxWindow
        self.maxFrame = maxFrame
    }
}

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

    private(set) var state = State.idle
    private var tally = ResendTally()
    /// Next offset to send.
    public private(set) var sent = 0
    /// The server's offset, from its last answer in order.
    public private(set) var acked = 0
    public private(set) var chunkSize = 0
    /// Requests in flight at most on this connection.
    public private(set) var window = 1
    /// The frame size limit on this connection: the server's `buf_size` (or `maxFrame`), down to
    /// whole ATT writes.
    public private(set) var frameLimit = 0
    /// What the session reports, each once, as it happens: the server ran out of buffers and the
    /// upload went on with one request in flight (once per run; a device with one buffer, or none
    /// reported, is described by the profile's `device_info` instead); the first upload request
    /// went unanswered and is asked again; the upload goes again from 0; the server gave no `match`.
    public private(set) var notes: [String] = []
    /// Whether the server reported `match` for the finished upload (nil: it did not say).
    public private(set) var serverMatch: Bool?
    /// Uploads sent again from 0 after the server found one wrong.
    public private(set) var startOvers = 0
    private var toldBusy = false

    private var prefix: PrefixCRC
    private var maxWrite = 20
    private var reassembler = SMPReassembler()
    private var sequence: UInt8 = 0
    /// Upload requests in flight, by sequence number: the offset their data ends at.
    private var inFlight: [UInt8: Int] = [:]
    /// Segments of frames to write, in order.
    private var queue: [[UInt8]] = []
    private var queueHead = 0
    private var retries = 0
    /// The frame size for the upload's requests after the first, picked on the link.
    private var probe: SMPFrameProbe?
    private var probeWrite = 0
    /// The session's clock at the last event (the probe times answers with it).
    private var now = Duration.zero
    /// How long to wait before asking a busy server again.
    public var busyBackoff: Duration { min(config.replyTimeout, .seconds(1)) }
    /// The hash the image is marked with: the MCUboot hash, or for an image that is not an MCUboot
    /// image, what the device reports for the slot it wrote.
    private var markHash: [UInt8]?
    /// The image states the device reported when it attached: what a refusal is explained with.
    private var states: SMPImageStates?
    /// The version the device reverts to when the checked image is not confirmed.
    private var revertTo: String?
    /// The state writes of the marking so far: companions marked (1…count), then this image (count + 1).
    private var marking = 0
    /// MCUboot's mode, from the first connection that reported it.
    public private(set) var bootloader: SMPBootloaderInfo?

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
    private var command: Command? {
        switch state {
        case .erasing(let c), .verifying(let c), .activating(let c), .checking(let c): c
        case .idle, .opening, .streaming, .rebooting, .done, .failed: nil
        }
    }

    /// The busy answer being waited out or retried, while the upload goes on.
    private var busy: Busy? {
        switch state {
        case .opening(let b), .streaming(let b): b
        default: nil
        }
    }

    private var waitingOutBusy: Bool { busy?.waiting == true }

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
    private var isRebooting: Bool { if case .rebooting = state { true } else { false } }
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
    private var agreedBefore = 0

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

    // MARK: Answers

    private mutating func answer(_ frame: SMPFrame) -> [TransferAction] {
        let seq = frame.header.sequence
        let response: SMPResponse
        do {
            response = try SMPResponse(decoding: frame)
        } catch {
            // An answer to something this engine did not send (or no longer waits for) is ignored.
            guard inFlight[seq] != nil || command?.sequence == seq else { return [] }
            return fail(OTAError(.protocolError, "the device's SMP answer is malformed: \(error)", cause: error))
        }
        if let end = inFlight.removeValue(forKey: seq) {
            return uploadAnswered(response, expected: end)
        }
        if let command, command.sequence == seq {
            return commandAnswered(response, to: command.request)
        }
        return []  // stale: a request forgotten after a rewind or a timeout
    }

    private mutating func uploadAnswered(_ response: SMPResponse, expected end: Int) -> [TransferAction] {
        let opening: Bool
        switch state {
        case .opening: opening = true
        case .streaming: opening = false
        default: return []  // the upload is over: an answer to a request still in flight changes nothing
        }
        let status: SMPUploadStatus
        switch response {
        case .upload(let s):
            status = s
            retries = 0
            state = opening ? .opening(nil) : .streaming(nil)
        case .error(let e) where e.general == .busy || e.general == .noMemory:
            if window > 1 {
                // The server ran out of buffers: go on with one request at a time.
                if !toldBusy {
                    toldBusy = true
                    notes.append("the device answered \(Self.name(of: e)) with \(window) requests in flight (out of SMP buffers, or busy): one request in flight from here on, slower")
                }
                window = 1
                // The first request is asked again at once; a later one when the window refills.
                return opening ? sendChunk(at: 0) : rewind(to: acked)
            }
            // Busy with one request at a time: wait, then ask again from the server's offset,
            // as often as a command is retried.
            let waiting = Busy(refusal: e, waiting: true)
            state = opening ? .opening(waiting) : .streaming(waiting)
            return rewind(to: acked)
        case .error(let e):
            return fail(refusal(e))
        default:
            return fail(OTAError(.protocolError, "the device answered an upload request with \(response)"))
        }
        guard let offset = Int(exactly: status.offset), offset <= image.size else {
            return fail(OTAError(.protocolError, "the device reported upload offset \(status.offset), past the image's \(image.size) bytes"))
        }
        if opening {
            state = .streaming(nil)
            if offset != end {
                // The server holds part of this very file (same sha): resume there (the first
                // request's data, which it already had, went for nothing).
                tally.resumed(from: offset)
                acked = offset
                sent = offset
                if offset < image.size { return [] }
            } else {
                // The server wrote the first request's data at 0: a new upload, or one it starts
                // over (it lost the upload in a reset, say), whatever this engine had seen it
                // confirm before. What it held goes again, and is counted so as it goes.
                tally.resumed(from: 0)
                tally.startedOver()
                acked = 0
            }
        }
        if offset == image.size {
            acked = offset
            prefix.record(offset: offset, crc: ackedCRC)
            serverMatch = status.match
            if status.match == false {
                let what = "the device's SHA-256 of the uploaded file does not match the file's"
                return startOver(because: what, OTAError(.verifyFailed, "the device's SHA-256 of the uploaded file does not match the file's\(againSaid); nothing was marked",
                                          hint: "run the same command again: it uploads the file anew; if it fails again, the link or the device's flash corrupts data",
                                          resumable: true))
            }
            return verify()
        }
        if offset != end {
            // The server is elsewhere: it refused or lost a request, or holds more of this file.
            tally.stats.rewinds += 1
            return rewind(to: offset)
        }
        acked = max(acked, offset)
        tally.stats.checkpoints += 1
        probe?.answered(end: offset, at: now)
        return []
    }

    /// How the note names a busy server's answer: "busy (10)", "out of memory (2)".
    static func name(of error: SMPDeviceError) -> String {
        switch error.general {
        case .busy?: "busy (10)"
        case .noMemory?: "out of memory (2)"
        default: "error \(error.rc)"
        }
    }

    /// The device's refusal of the upload, explained with the slot states it reported: which
    /// image holds slot 1 (NO_FREE_SLOT), which version runs (CURRENT_VERSION_IS_NEWER).
    private func refusal(_ e: SMPDeviceError) -> OTAError {
        let general = e.otaError(device: "the device", request: "the upload at \(acked)")
        let slots = (states?.images ?? []).filter { ($0.image ?? 0) == settings.imageNumber }
        let active = slots.first { $0.active }
        if e.imageError == .noFreeSlot {
            if let waiting = slots.first(where: { $0.pending && !$0.active }) {
                return OTAError(general.code, "the device refused the upload: no free slot (9): slot \(waiting.slot) holds image \(waiting.version), marked to run at the next reset; reset the device (otaflash reset), then confirm the image that runs (otaflash image confirm) or reset again to revert it, and retry", cause: e)
            }
            if let active, !active.confirmed {
                return OTAError(general.code, "the device refused the upload: no free slot (9): it runs test image \(active.version), not confirmed, and slot 1 holds the image to revert to; confirm it (otaflash image confirm) or reset the device (otaflash reset) to revert, then retry", cause: e)
            }
        }
        if e.imageError == .invalidFlashAddress, let mode = bootloader?.mode, mode.runsInPlace {
            let target = slots.first(where: { !$0.active }).map(\.slot) ?? active.map { 1 - $0.slot } ?? 1
            let built = header?.fixedAddress.map { " (load address 0x\(String($0, radix: 16)))" } ?? ""
            return OTAError(general.code, "the device refused the upload: invalid flash address (25): in \(mode) mode an image runs only at the address it was built for, and this one\(built) is not built for slot \(target), the slot not running, where the upload goes; give the image built for slot \(target) (nRF Connect SDK's direct-XIP build makes one for each slot)", cause: e)
        }
        if settings.imageNumber != 0, acked == 0, e.general == .invalidValue, case .opening = state {
            // img_mgmt refuses an image number past CONFIG_MCUMGR_GRP_IMG_UPDATABLE_IMAGE_NUMBER so.
            return OTAError(.incompatibleDevice, "the device refused the upload to image \(settings.imageNumber) with invalid value (3): it has no \(settings.label) (its MCUboot updates fewer images); give only the images it has, or build it with CONFIG_UPDATEABLE_IMAGE_NUMBER=\(settings.imageNumber + 1)", cause: e)
        }
        if e.imageError == .currentVersionIsNewer, let active {
            return OTAError(general.code, "the device refused the upload: current version is newer (27): it runs \(active.version), the same as or newer than this image, and refuses a downgrade; upload an image with a higher version (imgtool sign --version)", cause: e)
        }
        if e.general == .unknown, acked == 0, case .opening = state {
            // An image over the slot, answered in general codes: Zephyr translates its "too large"
            // (30) to this for an SMP v1 client, and mcumgr fails to erase that much. Resetting the
            // device cannot help then.
            let said = e.reason.map { " (device says: \($0))" } ?? ""
            return OTAError(general.code, "the device refused the first upload request with unknown error (1)\(said): the image (\(image.size) bytes) may not fit its slot (an SMP server that reports errors in general codes answers so to an image over its slot size); check the image against the device's slot (its flash partition), build a smaller one, or retry if the device's flash failed", cause: e)
        }
        return general
    }

    /// Forgets what is in flight and streams again from the server's `offset`.
    private mutating func rewind(to offset: Int) -> [TransferAction] {
        probe?.decide()
        inFlight = [:]
        queue = []
        queueHead = 0
        acked = offset
        sent = offset
        return []
    }

    private mutating func commandAnswered(_ response: SMPResponse, to request: SMPRequest) -> [TransferAction] {
        retries = 0
        if case .checking = state { return checked(response, to: request) }
        if case .imageStateWrite(_, let confirm) = request, case .error(let e) = response, e.general == .notSupported,
           !settings.confirmAfterCheck || !confirm, settings.reset {
            // No state write on this device: MCUboot in direct-XIP or RAM load, which boots the
            // slot with the highest version (a server that does not report its mode, say
            // mcumgr's, shows it only here). The reset follows; what booted decides.
            notes.append("the device has no image state write (NOT_SUPPORTED: MCUboot in direct-XIP or RAM load mode, which boots the slot with the highest version): resetting it without a mark")
            bootloader = bootloader ?? SMPBootloaderInfo(mode: .directXIP)
            return send(.reset(force: false), as: { .activating($0) })
        }
        if case .error(let e) = response {
            return fail(e.otaError(device: "the device", request: "\(request)"))
        }
        switch (request, response) {
        case (.imageStateRead, .imageStates(let states)):
            return verified(states)
        case (.imageStateWrite, .imageStates(let states)):
            return marked(states)
        case (.imageStateWrite, .empty):
            return marked(nil)
        case (.reset, _):
            // The link drops when the device resets (`rebootError`); the next connection reads
            // what MCUboot booted.
            state = .rebooting
            return []
        case (.imageErase, _):
            state = .opening(nil)
            return sendChunk(at: 0)
        default:
            return fail(OTAError(.protocolError, "the device answered \(request) with \(response)"))
        }
    }

    // MARK: Verify, mark, reset

    private mutating func verify() -> [TransferAction] {
        if settings.imageHash == nil {
            // Not an MCUboot image: the server's own check is all there is.
            guard serverMatch == true else {
                return fail(OTAError(.verifyFailed, "the device did not confirm the upload's SHA-256 (no 'match' in its answer), and the file is not an MCUboot image whose hash could be checked; nothing was marked",
                                     hint: "send an MCUboot image (imgtool sign), or enable CONFIG_IMG_ENABLE_IMAGE_CHECK on the device"),
                            in: .verifying)
            }
            return markOrFinish()
        }
        return send(.imageStateRead, as: { .verifying($0) })
    }

    private mutating func verified(_ states: SMPImageStates) -> [TransferAction] {
        // The freshest list: the marks that follow check the other images of the update in it.
        self.states = states
        let slots = states.images.filter { ($0.image ?? 0) == settings.imageNumber }
        guard let hash = settings.imageHash else {
            // The server checked the SHA-256; mark what it reports for the slot it wrote.
            guard let written = slots.first(where: { !$0.active && $0.hash != nil })?.hash else {
                return fail(OTAError(.protocolError, "after the upload the device lists no slot besides the running one; nothing was marked"))
            }
            markHash = written
            return markOrFinish()
        }
        guard slots.contains(where: { $0.hash == hash }) else {
            let listed = slots.map { "slot \($0.slot) \($0.hash.map(hexString) ?? "without a hash")" }.joined(separator: ", ")
            let what = "after the upload the device holds no image with this image's hash \(hexString(hash))"
            return startOver(because: what, OTAError(.verifyFailed, "after the upload the device holds no image with this image's hash \(hexString(hash)) (it lists \(listed.isEmpty ? "no slot" : listed))\(againSaid); nothing was marked",
                                      hint: "run the same command again: it uploads the file anew; if it fails again, the device's flash or its image check is at fault",
                                      resumable: true))
        }
        return markOrFinish()
    }

    private mutating func markOrFinish() -> [TransferAction] {
        guard config.activate, !settings.uploadOnly else {
            state = .done
            return [.finished]
        }
        if let mode = bootloader?.mode, mode == .directXIP || mode == .ramLoad {
            // No state write in these modes: MCUboot boots the slot with the highest version.
            guard settings.reset else {
                state = .done
                return [.finished]
            }
            return send(.reset(force: false), as: { .activating($0) })
        }
        guard let hash = markHash else {
            return fail(OTAError(.internalError, "no hash to mark the uploaded image with; please report this"), in: .activating)
        }
        if serverMatch == nil, settings.imageHash != nil {
            // An mcumgr server answers no `match` and reports the slot's hash TLV, not a hash of
            // what it holds: a corrupted upload looks intact until MCUboot checks it at the reset.
            notes.append("the device did not check the uploaded file's SHA-256 (its answer has no 'match', as an mcumgr server's), and the slot's hash it reports is read from the image: only MCUboot's check at the reset can find a corrupted upload; check that the new version runs afterwards (otaflash image list)")
        }
        marking = 0
        return markNext(ownHash: hash)
    }

    /// Marks the next image: the companions first, in order (each but one the device already
    /// runs), then this one. With a hash, confirm marks the uploaded image (without one it would
    /// confirm the running image).
    private mutating func markNext(ownHash hash: [UInt8]) -> [TransferAction] {
        let confirm = settings.confirm && !settings.confirmAfterCheck
        while marking < settings.companions.count {
            let companion = settings.companions[marking]
            marking += 1
            let slots = (states?.images ?? []).filter { ($0.image ?? 0) == companion.imageNumber && $0.hash == companion.imageHash }
            if slots.contains(where: \.active) { continue }
            guard states == nil || !slots.isEmpty else {
                // MCUboot refused it at a reset (and erased it) before this image was marked.
                return fail(OTAError(.verifyFailed, "the \(companion.label)'s image \(companion.version) is no longer on the device (MCUboot refused it at a reset and erased it); the \(settings.label)'s image was not marked, so nothing runs half updated",
                                     hint: "run the same command again: it uploads every image anew"), in: .activating)
            }
            return send(.imageStateWrite(hash: companion.imageHash, confirm: confirm), as: { .activating($0) })
        }
        marking = settings.companions.count + 1
        return send(.imageStateWrite(hash: hash, confirm: confirm), as: { .activating($0) })
    }

    /// The image (number and hash) the state write in flight marks.
    private var markedNow: (number: UInt32, hash: [UInt8]?) {
        guard marking > 0, marking <= settings.companions.count else { return (settings.imageNumber, markHash) }
        let companion = settings.companions[marking - 1]
        return (companion.imageNumber, companion.imageHash)
    }

    private mutating func marked(_ states: SMPImageStates?) -> [TransferAction] {
        let now = markedNow
        if let states, let hash = now.hash,
           let slot = states.images.first(where: { ($0.image ?? 0) == now.number && $0.hash == hash }),
           !(slot.pending || slot.confirmed || slot.active) {
            return fail(OTAError(.protocolError, "the device accepted marking the image but lists it neither pending nor confirmed"))
        }
        if marking <= settings.companions.count, let hash = markHash { return markNext(ownHash: hash) }
        guard settings.reset else {
            state = .done
            return [.finished]
        }
        return send(.reset(force: false), as: { .activating($0) })
    }

    /// The session reconnects on this (a resumable link loss) and the next connection's image
    /// states say whether MCUboot swapped the image in (`booted`).
    private var rebootError: OTAError {
        OTAError(.connection, "the device reset to swap the image in; reconnecting to read which image it runs",
                 hint: "if it does not come back, check what it runs with otaflash image list", resumable: true)
    }

    /// After the reset: ok only when the slot that runs holds the image's hash. MCUboot refuses an
    /// image whose hash or signature does not check out (a corrupted upload that an mcumgr server,
    /// answering no `match`, could not find) and runs the old one: that image is uploaded again
    /// while start-overs are left, else the run fails.
    private mutating func booted(_ states: SMPImageStates?) -> [TransferAction] {
        guard let states, let hash = markHash else {
            return fail(OTAError(.protocolError, "after its reset the device did not report its image states; check what it runs with otaflash image list"))
        }
        let slots = states.images.filter { ($0.image ?? 0) == settings.imageNumber }
        let running = slots.first(where: \.active)
        if running?.hash == hash {
            if let stale = settings.companions.first(where: { companion in
                !states.images.contains { ($0.image ?? 0) == companion.imageNumber && $0.hash == companion.imageHash && $0.active }
            }) {
                return fail(companionNotRunning(stale, states))
            }
            if !settings.companions.isEmpty {
                let all = settings.companions.map { "\($0.label) \($0.version)" } + ["\(settings.label) \(running?.version ?? "")"]
                notes.append("after the reset every image runs its new version: " + all.joined(separator: ", "))
            }
            guard settings.confirmAfterCheck else {
                state = .done
                return [.finished]
            }
            revertTo = slots.first(where: { !$0.active && $0.hash != hash })?.version
            return send(.echo(Self.checkText), as: { .checking($0) })
        }
        if let waiting = slots.first(where: { $0.hash == hash && $0.pending }) {
            return fail(OTAError(.timeout, "after its reset the device still lists the image in slot \(waiting.slot), marked to run at the next reset: it did not reset, or MCUboot did not swap the image in",
                                 hint: "reset the device (otaflash reset), then check what it runs with otaflash image list"))
        }
        let old = running.map { "its old image \($0.version)" } ?? "its old image"
        let what = "MCUboot refused the image at boot (its hash or signature did not check out) and the device runs \(old)"
        return startOver(because: what, OTAError(.verifyFailed, "\(what)\(againSaid)",
                                                 hint: "run the same command again: it uploads the file anew; if MCUboot refuses it again, check the image's signature key and the device's flash",
                                                 resumable: true))
    }

    /// After the reset this image runs, but `companion` (marked before it) does not: MCUboot
    /// skipped or refused its update.
    private func companionNotRunning(_ companion: SMPCompanion, _ states: SMPImageStates) -> OTAError {
        let slots = states.images.filter { ($0.image ?? 0) == companion.imageNumber }
        let runs = slots.first(where: \.active).map { "still runs \($0.version)" } ?? "lists no running image"
        let held = slots.contains { $0.hash == companion.imageHash } ? "; the new image is still in its slot" : ""
        return OTAError(.verifyFailed, "after the reset the \(settings.label) runs its new image, but the \(companion.label) \(runs), not \(companion.version): MCUboot did not take its update\(held)",
                        hint: "check each image with otaflash image list; run the same command again to upload and mark it anew (the network core's image is marked before the application's)")
    }

    // MARK: Bootloader modes

    /// The image's header as a slot holds it, for an MCUboot image.
    private var header: SMPSlotImage? { settings.imageHash == nil ? nil : SMPSlotImage(image.bytes) }

    /// What MCUboot's mode (first reported on this connection) says before anything is sent: a
    /// refusal where the update cannot work as asked, else a note on how it goes.
    private mutating func modeRefusal() -> OTAError? {
        guard let info = bootloader, let mode = info.mode else { return nil }
        let slots = (states?.images ?? []).filter { ($0.image ?? 0) == settings.imageNumber }
        let running = slots.first(where: \.active)
        let runningVersion = running.map { " \($0.version)" } ?? ""
        let runningImage = running.flatMap(MCUbootVersionText.slotImage)
        let candidate = header
        if mode.singleSlot {
            return OTAError(.incompatibleDevice, "the device's MCUboot runs in \(mode) mode: it has no second slot to upload an image to over SMP",
                            hint: "update it through MCUboot's serial recovery, or build MCUboot with two slots")
        }
        if settings.confirmAfterCheck, mode.keepsWithoutTest {
            return OTAError(.incompatibleDevice, "the device's MCUboot runs in \(mode) mode: it keeps an image as soon as it boots it, with no test run and no revert, so --confirm-after-check cannot leave a failed image to revert",
                            hint: "drop --confirm-after-check (the image is kept at the reset), or build MCUboot in a swap or direct-XIP-with-revert mode")
        }
        if info.noDowngrade, let candidate, let runningImage, candidate.isOlder(than: runningImage) {
            return OTAError(.incompatibleDevice, "the device's MCUboot refuses downgrades (no-downgrade): it runs\(runningVersion) and would not boot this older image \(candidate.versionText)",
                            hint: "upload an image with a higher version (imgtool sign --version)")
        }
        if mode == .directXIP || mode == .ramLoad, let candidate, let runningImage, !candidate.isNewer(than: runningImage) {
            return OTAError(.incompatibleDevice, "the device's MCUboot runs in \(mode) mode and boots the slot with the highest version: this image \(candidate.versionText) is not newer than the running\(runningVersion), so it would not run",
                            hint: "upload an image with a higher version (imgtool sign --version)")
        }
        switch mode {
        case .overwriteOnly:
            notes.append("the device's MCUboot runs in overwrite-only mode: at the reset it copies the image over the running one and keeps it, with no test run and no revert")
        case .directXIP, .directXIPWithRevert, .ramLoad:
            let target = slots.first(where: { !$0.active }).map(\.slot) ?? running.map { 1 - $0.slot } ?? 1
            let built = candidate?.fixedAddress.map { "it is built for load address 0x\(String($0, radix: 16))" }
                ?? "it does not say which address it is built for (no ROM_FIXED flag), so only booting it shows it fits"
            let marks = mode == .directXIPWithRevert ? "it runs for test, reverted unless confirmed" : "MCUboot then boots the slot with the highest version, with no test run"
            notes.append("the device's MCUboot runs in \(mode) mode: the image goes to slot \(target), the one not running, and runs there in place; \(built); \(marks)")
        default:
            break
        }
        return nil
    }

    // MARK: The check before the confirm

    /// What the check's echo sends.
    static let checkText = "otaflash check"

    /// `confirmAfterCheck`: the new image's answers. An echo answered (with the text sent, or
    /// NOT_SUPPORTED from a server built without echo: its SMP server answers) passes; then the
    /// image is confirmed, unless the caller checks it further (`holdsConfirm`).
    private mutating func checked(_ response: SMPResponse, to request: SMPRequest) -> [TransferAction] {
        switch (request, response) {
        case (.echo(let sent), .echo(let echoed)) where echoed == sent:
            return checkPassed()
        case (.echo, .error(let e)) where e.general == .notSupported:
            return checkPassed()
        case (.echo, _):
            return fail(checkFailed("it answered the SMP echo with \(response)"))
        case (.imageStateWrite, .imageStates(let states)):
            guard let hash = markHash,
                  states.images.contains(where: { ($0.image ?? 0) == settings.imageNumber && $0.hash == hash && $0.active && $0.confirmed }) else {
                return fail(OTAError(.protocolError, "the device accepted confirming the checked image but does not list it active and confirmed; check it with otaflash image list"))
            }
            state = .done
            return [.finished]
        case (.imageStateWrite, .empty):
            state = .done
            return [.finished]
        case (_, .error(let e)):
            return fail(e.otaError(device: "the device", request: "\(request)"))
        default:
            return fail(OTAError(.protocolError, "the device answered \(request) with \(response)"))
        }
    }

    private mutating func checkPassed() -> [TransferAction] {
        // A mode without a test run (found when the mark was not supported) keeps it as it is.
        guard !settings.holdsConfirm, bootloader?.mode?.keepsWithoutTest != true, let hash = markHash else {
            state = .done
            return [.finished]
        }
        return send(.imageStateWrite(hash: hash, confirm: true), as: { .checking($0) })
    }

    /// The new image failed its check (`why`): it stays unconfirmed, so MCUboot reverts it.
    private func checkFailed(_ why: String) -> OTAError {
        if let mode = bootloader?.mode, mode.keepsWithoutTest {
            return OTAError(.checkFailed, "the new image booted but failed its check: \(why); MCUboot runs in \(mode) mode, which keeps the image (no revert)",
                            hint: "upload a working image")
        }
        let back = revertTo.map { " to \($0)" } ?? ""
        return OTAError(.checkFailed, "the new image booted but failed its check: \(why); it was not confirmed, so MCUboot reverts it\(back) at the next reset",
                        hint: "reset the device to revert (otaflash reset), or confirm the image by hand if it is fine (otaflash image confirm)")
    }

    // MARK: Timeouts and failures

    /// ", after uploading it again from 0": said in a failure after a start-over.
    private var againSaid: String { startOvers > 0 ? ", also after uploading it again from 0" : "" }

    /// The server found the upload wrong: upload it again from offset 0 (a first request, which
    /// starts a new upload on a server whose last one finished) while start-overs are left;
    /// else fail with `error`.
    private mutating func startOver(because what: String, _ error: OTAError) -> [TransferAction] {
        guard startOvers < min(Self.maxStartOvers, config.maxRecoveries) else { return fail(error) }
        startOvers += 1
        agreedBefore += acked
        tally.stats.restarts += 1
        notes.append("\(what): uploading it again from 0")
        serverMatch = nil
        retries = 0
        inFlight = [:]
        queue = []
        queueHead = 0
        acked = 0
        sent = 0
        state = .opening(nil)
        return sendChunk(at: 0)
    }

    private mutating func timedOut() -> [TransferAction] {
        guard phase != .done, phase != .failed, phase != .idle else { return [] }
        if isRebooting {
            // The device answered the reset but kept the link: a new connection finds out.
            return [.failed(OTAError(.timeout, "the device answered the reset but did not drop the link within \(currentTimeout.seconds) s; reconnecting to read which image it runs",
                                     resumable: true))]
        }
        let afterBusy = waitingOutBusy
        let timeout = currentTimeout
        switch state {
        case .opening(let b?): state = .opening(Busy(refusal: b.refusal, waiting: false))
        case .streaming(let b?): state = .streaming(Busy(refusal: b.refusal, waiting: false))
        default: break
        }
        retries += 1
        if let busy, retries > config.commandRetries { return fail(refusal(busy.refusal)) }
        if case .opening = state, !afterBusy, retries > 1 || config.commandRetries == 0 {
            // The link is up, the request was written, and nothing came back for the whole erase allowance.
            let waited = Int((timeout + (retries > 1 ? config.replyTimeout : .zero)).seconds.rounded())
            return fail(OTAError(.timeout, "the device kept the link but did not answer the first upload request in \(waited) s: it erases its slot for longer than that, or it hung",
                                 hint: "reset the device (power cycle) and run the same command again; for a slot that takes longer to erase, raise --reply-timeout (the first request waits at least that long)",
                                 resumable: true))
        }
        if case .checking(let c) = state, retries > config.commandRetries {
            return fail(checkFailed("it did not answer \(c.request) within \(timeout.seconds) s, \(retries) times"))
        }
        guard retries <= config.commandRetries else {
            let what = command.map { "\($0.request)" } ?? "the upload request at \(acked)"
            return fail(OTAError(.timeout, "the device did not answer \(what) within \(timeout.seconds) s, \(retries) times",
                                 hint: "check the link and the device, then run the same command again to resume", resumable: true))
        }
        tally.stats.commandRetries += 1
        if case .opening = state, !afterBusy {
            let waited = timeout.seconds == timeout.seconds.rounded() ? "\(Int(timeout.seconds))" : "\(timeout.seconds)"
            notes.append("the device has not answered the first upload request in \(waited) s (it erases its slot for the \(image.size)-byte image before it answers): asking again, and waiting up to \(Int(currentTimeout.seconds)) s for the erase")
        }
        switch state {
        case .erasing(let c): return send(c.request, as: { .erasing($0) })
        case .verifying(let c): return send(c.request, as: { .verifying($0) })
        case .activating(let c): return send(c.request, as: { .activating($0) })
        case .checking(let c): return send(c.request, as: { .checking($0) })
        case .opening: return sendChunk(at: 0)
        case .streaming, .idle, .rebooting, .done, .failed: break
        }
        // Upload answers went missing, or a busy server was waited out: ask again from the last
        // offset the server confirmed (only the former is a rewind: nothing was lost).
        if !afterBusy { tally.stats.rewinds += 1 }
        return rewind(to: acked)
    }

    private mutating func fail(_ error: OTAError, in failedPhase: TransferPhase? = nil) -> [TransferAction] {
        state = .failed(in: failedPhase ?? phase)
        inFlight = [:]
        queue = []
        queueHead = 0
        return [.failed(error)]
    }

    // MARK: Sending

    private mutating func nextSequence() -> UInt8 {
        defer { sequence &+= 1 }
        return sequence
    }

    /// Queues the writes of `request` as the command the state `next` waits for.
    private mutating func send(_ request: SMPRequest, as next: (Command) -> State) -> [TransferAction] {
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
    private mutating func sendChunk(at offset: Int) -> [TransferAction] {
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
