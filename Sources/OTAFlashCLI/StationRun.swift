import Foundation
import GATT
import Ledger
import LineServer
import OTA
import OTACommandLine
import Simulator
import Synchronization

/// One shift of `otaflash station`: the loop that scans, claims and flashes, its devices' states,
/// its counts and its screen. The loop runs on one task; each device attempt on a task of its own,
/// which hands its outcome back through `completions` and wakes the loop.
///
/// Unchecked: its `let`s are the parsed command line (`Flash`, a value never changed after
/// parsing) and Sendable values; its mutable state is behind `state`'s lock.
final class StationRun: @unchecked Sendable {
    struct Settings: Sendable {
        var station: String
        var image: RunRecords.Image
        var perAdapter: Int
        var parallel: Int
        var retries: Int
        var backoff: Double
        var lease: Double
        var simulated: Bool
        var options: BatchOptions
        var passkeys: [DeviceAddress: UInt32]
    }

    /// The shift's tallies (what the screen and the `summary` show).
    struct Counts: Sendable {
        /// Flashed here, `ok`.
        var done = 0
        /// Left alone: the ledger showed them done with this image (here before a restart, or by another station).
        var alreadyDone = 0
        /// Attempts that failed (a device retried counts once per attempt).
        var failed = 0
        var quarantined = 0
        var inProgress = 0
        /// Simulated line: devices that left before they were flashed.
        var missed = 0
        /// Devices found held by another station (each time one was found so).
        var held = 0
        /// Devices found held by another station or already done, each once: encounters, not
        /// attempts (no record is written for them; docs/LEDGER.md, "Claims").
        var seenElsewhere = 0

        func line(hours: Double, clock: String?) -> String {
            "done \(done), already done \(alreadyDone), failed attempts \(failed), quarantined \(quarantined), in progress \(inProgress)"
                + (missed > 0 ? ", missed \(missed)" : "")
                + (seenElsewhere > 0 ? ", seen elsewhere \(seenElsewhere)" + (held > 0 ? " (found held by another station \(held) times)" : "") : "")
                + String(format: "; %.1f devices per hour", hours > 0 ? Double(done) / hours : 0) + (clock.map { " (\($0) clock, \(String(format: "%.2f", hours)) h)" } ?? "")
        }
    }

    private enum Phase: Sendable {
        case waiting
        case inFlight
        case done
        case quarantined
        /// Another station holds it; ask again after this (real) time.
        case held(ContinuousClock.Instant)
    }

    private struct Device: Sendable {
        var phase = Phase.waiting
        /// Failed attempts so far (the ledger's, for a device seen before a restart).
        var failures = 0
        /// Not tried again before this shift time.
        var eligibleAt: Duration = .zero
    }

    private struct Flight: Sendable {
        var adapter: String
        var started: Duration
        var bytes = 0
        var total = 0
        /// On virtual time: when the attempt, over in real time, ends on the shift's clock; its slot
        /// is taken until then (nil while it runs).
        var end: Duration?
    }

    private struct Finished: Sendable {
        let address: DeviceAddress
        let outcome: BatchOutcome
        let started: Duration
        let number: Int
    }

    private struct State: Sendable {
        var devices: [DeviceAddress: Device] = [:]
        var flights: [DeviceAddress: Flight] = [:]
        var busy: [String: Int] = [:]
        var completions: [Finished] = []
        var tasks: [DeviceAddress: Task<Void, Never>] = [:]
        var counts = Counts()
        /// The last failures, newest last: device, attempt, reason.
        var failures: [(String, Int, String)] = []
        var stopping = false
        /// When the last attempt ended, on the shift's clock.
        var lastEnd: Duration = .zero
        var scan: Task<(seen: [Sighting], problem: String?), Never>?
        /// Devices found held by another station or already done (`Counts.seenElsewhere`).
        var seenElsewhere: Set<DeviceAddress> = []

        mutating func sawElsewhere(_ address: DeviceAddress) {
            seenElsewhere.insert(address)
            counts.seenElsewhere = seenElsewhere.count
        }
        /// Since when the ledger cannot be reached (no device is started meanwhile), and why.
        var ledgerDown: (since: ContinuousClock.Instant, why: String)?
        /// Devices stopped because their claims could not be renewed: tried again, not failed.
        var stoppedForClaim: Set<DeviceAddress> = []
    }

