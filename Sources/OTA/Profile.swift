import GATT
import OTAWire

// The contracts between the shared session (supervisor, journal, batch, progress, events) and one
// protocol. A protocol brings a profile (how to find and check its service, how to build its
// engine) and a pure engine; `OTASession` drives any of them the same way. docs/ARCHITECTURE.md,
// "Adding a protocol".

/// Where a transfer stands, in terms every protocol shares. The session watches it: the stall
/// budget is spent only while `beginning` or `streaming`; the progress events start with
/// `streaming`; `verifying` and `activating` each have a deadline of their own.
public enum TransferPhase: String, Sendable, Hashable {
    case idle, beginning, streaming, verifying, activating, done, failed
}

/// Counters for reports, the soak and benchmarks. The byte, packet and resume figures are kept by
/// `ResendTally` the same way for every engine; the others by each engine.
public struct TransferStats: Sendable, Hashable {
    /// Image bytes put on the data characteristic, resends included.
    public var bytesSent = 0
    /// Bytes put on the link again at offsets this run had sent before, or the device reported
    /// holding: after a rewind, resume or restart.
    public var bytesResent = 0
    public var packets = 0
    /// Points at which the device confirmed what it holds (checkpoints, receipts, checksums).
    public var checkpoints = 0
    public var rewinds = 0
    public var rollbacks = 0
    public var restarts = 0
    public var commandRetries = 0
    /// The device's offset each time it said where the transfer stands on a connection.
    public var resumedFrom: [Int] = []
    /// Bytes re-sent on each connection, first connection first: after a resume, what the
    /// device had lost (at most one checkpoint window).
    public var resentPerConnection: [Int] = []
    /// For each resume (a connection after the first, where the device said where it stands):
    /// the bytes it had to send again, from where streaming restarted up to where the engine
    /// stood when the link was lost.
    public var resumeResends: [Int] = []
    /// Connections used (1 + reconnects).
    public var connections: Int { resentPerConnection.count }

    public init() {}
}

/// The resend figures of `TransferStats`, counted the same way for every engine: the engine says
/// when a connection begins (and where its stream stood then), where the device resumed and what
/// it streams; the tally works out what went on the link again. An engine keeps one and adds its own
/// counters (checkpoints, rewinds…) to `stats`.
public struct ResendTally: Sendable, Hashable {
    public var stats = TransferStats()
    /// The highest image offset ever streamed, or that the device reported holding.
    public var highWater: Int { mark }
    @usableFromInline var mark = 0
    /// On a connection after the first, where the stream stood before it, until the device says
    /// where it resumes; then `measuringFrom` until the first packet measures what the resume
    /// sends again.
    private var lossMark: Int?
    @usableFromInline var measuringFrom: Int?
    /// The same for bytes a protocol sends ahead of the image (Secure DFU's init packet): counted in
    /// `bytesSent` and `bytesResent`, never in the image's offsets.
    private var preambleHighWater = 0

    public init() {}

    /// A connection begins with the engine's stream at `position` (where it stood when the last
    /// connection ended): its resends are counted apart, and on a reconnect the next resume is
    /// measured against `position`.
    public mutating func connectionBegan(streamAt position: Int) {
        stats.resentPerConnection.append(0)
        lossMark = stats.connections > 1 ? position : nil
        measuringFrom = nil
    }

    /// The device holds the image up to `offset` on this connection: the resume point. The next
    /// packet streamed measures the resume.
    public mutating func resumed(from offset: Int) {
        stats.resumedFrom.append(offset)
        // What the device holds was sent before (by this run or an earlier one): sending it
        // again is a resend.
        mark = max(mark, offset)
        if let lossMark {
            measuringFrom = lossMark
            self.lossMark = nil
        }
    }

    /// The device lost what it held and the transfer starts over: not a resume to measure.
    public mutating func startedOver() {
        lossMark = nil
        measuringFrom = nil
    }

