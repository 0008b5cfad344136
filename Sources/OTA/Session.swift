import Foundation
import GATT
import Logging
import OTAWire

/// What a session reports while it works. The CLI prints these as a progress bar or JSON Lines.
public enum SessionEvent: Sendable {
    case connecting(device: String)
    case connected(device: String, mtu: Int, chunkSize: Int)
    /// The profile attached to the device and read its state.
    case deviceInfo(device: String, info: DeviceSummary)
    /// BEGIN accepted; `resumeOffset` > 0 when the device already held part of this image.
    case transferStarted(device: String, resumeOffset: Int, total: Int)
    case progress(TransferProgress)
    /// The device checks the whole image: `check` says how, in the profile's words.
    case verifying(device: String, check: String)
    case activating(device: String)
    /// The link was lost (or connecting failed) and the supervisor will try again after `delay`.
    case reconnecting(device: String, attempt: Int, reason: String, delay: Duration)
    /// Something the engine changed in how it works that the user should know, said once.
    case notice(device: String, message: String)
}

/// How the supervisor reconnects after an unexpected link loss.
public struct ReconnectPolicy: Sendable, Hashable {
    /// How long after a link loss reconnecting may go on; zero disables reconnecting.
    public var window: Duration
    public var initialDelay: Duration
    public var maxDelay: Duration
    /// Seed of the jitter, so that tests and the soak replay exactly.
    public var seed: UInt64

    public init(window: Duration = .seconds(60), initialDelay: Duration = .milliseconds(250),
                maxDelay: Duration = .seconds(5), seed: UInt64 = 0x5EED) {
        self.window = window
        self.initialDelay = initialDelay
        self.maxDelay = maxDelay
        self.seed = seed
    }

    public static let never = ReconnectPolicy(window: .zero)

    /// Exponential backoff with "equal jitter": half the delay fixed, half random, so attempts from
    /// many devices spread out but none waits less than half the nominal delay.
    public func delay(attempt: Int, using rng: inout some RandomNumberGenerator) -> Duration {
        let nominal = min(maxDelay, initialDelay * (1 << min(attempt - 1, 20)))
        let half = nominal / 2
        let jitterMicros = Int64(Double(half.seconds * 1e6) * Double.random(in: 0...1, using: &rng))
        return half + .microseconds(jitterMicros)
    }
}

/// Where a transfer stands.
public struct TransferProgress: Sendable, Hashable {
    public var device: String
    /// Image bytes sent so far (the stream position; it steps back when data is sent again).
    public var bytes: Int
    /// Bytes the device has confirmed at a checkpoint.
    public var confirmed: Int
    public var total: Int
    /// Recent throughput in bytes per second.
    public var rate: Double
    /// Seconds left at `rate`; nil until a rate is known.
    public var eta: Double?
    public var elapsed: Double

    public var fraction: Double { total == 0 ? 1 : Double(bytes) / Double(total) }

    public init(device: String, bytes: Int, confirmed: Int, total: Int, rate: Double, eta: Double?, elapsed: Double) {
        self.device = device
        self.bytes = bytes
        self.confirmed = confirmed
        self.total = total
        self.rate = rate
        self.eta = eta
        self.elapsed = elapsed
    }
}

/// The outcome of a successful update.
public struct OTAResult: Sendable, Hashable {
    public var device: String
    public var bytes: Int
    public var crc32: UInt32
    public var mtu: Int
    public var chunkSize: Int
    public var seconds: Double
    /// From BEGIN's reply to the last checkpoint's: the streaming part alone.
    public var transferSeconds: Double
    public var activated: Bool
    /// The device already ran `EngineConfig.skipIfVersion`: nothing was sent.
    public var skipped: Bool = false
    public var firmwareBefore: FirmwareVersion?
    public var stats: TransferStats

    /// Image bytes this run brought to the device (less what it already held), per second.
    public var throughput: Double {
        seconds > 0 ? Double(bytes - (stats.resumedFrom.first ?? 0)) / seconds : 0
    }
}

/// Per-phase time limits of a session (the engine has its own for command replies).
public struct SessionTimeouts: Sendable, Hashable {
    public var connect: Duration
    public var discovery: Duration
    /// Connected time without new confirmed data after which a transfer gives up: the bound on a
    /// device that answers but never confirms (it drops, corrupts or ignores every packet).
    /// Never shorter than the reply timeout; time spent reconnecting does not count.
    public var stall: Duration

    public init(connect: Duration = .seconds(20), discovery: Duration = .seconds(15), stall: Duration = .seconds(30)) {
        self.connect = connect
        self.discovery = discovery
        self.stall = stall
    }
}

/// The supervisor's reconnects after a link loss: attempts back off within the policy's window,
/// and a connection that moved the transfer forward ends the outage. The window is counted from
/// the device's last sign of life (the link lost, or the failed attempt's start when it never
/// connected) and bounds the attempts themselves: none is let run past it (`deadline`).
struct Outage {
    let policy: ReconnectPolicy
    private var rng: SeededGenerator
    private(set) var attempt = 0
    private var start: Duration?

    /// When the window ends; nil before the first failure.
    var deadline: Duration? { start.map { $0 + policy.window } }

    /// - Parameter since: when the device was last seen, when the first attempt already follows
    ///   one that failed (the updater's first connection): the window counts from there.
    init(policy: ReconnectPolicy, since: Duration? = nil) {
        self.policy = policy
        rng = SeededGenerator(seed: policy.seed)
        start = since
    }

