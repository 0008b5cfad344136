import GATT
import OTADevice
import OTAWire
import Synchronization

/// A central's link to a `SimulatedDevice`, timed by a `LinkModel`.
///
/// A discrete-event model driven by the central: every call first runs the connection events
/// that are due at the clock's `now`, then acts. When the central must wait (a full transmit
/// queue, a write response, the next event), the connection computes when the awaited thing can
/// happen and sleeps on the clock until then: on a `VirtualClock` that is a jump, so a test or
/// benchmark runs at CPU speed and still sees the model's timing; on a `SystemClock` it is real.
/// One session drives one connection, so nothing else can happen while it waits.
public final class SimulatedConnection: GATTConnection {
    public let peer: String
    public let clock: any MonotonicClock
    let device: SimulatedDevice
    let model: LinkModel
    /// The device's GATT table as this connection discovered it.
    let services: [GATTService]
    private let link: Mutex<Link>

    init(device: SimulatedDevice, clock: any MonotonicClock) {
        self.device = device
        (self.peer, self.services) = device.state.withLock { s in
            ((s.model.currentAddress ?? device.config.address).description, s.currentTable())
        }
        self.clock = clock
        self.model = device.config.link
        // The device's model learns of a bond at once (a bonded Nordic buttonless service); the
        // link itself starts unencrypted and is encrypted with the bond when the device first
        // refuses for want of it (`secure`).
        device.state.withLock { s in s.model.linkEncrypted(s.bond > .none) }
        let link = Link(anchor: clock.now, model: device.config.link)
        self.link = Mutex(link)
    }

    /// The device's permission check of a protected attribute (a read, a CCCD write, a write
    /// request), as embedded stacks make it (NimBLE `ble_att_svr_check_perms`, Zephyr
    /// `bt_gatt_check_perm`), and what the central's stack does about a refusal:
    /// - the central holds a bond but the link is not encrypted yet: insufficient encryption
    ///   (0x0F); the central's stack encrypts the link with its bond and asks again (BlueZ raises
    ///   the security level, src/shared/att.c `change_security`);
    /// - no bond, or one too weak: insufficient authentication (0x05). The central's stack starts
    ///   pairing by itself; nobody answers it (the user did not ask for pairing), so it is
    ///   abandoned: recorded as `stackPairing` and queued as `GATTEvent.stackPairing`.
    private func secure(_ l: inout Link, at now: Duration, _ operation: @autoclosure () -> String) throws(GATTError) {
        let required = device.config.security
        guard l.encryption < required else { return }
        let bond = device.state.withLock { $0.bond }
        if l.encryption == .none, bond > .none {
            l.refusals.append(.insufficientEncryption)
            l.encryption = bond
            if bond >= required { return }
        }
        l.refusals.append(.insufficientAuthentication)
        if l.stackPairing == nil {
            let asked: StackPairing.Question? = required == .authenticate ? (device.config.passkey != nil ? .passkey : .confirmation) : nil
            let attempt = StackPairing(bonded: false, asked: asked)
            l.stackPairing = attempt
            l.inbox.append((now, .stackPairing(attempt)))
        }
        let want = required == .authenticate ? "an authenticated (passkey or numeric comparison) bond" : "an encrypted link (a bond)"
        throw GATTError(.notAuthorized, "\(operation()) was refused (ATT insufficient authentication): the device requires \(want)",
                        attError: .insufficientAuthentication)
    }

    /// Whether the device takes a write command: on a link weaker than it requires, it drops
    /// the command without an answer (ATT has none for a command: NimBLE's `ble_att_svr_rx_write_no_rsp`
    /// discards it), and the central's stack learns nothing.
    private func takesCommand(_ l: inout Link) -> Bool {
        guard l.encryption < device.config.security else { return true }
        l.droppedCommands += 1
        return false
    }

    /// The ATT refusals the device answered on this link, in order (for tests).
    public var attRefusals: [ATTError] { link.withLock { $0.refusals } }
    /// Write commands the device dropped for want of security (for tests).
    public var droppedCommands: Int { link.withLock { $0.droppedCommands } }
    public var stackPairing: StackPairing? { link.withLock { $0.stackPairing } }

    /// One transmit queue carries requests and commands alike, in the order they were written.
    public var keepsWriteOrder: Bool { true }

