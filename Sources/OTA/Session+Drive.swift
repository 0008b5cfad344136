import Foundation
import GATT
import Logging
import OTAWire

extension OTASession {
    // MARK: Driving the engine over one connection

    /// One connection of the run: attaches, then feeds the engine every event and carries out
    /// every action until the transfer ends or the connection fails.
    func drive<Profile: OTAProfile>(_ engine: inout Profile.Engine, profile: Profile, on connection: any GATTConnection,
                                            stall: inout StallBudget, before: inout FirmwareVersion??,
                                            events: @escaping @Sendable (SessionEvent) -> Void) async throws(OTAError) -> OTAResult {
        let clock = connection.clock
        let started = clock.now
        let (link, mtu) = try await attach(profile, on: connection)
        guard let control = link.characteristics[.control], let data = link.characteristics[.data] else {
            throw OTAError(.internalError, "the \(profile.name) profile attached without a control and a data characteristic; please report this")
        }
        // After a reset the engine reads the outcome; what the device runs is the run's result to
        // tell (a read-back), not the state it starts from.
        if !engine.awaitsNextConnection { events(.deviceInfo(device: device, info: link.summary)) }
        if before == nil { before = .some(link.firmwareVersion) }
        // Only before the engine started: after an activation the device may run that version now.
        if let skip = config.skipIfVersion, engine.phase == .idle, link.firmwareVersion == skip {
            return OTAResult(device: device, bytes: image.size, crc32: image.crc32, mtu: mtu, chunkSize: 0, seconds: 0,
                             transferSeconds: 0, activated: false, skipped: true, firmwareBefore: link.firmwareVersion,
                             stats: engine.stats)
        }
        events(.connected(device: device, mtu: mtu, chunkSize: profile.chunkSize(mtu: mtu)))
        logger.debug("connected", metadata: ["device": "\(device)", "protocol": "\(profile.name)", "mtu": "\(mtu)",
                                             "slot": "\(link.summary.slotSize.map(String.init) ?? "?")"])
        lastLink = (mtu, profile.chunkSize(mtu: mtu))
        var run = ConnectionRun(engine: engine, stall: stall, link: link, control: control, data: data, mtu: mtu,
                                connection: connection, started: started, events: events)
        defer {
            run.stall.hold(at: clock.now)
            engine = run.engine
            stall = run.stall
            silentFor = clock.now - run.lastHeard
        }
        run.actions = run.engine.handle(.connected(link.peer, mtu: mtu))
        run.deadline = clock.now + run.engine.currentTimeout
        while true {
            try checkCancelled(confirmed: run.engine.acked)
            try checkStall(&run)
            recordProgress(&run)
            if let result = try await carryOutActions(&run, profile: profile) { return result }
            announceStart(&run)
            try await stream(&run, profile: profile)
            if !run.actions.isEmpty { continue }
            guard run.engine.isAwaitingReply else {
                throw OTAError(.internalError, "the engine stalled with nothing in flight in phase \(run.engine.phase); please report this")
            }
            try await awaitEvent(&run, profile: profile)
        }
    }

    /// Carries out what the engine asked for: its writes, or the end of the transfer.
    /// - Returns: the result once the engine finished.
    private func carryOutActions<Engine: TransferEngine>(_ run: inout ConnectionRun<Engine>, profile: some OTAProfile) async throws(OTAError) -> OTAResult? {
        let actions = run.actions
        run.actions = []
        for action in actions {
            switch action {
            case .write(let write):
                try await submitCommand(write, &run, profile: profile)
            case .finished:
                report(&run, force: true)
                let now = run.clock.now
                let streamed = (run.streamEnd ?? now) - (run.streamStart ?? run.started)
                return OTAResult(device: device, bytes: image.size, crc32: image.crc32, mtu: run.mtu,
                                 chunkSize: run.engine.chunkSize, seconds: (now - run.started).seconds,
                                 transferSeconds: streamed.seconds,
                                 activated: config.activate, firmwareBefore: run.link.firmwareVersion, stats: run.engine.stats)
            case .failed(let error):
                throw error
            }
        }
        return nil
    }

    /// Writes a command the engine asked for (an action or a stream step) and arms its deadline.
    private func submitCommand<Engine: TransferEngine>(_ write: TransferWrite, _ run: inout ConnectionRun<Engine>,
                                                       profile: some OTAProfile) async throws(OTAError) {
        announcePhase(&run, profile: profile)
        if let ticket = try await submit(write, to: run.target(of: write.role), on: run.connection, profile: profile.name) {
            run.commandTicket = ticket
        }
        run.deadline = run.clock.now + run.engine.currentTimeout
    }