    let flash: Flash
    let plan: FlashPlan
    let book: RunRecords
    let ledger: any LedgerStore
    let source: any LineSource
    let settings: Settings
    let printer: EventPrinter
    private let state = Mutex(State())
    private let wake = Wakeup()
    /// The shift's time: virtual on a simulated line on virtual time (advanced by the loop), else real.
    private let virtualShift: VirtualClock?
    private let shiftClock: any MonotonicClock
    private let screen: StationScreen?
    /// `--metrics`: each attempt that ends with a record is counted there.
    let metrics: StationMetrics?

    init(flash: Flash, plan: FlashPlan, book: RunRecords, ledger: any LedgerStore, source: any LineSource, settings: Settings, printer: EventPrinter,
         metrics: StationMetrics? = nil) {
        self.metrics = metrics
        self.flash = flash
        self.plan = plan
        self.book = book
        self.ledger = ledger
        self.source = source
        self.settings = settings
        self.printer = printer
        let virtual = settings.simulated && flash.target.simulator.clock is VirtualClock
        virtualShift = virtual ? VirtualClock() : nil
        shiftClock = virtualShift ?? SystemClock()
        screen = printer.mode == .human && CLIContext.output.isTerminal ? StationScreen(sink: CLIContext.output) : nil
        book.setHooks(RunRecords.Hooks(
            ledgerDown: { [weak self] why in self?.ledgerWentDown(why) },
            stopDevice: { [weak self] device in self?.stopForClaim(device) }))
    }

    /// The ledger cannot be reached: no device is started until it answers (spool), or the shift ends (stop).
    func ledgerWentDown(_ why: String) {
        let first = state.withLock { s -> Bool in
            guard s.ledgerDown == nil else { return false }
            s.ledgerDown = (ContinuousClock.now, why)
            return true
        }
        guard first else { return }
        printer.json(StationEvents.LedgerState(state: "unreachable", message: why, sent: 0))
        if book.whenDown?.spool == true {
            say("the ledger cannot be reached (\(why)); devices in flight go on within their claims' leases, their records kept in the outbox; no device is started until the ledger answers")
        } else {
            book.noteFailure(CLIFailure(.ledgerFailed, "the ledger cannot be reached (\(why)); --when-ledger-down stop: the shift ends once the devices in flight end, their records kept in the outbox"))
            stop(nil)
        }
        wake.signal()
    }

    /// A device whose claim may end before it is flashed: it stops after its current write.
    private func stopForClaim(_ device: String) {
        let task = state.withLock { s -> Task<Void, Never>? in
            guard let address = s.tasks.keys.first(where: { $0.description == device }) else { return nil }
            s.stoppedForClaim.insert(address)
            return s.tasks[address]
        }
        task?.cancel()
    }

    /// While the ledger is down: asks it again (the outbox is sent first); true once it answers.
    private func probeLedger() async -> Bool {
        guard let down = state.withLock({ $0.ledgerDown }) else { return true }
        let unsent = await (ledger as? SpoolingLedger)?.unsent ?? 0
        do {
            try await ledger.prepare(station: settings.station)
        } catch {
            return false
        }
        state.withLock { $0.ledgerDown = nil }
        let away = "the ledger answers again after \(formatSeconds((ContinuousClock.now - down.since).seconds))"
        printer.json(StationEvents.LedgerState(state: "answers", message: away, sent: unsent))
        say(away + ": \(unsent) records and releases sent from the outbox; starting devices again")
        return true
    }

    var counts: Counts { state.withLock { $0.counts } }
    /// The shift's length so far: on a simulated line, until its last attempt ended (not until its
    /// last device left); at radios, until now.
    /// The clock the shift's hours are on, for its summary: a simulated line runs on the virtual
    /// clock with `--sim-time virtual`, else on real time; nil at radios (always real).
    var clockName: String? { virtualShift != nil ? "virtual" : settings.simulated ? "real" : nil }

    var hours: Double { (settings.simulated ? state.withLock { $0.lastEnd } : shiftClock.now).seconds / 3600 }

    /// Ends the shift: no device is started any more, each in flight stops after its current write.
    func stop(_ note: String?) {
        let (tasks, scan) = state.withLock { s -> ([Task<Void, Never>], Task<(seen: [Sighting], problem: String?), Never>?) in
            s.stopping = true
            return (Array(s.tasks.values), s.scan)
        }
        if let note { say(note) }
        for task in tasks { task.cancel() }
        scan?.cancel()
        wake.signal()
    }

