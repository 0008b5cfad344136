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
    var lastLink = (mtu: 0, chunk: 0)
    /// When the last connection came up (nil: the attempt under way has not connected yet).
    private var connectedAt: Duration?
    /// How long the device had been silent on the last connection when it failed.
    var silentFor = Duration.zero
    let logger: Logger
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

    func checkCancelled(confirmed: Int) throws(OTAError) {
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

    func interrupted(confirmed: Int) -> OTAError {
        guard profile.resumesTransfer else {
            return OTAError(.interrupted, "interrupted with \(confirmed) of \(image.size) bytes confirmed by \(device)",
                            hint: "the \(profile.name) protocol cannot resume: reset the device (power cycle, or its reset button), then run the same command again")
        }
        return OTAError(.interrupted, "interrupted with \(confirmed) of \(image.size) bytes confirmed by \(device)",
                        hint: "the device keeps them: run the same command again to resume", resumable: true)
    }
}