    /// `count` image bytes from `offset` go on the link. Called per packet, so inlined into each
    /// protocol's engine.
    @inlinable
    public mutating func streamed(offset: Int, count: Int) {
        if let from = measuringFrom {
            measuringFrom = nil
            stats.resumeResends.append(max(0, from - offset))
        }
        if offset < mark { countResent(min(count, mark - offset)) }
        mark = max(mark, offset + count)
        stats.bytesSent += count
        stats.packets += 1
    }

    /// `count` bytes of what a protocol sends ahead of the image go on the link, from `offset` in it.
    public mutating func streamedPreamble(offset: Int, count: Int) {
        if offset < preambleHighWater { countResent(min(count, preambleHighWater - offset)) }
        preambleHighWater = max(preambleHighWater, offset + count)
        stats.bytesSent += count
        stats.packets += 1
    }

    @usableFromInline
    mutating func countResent(_ bytes: Int) {
        stats.bytesResent += bytes
        if !stats.resentPerConnection.isEmpty { stats.resentPerConnection[stats.resentPerConnection.count - 1] += bytes }
    }
}

/// What a transfer may do and how long it waits, the same for every protocol. A protocol's own
/// settings (the native checkpoint interval, Secure DFU's receipts, SMP's window) are its profile's.
public struct EngineConfig: Sendable, Hashable {
    /// Activate the image once the device checked it.
    public var activate: Bool
    /// Ignore a partial transfer the device holds and start from zero.
    public var restart: Bool
    /// How often a command is sent again after an ATT error or a lost reply.
    public var commandRetries: Int
    /// How often in a row the engine may fall back (rewind, roll back, restart) without the device
    /// confirming new data before it gives up.
    public var maxRecoveries: Int
    public var replyTimeout: Duration
    public var verifyTimeout: Duration
    public var activateTimeout: Duration
    /// Leave a device alone when it already runs this version.
    public var skipIfVersion: FirmwareVersion?

    public init(activate: Bool = true, restart: Bool = false, commandRetries: Int = 3, maxRecoveries: Int = 64,
                replyTimeout: Duration = .seconds(5), verifyTimeout: Duration = .seconds(30),
                activateTimeout: Duration = .seconds(10), skipIfVersion: FirmwareVersion? = nil) {
        self.activate = activate
        self.restart = restart
        self.commandRetries = commandRetries
        self.maxRecoveries = maxRecoveries
        self.replyTimeout = replyTimeout
        self.verifyTimeout = verifyTimeout
        self.activateTimeout = activateTimeout
        self.skipIfVersion = skipIfVersion
    }
}

/// The part a characteristic plays in a protocol. An open set: a protocol may name its own.
public struct CharacteristicRole: Hashable, Sendable, CustomStringConvertible {
    public let name: String
    public init(_ name: String) { self.name = name }
    public var description: String { name }

    /// Where commands are written and their replies notified.
    public static let control = CharacteristicRole("control")
    /// Where image data is streamed with write without response.
    public static let data = CharacteristicRole("data")
}

/// Bytes an engine wants written to the characteristic that plays `role`.
public struct TransferWrite: Sendable, Hashable {
    public var role: CharacteristicRole
    public var bytes: [UInt8]
    /// True: a write request, whose failure comes back as `TransferEvent.commandFailed`.
    public var withResponse: Bool

    public init(_ bytes: [UInt8], to role: CharacteristicRole = .control, withResponse: Bool = true) {
        self.role = role
        self.bytes = bytes
        self.withResponse = withResponse
    }
}

/// What happens to an engine: the session turns transport events into these.
public enum TransferEvent<Peer: Sendable>: Sendable {
    /// Connected, characteristics checked, the device's state read: (re)start the protocol.
    case connected(Peer, mtu: Int)
    /// A notification or indication from the characteristic playing `role`.
    case notification(CharacteristicRole, [UInt8])
    /// The write with response in flight failed.
    case commandFailed(GATTError)
    /// Nothing arrived within `currentTimeout`.
    case timeout
    case disconnected(DisconnectReason)
}

/// What an engine asks the session to do after an event.
public enum TransferAction: Sendable, Hashable {
    case write(TransferWrite)
    /// The transfer is over: the image was checked and, if configured, activated.
    case finished
    case failed(OTAError)
}

