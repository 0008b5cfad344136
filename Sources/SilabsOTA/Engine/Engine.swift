import GATT
import OTA
import OTAWire

/// What the profile learns of the device on a connection.
public struct SilabsOTALink: Sendable, Hashable {
    /// Who answers: the AppLoader (it serves the OTA version characteristic), else an
    /// application's OTA DFU component; nil: an application with the in-place component alone
    /// (OTA Control, no OTA Data), which must reboot into its AppLoader first.
    public var mode: SilabsOTAMode?
    /// What the version characteristics said, where they are served.
    public var versions: SilabsVersions
    /// OTA Data writes go out as write commands (else as write requests, each answered).
    public var writeCommands: Bool

    public init(mode: SilabsOTAMode?, versions: SilabsVersions = SilabsVersions(), writeCommands: Bool = false) {
        self.mode = mode
        self.versions = versions
        self.writeCommands = writeCommands
    }
}

/// Silicon Labs' Bluetooth OTA as a pure state machine, the sequence of the NCP host example
/// (`app/bluetooth/example_host/ota_dfu/main.c`): 0x00 on OTA Control, the GBL in writes to OTA
/// Data of a whole number of 32-bit words each (ATT MTU − 3 rounded down to a multiple of 4: what
/// `bootloader_writeStorage` takes), 0x03, then the link closed from this side.
///
/// Every write is one the session awaits: OTA Control flags write only, and OTA Data is handed
/// over without its write-without-response flag unless write commands were asked for, so each
/// data write is answered before the next goes out, as the host example does by default. An
/// answered write is a byte range the device took; a refused one ends the session with its ATT
/// error, which the profile reads (`SilabsRefusal`). With write commands nothing is answered: a
/// write lost on the way is found only by the device's check at the end.
///
/// The check: the AppLoader checks the GBL before it answers 0x03; the application OTA DFU
/// component checks its slot only once the link closes, and says nothing: its bootloader installs
/// the image at the reboot, or it starts over silently. So after 0x03 the engine closes the link
/// (a failure that asks the session to reconnect) and reads on the next connection what the
/// device runs: the GBL's application version is the success; the old one after
/// `verifyTimeout` a refusal; no version readable leaves an application OTA DFU device's outcome
/// unconfirmed (an AppLoader's 0x03 answer was its check).
///
/// Neither device keeps anything of a transfer whose link was lost: on the reconnect the GBL goes
/// again from its first byte (after `settle`, the time an application OTA DFU device takes to
/// erase its slot again), at most `maxRecoveries` times without a check accepted.
public struct SilabsOTAEngine: TransferEngine {
    public typealias Peer = SilabsOTALink

    /// Image bytes in one OTA Data write at ATT MTU `mtu`: whole 32-bit words.
    public static func chunk(mtu: Int) -> Int {
        let limit = ATTWriteLimit.value(mtu: mtu)
        return limit - limit % SilabsOTAService.wordSize
    }

    enum State: Sendable, Hashable {
        case idle
        /// A reconnect after a lost link: waiting `settle` before 0x00.
        case settling
        /// 0x00 due.
        case beginning
        case streaming(next: Int)
        /// 0x03 written and awaited.
        case ending
        /// 0x03 answered: the link is closed next.
        case closing
        /// The link closed for the check; `since`: when. `afterLoss`: the link was lost before
        /// 0x03 was answered (the device may or may not have it).
        case checking(since: Duration, afterLoss: Bool)
        /// Connected again while checking: what `peer` says is weighed at the next `.timeout`, at
        /// once, when the session has told the time (it does not before `.connected`).
        case weighing(since: Duration, afterLoss: Bool, peer: SilabsOTALink)
        case done
        case failed
    }

    let image: FirmwareImage
    let config: EngineConfig
    /// The GBL's application version, to recognise it on the device afterwards.
    public let imageVersion: UInt32?
    /// How long an application OTA DFU device is given to erase its slot again after a lost link.
    public let settle: Duration
    private(set) var state: State = .idle
    private var mode: SilabsOTAMode?
    private var writeCommands = false
    private var chunkBytes = 0
    private var tally = ResendTally()
    private var ackedBytes = 0
    private var startOvers = 0
    /// The furthest the device took the GBL in any attempt (answered requests; with write
    /// commands, writes the link took): what the stall budget watches. An attempt after a start-over
    /// sends again what an earlier one sent, which is no progress: a link that keeps dropping
    /// before the device gets further spends the budget (`--stall-timeout`) and ends the run, as
    /// the session's bound says.
    private var furthest = 0
    private var now = Duration.zero
    private var failedPhase: TransferPhase?
    private var noted: [String] = []
    /// The version the device ran when the transfer began.
    private var versionBefore: UInt32?

