import GATT
import OTA
import OTADevice

// How otaflash-soak and otaflash-bench exercise one protocol. Each protocol module supplies its
// strategies; the two executables loop over a list of them and name no protocol in their main.
//
// The contract lives here, in Simulator, rather than in OTA: a strategy builds simulated devices
// on the link model with seeded faults (FaultPlan), all of which are the simulator's, and only
// reads the session's results. OTA is the neutral core every program links to update real
// devices; it keeps no dependency on the simulator. Simulator depends on OTA for the session
// and profile types a trial hands to the runner.

// MARK: Soak

/// What every soak run shares: the session's settings and the native device's protocol version.
public struct SoakSettings: Sendable {
    public var config: EngineConfig
    public var timeouts: SessionTimeouts
    /// The reconnect window (each run seeds its own backoff).
    public var reconnectWindow: Duration
    /// `--device-version`: the protocol version of the device a run simulates.
    public var deviceVersion: Int

    public init(config: EngineConfig = EngineConfig(), timeouts: SessionTimeouts = SessionTimeouts(),
                reconnectWindow: Duration = .seconds(60), deviceVersion: Int = 1) {
        self.config = config
        self.timeouts = timeouts
        self.reconnectWindow = reconnectWindow
        self.deviceVersion = deviceVersion
    }

    /// The session's documented bound after the last progress (docs/PRODUCTION.md, "Time limits").
    public var sessionBound: Duration {
        OTASession.bound(config: config, timeouts: timeouts, reconnect: ReconnectPolicy(window: reconnectWindow))
    }
}

/// What one run drew from its seed: an image size, a link and the faults the simulated device
/// injects. The strategy chooses the sizes and scales the drop and corruption rates
/// (`SoakStrategy.drawSize`, `lossScale`); the rest of the draw is the same for every protocol.
public struct SoakScenario: Sendable, CustomStringConvertible {
    public var size: Int
    public var link: LinkModel
    public var faults: FaultPlan
    public var bitFlip: Bool
    /// A device that never confirms: it drops or corrupts every packet, or stops answering.
    public var neverConfirms: String?

    public init(seed: UInt64, for strategy: some SoakStrategy) {
        var rng = SeededGenerator(seed: seed)
        let size = strategy.drawSize(&rng)
        self.size = size
        let scale = strategy.lossScale
        let mtu = [23, 185, 247, 517][Int(rng.next() % 4)]
        let phy: LinkModel.PHY = rng.next() % 2 == 0 ? .le1M : .le2M
        let ci = [7500, 15000, 30000, 50000][Int(rng.next() % 4)]
        link = LinkModel(mtu: mtu, phy: phy, connectionInterval: .microseconds(Int64(ci)))
        func rate(_ max: Double) -> Double { rng.next() % 3 == 0 ? 0 : Double(rng.next() % 1000) / 1000 * max }
        func offsets(_ maxCount: UInt64) -> [Int] { (0..<Int(rng.next() % (maxCount + 1))).map { _ in Int(rng.next() % UInt64(size)) } }
        let bitFlip = rng.next() % 20 == 0
        self.bitFlip = bitFlip
        faults = FaultPlan(
            seed: rng.next(),
            dropRate: rate(0.03 * scale),
            disconnectAt: offsets(3),
            rebootAt: offsets(2),
            corruptRate: rate(0.005 * scale),
            gattErrorRate: rate(0.1),
            lostNotificationRate: rate(0.1),
            slowFlashPerKiB: .microseconds(Int64(rng.next() % 3000)),
            flashBitFlipAt: bitFlip ? Int(rng.next() % UInt64(size)) : nil)
        // One run in ten: a device that never confirms, which must still end within the bound.
        if rng.next() % 10 == 0 {
            switch rng.next() % 3 {
            case 0: faults.dropRate = 1; neverConfirms = "drops every packet"
            case 1: faults.corruptRate = 1; neverConfirms = "corrupts every packet"
            default:
                let at = Int(rng.next() % UInt64(size))
                faults.stopAnsweringAt = at
                neverConfirms = "stops answering at \(at)"
            }
        }
    }

    /// The same draw with its faults taken out: a device on the same link that confirms everything.
    public var withoutFaults: SoakScenario {
        var clean = self
        clean.faults = .none
        clean.bitFlip = false
        clean.neverConfirms = nil
        return clean
    }