    private var stopping: Bool { state.withLock { $0.stopping } }

    /// The shift: until stopped (or a simulated line's last device has left).
    func run() async {
        var lastProblem: String?
        while !stopping {
            handleCompletions()
            releaseEnded()
            if book.failure.withLock({ $0 != nil }) {
                stop("stopping: the ledger cannot take records (the line above says why)")
                break
            }
            if await probeLedger() == false {
                // Asked again each second; a device ending wakes the loop sooner.
                await wake.wait(timeout: .seconds(1))
                continue
            }
            let now = shiftClock.now
            // Who leaves first: a scan sees only the devices still in range.
            if let line = source as? SimulatedLine { noteLeaving(line, now: now) }
            let scan = Task { [source] in await source.scan(now: now) }
            state.withLock { $0.scan = scan }
            let (seen, problem) = await scan.value
            state.withLock { $0.scan = nil }
            if stopping { break }
            if let problem, problem != lastProblem { printer.warning(problem + "; scanning again") }
            lastProblem = problem
            var startable = false
            for sighting in seen {
                // Once every slot is taken, the rest wait for the next pass.
                if !state.withLock({ slotFree($0, adapter: sighting.adapter ?? "default") }) { break }
                if await consider(sighting, now: now) { startable = true }
            }
            redraw()
            guard let line = source as? SimulatedLine else {
                // A radio scan was this pass's wait; a failed one waits a window before the next.
                if problem != nil { await wake.wait(timeout: Ranges.scanWindow.duration(flash.batch.scanWindow)) }
                continue
            }
            if startable { continue }
            if await waitOnTheLine(line, now: now) == false { break }
        }
        // Every device in flight ends (its current write, then its record).
        let tasks = state.withLock { Array($0.tasks.values) }
        for task in tasks { await task.value }
        handleCompletions()
        state.withLock { s in for address in Array(s.flights.keys) { Self.release(&s, address) } }
        redraw(final: true)
    }

    /// Nothing to start on a simulated line now: moves time to the next thing that happens (an
    /// arrival, a retry coming due, a device leaving) or waits for a device in flight. False when
    /// the shift is over: every device has come and gone.
    private func waitOnTheLine(_ line: SimulatedLine, now: Duration) async -> Bool {
        // The line waits for the ledger: its time does not move meanwhile (the next pass asks it).
        if state.withLock({ $0.ledgerDown != nil }) { return true }
        let (inFlight, running, nextEnd, nextRetry, heldUntil, free) = state.withLock { s in
            (s.flights.count,
             s.flights.values.contains { $0.end == nil },
             s.flights.values.compactMap(\.end).min(),
             s.devices.values.compactMap { d -> Duration? in if case .waiting = d.phase, d.eligibleAt > now { d.eligibleAt } else { nil } }.min(),
             s.devices.values.compactMap { d -> ContinuousClock.Instant? in if case .held(let t) = d.phase { t } else { nil } }.min(),
             slotFree(s, adapter: "sim"))
        }
        // A device leaving needs no wake-up of its own: one still waiting with a slot free would
        // have been started, so it leaves while something else is due, and the next pass counts it missed.
        if let virtualShift {
            // Time moves only once every attempt in flight is over in real time and its end is
            // known: then to the first thing that happens, an attempt ending among them.
            if running {
                await wake.wait(timeout: .seconds(3600))  // a device in flight ends within its own timeouts
                return true
            }
            if let next = [line.nextArrival, nextRetry, nextEnd].compactMap({ $0 }).filter({ $0 > now }).min() {
                virtualShift.advance(to: next)
                return true
            }
        } else {
            let next = [line.nextArrival, nextRetry].compactMap { $0 }.filter { $0 > now }.min()
            if inFlight > 0, !free || next == nil {
                await wake.wait(timeout: .seconds(3600))  // a device in flight ends within its own timeouts
                return true
            }
            if let next {
                await wake.wait(timeout: next - now)
                return true
            }
        }
        if let heldUntil {
            // Another station flashes it: ask again once its lease may have ended (real time).
            await wake.wait(timeout: max(.milliseconds(50), heldUntil - ContinuousClock.now))
            return true
        }
        // Nothing in flight, nothing to come: the shift is over.
        return false
    }