    /// The wait before the next attempt after `failure`.
    /// - Parameter since: when the device was last up: the link's loss, or the failed attempt's
    ///   start when it never connected.
    /// - Throws: `failure`, saying so, once the next attempt would start past the window.
    mutating func nextDelay(after failure: OTAError, progressed: Bool, since: Duration, at now: Duration) throws(OTAError) -> Duration {
        if progressed || start == nil {
            start = since
            attempt = 0
        }
        attempt += 1
        let delay = policy.delay(attempt: attempt, using: &rng)
        guard let start, now + delay - start <= policy.window else {
            throw OTAError(failure.code, "\(failure.message) (gave up reconnecting after \(attempt - 1) attempts in \(Int(policy.window.seconds)) s)",
                           hint: "check that the device is powered and in range, then \(OTAError.resumeAdvice)", resumable: true,
                           cause: failure.cause)
        }
        return delay
    }
}

/// How long a session may go on without progress, counted over connected time while data is
/// being sent (not while reconnecting, verifying or activating, which have limits of their own):
/// the budget is spent while no new data is confirmed, and refilled whenever the device confirms
/// more of the image than ever before.
struct StallBudget {
    let limit: Duration
    private(set) var left: Duration
    private var mark = 0
    private var since: Duration?

    init(limit: Duration) {
        self.limit = limit
        self.left = limit
    }

    /// Spends from `now` on, unless already spending.
    mutating func spend(at now: Duration) {
        if since == nil { since = now }
    }

    /// Stops spending: the connection is gone, or a phase with its own deadline runs.
    mutating func hold(at now: Duration) {
        if let since { left -= now - since }
        since = nil
    }

    /// Refills the budget when the device holds more than before.
    mutating func observe(furthest: Int, at now: Duration) {
        guard furthest > mark else { return }
        mark = furthest
        left = limit
        since = since.map { _ in now }
    }

    /// When the budget runs out on the running connection.
    var deadline: Duration? { since.map { $0 + left } }
}