    public func discoverServices() async throws(GATTError) -> [GATTService] {
        try await roundTrips(3)
        return services
    }

    public func mtu() async throws(GATTError) -> Int {
        try link.withLock { l throws(GATTError) in try l.requireUp(at: clock.now) }
        return model.mtu
    }

    public func transportRead(_ characteristic: GATTCharacteristic) async throws(GATTError) -> [UInt8] {
        try await roundTrips(1)
        try link.withLock { l throws(GATTError) in try secure(&l, at: clock.now, "reading \(characteristic.uuid)") }
        guard let uuid = services.characteristic(id: characteristic.id)?.uuid,
              let value = device.state.withLock({ $0.model.read(uuid) }) else {
            throw .att(.readNotPermitted, "reading \(characteristic.uuid)")
        }
        return value
    }

    public func transportSetNotifications(_ enabled: Bool, for characteristic: GATTCharacteristic) async throws(GATTError) {
        try await roundTrips(1)
        try link.withLock { l throws(GATTError) in try secure(&l, at: clock.now, "enabling notifications on \(characteristic.uuid)") }
        link.withLock { l in
            l.notifying[characteristic.uuid] = enabled ? characteristic.id : nil
        }
        if let uuid = services.characteristic(id: characteristic.id)?.uuid {
            device.state.withLock { $0.model.notificationsChanged(enabled, for: uuid) }
        }
    }

    public func transportWrite(_ value: [UInt8], to characteristic: GATTCharacteristic, type: WriteType) async throws(GATTError) {
        switch type {
        case .withoutResponse:
            try await waitUntil { l, now throws(GATTError) in
                try l.requireUp(at: now)
                guard takesCommand(&l) else { return .done }
                guard l.model.timed else {
                    l.enqueue(.command(characteristic.uuid, value), device: device, now: now)
                    return .done
                }
                if l.forward.count - l.forwardHead < l.model.txQueueDepth {
                    l.enqueue(.command(characteristic.uuid, value), device: device, now: now)
                    return .done
                }
                return .wait(l.nextSendTime)
            }
        case .withResponse:
            let ticket = try link.withLock { l throws(GATTError) in
                try submit(&l, value, characteristic, blocking: true)
            }
            try await waitUntil { l, now throws(GATTError) in
                if let result = l.blockingResults.removeValue(forKey: ticket) {
                    if let error = result { throw error }
                    return .done
                }
                try l.requireUp(at: now)
                // Notifications that came meanwhile wait in the inbox for the session's next event.
                return .wait(l.nextWakeTime(limit: nil, eventsDueBy: now))
            }
        }
    }

    public func transportTryWriteWithoutResponse(_ value: [UInt8], to characteristic: GATTCharacteristic) throws(GATTError) -> Bool {
        try link.withLock { l throws(GATTError) in
            let now = clock.now
            l.run(until: now, device: device)
            try l.requireUp(at: now)
            guard takesCommand(&l) else { return true }
            guard !l.model.timed || l.forward.count - l.forwardHead < l.model.txQueueDepth else { return false }
            l.enqueue(.command(characteristic.uuid, value), device: device, now: now)
            return true
        }
    }

    public func transportSubmitWrite(_ value: [UInt8], to characteristic: GATTCharacteristic) throws(GATTError) -> WriteTicket {
        try link.withLock { l throws(GATTError) in try submit(&l, value, characteristic, blocking: false) }
    }

    private func submit(_ l: inout Link, _ value: [UInt8], _ c: GATTCharacteristic, blocking: Bool) throws(GATTError) -> WriteTicket {
        let now = clock.now
        l.run(until: now, device: device)
        try l.requireUp(at: now)
        try secure(&l, at: now, "writing \(c.uuid)")
        l.nextTicket += 1
        let ticket = WriteTicket(l.nextTicket)
        l.outstanding.insert(ticket)
        if blocking { l.blocking.insert(ticket) }
        l.enqueue(.request(c.uuid, value, ticket), device: device, now: now)
        return ticket
    }

    public func nextEvent(timeout: Duration) async -> GATTEvent? {
        let deadline = clock.now + timeout
        var event: GATTEvent?
        do {
            try await waitUntil { l, now in
                if let e = l.popEvent(at: now) {
                    event = e
                    return .done
                }
                if now >= deadline { return .done }
                return .wait(l.nextWakeTime(limit: deadline))
            }
        } catch {
            return nil
        }
        return event
    }