    /// Devices of a simulated line whose time in range is over leave it; those never flashed are missed.
    private func noteLeaving(_ line: SimulatedLine, now: Duration) {
        let left = line.leave(at: now) { address in
            state.withLock { s in
                switch s.devices[address]?.phase {
                case .inFlight?, .held?: true
                default: false
                }
            }
        }
        state.withLock { s in
            for member in left {
                if case .waiting? = s.devices.removeValue(forKey: member.address)?.phase { s.counts.missed += 1 }
            }
        }
    }

    /// A device in range: started when it is due and a slot is free. True when it was started.
    private func consider(_ sighting: Sighting, now: Duration) async -> Bool {
        let address = sighting.address
        var known = state.withLock { $0.devices[address] }
        if known == nil, state.withLock({ $0.ledgerDown != nil }) { return false }
        if known == nil {
            // First seen this shift: what the ledger knows of it (a restart picks up here).
            var device = Device()
            if let rows = try? await ledger.records(LedgerQuery(device: address.description, image: settings.image.sha256)) {
                if rows.contains(where: \.result.succeeded) {
                    device.phase = .done
                    state.withLock { s in
                        s.counts.alreadyDone += 1
                        s.sawElsewhere(address)
                    }
                } else {
                    device.failures = rows.filter { $0.result == .error && $0.errorCode != ExitCode.interrupted.name }.count
                    if device.failures > settings.retries {
                        device.phase = .quarantined
                        state.withLock { $0.counts.quarantined += 1 }
                        say("\(address): quarantined: the ledger shows \(device.failures) failed attempts with this image")
                    }
                }
            }
            state.withLock { $0.devices[address] = device }
            known = device
        }
        guard var device = known else { return false }
        if state.withLock({ $0.ledgerDown != nil }) { return false }
        switch device.phase {
        case .inFlight, .done, .quarantined: return false
        case .held(let until): if ContinuousClock.now < until { return false }
        case .waiting: if device.eligibleAt > now { return false }
        }
        let adapter = sighting.adapter ?? "default"
        let started = state.withLock { s -> Bool in
            guard !s.stopping, slotFree(s, adapter: adapter) else { return false }
            device.phase = .inFlight
            s.devices[address] = device
            s.flights[address] = Flight(adapter: adapter, started: now)
            s.busy[adapter, default: 0] += 1
            s.counts.inProgress += 1
            return true
        }
        guard started else { return false }
        let number = device.failures + 1
        let task = Task { [self] in
            let outcome = await attempt(sighting, number: number)
            state.withLock { $0.completions.append(Finished(address: address, outcome: outcome, started: now, number: number)) }
            wake.signal()
        }
        state.withLock { $0.tasks[address] = task }
        return true
    }

    private func slotFree(_ s: State, adapter: String) -> Bool {
        s.flights.count < settings.parallel && s.busy[adapter, default: 0] < settings.perAdapter
    }

