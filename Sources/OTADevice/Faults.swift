import GATT

/// Faults the simulated peripheral injects, deterministically for a given seed.
///
/// Offsets refer to image bytes: a fault "at offset X" fires when the device first receives a
/// data packet covering byte X. Rates are per event of their kind (data packet, command,
/// notification) and drawn from a generator seeded with `seed`, so a run replays exactly.
public struct FaultPlan: Sendable, Hashable {
    public var seed: UInt64
    /// Fraction of data packets (write without response) the peripheral's stack drops.
    public var dropRate: Double
    /// The link drops when the device receives these offsets (each fires once).
    public var disconnectAt: [Int]
    /// The device power-cycles when it receives these offsets: it loses what followed its last
    /// checkpoint and is away for `rebootDuration`.
    public var rebootAt: [Int]
    public var rebootDuration: Duration
    /// Fraction of data packets whose payload arrives with one byte flipped.
    public var corruptRate: Double
    /// Data packets covering these offsets arrive with that byte flipped (each fires once).
    public var corruptAt: [Int]
    /// Fraction of control point writes answered with an ATT error instead of being handled.
    public var gattErrorRate: Double
    /// Fraction of notifications the central never receives.
    public var lostNotificationRate: Double
    /// Extra time the device's flash needs per KiB written or read back.
    public var slowFlashPerKiB: Duration
    /// A byte of flash that rots at rest once the image is written: checkpoints pass, VERIFY (which
    /// reads the image back) must fail.
    public var flashBitFlipAt: Int?
    /// After this many connections the device refuses every further connection attempt
    /// (a device that went away for good). Nil: always connectable.
    public var refuseConnectionsAfter: Int?
    /// Once the device receives a data packet covering this offset it stops answering for good:
    /// data is ignored and commands are acknowledged at the ATT level but never answered (a
    /// firmware that hung). Nil: never.
    public var stopAnsweringAt: Int?
    /// The answer to the command that activates the image is lost: the device carries the
    /// command out (it activates and resets) but its answer never reaches the central, as when
    /// its disconnect overtakes it. Each protocol's device model applies it to its own last
    /// answer (Secure DFU: the last EXECUTE's; SMP: the reset's).
    public var loseFinalAnswer: Bool

    public init(seed: UInt64 = 1, dropRate: Double = 0, disconnectAt: [Int] = [], rebootAt: [Int] = [],
                rebootDuration: Duration = .milliseconds(500), corruptRate: Double = 0, corruptAt: [Int] = [],
                gattErrorRate: Double = 0, lostNotificationRate: Double = 0, slowFlashPerKiB: Duration = .zero,
                flashBitFlipAt: Int? = nil, refuseConnectionsAfter: Int? = nil, stopAnsweringAt: Int? = nil,
                loseFinalAnswer: Bool = false) {
        self.stopAnsweringAt = stopAnsweringAt
        self.loseFinalAnswer = loseFinalAnswer
        self.seed = seed
        self.dropRate = dropRate
        self.disconnectAt = disconnectAt
        self.rebootAt = rebootAt
        self.rebootDuration = rebootDuration
        self.corruptRate = corruptRate
        self.corruptAt = corruptAt
        self.gattErrorRate = gattErrorRate
        self.lostNotificationRate = lostNotificationRate
        self.slowFlashPerKiB = slowFlashPerKiB
        self.flashBitFlipAt = flashBitFlipAt
        self.refuseConnectionsAfter = refuseConnectionsAfter
    }

    public static let none = FaultPlan()
}