    public func pollEvent() -> GATTEvent? {
        link.withLock { l in
            let now = clock.now
            l.run(until: now, device: device)
            return l.popEvent(at: now)
        }
    }

    public func disconnect() async {
        link.withLock { l in
            let now = clock.now
            l.run(until: now, device: device)
            l.drop(at: now, reason: .local, noticeAfter: .zero, device: device)
        }
    }

    // MARK: - Waiting

    enum Step {
        case done
        case wait(Duration)
    }

    /// Runs due events, asks `check` whether to stop, and otherwise sleeps until the time it names.
    private func waitUntil(_ check: (inout Link, Duration) throws(GATTError) -> Step) async throws(GATTError) {
        while true {
            let step = try link.withLock { l throws(GATTError) -> Step in
                let now = clock.now
                l.run(until: now, device: device)
                return try check(&l, now)
            }
            guard case .wait(let wake) = step else { return }
            do {
                try await clock.sleep(until: wake)
            } catch {
                throw GATTError(.failed, "cancelled while waiting on \(peer)")
            }
        }
    }

    /// A request/response exchange on the link (read, discovery, CCCD write): about two
    /// connection intervals each.
    private func roundTrips(_ n: Int) async throws(GATTError) {
        try link.withLock { l throws(GATTError) in
            l.run(until: clock.now, device: device)
            try l.requireUp(at: clock.now)
        }
        guard model.timed else { return }
        do {
            try await clock.sleep(for: model.connectionInterval * (2 * n))
        } catch {
            throw GATTError(.failed, "cancelled while waiting on \(peer)")
        }
        // A request on a link that went down is never answered: it fails once the central
        // notices the loss, as a connection error.
        try await waitUntil { l, now throws(GATTError) in
            try l.requireUp(at: now)
            guard !l.up, let noticed = l.downNoticedAt else { return .done }
            return .wait(noticed)
        }
    }
}

/// The link's state: queues in both directions, the central's inbox, and whether it is up.
struct Link {
    let anchor: Duration
    let model: LinkModel
    private let ci: Duration

    /// Central to peripheral, in order; `forwardHead` is the first not yet fully sent.
    var forward: [Forward] = []
    var forwardHead = 0
    var headFragmentsSent = 0
    /// Peripheral to central, in generation order.
    var reverse: [Reverse] = []
    var reverseHead = 0
    /// What the central will see, with the time it sees it.
    var inbox: [(time: Duration, event: GATTEvent)] = []
    var inboxHead = 0

    var nextEvent = 0
    var eventOpen = false
    var eventUsed = 0.0
    var eventPackets = 0
    var up = true
    /// When the central learns that the link is down (after the supervision timeout).
    var downNoticedAt: Duration?
    var downReason = ""
    var deviceBusyUntil: Duration = .zero
    /// The characteristics the central enabled notifications on: their handles by UUID.
    var notifying: [BluetoothUUID: String] = [:]
    var nextTicket: UInt64 = 0
    var outstanding: Set<WriteTicket> = []
    var blocking: Set<WriteTicket> = []
    var blockingResults: [WriteTicket: GATTError?] = [:]
    /// How the link is encrypted: by pairing, or by the central re-encrypting with its bond.
    var encryption: LinkSecurity = .none
    /// The device's ATT refusals for want of security, in order.
    var refusals: [ATTError] = []
    var droppedCommands = 0
    /// The pairing the central's stack started by itself after a refusal.
    var stackPairing: StackPairing?

    enum Forward {
        /// A write without response to the characteristic with this UUID.
        case command(BluetoothUUID, [UInt8])
        /// A write with response, answered with a completion of `WriteTicket`.
        case request(BluetoothUUID, [UInt8], WriteTicket)

        var bytes: [UInt8] {
            switch self {
            case .command(_, let b), .request(_, let b, _): b
            }
        }
    }

    struct Reverse {
        var time: Duration
        var event: GATTEvent
        var size: Int
    }

    init(anchor: Duration, model: LinkModel) {
        self.anchor = anchor
        self.model = model
        self.ci = model.connectionInterval
    }

    var nextEventTime: Duration { anchor + ci * nextEvent }

    func requireUp(at now: Duration) throws(GATTError) {
        if let noticed = downNoticedAt, now >= noticed {
            throw GATTError(.notConnected, "not connected: \(downReason)")
        }
    }