    /// The image sizes most protocols draw: 4 KiB to 256 KiB, each with up to 511 bytes more.
    public static func standardSize(_ rng: inout SeededGenerator) -> Int {
        [4096, 32 * 1024, 100_000, 256 * 1024][Int(rng.next() % 4)] + Int(rng.next() % 512)
    }

    public var description: String {
        "size \(size), \(link), drop \(faults.dropRate), disconnects \(faults.disconnectAt), reboots \(faults.rebootAt), "
            + "corrupt \(faults.corruptRate), gatt errors \(faults.gattErrorRate), lost notifications \(faults.lostNotificationRate), "
            + "slow flash \(faults.slowFlashPerKiB), bit flip \(faults.flashBitFlipAt.map(String.init) ?? "none")"
            + (neverConfirms.map { ", never confirms: \($0)" } ?? "")
    }
}

/// What a protocol's checks found after one run, beyond the checks every run shares.
public struct SoakVerdict: Sendable {
    /// The first invariant the run broke.
    public var violation: String?
    /// The device activated (marked, swapped in) bytes other than the image sent.
    public var mismatchedActivation = false
    /// The run failed, yet the device activated something (other than `unconfirmedActivation`).
    public var activatedOnFailure = false
    /// The link was lost during the last command and the device activated the image anyway: the
    /// run failed with a connection error that says so, and the image is the one sent.
    public var unconfirmedActivation = false

    public init() {}

    /// Records `violation` unless an earlier one was found.
    public mutating func violate(_ message: String) {
        violation = violation ?? message
    }
}

/// One run ready to go: the simulated device with the scenario's faults, the plan (image and
/// profile) the session sends it, and the protocol's checks of what the device did.
public struct SoakTrial: Sendable {
    public var device: SimulatedDevice
    public var image: FirmwareImage
    public var profile: any OTAProfile
    /// What this run drew beyond the scenario, for its line ("buffers 4×384, canonical answers").
    public var detail: String?
    /// A key the strategy's summary groups runs by (SMP: the encoding of the server's answers).
    public var group: String?
    /// The most bytes a resume may send again in this run, and what that amount is.
    public var resendLimit: Int
    public var resendLimitName: String
    /// The protocol's invariants, checked on the run's result once it ended.
    public var check: @Sendable (Result<OTAResult, OTAError>) -> SoakVerdict

    public init(device: SimulatedDevice, image: FirmwareImage, profile: any OTAProfile, detail: String? = nil, group: String? = nil,
                resendLimit: Int, resendLimitName: String, check: @escaping @Sendable (Result<OTAResult, OTAError>) -> SoakVerdict) {
        self.device = device
        self.image = image
        self.profile = profile
        self.detail = detail
        self.group = group
        self.resendLimit = resendLimit
        self.resendLimitName = resendLimitName
        self.check = check
    }
}

extension SoakTrial {
    /// The session that runs this trial on virtual time: its device alone on a simulated central,
    /// the settings' engine, timeouts and reconnect window, the backoff seeded with `seed`.
    public func session(_ settings: SoakSettings, seed: UInt64) -> (session: OTASession, clock: VirtualClock) {
        let clock = VirtualClock()
        let central = SimulatedCentral(devices: [device], clock: clock)
        let session = OTASession(central: central, address: device.config.address, image: image, config: settings.config,
                                 profile: profile, timeouts: settings.timeouts,
                                 reconnect: ReconnectPolicy(window: settings.reconnectWindow, seed: seed))
        return (session, clock)
    }
}

/// One finished run as the summary counts it.
public struct SoakRecord: Sendable {
    /// How a run ended; its description is what the summary counts it as.
    public enum Outcome: Sendable, Hashable, CustomStringConvertible {
        case ok
        /// No end within the soak's wall-time limit.
        case hang
        case failed(OTAError.Code)

        /// "ok", "hang", or the error's code.
        public var description: String {
            switch self {
            case .ok: "ok"
            case .hang: "hang"
            case .failed(let code): code.description
            }
        }
    }

