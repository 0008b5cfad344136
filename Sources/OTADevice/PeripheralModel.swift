import GATT
import OTAWire

/// A characteristic a device model exposes; the transport gives it a handle.
public struct PeripheralCharacteristic: Sendable, Hashable {
    public var uuid: BluetoothUUID
    public var properties: CharacteristicProperties

    public init(_ uuid: BluetoothUUID, _ properties: CharacteristicProperties) {
        self.uuid = uuid
        self.properties = properties
    }
}

/// A service a device model exposes.
public struct PeripheralService: Sendable, Hashable {
    public var uuid: BluetoothUUID
    public var characteristics: [PeripheralCharacteristic]

    public init(_ uuid: BluetoothUUID, _ characteristics: [PeripheralCharacteristic]) {
        self.uuid = uuid
        self.characteristics = characteristics
    }
}

/// Something a transport must do for a device model at a given time.
public enum PeripheralOutput: Sendable, Hashable {
    /// Notify (or indicate) these bytes on the characteristic, if the central enabled it.
    case notify(BluetoothUUID, [UInt8])
    /// Drop the link to the central that wrote (an injected disconnect).
    case dropLink(reason: String)
    /// Drop every link and stay away until `until`: not advertising, refusing connections.
    /// `injected`: a fault, not a reset the central asked for (an activation, an SMP reset).
    case reboot(until: Duration, reason: String, injected: Bool = true)
    /// Call `wake(_:at:)` with this token then.
    case wake(UInt64)
}

/// An output and when it is due.
public struct PeripheralTimed: Sendable, Hashable {
    public var at: Duration
    public var output: PeripheralOutput

    public init(at: Duration, _ output: PeripheralOutput) {
        self.at = at
        self.output = output
    }
}

/// How a write with response is completed.
public enum PeripheralReply: Sendable, Hashable {
    /// With a write response at `at`.
    case success(at: Duration)
    /// At once, with this ATT error; `what` names the write for the message.
    case failure(ATTError, String)
    /// Not at all: the device is away. The transport drops the link that carried the write.
    case away
}

/// Something a device did that someone watching it wants to know: `otaflash simulate` prints
/// these and stores activated images. Protocol-neutral; each model says it in these terms.
public enum PeripheralReport: Sendable, Hashable {
    /// A transfer of a `size`-byte image began (or resumed at `offset`). `crc`: the image's CRC32,
    /// when the protocol announces one.
    case begin(size: Int, crc: UInt32?, offset: Int)
    /// The device holds `received` of `total` bytes (a host decides how often to show it).
    case progress(received: Int, total: Int)
    /// The whole image checked out (its CRC32 or hash). `crc`: the image's CRC32, when known.
    case verified(crc: UInt32?)
    /// The device activated `image` and boots it; `version` in the protocol's own notation.
    case activated(image: [UInt8], version: String?)
    /// A second central was refused: `owner` holds the transfer in progress.
    case busy(owner: String)
    /// An injected fault fired, or something else worth a line.
    case note(String)
}

/// What a write led to.
public struct PeripheralWriteResult: Sendable, Hashable {
    /// For a write with response: how it completes. Ignored for a write without response.
    public var reply: PeripheralReply
    public var outputs: [PeripheralTimed]
    /// What the write did, for people watching the device.
    public var reports: [PeripheralReport]

    public init(reply: PeripheralReply, outputs: [PeripheralTimed], reports: [PeripheralReport] = []) {
        self.reply = reply
        self.outputs = outputs
        self.reports = reports
    }
}

/// One protocol's device as a transport serves it: its GATT table and its behaviour over
/// injected time (writes in, timed outputs out). The simulator hosts any conformer the same way;
/// `NativePeripheral` is the native protocol's.
///
/// Pure: time comes in as `now`, nothing here sleeps or reads a clock.
public protocol PeripheralModel: Sendable {
    /// The GATT table, in order.
    var services: [PeripheralService] { get }
    /// The services the device advertises.
    var advertisedServices: [BluetoothUUID] { get }
    /// When the device can next be connected to (`.zero` when it never went away).
    var availableAt: Duration { get }
    /// Whether the device is away (rebooting) at `now`: it answers nothing.
    func isAway(at now: Duration) -> Bool
    /// Whether the device refuses every connection after `connections` accepted ones (gone for good).
    func refusesConnection(after connections: Int) -> Bool
    /// The value of a readable characteristic; nil when it cannot be read.
    func read(_ characteristic: BluetoothUUID) -> [UInt8]?
    /// A write reached the device at `now`.
    mutating func write(_ bytes: [UInt8], to characteristic: BluetoothUUID, withResponse: Bool,
                        from central: String?, at now: Duration) -> PeripheralWriteResult
    /// A `.wake` output is due.
    mutating func wake(_ token: UInt64, at now: Duration) -> [PeripheralTimed]
    /// The link to `central` (nil: every link) went down.
    mutating func linkDropped(central: String?)
    /// A short description of a write the device just handled and the state it left, for traces:
    /// "offset 4096 +240, received 4336".
    func describe(_ bytes: [UInt8], to characteristic: BluetoothUUID) -> String

    /// The address the device answers at now; nil: the one it was configured with. A device
    /// whose address changes (a Nordic application that reboots into its bootloader at the
    /// address + 1) answers at one address at a time.
    var currentAddress: DeviceAddress? { get }
    /// The name the device advertises now; nil: the one it was configured with.
    var advertisedName: String? { get }
    /// A central enabled or disabled notifications (or indications) on `characteristic`: the
    /// write to its Client Characteristic Configuration Descriptor.
    mutating func notificationsChanged(_ enabled: Bool, for characteristic: BluetoothUUID)
    /// The ATT MTU of the link a central connected over (or that its writes report): a device
    /// whose answers are longer than one notification splits them at MTU − 3.
    mutating func mtuChanged(_ mtu: Int)
    /// Whether the link the device serves is encrypted with a bond: a device that serves some
    /// requests only to a bonded central (Nordic's buttonless DFU with bonds) decides on it.
    mutating func linkEncrypted(_ encrypted: Bool)
    /// True when each write command to the device says where its bytes go (the native
    /// protocol's packets carry their offset), so one write lost, or replaced by a copy of
    /// another, is found by the protocol and sent again without starting anything over. Peripheral
    /// mode serves such a device's write-command characteristics through BlueZ's AcquireWrite,
    /// whose first writes may arrive as copies of a later one (scripts/bluez-vm/README.md, "Pitfalls").
    var writesCarryTheirPlace: Bool { get }
    /// Whether a second implementation of the device runs beside the model in lockstep and
    /// must answer alike (the native device's C library).
    var runsLockstep: Bool { get }
    /// With `runsLockstep`: the first point where the two answered differently (nil: none).
    var lockstepDivergence: String? { get }
}

extension PeripheralModel {
    public func isAway(at now: Duration) -> Bool { availableAt > now }
    public func describe(_ bytes: [UInt8], to characteristic: BluetoothUUID) -> String { "\(bytes.count) B" }
    public var currentAddress: DeviceAddress? { nil }
    public var advertisedName: String? { nil }
    public mutating func notificationsChanged(_ enabled: Bool, for characteristic: BluetoothUUID) {}
    public mutating func mtuChanged(_ mtu: Int) {}
    public mutating func linkEncrypted(_ encrypted: Bool) {}
    public var writesCarryTheirPlace: Bool { false }
    public var runsLockstep: Bool { false }
    public var lockstepDivergence: String? { nil }
}