/// What an engine sends next while streaming.
public enum TransferStep: Sendable, Hashable {
    /// Write `dataPacket(offset:count:)` to the `.data` characteristic without response.
    case data(offset: Int, count: Int)
    /// Write this now (a checkpoint or receipt request), then go on streaming.
    case write(TransferWrite)
    /// Nothing to send until an event arrives.
    case idle
}

/// The central side of one protocol as a pure state machine: events in, actions out, no I/O and
/// no clock, so its tests need no transport. `OTASession` drives it; the properties below are
/// what the shared supervisor, journal and progress read.
public protocol TransferEngine: Sendable {
    /// What the engine learns of the device on each connection (the profile reads it).
    associatedtype Peer: Sendable

    var phase: TransferPhase { get }
    /// The phase the engine was in when it failed.
    var failedIn: TransferPhase? { get }
    /// How long to wait for the reply to the command in flight.
    var currentTimeout: Duration { get }
    /// Whether the engine waits for the device: a command's reply, or a receipt it asked for.
    /// An engine that has nothing to send and waits for nothing is stalled (a bug).
    var isAwaitingReply: Bool { get }
    /// Next image offset to send.
    var sent: Int { get }
    /// Where this connection's transfer started, for the `transfer` event: where the device's
    /// data ended when streaming began (the default: `sent` then).
    var resumeOffset: Int { get }
    /// The last offset the device confirmed, and the CRC32 of the image up to it (journaled).
    var acked: Int { get }
    var ackedCRC: UInt32 { get }
    /// The highest offset ever sent, or that the device reported holding.
    var highWater: Int { get }
    /// The furthest position the device reported with a CRC that matched the image: what the
    /// session's stall budget watches.
    var furthestAgreed: Int { get }
    /// Whether the transfer ends only on the next connection: the device reset and what it runs
    /// then says how it went (SMP: MCUboot swapped the image in, or refused it). The session
    /// connects once more for it even when reconnecting after link losses is off.
    var awaitsNextConnection: Bool { get }
    /// Image bytes per data packet on the current connection.
    var chunkSize: Int { get }
    var stats: TransferStats { get }
    /// What the engine has to tell the user about how it now works (SMP: falling back to one
    /// request in flight), oldest first; the session reports each once, as a `notice` event.
    var notes: [String] { get }

    /// The session's clock, before each event it hands over (an engine that times the link uses
    /// it; the others ignore it).
    mutating func observe(time: Duration)
    /// Takes a confirmed position from the journal: only a shortcut for later CRC checks.
    mutating func seed(confirmedOffset: Int, crc: UInt32)
    mutating func handle(_ event: TransferEvent<Peer>) -> [TransferAction]
    /// The next thing to send while streaming. Called repeatedly until `.idle`.
    mutating func nextStreamStep() -> TransferStep
    /// The bytes of the data packet carrying `image[offset..<offset+count]`.
    func dataPacket(offset: Int, count: Int) -> [UInt8]
}

/// What a profile says about a device it attached to, for the `device_info` event.
public struct DeviceSummary: Sendable, Hashable {
    /// The profile's name: "native".
    public var protocolName: String
    /// The protocol version the device speaks, where the protocol has one.
    public var protocolVersion: Int?
    /// The version the device runs now, when the protocol tells it.
    public var firmwareVersion: FirmwareVersion?
    /// Where the device's transfer stands, in terms every protocol shares.
    public var state: State
    /// The same in the protocol's words, with what else it told: "slot 0 1.0.0 active confirmed;
    /// 4 × 384 B buffers".
    public var stateText: String
    /// The largest image the device takes, when it says.
    public var slotSize: Int?

    /// Where a device's transfer stands when a session attaches to it (`device_info`'s `state`).
    public enum State: String, CaseIterable, Sendable, Hashable {
        /// It holds no part of an image and takes a new one.
        case idle
        /// It holds part of an image, from an earlier transfer.
        case receiving
        /// It holds a whole image it checked, not yet activated.
        case verified
        /// It runs a bootloader that says where a transfer stands only once one begins (Secure DFU).
        case bootloader
        /// It reports a state this otaflash does not know (`stateText` says which).
        case unknown
    }