    /// When something the central waits for can next happen: the next connection event if
    /// anything is queued, else the next inbox entry, else `limit`.
    /// - Parameter due: for a wait that does not take events (a write's response): events in the
    ///   inbox by then are left for `nextEvent`, and only a later one is a reason to wake.
    func nextWakeTime(limit: Duration?, eventsDueBy due: Duration? = nil) -> Duration {
        var wake = limit ?? .seconds(1 << 40)
        if let next = inbox[inboxHead...].first(where: { entry in due.map { entry.time > $0 } ?? true }) { wake = min(wake, next.time) }
        if up, forwardHead < forward.count || reverseHead < reverse.count {
            wake = min(wake, nextSendTime)
        }
        if let noticed = downNoticedAt { wake = min(wake, noticed) }
        if let boot = scheduledDrop?.at { wake = min(wake, boot) }
        if up, let held = wakes.first?.at { wake = min(wake, held) }
        return wake
    }

    mutating func popEvent(at now: Duration) -> GATTEvent? {
        guard inboxHead < inbox.count, inbox[inboxHead].time <= now else { return nil }
        defer {
            inboxHead += 1
            if inboxHead > 256, inboxHead * 2 > inbox.count {
                inbox.removeFirst(inboxHead)
                inboxHead = 0
            }
        }
        return inbox[inboxHead].event
    }

    mutating func enqueue(_ pdu: Forward, device: SimulatedDevice, now: Duration) {
        guard up else { return }  // the link is gone but the central has not noticed yet
        if !model.timed {
            deliver(pdu, at: now, device: device)
            flushReverseUntimed()
            return
        }
        forward.append(pdu)
    }

    /// Runs the link up to `now`, packet by packet. A connection event stays open while either
    /// side has data ready when its next slot comes (the MD bit), until its time budget or
    /// `packetsPerEvent` runs out; a packet queued after the event closed waits for the next one.
    /// So the central can refill its queue during an event, as hosts do.
    mutating func run(until now: Duration, device: SimulatedDevice) {
        guard model.timed else {
            runWakes(until: now, device: device)
            return
        }
        defer { runWakes(until: now, device: device) }
        while up {
            if let at = scheduledDrop?.at, at <= now, at <= slotTime {
                dropForBoot(device: device)
                break
            }
            if !eventOpen {
                if forwardHead == forward.count && reverseHead == reverse.count {
                    // Idle: skip empty events up to now.
                    let last = Int(((now - anchor) / ci).rounded(.down))
                    if last >= nextEvent { nextEvent = last + 1 }
                    break
                }
                guard nextEventTime <= now else { break }
                eventOpen = true
                eventUsed = 0
                eventPackets = 0
            }
            guard let (cost, isReverse) = nextTransmission() else {
                closeEvent()
                continue
            }
            let done = slotTime + .microseconds(Int64(cost))
            if let at = scheduledDrop?.at, at <= now, at < done {
                // The device reboots before this packet is through. (Waiting for the event to
                // reach the reboot's time would wait on a time already past, for ever.)
                dropForBoot(device: device)
                break
            }
            if done > now { break }  // the event goes on when time reaches it
            eventUsed += cost
            if isReverse {
                let r = reverse[reverseHead]
                reverseHead += 1
                arrive(r.event, at: done)
            } else {
                eventPackets += 1
                headFragmentsSent += 1
                let pdu = forward[forwardHead]
                if headFragmentsSent == model.fragments(attBytes: pdu.bytes.count + 3).count {
                    headFragmentsSent = 0
                    forwardHead += 1
                    runWakes(until: done, device: device)  // deadlines before this packet come first
                    deliver(pdu, at: done, device: device)
                }
            }
        }
        compactForward()
    }

    private mutating func compactForward() {
        if forwardHead > 1024, forwardHead * 2 > forward.count {
            forward.removeFirst(forwardHead)
            forwardHead = 0
        }
        if reverseHead > 256, reverseHead * 2 > reverse.count {
            reverse.removeFirst(reverseHead)
            reverseHead = 0
        }
    }

    /// Time of the next slot in the open event (or the next event's start).
    var slotTime: Duration { nextEventTime + .microseconds(Int64(eventOpen ? eventUsed : 0)) }

