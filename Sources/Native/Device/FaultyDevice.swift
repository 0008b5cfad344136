import GATT
import OTADevice
import OTAWire

/// An `OTATarget` behind a `FaultPlan`: decides, for each write the device receives, whether a
/// fault fires and what the device then does. The in-process simulator and peripheral mode both
/// run it, so a fault means the same thing on either.
public struct FaultyDevice: Sendable {
    public var target: OTATarget
    private var injector: FaultInjector
    public var faults: FaultPlan { injector.plan }
    /// The device hung (`FaultPlan.stopAnsweringAt`): it ignores data and answers no command.
    public var silent: Bool { injector.silent }

    public init(target: OTATarget, faults: FaultPlan) {
        var target = target
        target.flashBitFlipAt = faults.flashBitFlipAt
        self.target = target
        self.injector = FaultInjector(faults)
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
        injector.flashTime(bytes: bytes)
    }

    /// Handles a data packet as the faults dictate.
    public mutating func receiveData(_ packet: [UInt8], from central: String? = nil) -> DataOutcome {
        var bytes = packet
        guard let (offset32, payload) = DataPacket.decode(bytes) else { return .handled(notification: target.handleData(bytes, from: central)) }
        let offset = Int(offset32)
        switch injector.packet(at: offset, count: payload.count) {
        case .dropped: return .dropped
        case .disconnect(let reason): return .disconnect(reason: reason)
        case .corrupt(let index, let mask): bytes[OTAProtocol.dataHeaderSize + index] ^= mask
        case .deliver: break
        }
        var event = target.handleData(bytes, from: central)
        if event != nil, injector.losesNotification() { event = nil }
        if injector.rebootsAfterPacket(at: offset, count: payload.count) {
            target.reboot()
            return .reboot(reason: "device rebooted at offset \(offset)")
        }
        return .handled(notification: event)
    }

    /// Handles a control point write as the faults dictate.
    public mutating func receiveCommand(_ bytes: [UInt8], from central: String? = nil) -> CommandOutcome {
        if silent { return .handled(response: [], notify: false, activated: false) }
        if injector.refusesCommand() { return .attError }
        let response = target.handleControl(bytes, from: central)
        let activated = bytes.first == OTAOpcode.activate.rawValue && response.count >= 3
            && response[2] == OTAStatus.success.rawValue
        // `--sim-lose-final-answer`: the ACTIVATE reply is lost as the device reboots into the image.
        if activated, injector.plan.loseFinalAnswer { return .handled(response: response, notify: false, activated: true) }
        return .handled(response: response, notify: !injector.losesNotification(), activated: activated)
    }

    /// Whether a connection attempt is refused (a device gone for good).
    public func refusesConnection(after connections: Int) -> Bool {
        injector.refusesConnection(after: connections)
    }
}