    /// - Parameter stateText: nil: the state's name.
    public init(protocolName: String, protocolVersion: Int? = nil, firmwareVersion: FirmwareVersion? = nil,
                state: State, stateText: String? = nil, slotSize: Int? = nil) {
        self.protocolName = protocolName
        self.protocolVersion = protocolVersion
        self.firmwareVersion = firmwareVersion
        self.state = state
        self.stateText = stateText ?? state.rawValue
        self.slotSize = slotSize
    }
}

/// A connection a profile has checked and prepared (notifications enabled, state read).
public struct AttachedLink<Peer: Sendable>: Sendable {
    /// The characteristics by the role they play.
    public var characteristics: [CharacteristicRole: GATTCharacteristic]
    /// What the engine needs on `.connected`.
    public var peer: Peer
    public var summary: DeviceSummary

    public init(characteristics: [CharacteristicRole: GATTCharacteristic], peer: Peer, summary: DeviceSummary) {
        self.characteristics = characteristics
        self.peer = peer
        self.summary = summary
    }

    /// The version the device runs (compared with `--skip-if-version`).
    public var firmwareVersion: FirmwareVersion? { summary.firmwareVersion }
}

/// One protocol as the session sees it: its service, how to attach to a device, and its engine.
public protocol OTAProfile: Sendable {
    associatedtype Engine: TransferEngine

    /// The name `--protocol` takes: "native".
    var name: String { get }
    /// The service a device running this protocol exposes (and usually advertises).
    var serviceUUID: BluetoothUUID { get }
    /// The image formats this protocol sends (`--protocol auto` picks from them).
    var imageFormats: Set<ImageFormat.Kind> { get }
    /// What to do with an image of another format when this protocol is asked for by name (nil:
    /// the general advice).
    var otherFormatHint: String? { get }
    /// How the device checks the whole image before it may activate it, for the line that says
    /// so: "computes the CRC32 of the whole image".
    var imageCheck: String { get }
    /// Whether a device of this protocol tells the version it runs once it came back from an
    /// update (a batch reads it back); false: do not connect again to ask.
    var reportsFirmwareVersion: Bool { get }
    /// Whether a single-device run, too, reconnects after activation to report what the device
    /// runs (SMP: MCUboot swaps the image in at the reset, or reverts it).
    var readsBackAfterActivation: Bool { get }
    /// Whether a transfer that stopped (an interruption, a lost link) resumes where it stopped
    /// when the same command runs again; false: the device must be reset first, and the whole
    /// image goes again.
    var resumesTransfer: Bool { get }

    /// Finds the protocol's service on `connection`, checks its characteristics (naming what is
    /// missing), enables notifications and reads the device's state.
    ///
    /// - Parameters:
    ///   - device: the device's name in messages.
    ///   - discoveryTimeout: the limit on finding the service.
    /// - Throws: `OTAError` with a one-line message.
    func attach(to connection: any GATTConnection, device: String,
                discoveryTimeout: Duration) async throws(OTAError) -> AttachedLink<Engine.Peer>
    /// Image bytes per data packet at ATT MTU `mtu`.
    func chunkSize(mtu: Int) -> Int
    func makeEngine(image: FirmwareImage, config: EngineConfig) -> Engine

    /// Moves a device that runs its application into the mode this protocol updates it in, when
    /// it has to be moved first (a Nordic application with the buttonless service reboots into
    /// its bootloader, at another address); nil when the device is ready as it is. Called once,
    /// before the sessions, on a connection whose `services` were discovered. After an entry
    /// the link is gone and the sessions go to the entry's address.
    ///
    /// - Throws: `OTAError` with a one-line message when the device refuses or cannot be moved.
    func enterUpdateMode(on connection: any GATTConnection, services: [GATTService], device: DeviceAddress,
                         limits: UpdateModeLimits) async throws(OTAError) -> UpdateModeEntry?

    /// After the answer to the command that activates the image was lost
    /// (`OTAError.Code.notConfirmed`): whether the device, reached where it runs its application
    /// (`services` discovered there), shows that it activated the image. False: it cannot tell
    /// (the default).
    func confirmsActivation(on connection: any GATTConnection, services: [GATTService]) async -> Bool