    public var outcome: Outcome
    public var violation: String?
    public var reconnects: Int
    public var resumeResends: [Int]
    public var bytesSent: Int
    public var virtualSeconds: Double
    public var wallSeconds: Double
    /// Virtual seconds from the last newly confirmed data (or the start) to the end.
    public var afterProgress: Double
    public var neverConfirms: Bool
    /// A resume re-sent more than the run's limit.
    public var overResendLimit = false
    public var verdict = SoakVerdict()
    /// `SoakTrial.group`.
    public var group: String?

    public init(outcome: Outcome, violation: String? = nil, reconnects: Int = 0, resumeResends: [Int] = [], bytesSent: Int = 0,
                virtualSeconds: Double = 0, wallSeconds: Double = 0, afterProgress: Double = 0, neverConfirms: Bool = false) {
        self.outcome = outcome
        self.violation = violation
        self.reconnects = reconnects
        self.resumeResends = resumeResends
        self.bytesSent = bytesSent
        self.virtualSeconds = virtualSeconds
        self.wallSeconds = wallSeconds
        self.afterProgress = afterProgress
        self.neverConfirms = neverConfirms
    }

    public var passed: Bool { outcome == .ok && violation == nil }
}

/// How to soak one protocol: the scenario's shape, the device, plan and checks of each run, the
/// bound its runs must end within, and the summary lines of its own.
public protocol SoakStrategy: Sendable {
    /// The `--protocol` value that selects it.
    var name: String { get }
    /// The device versions `--device-version` may ask of it.
    var deviceVersions: ClosedRange<Int> { get }
    /// What the summary's first line says the runs were of; nil: nothing.
    func title(_ settings: SoakSettings) -> String?
    /// The image size a run draws.
    func drawSize(_ rng: inout SeededGenerator) -> Int
    /// The factor on the drop and corruption rates a run draws.
    var lossScale: Double { get }
    /// How long a run may go on after its last progress.
    func bound(_ settings: SoakSettings) -> Duration
    /// The most a resume may send again over all runs, and what it is, for the summary.
    func resendLimit(_ settings: SoakSettings) -> (bytes: Int, name: String)
    /// One run's device, plan and checks. Throws when the soak built something otaflash refuses.
    func trial(_ scenario: SoakScenario, seed: UInt64, settings: SoakSettings) throws(OTAError) -> SoakTrial
    /// Lines of its own for the summary, after the shared ones.
    func summary(_ records: [SoakRecord]) -> [String]
}

extension SoakStrategy {
    public var deviceVersions: ClosedRange<Int> { 1...1 }
    public func title(_ settings: SoakSettings) -> String? { name }
    public func drawSize(_ rng: inout SeededGenerator) -> Int { SoakScenario.standardSize(&rng) }
    public var lossScale: Double { 1 }
    public func bound(_ settings: SoakSettings) -> Duration { settings.sessionBound }
    public func summary(_ records: [SoakRecord]) -> [String] { [] }
}

extension SoakStrategy {
    /// The trial of `seed`'s scenario with its faults taken out, run to its end: a run every
    /// strategy's checks must pass, and where its tests start.
    public func cleanRun(seed: UInt64, settings: SoakSettings = SoakSettings()) async throws(OTAError) -> (trial: SoakTrial, result: OTAResult) {
        let trial = try trial(SoakScenario(seed: seed, for: self).withoutFaults, seed: seed, settings: settings)
        return (trial, try await trial.session(settings, seed: seed).session.run())
    }
}

// MARK: Bench

/// One part of the bench's report: printed as it is measured, its figures returned for `--json`.
public struct BenchSection: Sendable {
    /// The flag that selects it ("--nordic").
    public var flag: String
    /// Measures on `image` (the bench's seeded image), prints the lines, returns the figures.
    public var measure: @Sendable (FirmwareImage) async throws -> [(key: String, value: Any)]

    public init(flag: String, measure: @escaping @Sendable (FirmwareImage) async throws -> [(key: String, value: Any)]) {
        self.flag = flag
        self.measure = measure
    }
}

/// How to bench one protocol: its sections, in the order they print.
public protocol BenchStrategy: Sendable {
    var sections: [BenchSection] { get }
}

/// A bench run that did not go as a clean link makes it go: the figure would be wrong.
public struct BenchFailure: Error, CustomStringConvertible {
    public let description: String
    public init(_ description: String) { self.description = description }
}