    /// One attempt at a device: claimed, flashed, recorded (`RunRecords`), as a batch flashes one.
    private func attempt(_ sighting: Sighting, number: Int) async -> BatchOutcome {
        let address = sighting.address
        let central: any GATTCentral
        let clock: any MonotonicClock
        if let member = sighting.member {
            let fault: SimulatedDeviceFault.Mode? = switch member.fault {
            case .gone?: .gone
            case .noOTAService?: .noOTAService
            case .smallSlot?: .smallSlot
            case .flaky?: number == 1 ? .gone : nil
            case nil: nil
            }
            do {
                let device = try flash.simulatedDevice(address, number: member.index, fault: fault, plan: plan)
                clock = flash.target.simulator.clock
                central = SimulatedCentral(devices: [device], clock: clock)
            } catch {
                return BatchOutcome(device: address.description, adapter: sighting.adapter, result: .failed(OTAError(.internalError, "the simulated device could not be made: \(error)")),
                                    attempts: number, seconds: 0, firmwareBefore: nil, firmwareAfter: nil)
            }
        } else {
            guard let radio = sighting.central else {
                return BatchOutcome(device: address.description, adapter: sighting.adapter, result: .failed(OTAError(.internalError, "no adapter reaches \(address)")),
                                    attempts: number, seconds: 0, firmwareBefore: nil, firmwareAfter: nil)
            }
            central = radio
            clock = SystemClock()
        }
        let runner = BatchRunner(plan: plan.update, options: settings.options, logger: flash.output.logger("otaflash.station"))
        let target = BatchTarget(address: address, adapter: sighting.adapter, central: central,
                                 credentials: flash.pairing.answers.credentials(for: address, file: settings.passkeys))
        let book = book
        let outcomes = await runner.run([target], before: { await book.begin($0.address.description) },
                                        finished: { await book.finish($0.numbered(number)) }) { [self] event in
            book.observe(event)
            switch event {
            case .session(let event):
                if printer.mode == .json { printer.session(event) }
                if case .progress(let p) = event {
                    state.withLock { s in
                        s.flights[address]?.bytes = p.bytes
                        s.flights[address]?.total = p.total
                    }
                    redraw()
                }
            case .pairing(let device, let note):
                printer.json(FlashEvents.Note(device: device, message: note))
            case .prepared, .image, .identity:
                break
            }
        }
        return (outcomes.first ?? BatchOutcome(device: address.description, adapter: sighting.adapter,
                                               result: .failed(OTAError(.interrupted, "stopped before it was flashed")),
                                               attempts: number, seconds: 0, firmwareBefore: nil, firmwareAfter: nil)).numbered(number)
    }

    private static func release(_ s: inout State, _ address: DeviceAddress) {
        guard let flight = s.flights.removeValue(forKey: address) else { return }
        s.busy[flight.adapter, default: 1] -= 1
        s.counts.inProgress -= 1
    }

    /// On virtual time: frees the slots of attempts whose end the shift's clock has reached.
    private func releaseEnded() {
        guard let virtualShift else { return }
        let now = virtualShift.now
        state.withLock { s in
            for (address, flight) in s.flights where (flight.end.map { $0 <= now } ?? false) { Self.release(&s, address) }
        }
    }

    /// Devices that ended: counted, and retried later, quarantined, or left alone.
    private func handleCompletions() {
        let finished = state.withLock { s -> [Finished] in
            defer { s.completions.removeAll() }
            return s.completions
        }
        for f in finished {
            let end = f.started + .milliseconds(Int64((f.outcome.seconds * 1000).rounded()))
            var lines: [String] = []
            var events: [any JSONEvent] = []
            var attempt: (result: String, error: String?)?
            var bytes = 0
            state.withLock { s in
                bytes = s.flights[f.address]?.bytes ?? 0
                s.lastEnd = max(s.lastEnd, end)
                s.tasks[f.address] = nil
                if virtualShift != nil {
                    s.flights[f.address]?.end = end
                } else {
                    Self.release(&s, f.address)
                }
                var device = s.devices[f.address] ?? Device()
                let name = f.outcome.device
                switch f.outcome.result {
                case .ok:
                    device.phase = .done
                    s.counts.done += 1
                    attempt = ("ok", nil)
                case .skipped:
                    attempt = ("skipped", nil)
                    device.phase = .done
                    s.counts.alreadyDone += 1
                    s.sawElsewhere(f.address)
                case .failed(let e) where e.code == .heldElsewhere:
                    device.phase = .held(ContinuousClock.now + .milliseconds(Int64(min(30, max(0.1, settings.lease / 4)) * 1000)))
                    s.counts.held += 1
                    s.sawElsewhere(f.address)
                case .failed(let e) where e.code == .interrupted && s.stopping:
                    device.phase = .waiting
                case .failed(let e) where e.code == .ledgerFailed && book.wasUnstarted(name):
                    // Not started: the ledger could not be reached. It waits for it.
                    device.phase = .waiting
                case .failed(let e) where e.code == .interrupted && s.stoppedForClaim.remove(f.address) != nil:
                    // Stopped before its claim could lapse: tried again once the ledger answers.
                    device.phase = .waiting
                case .failed(let e):
                    s.counts.failed += 1
                    attempt = (e.code == .bondLeft ? "bond_left" : "error", ExitCode(e.code).name)
                    device.failures = f.number
                    s.failures.append((name, f.number, e.description))
                    if s.failures.count > 5 { s.failures.removeFirst() }
                    if device.failures > settings.retries {
                        device.phase = .quarantined
                        s.counts.quarantined += 1
                        lines.append("\(name): quarantined after \(device.failures) failed attempts: \(e.description)")
                        events.append(StationEvents.Quarantined(device: name, attempts: device.failures, error: ExitCode(e.code).name, message: e.description))
                    } else {
                        let delay = min(3600, settings.backoff * pow(2, Double(device.failures - 1)))
                        device.phase = .waiting
                        device.eligibleAt = end + .milliseconds(Int64(delay * 1000))
                        lines.append("\(name): attempt \(f.number) failed (\(e.description)); trying again in \(formatSeconds(delay))")
                        events.append(StationEvents.Retry(device: name, attempt: f.number + 1, after: delay, error: ExitCode(e.code).name))
                    }
                }
                s.devices[f.address] = device
            }
            if let attempt { metrics?.attemptEnded(result: attempt.result, error: attempt.error, seconds: f.outcome.seconds, bytes: bytes) }
            for line in lines { say(line) }
            for event in events { printer.json(event) }
        }
        if !finished.isEmpty { redraw() }
    }