/// Drives one protocol's engine over one `GATTConnection`: the thin layer that does the I/O, and
/// the supervisor around it.
///
/// It connects, lets the profile find its service and read the device's state, then feeds the
/// engine every event and carries out every action. Data packets go through the transport's
/// non-waiting fast path when it has room, so a fast link costs no suspension per packet. Any
/// `OTAProfile` runs here the same way: reconnects, the stall budget, the journal and the events
/// are the session's, never the protocol's.
public actor OTASession {
    public let device: String
    public let image: FirmwareImage
    public let config: EngineConfig
    /// The protocol spoken to the device.
    public let profile: any OTAProfile
    public let timeouts: SessionTimeouts
    public let reconnect: ReconnectPolicy
    /// Where confirmed progress is recorded (nil: nowhere).
    public let journal: JournalStore?
    /// Connects within the given time (at most `timeouts.connect`; less when the reconnect
    /// window ends sooner).
    private let connect: @Sendable (Duration) async throws(GATTError) -> any GATTConnection
    private let clock: any MonotonicClock
    /// After the answer to the activating command was lost (`OTAError.Code.notConfirmed`): reads
    /// the device's next state where it runs its application; true when that shows the image
    /// was activated. Nil: nothing can confirm it.
    private let confirmActivation: (@Sendable () async -> Bool)?
    /// When an attempt before this session's first (the updater's first connection) began and
    /// failed to connect: the reconnect window counts from there.
    private let unreachedSince: Duration?
    /// The last connection's MTU and chunk size, for a result confirmed after it was gone.
    private var lastLink = (mtu: 0, chunk: 0)
    /// When the last connection came up (nil: the attempt under way has not connected yet).
    private var connectedAt: Duration?
    /// How long the device had been silent on the last connection when it failed.
    private var silentFor = Duration.zero
    private let logger: Logger
    /// Least time between two progress events.
    public static let progressInterval: Duration = .milliseconds(250)

    public init(device: String, image: FirmwareImage, config: EngineConfig = EngineConfig(),
                profile: any OTAProfile, timeouts: SessionTimeouts = SessionTimeouts(), reconnect: ReconnectPolicy = ReconnectPolicy(),
                journal: JournalStore? = nil, clock: any MonotonicClock = SystemClock(),
                logger: Logger = Logger(label: "otaflash.session"),
                connect: @escaping @Sendable () async throws(GATTError) -> any GATTConnection) {
        self.init(device: device, image: image, config: config, profile: profile, timeouts: timeouts, reconnect: reconnect,
                  journal: journal, clock: clock, logger: logger, connectWithin: { _ async throws(GATTError) in try await connect() })
    }

    /// As above, with a connect that takes its time limit: the reconnect window then bounds each
    /// attempt too.
    public init(device: String, image: FirmwareImage, config: EngineConfig = EngineConfig(),
                profile: any OTAProfile, timeouts: SessionTimeouts = SessionTimeouts(), reconnect: ReconnectPolicy = ReconnectPolicy(),
                journal: JournalStore? = nil, clock: any MonotonicClock = SystemClock(),
                logger: Logger = Logger(label: "otaflash.session"),
                confirmActivation: (@Sendable () async -> Bool)? = nil, unreachedSince: Duration? = nil,
                connectWithin: @escaping @Sendable (Duration) async throws(GATTError) -> any GATTConnection) {
        let connect = connectWithin
        self.confirmActivation = confirmActivation
        self.unreachedSince = unreachedSince
        self.journal = journal
        self.device = device
        self.image = image
        self.config = config
        self.profile = profile
        self.timeouts = timeouts
        self.reconnect = reconnect
        self.clock = clock
        self.logger = logger
        self.connect = connect
    }

    /// Connects to `address` through `central`.
    public init(central: any GATTCentral, address: DeviceAddress, image: FirmwareImage,
                config: EngineConfig = EngineConfig(), profile: any OTAProfile, timeouts: SessionTimeouts = SessionTimeouts(),
                reconnect: ReconnectPolicy = ReconnectPolicy(), journal: JournalStore? = nil,
                logger: Logger = Logger(label: "otaflash.session")) {
        self.init(device: address.description, image: image, config: config, profile: profile, timeouts: timeouts, reconnect: reconnect,
                  journal: journal, clock: central.clock, logger: logger) { (limit: Duration) async throws(GATTError) in
            try await central.connect(to: address, timeout: limit)
        }
    }

    /// The longest a run goes on after the device last confirmed new data (or after it started),
    /// whatever the device does: the stall budget, the reconnect window, one more connection's
    /// connect and discovery, one VERIFY, and one command's retries (docs/PRODUCTION.md, "Time limits").
    public static func bound(config: EngineConfig, timeouts: SessionTimeouts, reconnect: ReconnectPolicy) -> Duration {
        max(timeouts.stall, config.replyTimeout) + reconnect.window + timeouts.connect + timeouts.discovery
            + config.verifyTimeout + max(config.replyTimeout, config.activateTimeout) * (config.commandRetries + 1)
    }

    /// Runs the whole update, reconnecting after unexpected link losses as `reconnect` allows.
    /// Throws `OTAError` with a one-line message. Cancelling the task stops it between two writes,
    /// leaving the device resumable (`interrupted`).
    public func run(events: @escaping @Sendable (SessionEvent) -> Void = { _ in }) async throws(OTAError) -> OTAResult {
        do {
            return try await profile.run(self, events: events)
        } catch {
            // A device whose protocol cannot resume is told to be reset, whatever stopped it.
            throw profile.resumesTransfer ? error : error.startingOver(protocolName: profile.name)
        }
    }

    /// `run` with the profile's type known, so the engine is a concrete value in the hot loop
    /// (reached through `OTAProfile.run(_:events:)`, which specializes it per profile).
    func run<Profile: OTAProfile>(_ profile: Profile,
                                  events: @escaping @Sendable (SessionEvent) -> Void) async throws(OTAError) -> OTAResult {
        var engine = profile.makeEngine(image: image, config: config)
        if config.restart {
            journal?.remove(device: device, image: image)
        } else if let entry = journal?.load(device: device, image: image) {
            engine.seed(confirmedOffset: entry.confirmedOffset, crc: entry.confirmedCRC)
            logger.debug("journal", metadata: ["device": "\(device)", "confirmed": "\(entry.confirmedOffset)"])
        }
        var stall = StallBudget(limit: max(timeouts.stall, config.replyTimeout))
        // Without reconnecting, this session's first attempt is the one attempt it has.
        var outage = Outage(policy: reconnect, since: reconnect.window > .zero ? unreachedSince : nil)
        let started = clock.now
        // What the first attached connection ran: a later one may run the new image already
        // (SMP reads the device back after its reset on a connection of its own).
        var before: FirmwareVersion?? = nil
        var readBackTried = false
        // The activating command's answer was lost (`notConfirmed`): what a give-up says.
        var unconfirmed: OTAError?
        while true {
            try checkCancelled(confirmed: engine.acked)
            events(.connecting(device: device))
            let ackedBefore = engine.acked
            let agreedBefore = engine.furthestAgreed
            let attemptStart = clock.now
            // No attempt runs past the reconnect window.
            let limit = outage.deadline.map { min(timeouts.connect, max(.milliseconds(1), $0 - attemptStart)) } ?? timeouts.connect
            connectedAt = nil
            silentFor = .zero
            do {
                var result = try await connectAndDrive(&engine, profile: profile, stall: &stall, before: &before, limit: limit, events: events)
                if !result.skipped, case .some(let version) = before { result.firmwareBefore = version }
                journal?.remove(device: device, image: image)
                result.seconds = (clock.now - started).seconds
                return result
            } catch {
                if Task.isCancelled { throw interrupted(confirmed: engine.acked) }
                if error.code == .verifyFailed { journal?.remove(device: device, image: image) }
                let lostAt = clock.now
                if error.code == .notConfirmed { unconfirmed = error }
                if error.code == .notConfirmed, let confirmActivation, await confirmActivation() {
                    events(.notice(device: device, message: "the answer to the command that activates the image was lost (\(error.message)); the device runs its application again: the image was activated"))
                    journal?.remove(device: device, image: image)
                    return OTAResult(device: device, bytes: image.size, crc32: image.crc32, mtu: lastLink.mtu, chunkSize: lastLink.chunk,
                                     seconds: (clock.now - started).seconds, transferSeconds: 0, activated: true,
                                     firmwareBefore: before ?? nil, stats: engine.stats)
                }
                // A new connection helps a lost or stuck link; it cannot make a device confirm data it
                // keeps losing (the stall budget is spent), verify faster, or answer when it kept the
                // link and answered nothing for a whole stall budget (busy longer than any wait
                // allowed for, or hung).
                let exhausted = stall.left <= .zero || (error.code == .timeout && engine.failedIn == .verifying)
                    || (error.code == .timeout && silentFor >= stall.limit)
                if reconnect.window == .zero, engine.awaitsNextConnection, !readBackTried {
                    // Reconnecting after link losses is off; the reset's outcome is read all the same, once.
                    readBackTried = true
                    events(.reconnecting(device: device, attempt: 1, reason: error.message, delay: .zero))
                    continue
                }
                // An unconfirmed activation that may not have happened (the device may still wait in
                // its update mode, where the engine finds out) is looked for there too, within the window.
                guard error.resumable, error.code == .connection || error.code == .timeout || error.code == .notConfirmed,
                      reconnect.window > .zero, !exhausted else {
                    throw error
                }
                let since = connectedAt == nil ? attemptStart : lostAt
                let delay: Duration
                do throws(OTAError) {
                    delay = try outage.nextDelay(after: error, progressed: engine.acked > ackedBefore || engine.furthestAgreed > agreedBefore,
                                                 since: since, at: clock.now)
                } catch {
                    if let unconfirmed { throw notConfirmed(OTAError(unconfirmed.code, "\(unconfirmed.message); \(error.message)", hint: unconfirmed.hint)) }
                    throw engine.awaitsNextConnection ? notConfirmed(error) : error
                }
                logger.debug("reconnecting", metadata: ["device": "\(device)", "attempt": "\(outage.attempt)", "reason": "\(error.message)"])
                events(.reconnecting(device: device, attempt: outage.attempt, reason: error.message, delay: delay))
                do {
                    try await clock.sleep(for: delay)
                } catch {
                    throw interrupted(confirmed: engine.acked)
                }
            }
        }
    }

    /// One connection: connects, drives the engine over it, and disconnects.
    private func connectAndDrive<Profile: OTAProfile>(_ engine: inout Profile.Engine, profile: Profile, stall: inout StallBudget,
                                                      before: inout FirmwareVersion??, limit: Duration,
                                                      events: @escaping @Sendable (SessionEvent) -> Void) async throws(OTAError) -> OTAResult {
        let connection = try await connectOrThrow(within: limit)
        connectedAt = connection.clock.now
        do {
            let result = try await drive(&engine, profile: profile, on: connection, stall: &stall, before: &before, events: events)
            await connection.disconnect()
            return result
        } catch {
            await connection.disconnect()
            throw error
        }
    }

    private func connectOrThrow(within limit: Duration) async throws(OTAError) -> any GATTConnection {
        do {
            return try await connect(limit)
        } catch {
            throw OTAError.from(error, device: device)
        }
    }

    private func checkCancelled(confirmed: Int) throws(OTAError) {
        if Task.isCancelled { throw interrupted(confirmed: confirmed) }
    }

    /// The device reset to activate the image (the activating command went out and the link
    /// dropped) and did not come back within the reconnect window to say what it runs.
    private func notConfirmed(_ error: OTAError) -> OTAError {
        if error.code == .notConfirmed {
            return OTAError(.notConfirmed, "\(error.message); nor did the device's next state confirm the activation",
                            hint: "check the version it runs before sending it again", cause: error.cause)
        }
        return OTAError(.notConfirmed, "\(device) was sent the image and the command that activates it, and reset, but did not come back to confirm it: \(error.message)",
                        hint: "check the version it runs (otaflash info, or its own tools) before sending it again", cause: error)
    }

    private func interrupted(confirmed: Int) -> OTAError {
        guard profile.resumesTransfer else {
            return OTAError(.interrupted, "interrupted with \(confirmed) of \(image.size) bytes confirmed by \(device)",
                            hint: "the \(profile.name) protocol cannot resume: reset the device (power cycle, or its reset button), then run the same command again")
        }
        return OTAError(.interrupted, "interrupted with \(confirmed) of \(image.size) bytes confirmed by \(device)",
                        hint: "the device keeps them: run the same command again to resume", resumable: true)
    }

    /// How long a refused setup step waits to see whether the link drops right after it.
    static let linkLossGrace: Duration = .seconds(2)

    /// A setup step the device refused just before its link dropped (a device that reboots
    /// answers what reaches it with an error, then drops the link) is a link loss: resumable.
    private func linkLossExplaining(_ error: OTAError, on connection: any GATTConnection) async -> OTAError {
        guard error.code == .protocolError, error.cause is GATTError,
              case .disconnected(let reason)? = await connection.nextEvent(timeout: Self.linkLossGrace) else { return error }
        return OTAError(.connection, "\(reason) while setting up (\(error.message))",
                        hint: OTAError.resumeAdvice, resumable: true, cause: error)
    }

    /// Whether setting up failed (or succeeded only) because the device wants pairing: it refused
    /// with ATT 0x05/0x0F, the central's stack paired (or tried to) by itself, or its silence
    /// after a timeout turns out to be that (`probeSecurity`). Nil: something else.
    private func pairingRefusal<Profile: OTAProfile>(on connection: any GATTConnection, after error: OTAError?,
                                                     profile: Profile) async -> OTAError? {
        guard let stack = connection.stackPairing else {
            if let error, error.code == .timeout { return await probeSecurity(on: connection, profile: profile) }
            return nil
        }
        return OTAError.pairingRequired(device: device, stack: stack, cause: error?.cause as? GATTError, stillRefused: error != nil)
    }

    /// A transport event that says the device wants pairing: the stack's own pairing, or a write
    /// request refused with ATT 0x05/0x0F (ended here for every protocol, whatever its engine
    /// makes of a failed write).
    private func pairingRefusal(in event: GATTEvent, on connection: any GATTConnection) -> OTAError? {
        switch event {
        case .stackPairing(let stack):
            return OTAError.pairingRequired(device: device, stack: connection.stackPairing ?? stack, cause: nil)
        case .writeCompleted(_, let error?) where error.wantsPairing:
            return OTAError.pairingRequired(device: device, stack: connection.stackPairing, cause: error)
        default:
            return nil
        }
    }

    /// Looks into a device that answered nothing at all: an embedded stack drops a write command
    /// on a link weaker than the characteristic requires, without an answer (ATT has none for a
    /// command: NimBLE `ble_att_svr_rx_write_no_rsp`, Zephyr `att_write_cmd`), so the central
    /// learns nothing. A read of the protocol service's readable characteristics is answered:
    /// refused with 0x05/0x0F (or setting off the stack's own pairing) when security is what
    /// is missing. Nil when the probe says nothing of the kind.
    private func probeSecurity<Profile: OTAProfile>(on connection: any GATTConnection, profile: Profile) async -> OTAError? {
        if let stack = connection.stackPairing { return OTAError.pairingRequired(device: device, stack: stack, cause: nil) }
        let services: [GATTService]
        do {
            services = try await withTimeout(config.replyTimeout, clock: connection.clock, "discovering services") { () async throws(GATTError) in
                try await connection.discoverServices()
            }
        } catch {
            return nil
        }
        let readable = services.filter { $0.uuid == profile.serviceUUID }.flatMap(\.characteristics).filter { $0.properties.contains(.read) }
        for characteristic in readable {
            do {
                _ = try await withTimeout(config.replyTimeout, clock: connection.clock, "reading \(characteristic.uuid)") { () async throws(GATTError) in
                    try await connection.read(characteristic)
                }
            } catch where error.wantsPairing {
                logger.debug("the probe read was refused for want of security", metadata: ["device": "\(device)", "error": "\(error)"])
                return OTAError.pairingRequired(device: device, stack: connection.stackPairing, cause: error)
            } catch {
                logger.debug("the probe read failed", metadata: ["device": "\(device)", "error": "\(error)"])
            }
            if let stack = connection.stackPairing { return OTAError.pairingRequired(device: device, stack: stack, cause: nil) }
        }
        return nil
    }

    /// One connection of the run: attaches, then feeds the engine every event and carries out
    /// every action until the transfer ends or the connection fails.
    private func drive<Profile: OTAProfile>(_ engine: inout Profile.Engine, profile: Profile, on connection: any GATTConnection,
                                            stall: inout StallBudget, before: inout FirmwareVersion??,
                                            events: @escaping @Sendable (SessionEvent) -> Void) async throws(OTAError) -> OTAResult {
        let clock = connection.clock
        let started = clock.now
        let (link, mtu) = try await attach(profile, on: connection)
        guard let control = link.characteristics[.control], let data = link.characteristics[.data] else {
            throw OTAError(.internalError, "the \(profile.name) profile attached without a control and a data characteristic; please report this")
        }
        // After a reset the engine reads the outcome; what the device runs is the run's result to
        // tell (a read-back), not the state it starts from.
        if !engine.awaitsNextConnection { events(.deviceInfo(device: device, info: link.summary)) }
        if before == nil { before = .some(link.firmwareVersion) }
        // Only before the engine started: after an activation the device may run that version now.
        if let skip = config.skipIfVersion, engine.phase == .idle, link.firmwareVersion == skip {
            return OTAResult(device: device, bytes: image.size, crc32: image.crc32, mtu: mtu, chunkSize: 0, seconds: 0,
                             transferSeconds: 0, activated: false, skipped: true, firmwareBefore: link.firmwareVersion,
                             stats: engine.stats)
        }
        events(.connected(device: device, mtu: mtu, chunkSize: profile.chunkSize(mtu: mtu)))
        logger.debug("connected", metadata: ["device": "\(device)", "protocol": "\(profile.name)", "mtu": "\(mtu)",
                                             "slot": "\(link.summary.slotSize.map(String.init) ?? "?")"])
        lastLink = (mtu, profile.chunkSize(mtu: mtu))
        var run = ConnectionRun(engine: engine, stall: stall, link: link, control: control, data: data, mtu: mtu,
                                connection: connection, started: started, events: events)
        defer {
            run.stall.hold(at: clock.now)
            engine = run.engine
            stall = run.stall
            silentFor = clock.now - run.lastHeard
        }
        run.actions = run.engine.handle(.connected(link.peer, mtu: mtu))
        run.deadline = clock.now + run.engine.currentTimeout
        while true {
            try checkCancelled(confirmed: run.engine.acked)
            try checkStall(&run)
            recordProgress(&run)
            if let result = try await carryOutActions(&run, profile: profile) { return result }
            announceStart(&run)
            try await stream(&run, profile: profile)
            if !run.actions.isEmpty { continue }
            guard run.engine.isAwaitingReply else {
                throw OTAError(.internalError, "the engine stalled with nothing in flight in phase \(run.engine.phase); please report this")
            }
            try await awaitEvent(&run, profile: profile)
        }
    }

    /// Lets the profile attach and reads the link's MTU; a refusal for want of pairing, or one
    /// that came just before the link dropped, says so.
    private func attach<Profile: OTAProfile>(_ profile: Profile, on connection: any GATTConnection) async throws(OTAError)
        -> (AttachedLink<Profile.Engine.Peer>, mtu: Int) {
        let link: AttachedLink<Profile.Engine.Peer>
        do throws(OTAError) {
            link = try await profile.attach(to: connection, device: device, discoveryTimeout: timeouts.discovery)
        } catch {
            if let refusal = await pairingRefusal(on: connection, after: error, profile: profile) { throw refusal }
            throw await linkLossExplaining(error, on: connection)
        }
        if let refusal = await pairingRefusal(on: connection, after: nil, profile: profile) { throw refusal }
        do {
            return (link, try await connection.mtu())
        } catch {
            throw OTAError.from(error, device: device)
        }
    }

    /// Carries out what the engine asked for: its writes, or the end of the transfer.
    /// - Returns: the result once the engine finished.
    private func carryOutActions<Engine: TransferEngine>(_ run: inout ConnectionRun<Engine>, profile: some OTAProfile) async throws(OTAError) -> OTAResult? {
        let actions = run.actions
        run.actions = []
        for action in actions {
            switch action {
            case .write(let write):
                try await submitCommand(write, &run, profile: profile)
            case .finished:
                report(&run, force: true)
                let now = run.clock.now
                let streamed = (run.streamEnd ?? now) - (run.streamStart ?? run.started)
                return OTAResult(device: device, bytes: image.size, crc32: image.crc32, mtu: run.mtu,
                                 chunkSize: run.engine.chunkSize, seconds: (now - run.started).seconds,
                                 transferSeconds: streamed.seconds,
                                 activated: config.activate, firmwareBefore: run.link.firmwareVersion, stats: run.engine.stats)
            case .failed(let error):
                throw error
            }
        }
        return nil
    }

    /// Writes a command the engine asked for (an action or a stream step) and arms its deadline.
    private func submitCommand<Engine: TransferEngine>(_ write: TransferWrite, _ run: inout ConnectionRun<Engine>,
                                                       profile: some OTAProfile) async throws(OTAError) {
        announcePhase(&run, profile: profile)
        if let ticket = try await submit(write, to: run.target(of: write.role), on: run.connection, profile: profile.name) {
            run.commandTicket = ticket
        }
        run.deadline = run.clock.now + run.engine.currentTimeout
    }

    /// Streams while the engine has something to send and nothing has arrived; stops early when
    /// an event gave the engine actions to carry out.
    private func stream<Engine: TransferEngine>(_ run: inout ConnectionRun<Engine>, profile: some OTAProfile) async throws(OTAError) {
        while true {
            switch run.engine.nextStreamStep() {
            case .data(let offset, let count):
                let lost = try await writeStreamed(run.engine.dataPacket(offset: offset, count: count), to: run.data, on: run.connection)
                if try afterStreamedWrite(&run, lost: lost) { return }
            case .write(let write) where !write.withResponse:
                // A protocol whose frames span several writes (SMP) streams them like data.
                announcePhase(&run, profile: profile)
                guard let target = run.target(of: write.role) else {
                    throw OTAError(.internalError, "the \(profile.name) engine wrote to \(write.role), which its profile did not attach; please report this")
                }
                run.deadline = run.clock.now + run.engine.currentTimeout
                let lost = try await writeStreamed(write.bytes, to: target, on: run.connection)
                if try afterStreamedWrite(&run, lost: lost) { return }
            case .write(let write):
                try await submitCommand(write, &run, profile: profile)
            case .idle:
                return
            }
        }
    }

    /// After a packet went out without response: takes an event that arrived meanwhile.
    /// - Parameter lost: why the link is gone, or nil when the packet went out.
    /// - Returns: true when the engine has actions to carry out (streaming stops).
    private func afterStreamedWrite<Engine: TransferEngine>(_ run: inout ConnectionRun<Engine>, lost: String?) throws(OTAError) -> Bool {
        if let lost {
            run.actions = run.engine.handle(.disconnected(.linkLost(lost)))
            return true
        }
        if Task.isCancelled { throw interrupted(confirmed: run.engine.acked) }
        if let event = run.connection.pollEvent() {
            if let refusal = pairingRefusal(in: event, on: run.connection) { throw refusal }
            run.hear()
            if let mapped = run.map(event) {
                run.engine.observe(time: run.clock.now)
                run.actions = run.engine.handle(mapped)
                if !run.actions.isEmpty { return true }
                // A device that keeps answering with rewinds never lets the stream idle.
                try checkStall(&run)
                recordProgress(&run)
            }
        }
        report(&run, force: false)
        return false
    }

    /// Waits for the reply, an event, or the deadline, and hands what came to the engine.
    private func awaitEvent<Engine: TransferEngine>(_ run: inout ConnectionRun<Engine>, profile: some OTAProfile) async throws(OTAError) {
        let until = min(run.deadline, stallDeadline(&run) ?? run.deadline)
        let next = await run.connection.nextEvent(timeout: max(.zero, until - run.clock.now))
        try checkCancelled(confirmed: run.engine.acked)
        guard let event = next else {
            if run.clock.now < run.deadline { return }  // the stall deadline: checked at the loop's top
            if !run.heard, !run.probed {
                run.probed = true
                if let refusal = await probeSecurity(on: run.connection, profile: profile) { throw refusal }
            }
            run.engine.observe(time: run.clock.now)
            run.actions = run.engine.handle(.timeout)
            if run.actions.isEmpty { run.deadline = run.clock.now + run.engine.currentTimeout }
            return
        }
        if let refusal = pairingRefusal(in: event, on: run.connection) { throw refusal }
        run.hear()
        if let mapped = run.map(event) {
            run.engine.observe(time: run.clock.now)
            run.actions = run.engine.handle(mapped)
            // An answer that asks the engine to wait (a busy SMP server) may shorten the wait.
            if run.actions.isEmpty { run.deadline = min(run.deadline, run.clock.now + run.engine.currentTimeout) }
        }
        report(&run, force: false)
    }

    // MARK: What a connection reports

    /// A progress event, at most every `progressInterval` unless `force`d; none before the
    /// transfer's `transferStarted` event.
    private func report<Engine: TransferEngine>(_ run: inout ConnectionRun<Engine>, force: Bool) {
        let now = run.clock.now
        guard run.announcedStart, force || now - run.lastProgress >= Self.progressInterval else { return }
        run.lastProgress = now
        run.meter.sample(bytes: run.engine.highWater, at: now)
        let rate = run.meter.rate
        let left = Double(image.size - run.engine.sent)
        run.events(.progress(TransferProgress(device: device, bytes: run.engine.sent, confirmed: run.engine.acked, total: image.size,
                                              rate: rate, eta: rate > 0 ? left / rate : nil, elapsed: (now - run.started).seconds)))
    }

    /// The `transferStarted` event, once the engine streams.
    private func announceStart<Engine: TransferEngine>(_ run: inout ConnectionRun<Engine>) {
        guard !run.announcedStart, run.engine.phase == .streaming else { return }
        run.announcedStart = true
        run.streamStart = run.clock.now
        run.events(.transferStarted(device: device, resumeOffset: run.engine.resumeOffset, total: image.size))
    }

    /// Before a command goes out: the events of the phase it belongs to (a streaming engine
    /// may send its first verifying command as a stream step or as an action).
    private func announcePhase<Engine: TransferEngine>(_ run: inout ConnectionRun<Engine>, profile: some OTAProfile) {
        if run.engine.phase == .verifying, run.streamEnd == nil {
            run.streamEnd = run.clock.now
            report(&run, force: true)
            run.events(.verifying(device: device, check: profile.imageCheck))
        }
        // Once: activating may take several commands (SMP: mark, then reset) or retries.
        if run.engine.phase == .activating, !run.announcedActivate {
            run.announcedActivate = true
            run.events(.activating(device: device))
        }
    }

    /// Says what the engine noted, and records a newly confirmed position in the journal.
    private func recordProgress<Engine: TransferEngine>(_ run: inout ConnectionRun<Engine>) {
        let notes = run.engine.notes
        while run.told < notes.count {
            run.events(.notice(device: device, message: notes[run.told]))
            run.told += 1
        }
        guard run.engine.acked != run.journaled, let journal else { return }
        run.journaled = run.engine.acked
        let entry = TransferJournal(device: device, imageSize: image.size, imageCRC: hex32(image.crc32),
                                    confirmedOffset: run.engine.acked, confirmedCRC: run.engine.ackedCRC, updated: Date())
        do { try journal.save(entry, image: image) } catch {
            logger.warning("cannot write the journal", metadata: ["path": "\(journal.path(device: device, image: image))", "error": "\(error)"])
        }
    }

    // MARK: The stall budget

    /// The stall deadline while it applies: VERIFY and ACTIVATE have deadlines of their own; so
    /// does one wait the protocol allows to last longer than the whole budget (SMP's first
    /// upload request: the server erases its slot before it answers), timed by the engine's
    /// timeout and retries.
    private func stallDeadline<Engine: TransferEngine>(_ run: inout ConnectionRun<Engine>) -> Duration? {
        let now = run.clock.now
        run.stall.observe(furthest: run.engine.furthestAgreed, at: now)
        guard run.engine.phase == .beginning || run.engine.phase == .streaming,
              !(run.engine.isAwaitingReply && run.engine.currentTimeout > run.stall.limit) else {
            run.stall.hold(at: now)
            return nil
        }
        run.stall.spend(at: now)
        return run.stall.deadline
    }

    private func checkStall<Engine: TransferEngine>(_ run: inout ConnectionRun<Engine>) throws(OTAError) {
        guard let limit = stallDeadline(&run), run.clock.now >= limit else { return }
        run.stall.hold(at: run.clock.now)
        let stats = run.engine.stats
        throw OTAError(.timeout, "\(device) confirmed no new data in \(run.stall.limit.seconds) s of connected time (\(run.engine.acked) of \(image.size) bytes confirmed, \(stats.rewinds) rewinds, \(stats.rollbacks) rollbacks)",
                       hint: "the link loses or corrupts the data, the device writes its flash too slowly, or it stopped answering: check the link and the device, then \(OTAError.resumeAdvice)",
                       resumable: true)
    }

    /// Writes a packet without response, through the transport's fast path when it has room; to a
    /// characteristic that takes no write commands, as a write request whose response it awaits
    /// (a profile hands the session the characteristic as flagged: what it flags is what is sent).
    /// - Returns: why the link is gone, or nil when the packet went out.
    private func writeStreamed(_ packet: [UInt8], to target: GATTCharacteristic, on connection: any GATTConnection) async throws(OTAError) -> String? {
        do {
            if target.streamWriteType == .withResponse {
                try await connection.write(packet, to: target, type: .withResponse)
            } else if try !connection.tryWriteWithoutResponse(packet, to: target) {
                try await connection.write(packet, to: target, type: .withoutResponse)
            }
            return nil
        } catch {
            if error.code == .notConnected { return error.message }
            throw OTAError.from(error, device: device)
        }
    }

    /// Writes a command: with response through the ticketed path (its failure comes back as an
    /// event, so the ticket is returned), else without. A link already gone is left to its
    /// disconnect event.
    private func submit(_ write: TransferWrite, to target: GATTCharacteristic?, on connection: any GATTConnection,
                        profile: String) async throws(OTAError) -> WriteTicket? {
        guard let target else {
            throw OTAError(.internalError, "the \(profile) engine wrote to \(write.role), which its profile did not attach; please report this")
        }
        do {
            if write.withResponse { return try connection.submitWrite(write.bytes, to: target) }
            try await connection.write(write.bytes, to: target, type: target.streamWriteType)
        } catch {
            if error.code != .notConnected { throw OTAError.from(error, device: device) }
        }
        return nil
    }
}

