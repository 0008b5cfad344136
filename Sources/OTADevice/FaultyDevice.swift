import GATT
import OTAWire

/// An `OTATarget` behind a `FaultPlan`: decides, for each write the device receives, whether a
/// fault fires and what the device then does. The in-process simulator and peripheral mode both
/// run it, so a fault means the same thing on either.
public struct FaultyDevice: Sendable {
    public var target: OTATarget
    public private(set) var faults: FaultPlan
    private var rng: SeededGenerator
    /// The device hung (`FaultPlan.stopAnsweringAt`): it ignores data and answers no command.
    public private(set) var silent = false

    public init(target: OTATarget, faults: FaultPlan) {
        var target = target
        target.flashBitFlipAt = faults.flashBitFlipAt
        self.target = target
        self.faults = faults
        self.rng = SeededGenerator(seed: faults.seed)
    }

    /// What became of a data packet.
    public enum DataOutcome: Sendable, Equatable {
        /// Handled; `notification` (a GAP event) is to be notified unless `nil`.
        case handled(notification: [UInt8]?)
        /// Dropped by the device's stack before the protocol saw it.
        case dropped
        /// The link must drop now; the packet was lost with it.
        case disconnect(reason: String)
        /// The device handled the packet, then power-cycled: the link drops and the device is
        /// away for `FaultPlan.rebootDuration`.
        case reboot(reason: String)
    }

    /// What became of a control point write.
    public enum CommandOutcome: Sendable, Equatable {
        /// Answer the write with an ATT error instead of handling it.
        case attError
        /// Handled: notify `response` unless `notify` is false (a lost notification). After
        /// `activated`, the device reboots into the new image.
        case handled(response: [UInt8], notify: Bool, activated: Bool)
    }

    /// Extra time the flash needs for `bytes` bytes.
    public func flashTime(bytes: Int) -> Duration {
        faults.slowFlashPerKiB * bytes / 1024
    }

    /// Handles a data packet as the faults dictate.
    public mutating func receiveData(_ packet: [UInt8], from central: String? = nil) -> DataOutcome {
        var bytes = packet
        guard let (offset32, payload) = DataPacket.decode(bytes) else { return .handled(notification: target.handleData(bytes, from: central)) }
        let offset = Int(offset32)
        let range = offset..<(offset + payload.count)
        if silent { return .dropped }
        if let at = faults.stopAnsweringAt, range.contains(at) {
            silent = true
            return .dropped
        }
        if let i = faults.disconnectAt.firstIndex(where: range.contains) {
            faults.disconnectAt.remove(at: i)
            return .disconnect(reason: "disconnect fault at offset \(offset)")
        }
        if rng.chance(faults.dropRate) { return .dropped }
        if let i = faults.corruptAt.firstIndex(where: range.contains) {
            bytes[OTAProtocol.dataHeaderSize + faults.corruptAt[i] - offset] ^= 0xA5
            faults.corruptAt.remove(at: i)
        } else if rng.chance(faults.corruptRate) {
            bytes[OTAProtocol.dataHeaderSize + Int(rng.next() % UInt64(range.count))] ^= 0x5A
        }
        var event = target.handleData(bytes, from: central)
        if event != nil, rng.chance(faults.lostNotificationRate) { event = nil }
        if let i = faults.rebootAt.firstIndex(where: range.contains) {
            faults.rebootAt.remove(at: i)
            target.reboot()
            return .reboot(reason: "device rebooted at offset \(offset)")
        }
        return .handled(notification: event)
    }

    /// Handles a control point write as the faults dictate.
    public mutating func receiveCommand(_ bytes: [UInt8], from central: String? = nil) -> CommandOutcome {
        if silent { return .handled(response: [], notify: false, activated: false) }
        if rng.chance(faults.gattErrorRate) { return .attError }
        let response = target.handleControl(bytes, from: central)
        let activated = bytes.first == OTAOpcode.activate.rawValue && response.count >= 3
            && response[2] == OTAStatus.success.rawValue
        return .handled(response: response, notify: !rng.chance(faults.lostNotificationRate), activated: activated)
    }

    /// Whether a connection attempt is refused (a device gone for good).
    public func refusesConnection(after connections: Int) -> Bool {
        faults.refuseConnectionsAfter.map { connections >= $0 } ?? false
    }
}