    /// A line for people: above the screen on a terminal, else on stderr.
    private func say(_ line: String) {
        if let screen { screen.log(line) } else { printer.note(line) }
    }

    private func redraw(final: Bool = false) {
        guard let screen else { return }
        let (counts, flights, failures) = state.withLock { ($0.counts, $0.flights, $0.failures) }
        let now = shiftClock.now
        var lines = ["otaflash station \(settings.station) · \(settings.image.name) · " + counts.line(hours: hours, clock: clockName)]
        if !flights.isEmpty {
            lines.append("in progress:")
            for (address, f) in flights.sorted(by: { $0.value.started < $1.value.started }).prefix(16) {
                let share = f.total > 0 ? String(format: "%3.0f%%", Double(f.bytes) * 100 / Double(f.total)) : "  - "
                lines.append("  \(address)  \(f.adapter)  \(share)  since \(formatSeconds((now - f.started).seconds))")
            }
        }
        if !failures.isEmpty {
            lines.append("last failures:")
            for (device, attempt, reason) in failures.reversed() { lines.append("  \(device) (attempt \(attempt)): \(reason)") }
        }
        screen.draw(lines, force: final)
    }
}

extension BatchOutcome {
    /// The same outcome as the station's attempt `number` at the device.
    func numbered(_ number: Int) -> BatchOutcome {
        BatchOutcome(device: device, updateModeAddress: updateModeAddress, adapter: adapter, result: result, attempts: number,
                     seconds: seconds, firmwareBefore: firmwareBefore, firmwareAfter: firmwareAfter)
    }
}

/// Wakes one waiter, or the next one to wait (a wake-up is kept until taken); every wait has a timeout.
///
/// The timeout is a dispatch timer, cancelled (and freed) as soon as a signal comes first: a
/// cancelled `Task.sleep` keeps its timer queued until its deadline, and a shift's waits of up to
/// an hour each then held memory for every device of that hour.
final class Wakeup: Sendable {
    private struct State {
        var pending = false
        var waiter: CheckedContinuation<Void, Never>?
        var timer: (any DispatchSourceTimer)?
    }

    private let state = Mutex(State())
    private static let timers = DispatchQueue(label: "otaflash.station.wakeup")

    func signal() {
        let (waiter, timer) = state.withLock { s -> (CheckedContinuation<Void, Never>?, (any DispatchSourceTimer)?) in
            guard let waiter = s.waiter else {
                s.pending = true
                return (nil, nil)
            }
            defer { s.waiter = nil; s.timer = nil }
            return (waiter, s.timer)
        }
        timer?.cancel()
        waiter?.resume()
    }

    /// Returns when signalled (or already signalled since the last wait), or after `timeout`.
    func wait(timeout: Duration) async {
        await withCheckedContinuation { (c: CheckedContinuation<Void, Never>) in
            let ready = state.withLock { s -> Bool in
                if s.pending {
                    s.pending = false
                    return true
                }
                s.waiter = c
                let timer = DispatchSource.makeTimerSource(queue: Self.timers)
                timer.schedule(deadline: .now() + timeout.dispatchInterval)
                timer.setEventHandler { [weak self] in self?.signal() }
                timer.resume()
                s.timer = timer
                return false
            }
            if ready { c.resume() }
        }
        // A timeout's signal may arrive after the waiter left: it is a wake-up the next wait takes.
    }
}

