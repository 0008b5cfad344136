import Foundation
import GATT
import Logging
import OTAWire

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