/// What one connection of a session keeps while it drives the engine: the engine itself (a
/// concrete value, so the per-packet path calls it directly), the attached link, the deadlines
/// and what was already said. `OTASession.drive` and its steps pass it along.
struct ConnectionRun<Engine: TransferEngine> {
    var engine: Engine
    var stall: StallBudget
    let link: AttachedLink<Engine.Peer>
    let control: GATTCharacteristic
    let data: GATTCharacteristic
    let mtu: Int
    let connection: any GATTConnection
    let clock: any MonotonicClock
    /// When the connection began.
    let started: Duration
    let events: @Sendable (SessionEvent) -> Void
    /// Notifications by characteristic, looked up without hashing.
    let roles: [(id: String, role: CharacteristicRole)]

    /// What the engine asked for and the session has not carried out yet.
    var actions: [TransferAction] = []
    /// When the command in flight (or the wait the engine asked for) times out.
    var deadline: Duration
    /// The write with response in flight, whose failure comes back as an event.
    var commandTicket: WriteTicket?
    var meter: RateMeter
    var lastProgress: Duration
    var announcedStart = false
    var announcedActivate = false
    var streamStart: Duration?
    var streamEnd: Duration?
    /// The confirmed position last journaled, and the engine's notes already told.
    var journaled: Int
    var told: Int
    /// Whether the device answered anything on this connection, and whether its silence was
    /// looked into (`OTASession.probeSecurity`).
    var heard = false
    var probed = false
    /// When the device last sent anything on this connection (or the connection began).
    var lastHeard: Duration