    public init(image: FirmwareImage, config: EngineConfig, imageVersion: UInt32?, settle: Duration = .seconds(5)) {
        self.image = image
        self.config = config
        self.imageVersion = imageVersion
        self.settle = settle
    }

    // MARK: What the session reads

    public var phase: TransferPhase {
        switch state {
        case .idle, .settling: .idle
        // 0x00 goes out as the stream's first write: the transfer has started.
        case .beginning, .streaming: .streaming
        case .ending, .closing: .verifying
        case .checking, .weighing: .activating
        case .done: .done
        case .failed: .failed
        }
    }

    public var failedIn: TransferPhase? { failedPhase }

    public var currentTimeout: Duration {
        switch state {
        case .settling: settle
        // The write itself is awaited; once it returned, the close is at once.
        case .ending, .closing: .zero
        case .checking: config.activateTimeout
        case .weighing: .zero
        default: config.replyTimeout
        }
    }

    public var isAwaitingReply: Bool {
        switch state {
        case .settling, .ending, .closing, .checking, .weighing: true
        default: false
        }
    }

    public var sent: Int {
        switch state {
        case .streaming(let next): next
        case .ending, .closing, .checking, .weighing, .done: image.size
        default: 0
        }
    }

    public var resumeOffset: Int { 0 }
    public var acked: Int { ackedBytes }
    public var ackedCRC: UInt32 { CRC32.checksum(image.bytes[0..<ackedBytes]) }
    public var highWater: Int { tally.highWater }
    public var furthestAgreed: Int { furthest }
    public var chunkSize: Int { chunkBytes }
    public var stats: TransferStats { tally.stats }
    public var notes: [String] { noted }
    public var awaitsNextConnection: Bool {
        switch state {
        case .checking, .weighing: true
        default: false
        }
    }

    public mutating func observe(time: Duration) { now = time }

    public mutating func seed(confirmedOffset: Int, crc: UInt32) {
        // Nothing to resume: neither device keeps a transfer across a lost link.
    }

    // MARK: Events

    public mutating func handle(_ event: TransferEvent<SilabsOTALink>) -> [TransferAction] {
        switch event {
        case .connected(let peer, let mtu):
            return connected(peer, mtu: mtu)
        case .notification:
            return []
        case .commandFailed(let error):
            return fail(OTAError(.protocolError, "a write to the OTA service failed: \(error.message)", cause: error))
        case .timeout:
            return timedOut()
        case .disconnected(let reason):
            return disconnected(reason)
        }
    }

    private mutating func connected(_ peer: SilabsOTALink, mtu: Int) -> [TransferAction] {
        if case .checking(let since, let afterLoss) = state {
            state = .weighing(since: since, afterLoss: afterLoss, peer: peer)
            return []
        }
        guard state == .idle || state == .settling else { return [] }
        guard let mode = peer.mode else {
            return fail(OTAError(.incompatibleDevice, "the device runs an application with in-place OTA DFU (OTA Control, no OTA Data): it must reboot into its AppLoader first, and it did not",
                                 hint: "run the same command again; if it keeps answering so, write 0x00 to OTA Control by hand and look for its AppLoader advertising \"\(SilabsOTAService.appLoaderName)\""))
        }
        chunkBytes = Self.chunk(mtu: mtu)
        guard chunkBytes >= SilabsOTAService.wordSize else {
            return fail(OTAError(.incompatibleDevice, "an ATT MTU of \(mtu) leaves no room for a 32-bit word of OTA Data"))
        }
        if versionBefore == nil { versionBefore = peer.versions.application }
        self.mode = mode
        writeCommands = peer.writeCommands
        tally.connectionBegan(streamAt: sent)
        // An application OTA DFU device erases its slot again after a lost link before it takes 0x00.
        if state == .idle, startOvers > 0, mode == .application {
            state = .settling
            return []
        }
        state = .beginning
        return []
    }