    private mutating func closeEvent() {
        eventOpen = false
        nextEvent += 1
    }

    /// The cost of the next packet of the open event and its direction; nil closes the event.
    private func nextTransmission() -> (Double, Bool)? {
        let budget = ci.seconds * 1e6
        let at = slotTime
        if reverseHead < reverse.count, reverse[reverseHead].time <= at {
            // Rides in the peripheral's slot of a central packet: only its extra air time when the
            // central has data flowing, a whole pair (with an empty central packet) otherwise.
            let riding = forwardHead < forward.count
            let cost = model.fragments(attBytes: reverse[reverseHead].size).reduce(0.0) {
                $0 + (riding ? model.airTime(payload: $1) - model.airTime(payload: 0) : model.pairTime(payload: $1))
            }
            return eventUsed + cost <= budget || eventUsed == 0 ? (cost, true) : nil
        }
        guard forwardHead < forward.count else { return nil }
        if let limit = model.packetsPerEvent, eventPackets >= limit { return nil }
        let frags = model.fragments(attBytes: forward[forwardHead].bytes.count + 3)
        let cost = model.pairTime(payload: frags[headFragmentsSent])
        return eventUsed + cost <= budget ? (cost, false) : nil
    }

    /// When the head of the transmit queue next leaves (for a central waiting on a full queue).
    var nextSendTime: Duration {
        guard eventOpen else { return nextEventTime + .microseconds(1) }
        if let (cost, _) = nextTransmission() { return slotTime + .microseconds(Int64(cost)) }
        return anchor + ci * (nextEvent + 1) + .microseconds(1)
    }

    private mutating func flushReverseUntimed() {
        while reverseHead < reverse.count {
            arrive(reverse[reverseHead].event, at: reverse[reverseHead].time)
            reverseHead += 1
        }
    }

    /// When the device reboots into an image it just activated, and why.
    var scheduledDrop: (at: Duration, reason: String)?

    private mutating func dropForBoot(device: SimulatedDevice) {
        guard let (at, reason) = scheduledDrop else { return }
        scheduledDrop = nil
        drop(at: at, reason: .linkLost(reason), noticeAfter: model.timed ? model.supervisionTimeout : .zero, device: device)
    }

    /// The peripheral receives a PDU at time `t`: the device model decides what follows and when
    /// (`PeripheralModel`), the link carries it out.
    private mutating func deliver(_ pdu: Forward, at t: Duration, device: SimulatedDevice) {
        let result: PeripheralWriteResult
        switch pdu {
        case .command(let uuid, let bytes):
            result = device.state.withLock { $0.model.write(bytes, to: uuid, withResponse: false, from: nil, at: t) }
        case .request(let uuid, let bytes, let ticket):
            result = device.state.withLock { $0.model.write(bytes, to: uuid, withResponse: true, from: nil, at: t) }
            switch result.reply {
            case .success(let at):
                enqueueReverse(Reverse(time: at, event: .writeCompleted(ticket, nil), size: 1))
            case .failure(let error, let what):
                enqueueReverse(Reverse(time: t, event: .writeCompleted(ticket, .att(error, what)), size: 5))
            case .away:
                break  // nothing answers; the link is already down
            }
        }
        if !result.outputs.isEmpty { carryOut(result.outputs, now: t, device: device) }
    }

    /// Held checkpoints' deadlines (`PeripheralOutput.wake`), in the order they were set.
    var wakes: [(at: Duration, token: UInt64)] = []

    /// Does what the device model decided, each at its time.
    private mutating func carryOut(_ outputs: [PeripheralTimed], now t: Duration, device: SimulatedDevice) {
        for timed in outputs {
            switch timed.output {
            case .notify(let uuid, let value):
                if let id = notifying[uuid] {
                    enqueueReverse(Reverse(time: timed.at, event: .notification(characteristicID: id, value: value), size: value.count + 3))
                }
            case .dropLink(let reason):
                drop(at: timed.at, reason: .linkLost(reason), noticeAfter: model.supervisionTimeout, device: device)
            case .reboot(_, let reason, let injected):
                if !injected { ActivationLog.note(device.address, reason) }
                if timed.at <= t || !model.timed {
                    drop(at: max(t, timed.at), reason: .linkLost(reason), noticeAfter: model.timed ? model.supervisionTimeout : .zero, device: device)
                } else {
                    scheduledDrop = (timed.at, reason)
                }
            case .wake(let token):
                wakes.append((timed.at, token))
            }
        }
    }

