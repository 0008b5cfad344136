import GATT
import OTADevice
import OTAWire

/// When an OTA device answers, drops its link and is away: one behaviour for every transport.
///
/// `FaultyDevice` decides *what* the device does with a write; this model adds *when*: slow flash
/// delays replies, ACTIVATE is answered and only then followed by the reboot into the new image, a
/// CHECKPOINT that arrived ahead of its data is held for a bounded time, and a rebooting device is
/// away (not advertising, not connectable). The in-process simulator and `otaflash simulate`
/// (peripheral mode over BlueZ) feed it every write with the time it reached the device and carry
/// out the timed outputs it returns; neither decides any of this on its own.
///
/// Pure: time comes in as `now` (a `Duration` from any origin the transport keeps fixed), nothing
/// here sleeps or reads a clock. docs/PROTOCOL.md, "Device behaviour" and "Device timing".
public struct DeviceModel: Sendable {
    /// The timing a transport gives its device.
    public struct Timing: Sendable, Hashable {
        /// How long a CHECKPOINT that arrives ahead of its data is held for that data before it is
        /// answered `gap`. Nil answers `gap` at once: right for a link that never reorders writes.
        public var holdEarlyCheckpoint: Duration?
        /// From the ACTIVATE reply to the link drop that boots the new image.
        public var bootDelay: Duration

        public init(holdEarlyCheckpoint: Duration? = nil, bootDelay: Duration = .milliseconds(300)) {
            self.holdEarlyCheckpoint = holdEarlyCheckpoint
            self.bootDelay = bootDelay
        }
    }

    /// An output and when it is due: the notifications go to the control point, a `.wake`
    /// carries the token of a held CHECKPOINT.
    public typealias Timed = PeripheralTimed

    /// How a control point write is completed.
    public enum Reply: Sendable, Hashable {
        /// With a write response at `at` (once the device got to the command).
        case success(at: Duration)
        /// At once, with an ATT error: an injected fault.
        case injectedError
        /// At once, with ATT application error 0x89 (0x80 + status `busy`): another central owns
        /// the transfer in progress. Nothing is notified (docs/PROTOCOL.md, "One transfer at a time").
        case busy(owner: String)
        /// Not at all: the device is away. The transport drops the link that carried the write.
        case away
    }

    /// What a control point write led to.
    public struct CommandResult: Sendable, Hashable {
        public var reply: Reply
        public var outputs: [Timed]
        /// The reply the device's logic produced; empty while a CHECKPOINT is held or when
        /// the write was not handled.
        public var response: [UInt8]
        /// A lost-notification fault swallowed `response`.
        public var notificationLost: Bool
        /// The command activated an image; `outputs` holds the reboot into it.
        public var activated: Bool
    }

    public private(set) var device: FaultyDevice
    public let timing: Timing
    /// The flash is busy until then: a reply waits for it.
    public private(set) var busyUntil: Duration = .zero
    /// While the device reboots: it neither advertises nor accepts connections.
    public private(set) var away: Range<Duration>?
    /// The token of the held CHECKPOINT's `.wake`; one whose CHECKPOINT was since answered,
    /// replaced or cancelled wakes nothing.
    private var held: UInt64?
    private var nextToken: UInt64 = 0

    public init(device: FaultyDevice, timing: Timing) {
        var device = device
        device.target.deferEarlyCheckpoints = timing.holdEarlyCheckpoint != nil
        self.device = device
        self.timing = timing
    }

    public var target: OTATarget { device.target }

    /// Whether the device is rebooting at `now`.
    public func isAway(at now: Duration) -> Bool {
        away?.contains(now) ?? false
    }

    /// When the device can next be connected to (`.zero` when it never went away).
    public var availableAt: Duration { away?.upperBound ?? .zero }

    /// Whether a connection attempt at `now` fails: the device is rebooting, or gone for good
    /// (`FaultPlan.refuseConnectionsAfter`) after `connections` accepted ones.
    public func refusesConnection(at now: Duration, after connections: Int) -> Bool {
        isAway(at: now) || device.refusesConnection(after: connections)
    }

    // MARK: Writes

    /// A data packet (write without response) reached the device at `now`.
    public mutating func receiveData(_ bytes: [UInt8], from central: String? = nil, at now: Duration) -> [Timed] {
        guard !isAway(at: now) else { return [] }
        switch device.receiveData(bytes, from: central) {
        case .dropped:
            return []
        case .disconnect(let reason):
            cancelHold()
            return [Timed(at: now, .dropLink(reason: reason))]
        case .reboot(let reason):
            cancelHold()
            return [rebootOutput(at: now, reason: reason)]
        case .handled(let notification):
            busyUntil = max(busyUntil, now) + device.flashTime(bytes: max(0, bytes.count - OTAProtocol.dataHeaderSize))
                + nativeFlashTime(bytes: max(0, bytes.count - OTAProtocol.dataHeaderSize))
            if target.deferred == nil { held = nil }
            return notification.map { [Timed(at: busyUntil, .notify(OTAProtocol.controlPointUUID, $0))] } ?? []
        }
    }