    /// Streams while the engine has something to send and nothing has arrived; stops early when
    /// an event gave the engine actions to carry out.
    private func stream<Engine: TransferEngine>(_ run: inout ConnectionRun<Engine>, profile: some OTAProfile) async throws(OTAError) {
        while true {
            switch run.engine.nextStreamStep() {
            case .data(let offset, let count):
                let lost = try await writeStreamed(run.engine.dataPacket(offset: offset, count: count), to: run.data, on: run.connection)
                if try afterStreamedWrite(&run, lost: lost) { return }
            case .write(let write) where !write.withResponse:
                // A protocol whose frames span several writes (SMP) streams them like data.
                announcePhase(&run, profile: profile)
                guard let target = run.target(of: write.role) else {
                    throw OTAError(.internalError, "the \(profile.name) engine wrote to \(write.role), which its profile did not attach; please report this")
                }
                run.deadline = run.clock.now + run.engine.currentTimeout
                let lost = try await writeStreamed(write.bytes, to: target, on: run.connection)
                if try afterStreamedWrite(&run, lost: lost) { return }
            case .write(let write):
                try await submitCommand(write, &run, profile: profile)
            case .idle:
                return
            }
        }
    }

    /// After a packet went out without response: takes an event that arrived meanwhile.
    /// - Parameter lost: why the link is gone, or nil when the packet went out.
    /// - Returns: true when the engine has actions to carry out (streaming stops).
    private func afterStreamedWrite<Engine: TransferEngine>(_ run: inout ConnectionRun<Engine>, lost: String?) throws(OTAError) -> Bool {
        if let lost {
            run.actions = run.engine.handle(.disconnected(.linkLost(lost)))
            return true
        }
        if Task.isCancelled { throw interrupted(confirmed: run.engine.acked) }
        if let event = run.connection.pollEvent() {
            if let refusal = pairingRefusal(in: event, on: run.connection) { throw refusal }
            run.hear()
            if let mapped = run.map(event) {
                run.engine.observe(time: run.clock.now)
                run.actions = run.engine.handle(mapped)
                if !run.actions.isEmpty { return true }
                // A device that keeps answering with rewinds never lets the stream idle.
                try checkStall(&run)
                recordProgress(&run)
            }
        }
        report(&run, force: false)
        return false
    }

    /// Waits for the reply, an event, or the deadline, and hands what came to the engine.
    private func awaitEvent<Engine: TransferEngine>(_ run: inout ConnectionRun<Engine>, profile: some OTAProfile) async throws(OTAError) {
        let until = min(run.deadline, stallDeadline(&run) ?? run.deadline)
        let next = await run.connection.nextEvent(timeout: max(.zero, until - run.clock.now))
        try checkCancelled(confirmed: run.engine.acked)
        guard let event = next else {
            if run.clock.now < run.deadline { return }  // the stall deadline: checked at the loop's top
            if !run.heard, !run.probed {
                run.probed = true
                if let refusal = await probeSecurity(on: run.connection, profile: profile) { throw refusal }
            }
            run.engine.observe(time: run.clock.now)
            run.actions = run.engine.handle(.timeout)
            if run.actions.isEmpty { run.deadline = run.clock.now + run.engine.currentTimeout }
            return
        }
        if let refusal = pairingRefusal(in: event, on: run.connection) { throw refusal }
        run.hear()
        if let mapped = run.map(event) {
            run.engine.observe(time: run.clock.now)
            run.actions = run.engine.handle(mapped)
            // An answer that asks the engine to wait (a busy SMP server) may shorten the wait.
            if run.actions.isEmpty { run.deadline = min(run.deadline, run.clock.now + run.engine.currentTimeout) }
        }
        report(&run, force: false)
    }

    /// Writes a packet without response, through the transport's fast path when it has room; to a
    /// characteristic that takes no write commands, as a write request whose response it awaits
    /// (a profile hands the session the characteristic as flagged: what it flags is what is sent).
    /// - Returns: why the link is gone, or nil when the packet went out.
    private func writeStreamed(_ packet: [UInt8], to target: GATTCharacteristic, on connection: any GATTConnection) async throws(OTAError) -> String? {
        do {
            if target.streamWriteType == .withResponse {
                try await connection.write(packet, to: target, type: .withResponse)
            } else if try !connection.tryWriteWithoutResponse(packet, to: target) {
                try await connection.write(packet, to: target, type: .withoutResponse)
            }
            return nil
        } catch {
            if error.code == .notConnected { return error.message }
            throw OTAError.from(error, device: device)
        }
    }

    /// Writes a command: with response through the ticketed path (its failure comes back as an
    /// event, so the ticket is returned), else without. A link already gone is left to its
    /// disconnect event.
    private func submit(_ write: TransferWrite, to target: GATTCharacteristic?, on connection: any GATTConnection,
                        profile: String) async throws(OTAError) -> WriteTicket? {
        guard let target else {
            throw OTAError(.internalError, "the \(profile) engine wrote to \(write.role), which its profile did not attach; please report this")
        }
        do {
            if write.withResponse { return try connection.submitWrite(write.bytes, to: target) }
            try await connection.write(write.bytes, to: target, type: target.streamWriteType)
        } catch {
            if error.code != .notConnected { throw OTAError.from(error, device: device) }
        }
        return nil
    }
}

extension GATTCharacteristic {
    /// How an engine's write that wants no response goes out: a write command where the
    /// characteristic is flagged for one, else a write request (strict in what is sent; a profile
    /// that knows its device takes commands anyway says so by the flags it hands over, as ESP32's).
    var streamWriteType: WriteType { properties.contains(.writeWithoutResponse) ? .withoutResponse : .withResponse }
}
