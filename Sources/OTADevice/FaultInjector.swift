import GATT

/// The decisions a `FaultPlan` makes, for any protocol's device: which packet is dropped,
/// corrupted or brings a link loss, a reboot or a hang, which control point write gets an ATT
/// error, which notification is lost. Every device model that honours the fault options draws
/// from one of these, in the same order, so a seed and an option mean the same on each.
///
/// Offsets are image bytes; a device that cannot place a packet in the image (a Secure DFU init
/// packet) passes nil, and only the rate faults apply to it.
public struct FaultInjector: Sendable {
    public private(set) var plan: FaultPlan
    private var rng: SeededGenerator
    /// The device hung (`FaultPlan.stopAnsweringAt`): it ignores data and answers no command.
    public private(set) var silent = false

    public init(_ plan: FaultPlan) {
        self.plan = plan
        self.rng = SeededGenerator(seed: plan.seed)
    }

    /// What becomes of a packet as it arrives.
    public enum PacketFate: Sendable, Hashable {
        /// It arrives as sent.
        case deliver
        /// It arrives with the byte at `index` (counted from the payload's start) XORed with `mask`.
        case corrupt(index: Int, mask: UInt8)
        /// The device's stack drops it (or the device hung).
        case dropped
        /// The link drops now, and the packet with it.
        case disconnect(reason: String)
    }

    /// Decides the fate of a packet of `count` payload bytes that the device places at image
    /// `offset` (nil: not in the image). Offset faults fire once each.
    public mutating func packet(at offset: Int?, count: Int) -> PacketFate {
        if silent { return .dropped }
        let range = offset.map { $0..<($0 + count) }
        if let range, let at = plan.stopAnsweringAt, range.contains(at) {
            silent = true
            return .dropped
        }
        if let range, let i = plan.disconnectAt.firstIndex(where: range.contains) {
            plan.disconnectAt.remove(at: i)
            return .disconnect(reason: "disconnect fault at offset \(range.lowerBound)")
        }
        if rng.chance(plan.dropRate) { return .dropped }
        if let range, let i = plan.corruptAt.firstIndex(where: range.contains) {
            let index = plan.corruptAt[i] - range.lowerBound
            plan.corruptAt.remove(at: i)
            return .corrupt(index: index, mask: 0xA5)
        }
        if count > 0, rng.chance(plan.corruptRate) {
            return .corrupt(index: Int(rng.next() % UInt64(count)), mask: 0x5A)
        }
        return .deliver
    }

    /// Whether the device power-cycles after handling a packet at `offset` (each offset once).
    public mutating func rebootsAfterPacket(at offset: Int?, count: Int) -> Bool {
        guard let offset, let i = plan.rebootAt.firstIndex(where: (offset..<(offset + count)).contains) else { return false }
        plan.rebootAt.remove(at: i)
        return true
    }

    /// Whether a control point write is answered with an ATT error instead of being handled.
    public mutating func refusesCommand() -> Bool {
        rng.chance(plan.gattErrorRate)
    }

    /// Whether a notification the device sends never reaches the central.
    public mutating func losesNotification() -> Bool {
        rng.chance(plan.lostNotificationRate)
    }

    /// Extra time the flash needs for `bytes` bytes.
    public func flashTime(bytes: Int) -> Duration {
        plan.slowFlashPerKiB * bytes / 1024
    }

    /// Whether a connection attempt is refused (a device gone for good).
    public func refusesConnection(after connections: Int) -> Bool {
        plan.refuseConnectionsAfter.map { connections >= $0 } ?? false
    }
}
