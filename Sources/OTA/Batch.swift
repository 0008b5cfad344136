import GATT
import Logging
import OTAWire

/// One device of a batch: where it is and how to reach it.
public struct BatchTarget: Sendable {
    public let address: DeviceAddress
    /// The adapter it is flashed through (nil: the only one); sessions are limited per adapter.
    public let adapter: String?
    public let central: any GATTCentral
    /// This device's own pairing answers (its passkey from a file), over the batch's.
    public let credentials: PairingCredentials?

    public init(address: DeviceAddress, adapter: String?, central: any GATTCentral, credentials: PairingCredentials? = nil) {
        self.address = address
        self.adapter = adapter
        self.central = central
        self.credentials = credentials
    }
}

/// How a batch runs.
public struct BatchOptions: Sendable {
    /// Sessions at once, over all adapters.
    public var parallel: Int
    /// Sessions at once on one adapter (controllers handle a limited number of connections).
    public var perAdapter: Int
    /// Whole-session attempts after the first, once a session's own reconnects gave up.
    public var retries: Int
    public var config: EngineConfig
    /// The protocols `protocolName` `auto` chooses from; nil: the plan's own.
    public var registry: ProtocolRegistry?
    /// `auto` or a registered name (`--protocol`).
    public var protocolName: String
    public var timeouts: SessionTimeouts
    public var reconnect: ReconnectPolicy
    public var journal: JournalStore?
    /// Reconnect after activation to read the version the device now runs.
    public var readBackVersion: Bool
    /// Pairing and unpairing, for each device on its own.
    public var pairing: PairingPolicy
    /// Read each device's Device Information Service (`DeviceUpdater.readsIdentity`).
    public var readsIdentity = false

    public init(parallel: Int = 1, perAdapter: Int = 4, retries: Int = 1, config: EngineConfig = EngineConfig(),
                timeouts: SessionTimeouts = SessionTimeouts(), reconnect: ReconnectPolicy = ReconnectPolicy(),
                registry: ProtocolRegistry? = nil, protocolName: String = ProtocolRegistry.auto,
                journal: JournalStore? = nil, readBackVersion: Bool = true, pairing: PairingPolicy = .none) {
        self.parallel = parallel
        self.perAdapter = perAdapter
        self.retries = retries
        self.config = config
        self.registry = registry
        self.protocolName = protocolName
        self.timeouts = timeouts
        self.reconnect = reconnect
        self.journal = journal
        self.readBackVersion = readBackVersion
        self.pairing = pairing
    }
}

/// What happened to one device, in a batch or alone: the CLI reports both the same way.
public struct BatchOutcome: Sendable {
    public enum Result: Sendable {
        case ok(OTAResult)
        case skipped(FirmwareVersion?)
        case failed(OTAError)
    }

    public let device: String
    /// Where the device answered in its update mode, when it was moved there (a Nordic
    /// bootloader after buttonless entry).
    public var updateModeAddress: String?
    public let adapter: String?
    public let result: Result
    /// Sessions started (1 + retries used).
    public let attempts: Int
    public let seconds: Double
    public let firmwareBefore: FirmwareVersion?
    public let firmwareAfter: FirmwareVersion?

    public init(device: String, updateModeAddress: String? = nil, adapter: String?, result: Result, attempts: Int, seconds: Double,
                firmwareBefore: FirmwareVersion?, firmwareAfter: FirmwareVersion?) {
        self.device = device
        self.updateModeAddress = updateModeAddress
        self.adapter = adapter
        self.result = result
        self.attempts = attempts
        self.seconds = seconds
        self.firmwareBefore = firmwareBefore
        self.firmwareAfter = firmwareAfter
    }

    /// The outcome of a session that returned: `skipped` when the device already ran the version
    /// (it still runs it afterwards), otherwise `ok`.
    public init(_ result: OTAResult, updateModeAddress: String? = nil, adapter: String?, attempts: Int, seconds: Double,
                firmwareAfter: FirmwareVersion?) {
        self.init(device: result.device, updateModeAddress: updateModeAddress, adapter: adapter, result: result.skipped ? .skipped(result.firmwareBefore) : .ok(result),
                  attempts: attempts, seconds: seconds, firmwareBefore: result.firmwareBefore,
                  firmwareAfter: result.skipped ? result.firmwareBefore : firmwareAfter)
    }

    /// The outcome once a bond could not be removed (`DeviceUpdater.removeBonds`): never a success.
    public func leaving(_ bond: OTAError?) -> BatchOutcome {
        guard let bond else { return self }
        let error: OTAError
        switch result {
        case .ok, .skipped: error = bond
        case .failed(let failure): error = failure.leaving(bond)
        }
        return BatchOutcome(device: device, updateModeAddress: updateModeAddress, adapter: adapter, result: .failed(error),
                            attempts: attempts, seconds: seconds, firmwareBefore: firmwareBefore, firmwareAfter: firmwareAfter)
    }

    public var succeeded: Bool {
        switch result {
        case .ok, .skipped: true
        case .failed: false
        }
    }
}

/// Flashes one plan (an image, or a package's images) into many devices, several at a time, each
/// through its own `DeviceUpdater`: its own sessions, reconnect supervisor and retries. A device's
/// failure never stops the others. The images are shared by all sessions, never copied per device.
public struct BatchRunner: Sendable {
    public let plan: UpdatePlan
    public let options: BatchOptions
    public let logger: Logger

    public init(plan: UpdatePlan, options: BatchOptions, logger: Logger = Logger(label: "otaflash.batch")) {
        self.plan = plan
        self.options = options
        self.logger = logger
    }