    mutating func hear() {
        heard = true
        lastHeard = clock.now
    }

    init(engine: Engine, stall: StallBudget, link: AttachedLink<Engine.Peer>, control: GATTCharacteristic, data: GATTCharacteristic,
         mtu: Int, connection: any GATTConnection, started: Duration, events: @escaping @Sendable (SessionEvent) -> Void) {
        self.engine = engine
        self.stall = stall
        self.link = link
        self.control = control
        self.data = data
        self.mtu = mtu
        self.connection = connection
        self.clock = connection.clock
        self.started = started
        self.events = events
        roles = link.characteristics.map { (id: $0.value.id, role: $0.key) }
        let now = clock.now
        deadline = now
        lastHeard = now
        meter = RateMeter(start: now)
        lastProgress = now - OTASession.progressInterval
        journaled = engine.acked
        told = engine.notes.count
    }

    /// The characteristic that plays `role` (nil: the profile did not attach one).
    func target(of role: CharacteristicRole) -> GATTCharacteristic? {
        role == .control ? control : link.characteristics[role]
    }

    /// Turns a transport event into an engine event; nil for events the engine does not need.
    mutating func map(_ event: GATTEvent) -> TransferEvent<Engine.Peer>? {
        switch event {
        case .notification(let id, let value):
            guard let role = roles.first(where: { $0.id == id })?.role else { return nil }
            return .notification(role, value)
        case .writeCompleted(let t, let error):
            guard t == commandTicket, let error else { return nil }
            commandTicket = nil
            return .commandFailed(error)
        case .disconnected(let reason):
            return .disconnected(reason)
        case .stackPairing:
            return nil  // `pairingRefusal(in:on:)` ends the session first
        }
    }
}