/// The station's screen on a terminal: its lines redrawn in place (at most 4 times a second),
/// with notes printed above it.
final class StationScreen: Sendable {
    private struct State {
        var lines: [String] = []
        var drawn = 0
        var last = ContinuousClock.now - .seconds(1)
    }

    private let sink: any OutputSink
    private let state = Mutex(State())

    init(sink: any OutputSink) { self.sink = sink }

    func draw(_ lines: [String], force: Bool) {
        let text = state.withLock { s -> String? in
            s.lines = lines
            guard force || ContinuousClock.now - s.last >= .milliseconds(250) else { return nil }
            s.last = ContinuousClock.now
            return frame(&s)
        }
        if let text { sink.err(text) }
    }

    func log(_ line: String) {
        let text = state.withLock { s -> String in
            let clear = Self.clear(s.drawn)
            s.drawn = 0
            return clear + line + "\n" + frame(&s)
        }
        sink.err(text)
    }

    private func frame(_ s: inout State) -> String {
        let width = 200
        let out = Self.clear(s.drawn) + s.lines.map { LiveView.cut($0, to: width) + "\n" }.joined()
        s.drawn = s.lines.count
        return out
    }

    /// Moves up over `lines` drawn lines and clears them.
    private static func clear(_ lines: Int) -> String {
        lines > 0 ? "\u{1B}[\(lines)A\r\u{1B}[J" : ""
    }
}

/// The events `otaflash station` adds to a batch's (docs/EVENTS.md, "otaflash station").
enum StationEvents {
    /// One of each, for the schema's tests (`EventCatalog`).
    static var examples: [any JSONEvent] {
        [Station(station: "line-3", ledger: "/var/lib/otaflash/ledger.sqlite", adapters: ["hci0", "hci1"], perAdapter: 4, parallel: 8,
                 retries: 2, retryBackoff: 30, simulator: false),
         Retry(device: "C0:FF:EE:00:00:01", attempt: 2, after: 30, error: "connection"),
         Quarantined(device: "C0:FF:EE:00:00:01", attempts: 3, error: "connection", message: "connecting to C0:FF:EE:00:00:01 failed"),
         Summary(StationRun.Counts(done: 90, alreadyDone: 3, failed: 4, quarantined: 1), hours: 0.5, exitCode: .success),
         LedgerState(state: "answers", message: "the ledger answers again after 31.2 s", sent: 4)]
    }

    /// The shared ledger went away (`unreachable`), or answers again (`answers`, with what the outbox sent).
    struct LedgerState: JSONEvent {
        static let name = "ledger"
        var state: String
        var message: String
        var sent: Int
    }

    /// The station's settings, once, after `start`.
    struct Station: JSONEvent {
        static let name = "station"
        var station: String
        var ledger: String
        var adapters: [String]
        var perAdapter: Int
        var parallel: Int
        var retries: Int
        var retryBackoff: Double
        var simulator: Bool
    }

    /// A device's attempt failed; it is tried again after a backoff.
    struct Retry: JSONEvent {
        static let name = "retry"
        var device: String
        /// The attempt to come.
        var attempt: Int
        /// Seconds until then.
        var after: Double
        var error: String
    }

    /// A device that failed every attempt: left alone for the rest of the shift.
    struct Quarantined: JSONEvent {
        static let name = "quarantined"
        var device: String
        var attempts: Int
        var error: String
        var message: String
    }

    /// The shift's last line.
    struct Summary: JSONEvent {
        static let name = "summary"
        var done: Int
        var alreadyDone: Int
        var failed: Int
        var quarantined: Int
        var missed: Int
        var held: Int
        var seenElsewhere: Int
        var hours: Double
        var devicesPerHour: Double
        var exitCode: Int

        init(_ c: StationRun.Counts, hours: Double, exitCode: ExitCode) {
            done = c.done
            alreadyDone = c.alreadyDone
            failed = c.failed
            quarantined = c.quarantined
            missed = c.missed
            held = c.held
            seenElsewhere = c.seenElsewhere
            self.hours = (hours * 1000).rounded() / 1000
            devicesPerHour = hours > 0 ? (Double(c.done) / hours * 10).rounded() / 10 : 0
            self.exitCode = Int(exitCode.rawValue)
        }
    }
}