    /// Runs the held CHECKPOINTs' deadlines that are due at `now`.
    mutating func runWakes(until now: Duration, device: SimulatedDevice) {
        while up, let first = wakes.first, first.at <= now {
            wakes.removeFirst()
            let outputs = device.state.withLock { $0.model.wake(first.token, at: first.at) }
            carryOut(outputs, now: first.at, device: device)
        }
        if !model.timed { flushReverseUntimed() }
    }

    /// Routes an event that has reached the central: a blocking write's completion to its
    /// waiter, everything else to the inbox.
    private mutating func arrive(_ event: GATTEvent, at time: Duration) {
        if case .writeCompleted(let ticket, let error) = event, blocking.remove(ticket) != nil {
            blockingResults[ticket] = .some(error)
        } else {
            inbox.append((time, event))
        }
    }

    private mutating func enqueueReverse(_ r: Reverse) {
        if case .writeCompleted(let ticket, _) = r.event { outstanding.remove(ticket) }
        reverse.append(r)
        if !model.timed { flushReverseUntimed() }
    }

    /// The link goes down at `t`; the central notices `noticeAfter` later.
    mutating func drop(at t: Duration, reason: DisconnectReason, noticeAfter: Duration, device: SimulatedDevice?) {
        guard up else { return }
        up = false
        let noticed = t + noticeAfter
        downNoticedAt = noticed
        downReason = reason.description
        forward.removeAll()
        forwardHead = 0
        headFragmentsSent = 0
        // Replies not yet on the air are lost with the link.
        while reverseHead < reverse.count {
            if case .writeCompleted(let ticket, _) = reverse[reverseHead].event { outstanding.insert(ticket) }
            reverseHead += 1
        }
        for ticket in outstanding.sorted(by: { $0.rawValue < $1.rawValue }) {
            arrive(.writeCompleted(ticket, GATTError(.notConnected, "write failed: \(reason)")), at: noticed)
        }
        outstanding.removeAll()
        inbox.append((noticed, .disconnected(reason)))
        wakes.removeAll()
        device?.state.withLock { d in
            d.connected = false
            d.model.linkDropped(central: nil)
        }
    }
}

extension SimulatedConnection: GATTPairing {
    public func isBonded() async throws(GATTError) -> Bool {
        device.state.withLock { $0.bond > .none }
    }

    /// The Security Manager's exchange in a few round trips: a device that requires
    /// authentication takes only the passkey it expects (or, without one, a confirmed numeric
    /// comparison); anything else bonds Just Works, unauthenticated.
    public func pair(_ credentials: PairingCredentials, timeout: Duration) async throws(GATTError) {
        try await roundTrips(4)
        let config = device.config
        let reached: LinkSecurity
        if config.security == .authenticate {
            if let expected = config.passkey {
                guard let given = credentials.passkey else {
                    throw GATTError(.authenticationFailed, "pairing with \(peer) failed (AuthenticationFailed): it asked for a passkey; pass --passkey with the one it shows or expects")
                }
                guard given == expected else {
                    throw GATTError(.authenticationFailed, "pairing with \(peer) failed (AuthenticationFailed): the passkey \(PairingCredentials.text(given)) was not accepted; check the passkey the device expects")
                }
            } else if !credentials.confirmsComparison {
                throw GATTError(.authenticationFailed, "pairing with \(peer) failed (AuthenticationFailed): it asked to confirm a numeric comparison; pass --confirm-pairing to accept it")
            }
            reached = .authenticate
        } else {
            // A device with no input and no output: Just Works whatever the central can do.
            reached = .encrypt
        }
        device.state.withLock { s in
            s.bond = reached
            s.model.linkEncrypted(true)
        }
        link.withLock { $0.encryption = reached }
    }
}

extension SimulatedCentral: GATTBondStore {
    public func removeBond(_ address: DeviceAddress) async throws(GATTError) {
        for device in devices where device.address == address {
            device.state.withLock { $0.bond = .none }
        }
    }

    /// True when the central holds a bond with `address`.
    public func isBonded(_ address: DeviceAddress) -> Bool {
        devices.contains { $0.address == address && $0.state.withLock { $0.bond > .none } }
    }
}