/// Bytes per second over the last few seconds.
struct RateMeter {
    private var samples: [(time: Duration, bytes: Int)]
    static let span: Duration = .seconds(3)

    init(start: Duration) { samples = [(start, 0)] }

    mutating func sample(bytes: Int, at time: Duration) {
        samples.append((time, bytes))
        while samples.count > 2, time - samples[1].time >= Self.span { samples.removeFirst() }
    }

    var rate: Double {
        guard let first = samples.first, let last = samples.last else { return 0 }
        let dt = (last.time - first.time).seconds
        return dt > 0 ? Double(last.bytes - first.bytes) / dt : 0
    }
}

/// Runs `body`, failing with a `timeout` GATTError naming `what` when it takes longer than `limit`.
public func withTimeout<T: Sendable>(_ limit: Duration, clock: any MonotonicClock, _ what: String,
                                     _ body: @escaping @Sendable () async throws(GATTError) -> T) async throws(GATTError) -> T {
    // A racing timer would make virtual time jump ahead of the one flow that runs on it; there,
    // every wait is computed by the link model and bounded by it.
    if clock is VirtualClock { return try await body() }
    let result: Result<T, GATTError>? = await withTaskGroup(of: Result<T, GATTError>?.self) { group in
        group.addTask {
            do throws(GATTError) { return .success(try await body()) } catch { return .failure(error) }
        }
        group.addTask {
            try? await clock.sleep(for: limit)
            return nil
        }
        let first = await group.next() ?? nil
        group.cancelAll()
        return first
    }
    guard let result else { throw GATTError(.timeout, "\(what) took longer than \(limit.seconds) s") }
    return try result.get()
}

extension GATTCharacteristic {
    /// How an engine's write that wants no response goes out: a write command where the
    /// characteristic is flagged for one, else a write request (strict in what is sent; a profile
    /// that knows its device takes commands anyway says so by the flags it hands over, as ESP32's).
    var streamWriteType: WriteType { properties.contains(.writeWithoutResponse) ? .withoutResponse : .withResponse }
}