    /// After the link was closed for the device's check, on the next connection.
    private mutating func readBack(_ peer: SilabsOTALink, since: Duration, afterLoss: Bool) -> [TransferAction] {
        let waited = now - since
        let running = peer.versions.application
        let text = { (v: UInt32?) in v.map { "0x" + hex32($0) } ?? "an unknown version" }
        if mode == .appLoader {
            // The old application is overwritten as data arrives: whatever runs but the AppLoader
            // is what 0x03 checked. The AppLoader again: it did not take 0x03, or what it took
            // does not start.
            if imageVersion != nil && running == imageVersion {
                state = .done
                return [.finished]
            }
            if peer.mode != .appLoader {
                // An application that says it runs another version than the GBL's is the old one:
                // the AppLoader leaves to it when the link goes before any data came.
                if let running, let imageVersion {
                    return fail(OTAError(.connection, "the link was lost before 0x03 was answered, and the device left its AppLoader for application version \(text(running)), not the GBL's \(text(imageVersion)): it kept its application",
                                         hint: "run the same command again: the device enters its AppLoader again"))
                }
                // Otherwise it is what 0x03 checked, unless the link went before 0x03 was answered.
                guard !afterLoss else {
                    return fail(OTAError(.notConfirmed, "sent, not confirmed: the link was lost before 0x03 was answered, and the device runs an application again that reports no version: the new one, or its old one if the AppLoader had taken no data",
                                         hint: "check what the device runs before sending it again"))
                }
                state = .done
                return [.finished]
            }
            if afterLoss { return startOver(peer, why: "the link was lost around 0x03 and the device is still in its AppLoader") }
            if waited < config.verifyTimeout { return [.failed(checkingError("the AppLoader still answers"))] }
            return fail(OTAError(.verifyFailed, "the AppLoader took the GBL (0x03 answered), but the device is still in its AppLoader \(waited.seconds) s after the link closed: the new application does not start",
                                 hint: "check that the GBL holds an application for this device (commander gbl parse), then run the same command again"))
        }
        if running == nil, versionBefore != nil, waited < config.verifyTimeout {
            // It reported its version before the transfer: a read that found none now is a device
            // still starting its application (or its read failed), not one that has none.
            return [.failed(checkingError("it reported no application version yet"))]
        }
        guard let running, let imageVersion else {
            return fail(OTAError(.notConfirmed, "sent, not confirmed: an application OTA DFU device checks its slot only once the link closes and says nothing, and this one reports no application version to show what it runs",
                                 hint: "check what the device runs (its own version) before sending it again"))
        }
        if versionBefore == imageVersion {
            return fail(OTAError(.notConfirmed, "sent, not confirmed: the device ran application version \(text(imageVersion)) before, as the GBL carries, so what it runs now cannot tell whether its bootloader took the GBL",
                                 hint: "check the device by other means before sending it again"))
        }
        if running == imageVersion {
            state = .done
            return [.finished]
        }
        if waited < config.verifyTimeout { return [.failed(checkingError("it still runs application version \(text(running))"))] }
        if afterLoss { return startOver(peer, why: "the link was lost around 0x03 and the device still runs application version \(text(running))") }
        if writeCommands {
            // Nothing was answered: it may never have taken 0x00 (refused silently while it
            // erased its slot), so nothing says its bootloader checked anything.
            return fail(OTAError(.protocolError, "the device still runs application version \(text(running)) \(waited.seconds) s after the link closed: it did not install the GBL; with write commands nothing was answered, so it refused the GBL or never took the transfer (0x00 is refused silently while it erases its slot)",
                                 hint: "run the same command again without --silabs-write-commands: each write is then answered"))
        }
        return fail(OTAError(.verifyFailed, "the device took every byte and 0x03, and still runs application version \(text(running)) \(waited.seconds) s after the link closed: its bootloader refused the GBL (a CRC, a signature, or another product), which the application OTA DFU component does not report",
                             hint: "check the GBL (commander gbl parse; --gbl-key checks its signature), then run the same command again: the device started over by itself"))
    }

    private func checkingError(_ what: String) -> OTAError {
        OTAError(.connection, "waiting for the device to check the GBL: \(what)",
                 hint: "check what the device runs before sending it again", resumable: true)
    }