    /// Runs every target and returns their outcomes in the targets' order. Every event carries
    /// the address the target was given.
    ///
    /// `before` runs as a device's turn comes, before anything is sent to it: a result it returns
    /// is that device's outcome with no attempt made, and nothing is sent (`.failed`: a record that
    /// could not be written, a device another station holds; `.skipped`: a ledger shows it done).
    /// `finished` runs as soon as a device's outcome is final, before the next device takes its
    /// place: what is kept of it (a ledger record, a log, a report row) never waits for the batch.
    public func run(_ targets: [BatchTarget],
                    before: @escaping @Sendable (BatchTarget) async -> BatchOutcome.Result? = { _ in nil },
                    finished: @escaping @Sendable (BatchOutcome) async -> Void = { _ in },
                    events: @escaping @Sendable (DeviceUpdater.Event) -> Void = { _ in }) async -> [BatchOutcome] {
        let total = Limiter(options.parallel)
        // One limiter per adapter, shared by its targets.
        var perAdapter: [String: Limiter] = [:]
        let adapterLimits = targets.map { target in
            if let limiter = perAdapter[target.adapter ?? ""] { return limiter }
            let limiter = Limiter(options.perAdapter)
            perAdapter[target.adapter ?? ""] = limiter
            return limiter
        }
        return await withTaskGroup(of: (Int, BatchOutcome).self) { group in
            for (index, target) in targets.enumerated() {
                group.addTask {
                    let adapterLimit = adapterLimits[index]
                    await adapterLimit.acquire()
                    await total.acquire()
                    let outcome: BatchOutcome
                    if let decided = await before(target) {
                        outcome = BatchOutcome(device: target.address.description, adapter: target.adapter, result: decided,
                                               attempts: 0, seconds: 0, firmwareBefore: nil, firmwareAfter: nil)
                    } else {
                        outcome = await flash(target, events: events)
                    }
                    await finished(outcome)
                    await total.release()
                    await adapterLimit.release()
                    return (index, outcome)
                }
            }
            var outcomes: [(index: Int, outcome: BatchOutcome)] = []
            for await finished in group { outcomes.append(finished) }
            return outcomes.sorted { $0.index < $1.index }.map(\.outcome)
        }
    }

    /// The device's time is its link's (virtual on a simulated line).
    private func flash(_ target: BatchTarget, events: @escaping @Sendable (DeviceUpdater.Event) -> Void) async -> BatchOutcome {
        let started = target.central.clock.now
        var pairing = options.pairing
        if let credentials = target.credentials { pairing.credentials = credentials }
        var updater = DeviceUpdater(plan: plan, registry: options.registry, protocolName: options.protocolName, config: options.config,
                                    timeouts: options.timeouts, reconnect: options.reconnect, journal: options.journal,
                                    logger: logger, namesSessionsByDevice: true, readsBack: options.readBackVersion,
                                    pairing: pairing)
        updater.readsIdentity = options.readsIdentity
        let outcome = await attempts(updater, target, started: started, events: events)
        let left = await updater.removeBonds(central: target.central, address: target.address,
                                             updateModeAddress: outcome.updateModeAddress.flatMap(DeviceAddress.init), events: events)
        return outcome.leaving(left)
    }

    /// The device's attempts: the first, then retries while its failure is one a new attempt can overcome.
    private func attempts(_ updater: DeviceUpdater, _ target: BatchTarget, started: Duration,
                          events: @escaping @Sendable (DeviceUpdater.Event) -> Void) async -> BatchOutcome {
        var attempt = 0
        var lastError: OTAError?
        var before: FirmwareVersion?
        var progress = DeviceUpdater.Progress()
        while attempt <= options.retries {
            attempt += 1
            if Task.isCancelled { break }
            let outcome = await updater.run(central: target.central, address: target.address, from: progress, events: events)
            progress = outcome.progress
            let error: OTAError
            switch outcome.result {
            case .success(let result):
                before = result.firmwareBefore
                return BatchOutcome(result, updateModeAddress: progress.entry?.address.description, adapter: target.adapter,
                                    attempts: attempt, seconds: (target.central.clock.now - started).seconds, firmwareAfter: outcome.after?.firmwareVersion)
            case .failure(let failure):
                error = failure
            }
            lastError = error
            logger.debug("attempt failed", metadata: ["device": "\(target.address)", "attempt": "\(attempt)", "error": "\(error)"])
            // Only failures a new attempt can overcome are worth one; it goes on where this one
            // left the device (moved into its update mode, images installed).
            guard error.resumable, error.code != .interrupted else { break }
        }
        let error = lastError ?? OTAError(.interrupted, "stopped before \(target.address) was flashed", resumable: true)
        return BatchOutcome(device: target.address.description, updateModeAddress: progress.entry?.address.description,
                            adapter: target.adapter, result: .failed(error), attempts: attempt,
                            seconds: (target.central.clock.now - started).seconds, firmwareBefore: before, firmwareAfter: nil)
    }
}

/// A counting semaphore for tasks: `acquire` waits (on a continuation) until a slot is free.
actor Limiter {
    private var free: Int
    private var waiting: [CheckedContinuation<Void, Never>] = []

    init(_ slots: Int) { free = max(1, slots) }

    func acquire() async {
        if free > 0 {
            free -= 1
            return
        }
        await withCheckedContinuation { waiting.append($0) }
    }

    func release() {
        if waiting.isEmpty {
            free += 1
        } else {
            waiting.removeFirst().resume()
        }
    }
}