    /// Runs `session` with this profile's concrete types, so that per data packet the session
    /// calls the engine directly rather than through an existential. The default implementation
    /// is the only right one.
    func run(_ session: OTASession, events: @escaping @Sendable (SessionEvent) -> Void) async throws(OTAError) -> OTAResult
}

extension TransferEngine {
    public var resumeOffset: Int { sent }
    public var notes: [String] { [] }
    public var awaitsNextConnection: Bool { false }
    public mutating func observe(time: Duration) {}
}

extension OTAProfile {
    public var imageCheck: String { "checks the whole image" }
    public var otherFormatHint: String? { nil }
    public var reportsFirmwareVersion: Bool { true }
    public var readsBackAfterActivation: Bool { false }
    public var resumesTransfer: Bool { true }
    public func confirmsActivation(on connection: any GATTConnection, services: [GATTService]) async -> Bool { false }
    /// A device of this protocol is always ready as it is.
    public func enterUpdateMode(on connection: any GATTConnection, services: [GATTService], device: DeviceAddress,
                                limits: UpdateModeLimits) async throws(OTAError) -> UpdateModeEntry? {
        nil
    }

    public func run(_ session: OTASession, events: @escaping @Sendable (SessionEvent) -> Void) async throws(OTAError) -> OTAResult {
        try await session.run(self, events: events)
    }
}

extension OTAProfile {
    /// Attaches to a connected device and returns what it reports (the version it runs, when the
    /// protocol tells): how a device is read back after its update.
    public func summary(on connection: any GATTConnection, device: String,
                        discoveryTimeout: Duration) async throws(OTAError) -> DeviceSummary {
        try await attach(to: connection, device: device, discoveryTimeout: discoveryTimeout).summary
    }
}

/// The limits on moving a device into its update mode (`OTAProfile.enterUpdateMode`).
public struct UpdateModeLimits: Sendable, Hashable {
    /// For the device's answer to each request.
    public var reply: Duration
    /// For the device to drop the link once it accepted.
    public var disconnect: Duration

    public init(reply: Duration, disconnect: Duration) {
        self.reply = reply
        self.disconnect = disconnect
    }
}

/// Where a device answers once a profile moved it into its update mode.
public struct UpdateModeEntry: Sendable, Hashable {
    /// The address the device runs its application at.
    public var application: DeviceAddress
    /// The address it answers at in its update mode (a Nordic bootloader's).
    public var address: DeviceAddress
    /// The name it advertises there, to find it by when nothing answers at `address` (nil: none).
    public var name: String?
    /// What the device was moved into and how, for a note: "its bootloader, through buttonless DFU".
    public var mode: String

    public init(application: DeviceAddress, address: DeviceAddress, name: String?, mode: String) {
        self.application = application
        self.address = address
        self.name = name
        self.mode = mode
    }
}

extension GATTCentral {
    /// Connects to a device in its update mode: at the entry's address, or, when nothing answers
    /// there and the device was given a name to advertise, to the device advertising it. Within
    /// `timeout` in all: with a name, half of it goes to the address, the rest to the scan and
    /// the connection to what it finds.
    public func connect(to entry: UpdateModeEntry, timeout: Duration) async throws(GATTError) -> any GATTConnection {
        let deadline = clock.now + timeout
        let missed: GATTError
        do {
            return try await connect(to: entry.address, timeout: entry.name == nil ? timeout : timeout / 2)
        } catch let error where error.code == .deviceNotFound || error.code == .connectFailed {
            missed = error
        }
        guard let name = entry.name else { throw missed }
        let scanFor = max(.milliseconds(1), (deadline - clock.now) / 2)
        let found = try await scan(filter: ScanFilter(namePrefix: name), timeout: scanFor).first { $0.name == name }
        guard let found else {
            throw GATTError(missed.code, "\(missed.message); nor did a device advertising '\(name)' appear within \(scanFor.secondsText)")
        }
        return try await connect(to: found.address, timeout: max(.milliseconds(1), deadline - clock.now))
    }
}