    /// The transfer again from its first byte, on this connection.
    private mutating func startOver(_ peer: SilabsOTALink, why: String) -> [TransferAction] {
        startOvers += 1
        guard startOvers <= config.maxRecoveries else {
            return fail(OTAError(.protocolError, "started over \(startOvers - 1) times without a check accepted (\(why))",
                                 hint: "check the device and the GBL, then run the same command again"))
        }
        noted.append("\(why): the device cannot resume, so the whole GBL goes again")
        tally.startedOver()
        ackedBytes = 0
        state = .idle
        return connected(peer, mtu: chunkBytes + ATTWriteLimit.overhead)
    }

    private mutating func timedOut() -> [TransferAction] {
        switch state {
        case .settling:
            state = .beginning
            return []
        case .ending, .closing:
            // 0x03 answered (the session awaited it): the link is closed for the device's check.
            ackedBytes = mode == .appLoader || !writeCommands ? image.size : ackedBytes
            state = .checking(since: now, afterLoss: false)
            return [.failed(OTAError(.connection, mode == .appLoader
                    ? "the AppLoader checked the GBL (0x03 answered); closing the link so that it boots the new application, and reconnecting to see it"
                    : "0x03 answered; closing the link so that the device checks its slot and installs the GBL, and reconnecting to see what it runs",
                hint: "check what the device runs before sending it again", resumable: true))]
        case .weighing(let since, let afterLoss, let peer):
            state = .checking(since: since, afterLoss: afterLoss)
            return readBack(peer, since: since, afterLoss: afterLoss)
        case .checking:
            return [.failed(checkingError("no answer"))]
        default:
            return []
        }
    }

    private mutating func disconnected(_ reason: DisconnectReason) -> [TransferAction] {
        switch state {
        case .idle, .settling, .beginning:
            state = .idle
            return [.failed(OTAError(.connection, "\(reason) before the transfer began", resumable: true))]
        case .streaming:
            startOvers += 1
            let at = ackedBytes
            ackedBytes = 0
            state = .idle
            guard startOvers <= config.maxRecoveries else {
                return fail(OTAError(.connection, "\(reason) at \(at) of \(image.size) bytes, the \(startOvers)th time", hint: resetHint))
            }
            noted.append("\(reason) at \(at) of \(image.size) bytes: the device cannot resume, so the whole GBL goes again on the next connection")
            return [.failed(OTAError(.connection, "\(reason) at \(at) of \(image.size) bytes: Silicon Labs' OTA cannot resume; the whole GBL goes again", resumable: true))]
        case .ending:
            state = .checking(since: now, afterLoss: true)
            return [.failed(OTAError(.connection, "\(reason) before 0x03 was answered; reconnecting to see whether the device took it",
                                     hint: "check what the device runs before sending it again", resumable: true))]
        case .closing:
            state = .checking(since: now, afterLoss: false)
            return [.failed(OTAError(.connection, "\(reason) after 0x03 was answered; reconnecting to see what the device runs",
                                     hint: "check what the device runs before sending it again", resumable: true))]
        case .weighing(let since, let afterLoss, _):
            state = .checking(since: since, afterLoss: afterLoss)
            return [.failed(OTAError(.connection, "\(reason) while reading what the device runs", resumable: true))]
        case .checking, .done, .failed:
            return []
        }
    }

    private var resetHint: String {
        "run the same command again: the whole GBL goes again (the device keeps nothing of a stopped transfer, and needs no reset)"
    }

    private mutating func fail(_ error: OTAError) -> [TransferAction] {
        failedPhase = phase
        state = .failed
        return [.failed(error)]
    }

    // MARK: Streaming

    public mutating func nextStreamStep() -> TransferStep {
        switch state {
        case .beginning:
            state = .streaming(next: 0)
            return .write(TransferWrite(SilabsControl.begin.encoded, to: .control, withResponse: false))
        case .streaming(let next):
            // The write before this one was answered (requests are awaited one at a time).
            if !writeCommands {
                ackedBytes = next
                furthest = max(furthest, next)
            }
            guard next < image.size else {
                state = .ending
                return .write(TransferWrite(SilabsControl.end.encoded, to: .control, withResponse: false))
            }
            let count = min(chunkBytes, image.size - next)
            if writeCommands { furthest = max(furthest, next + count) }
            tally.streamed(offset: next, count: count)
            state = .streaming(next: next + count)
            return .data(offset: next, count: count)
        case .ending:
            state = .closing
            return .idle
        default:
            return .idle
        }
    }

    public func dataPacket(offset: Int, count: Int) -> [UInt8] {
        Array(image.bytes[offset..<(offset + count)])
    }
}