    /// Version 2 devices: the erases the last packet caused and the words it programmed, at the
    /// flash's own speed (on top of any slow-flash fault).
    private mutating func nativeFlashTime(bytes: Int) -> Duration {
        guard let v2 = target.version2 else { return .zero }
        let erases = target.erases - erasesCounted
        erasesCounted = target.erases
        return v2.flashTime(erases: erases, bytes: bytes)
    }

    private var erasesCounted = 0

    /// A data packet written *with* response (what a naive central does): handled as data, without
    /// faults. Its write response goes out at `acknowledged`.
    public mutating func receiveAcknowledgedData(_ bytes: [UInt8], at now: Duration) -> (acknowledged: Duration, outputs: [Timed]) {
        guard !isAway(at: now) else { return (now, []) }
        busyUntil = max(busyUntil, now) + device.flashTime(bytes: max(0, bytes.count - OTAProtocol.dataHeaderSize))
        let notification = device.target.handleData(bytes)
        if target.deferred == nil { held = nil }
        return (busyUntil, notification.map { [Timed(at: busyUntil, .notify(OTAProtocol.controlPointUUID, $0))] } ?? [])
    }

    /// A control point write reached the device at `now`.
    ///
    /// The reply waits until the flash is idle, plus a whole-image read for VERIFY and ACTIVATE.
    /// A successful ACTIVATE is answered first; the reboot into the new image follows
    /// `Timing.bootDelay` after that reply, and the device is away for `FaultPlan.rebootDuration`
    /// from then. Every command replaces a held CHECKPOINT.
    public mutating func receiveCommand(_ bytes: [UInt8], from central: String? = nil, at now: Duration) -> CommandResult {
        guard !isAway(at: now) else {
            return CommandResult(reply: .away, outputs: [], response: [], notificationLost: false, activated: false)
        }
        var ready = max(busyUntil, now)
        if bytes.first == OTAOpcode.verify.rawValue || bytes.first == OTAOpcode.activate.rawValue {
            ready += device.flashTime(bytes: Int(target.pending?.imageSize ?? 0))
        }
        held = nil
        switch device.receiveCommand(bytes, from: central) {
        case .attError:
            return CommandResult(reply: .injectedError, outputs: [], response: [], notificationLost: false, activated: false)

        case .handled(let response, let notify, let activated):
            if response.count >= 3, response[2] == OTAStatus.busy.rawValue, let central, let owner = target.owner, owner != central {
                return CommandResult(reply: .busy(owner: owner), outputs: [], response: response, notificationLost: false, activated: false)
            }
            busyUntil = ready
            var outputs: [Timed] = []
            if !response.isEmpty, notify {
                outputs.append(Timed(at: ready, .notify(OTAProtocol.controlPointUUID, response)))
            }
            if response.isEmpty, target.deferred != nil, let bound = timing.holdEarlyCheckpoint {
                nextToken += 1
                held = nextToken
                outputs.append(Timed(at: ready + bound, .wake(nextToken)))
            }
            if activated {
                outputs.append(rebootOutput(at: ready + timing.bootDelay, reason: "the device boots the new image", injected: false))
            }
            return CommandResult(reply: .success(at: ready), outputs: outputs, response: response,
                                 notificationLost: !response.isEmpty && !notify, activated: activated)
        }
    }

    /// A `.wake` output is due: answers the CHECKPOINT it was for with `gap`, unless that one was
    /// answered, replaced or cancelled since.
    public mutating func wake(_ token: UInt64, at now: Duration) -> [Timed] {
        guard held == token else { return [] }
        held = nil
        guard let reply = device.target.expireDeferredCheckpoint() else { return [] }
        return [Timed(at: max(now, busyUntil), .notify(OTAProtocol.controlPointUUID, reply))]
    }

    /// The link to `central` (nil: every link) went down. A held CHECKPOINT from it is forgotten:
    /// its reply would reach whoever connects next.
    public mutating func linkDropped(central: String? = nil) {
        if central == nil || target.owner == nil || target.owner == central { cancelHold() }
    }

    private mutating func cancelHold() {
        held = nil
        device.target.cancelDeferredCheckpoint()
    }

    private mutating func rebootOutput(at time: Duration, reason: String, injected: Bool = true) -> Timed {
        let until = time + device.faults.rebootDuration
        away = time..<until
        return Timed(at: time, .reboot(until: until, reason: reason, injected: injected))
    }
}
