import ArgumentParser
import Foundation
import GATT
import Ledger
import LineServer
import OTA
import OTACommandLine
import Simulator
import Synchronization

/// `otaflash station`: an unattended station for a shift (docs/PRODUCTION.md, "A station").
struct Station: AsyncParsableCommand {
    /// How long a station that ends holding records nowhere else (its outbox's disk full) waits
    /// for the ledger to take them (docs/LEDGER.md, "When the server goes away").
    static let strandedWait: Duration = .seconds(600)

    /// How often a station writes its heartbeat to the ledger (docs/LINE.md): a dashboard shows it
    /// dead once its last beat is three of these old.
    static let heartbeatInterval: Duration = .seconds(2)

    static let configuration = CommandConfiguration(
        commandName: "station",
        abstract: "Run an unattended station for a shift: flash every matching device that comes into range, once.",
        discussion: """
            The station scans without end on its adapters (--adapter hci0,hci1) for devices that advertise the \
            image's update service (and match --name-prefix and --min-rssi), and flashes each one the ledger does \
            not already show done with this image: --per-adapter at a time on each adapter, --parallel in all. \
            Before a device is flashed it is claimed in the ledger (--claim-lease), so stations that share a \
            PostgreSQL ledger (--ledger postgres://…) never both flash it. A device that fails is tried again \
            after --retry-backoff seconds (doubling each time), --retries times, then quarantined: left alone and \
            listed until the station restarts with the ledger showing it still failed.

            On a terminal: one screen with the counts (done, failed, quarantined, in progress, devices per hour), \
            the devices in progress and the last failures with their reasons. --json streams a batch's events, \
            each device's `done` as it ends, plus `held`, `retry` and `quarantined` (docs/EVENTS.md). \
            Ctrl-C, SIGTERM or SIGHUP end the shift: every device stops after its current write, its record is \
            written, and the station exits 0. Started again, it picks up where it was: the ledger says which \
            devices are done, and none is flashed twice.

            With --simulator it runs on a simulated line (--sim-devices, --sim-arrivals, --sim-dwell, --sim-fail) \
            on virtual time, and needs --ledger PATH; it ends when the last device has left. The simulated \
            peripheral's options (--sim-*): `otaflash help simulator`.

            Examples:
              otaflash station --adapter hci0,hci1 --per-adapter 4 --station line-3 \\
                  --operator ana app.bin
              otaflash station --ledger 'postgres://line@db/otaflash' --station line-3 \\
                  --name-prefix SENSOR app.bin
              otaflash station --simulator --ledger shift.sqlite --sim-devices 200 \\
                  --sim-fail gone:0.02 firmware-samples/seeded-4k.bin
              otaflash ledger --ledger shift.sqlite --summary
            """
    )

    @OptionGroup var flash: Flash

    @Option(name: .customLong("retry-backoff"), parsing: .unconditional, help: Ranges.retryBackoff.help("Seconds before a failed device is tried again, doubling for each further retry (at most an hour)", valueName: "seconds"))
    var retryBackoff: Double = 30

    @Option(name: .customLong("metrics"), help: ArgumentHelp("Serve Prometheus metrics at http://HOST:PORT/metrics while the shift runs (port 1-65535; docs/LINE.md)", valueName: "host:port"))
    var metrics: String?

    @OptionGroup(title: "When a postgres:// ledger cannot be reached") var whenDown: LedgerDownOptions

    @OptionGroup(title: "Simulated line (with --simulator)") var line: LineOptions

    /// `flash`'s options a station refuses (`validate()`): its help leaves them out.
    static let refusedOptions = Set(["--device", "--devices-file", "--scan", "--count", "--sim-device-fault", "--no-ledger"]
                                    + ProtocolCommandLine.all.compactMap(\.state?.option))

    /// `station`'s help without the options it refuses, and without the simulated peripheral's
    /// (`otaflash help simulator`), as `flash --help`.
    static func shortened(_ help: String) -> String {
        let simulator = SimulatorTopic.optionNames
        return HelpText(help).removing { entry in entry.names.contains { refusedOptions.contains($0) || simulator.contains($0) } }
    }

    mutating func validate() throws {
        try Ranges.retryBackoff.check(retryBackoff)
        let batch = flash.batch
        for (given, option) in [(!flash.target.device.isEmpty, "--device"), (batch.devicesFile != nil, "--devices-file"), (batch.scan, "--scan"),
                                (batch.count != nil, "--count"), (!batch.simDeviceFault.isEmpty, "--sim-device-fault")] where given {
            throw ValidationError("\(option) lists a batch's devices; a station flashes every matching device it finds: choose them with --name-prefix and --min-rssi")
        }
        if let option = flash.keptState?.keeper.option {
            throw ValidationError("\(option) keeps one simulated device; a station's simulated line is made by --sim-devices, --sim-arrivals, --sim-dwell and --sim-fail")
        }
        if flash.records.noLedger {
            throw ValidationError("--no-ledger: a station keeps its books in the ledger, which also tells it which devices are done; drop --no-ledger")
        }
        if flash.target.simulator.enabled, flash.records.ledger == nil {
            throw ValidationError("--simulator: a simulated line is recorded only in a ledger you name: add --ledger PATH")
        }
        try line.check(simulator: flash.target.simulator.enabled)
        try Ranges.maxUnconfirmed.check(whenDown.maxUnconfirmed)
        if let metrics {
            do { _ = try ListenAddress(metrics, option: "--metrics") } catch { throw ValidationError(error.message) }
        }
    }

    func run() async throws {
        let printer = EventPrinter(mode: flash.output.mode, bars: false, live: false)
        do {
            try await shift(printer)
        } catch let failure as CLIFailure {
            if failure.reported { throw failure }
            printer.json(FlashEvents.Done(failure: failure, device: nil, adapter: flash.target.adapter))
            throw failure
        }
    }

    private func shift(_ printer: EventPrinter) async throws {
        try flash.checkOutputPaths()
        let plan = try FlashPlan.load(path: flash.image, flash.request)
        try flash.refuseOptionsThatDoNotApply(to: plan)
        let book = try flash.openRecords(plan: plan, printer: printer, skipsDone: true, whenDown: whenDown)
        try await book.posting { try await shift(plan: plan, book: book, printer) }
    }

    /// The shift itself, with the ledger and the run's records open.
    private func shift(plan: FlashPlan, book: RunRecords, _ printer: EventPrinter) async throws {
        guard let ledger = book.ledger else { throw CLIFailure(.usage, "a station needs a ledger: give --ledger PATH") }
        // Started again, the station sends what its outbox kept before it claims anything.
        let unsent = await (ledger as? SpoolingLedger)?.unsent ?? 0
        var startsDown: String?
        do {
            try await ledger.prepare(station: book.station)
            if unsent > 0 { printer.note("the outbox \((ledger as? SpoolingLedger)?.outbox.path ?? ""): \(unsent) records and releases sent to the ledger") }
        } catch {
            guard book.whenDown?.spool == true, error.kind == .unreachable || error.kind == .locked else { throw CLIFailure(.ledgerFailed, error.message) }
            startsDown = error.message
        }
        let simulated = flash.target.simulator.enabled
        let source: any LineSource = simulated
            ? SimulatedLine(line.population(seed: flash.target.simulator.seed), scanDwell: SimulatedCentral.scanDwell)
            : RadioLine(centrals: try await flash.adapterCentrals(),
                        filter: ScanFilter(serviceUUIDs: [plan.profile.serviceUUID], namePrefix: flash.batch.namePrefix, minimumRSSI: flash.batch.minRSSI),
                        window: Ranges.scanWindow.duration(flash.batch.scanWindow))
        let settings = StationRun.Settings(
            station: book.station, image: book.image, perAdapter: flash.batch.perAdapter, parallel: flash.batch.parallel,
            retries: flash.batch.retries, backoff: retryBackoff, lease: flash.records.claimLease, simulated: simulated,
            options: try flash.batchOptions(plan: plan, book: book, perAdapter: flash.batch.perAdapter, retries: 0),
            passkeys: try flash.pairing.answers.passkeys())
        printer.json(FlashEvents.Start(device: nil, image: flash.image, size: plan.size, crc32: plan.crc32, simulator: simulated, protocol: plan.profile.name))
        printer.json(StationEvents.Station(station: settings.station, ledger: ledger.location.redactingPassword, adapters: source.adapters,
                                           perAdapter: settings.perAdapter, parallel: settings.parallel, retries: settings.retries,
                                           retryBackoff: retryBackoff, simulator: simulated))
        let meter = metrics == nil ? nil : StationMetricsSource(ledger: ledger, book: book, source: source)
        let run = StationRun(flash: flash, plan: plan, book: book, ledger: ledger, source: source, settings: settings, printer: printer,
                             metrics: meter?.registry)
        meter?.attach(run)
        // Before any device: a port in use ends the station here (exit 2), not mid-shift.
        var listener: HTTPListener?
        if let address = metrics, let meter {
            do throws(ListenerError) {
                listener = try await HTTPListener.metrics(meter.registry, on: try ListenAddress(address, option: "--metrics"))
            } catch {
                throw CLIFailure(.usage, error.message)
            }
        }
        if let startsDown { run.ledgerWentDown(startsDown) }
        let heart = Heart(ledger: ledger, template: StationHeartbeat(station: settings.station, run: book.runID, startedAt: LedgerRecord.timestamp(Date()),
                                                               interval: Self.heartbeatInterval.seconds, adapters: source.adapters, inProgress: 0, claimsHeld: 0),
                          sample: { (run.counts.inProgress, book.claimsHeld) })
        let beating = Task { await heart.beat(every: Self.heartbeatInterval) }
        let interrupts = InterruptHandler { _ in run.stop("stopping: every device ends after its current write and gets its record (press Ctrl-C again to exit at once)…") }
        CLIContext.output.onFailure { run.stop(nil) }
        await run.run()
        interrupts.cancel()
        await listener?.stop()
        beating.cancel()
        await beating.value
        await heart.last()
        if let spooling = ledger as? SpoolingLedger {
            // Records only this process holds (the outbox's disk was full): the station does not
            // end with them while the ledger may still come back (their devices' claims are
            // re-armed for this station when it does). Asked each second, for at most
            // `strandedWait` (at least three leases); SIGINT, SIGTERM or SIGHUP abandons them.
            let waiting = await spooling.strandedDevices
            if !waiting.isEmpty {
                let limit = max(Self.strandedWait, Duration.milliseconds(Int64(flash.records.claimLease * 3000)))
                printer.warning("\(waiting.count) record\(waiting.count == 1 ? "" : "s") exist only in this process (the outbox's disk is full): waiting up to \(Int(limit.seconds)) s for the ledger to take \(waiting.count == 1 ? "it" : "them") (\(waiting.joined(separator: ", "))); Ctrl-C abandons \(waiting.count == 1 ? "it" : "them"), and another station may then flash \(waiting.count == 1 ? "that device" : "those devices") again")
                let wait = Task {
                    let giveUp = ContinuousClock.now + limit
                    while await !spooling.strandedDevices.isEmpty, ContinuousClock.now < giveUp {
                        if (try? await spooling.replay()) != nil { break }
                        do { try await Task.sleep(for: .seconds(1)) } catch { break }
                    }
                }
                let abandon = InterruptHandler { _ in wait.cancel() }
                _ = await wait.result
                abandon.cancel()
            }
            let stranded = await spooling.strandedDevices
            if !stranded.isEmpty {
                printer.warning("updated, with no record anywhere (the outbox's disk was full and the ledger did not answer): \(stranded.joined(separator: ", ")); their claims lapse after the lease, and another station may flash them again")
            }
            let unsent = await spooling.unsent
            if unsent > 0 {
                printer.note("the outbox \(spooling.outbox.path) keeps \(unsent) records and releases for the ledger: they are sent when this station starts again")
            }
        }
        let counts = run.counts
        let recordFailure = book.failure.withLock { $0 }
        let code: ExitCode = CLIContext.output.failure != nil ? .outputFailed : recordFailure?.code ?? .success
        printer.json(StationEvents.Summary(counts, hours: run.hours, exitCode: code))
        printer.result(counts.line(hours: run.hours, clock: run.clockName))
        if let recordFailure { throw recordFailure.markedReported() }
    }
}

/// The station's heartbeat in the ledger (`StationHeartbeat`): written every interval while the
/// shift runs, and once more, ended, when it is over. A beat the ledger does not take is left: the
/// dashboard then sees the station as silent, which it is from the ledger's side.
struct Heart: Sendable {
    let ledger: any LedgerStore
    let template: StationHeartbeat
    let sample: @Sendable () -> (inProgress: Int, claimsHeld: Int)

    func now(ended: Bool) -> StationHeartbeat {
        var beat = template
        (beat.inProgress, beat.claimsHeld) = sample()
        beat.ended = ended
        return beat
    }

    /// Beats until cancelled.
    func beat(every interval: Duration) async {
        while !Task.isCancelled {
            try? await ledger.beat(now(ended: false))
            do { try await Task.sleep(for: interval) } catch { return }
        }
    }

    /// The last beat: the shift is over.
    func last() async {
        try? await ledger.beat(now(ended: true))
    }
}

/// `--metrics`: the station's registry, its gauges read from the run at each scrape.
final class StationMetricsSource: Sendable {
    private final class Slot: Sendable {
        let run = Mutex<StationRun?>(nil)
    }

    let registry: StationMetrics
    private let slot: Slot

    init(ledger: any LedgerStore, book: RunRecords, source: any LineSource) {
        let slot = Slot()
        self.slot = slot
        registry = StationMetrics {
            let counts = slot.run.withLock { $0?.counts }
            return StationMetrics.Gauges(inProgress: counts?.inProgress ?? 0, claimsHeld: book.claimsHeld, adaptersUp: source.adaptersUp,
                                         outboxDepth: await (ledger as? SpoolingLedger)?.unsent)
        }
    }

    func attach(_ station: StationRun) { slot.run.withLock { $0 = station } }
}

/// What a station does while its `postgres://` ledger cannot be reached (docs/LEDGER.md, "When
/// the server goes away").
struct LedgerDownOptions: ParsableArguments {
    enum Mode: String, ExpressibleByArgument, CaseIterable {
        case spool, stop
    }

    @Option(name: .customLong("when-ledger-down"), help: ArgumentHelp("spool: keep the shift going, records kept in the station's outbox and sent when the ledger answers, no device started until it does; stop: end the shift once the devices in flight end (exit 18)", valueName: "spool|stop"))
    var mode: Mode = .spool

    @Option(name: .customLong("max-unconfirmed"), parsing: .unconditional, help: Ranges.maxUnconfirmed.help("Devices in flight that go on while their claims cannot be renewed, each until a third of its lease is left; the others stop after their current write (default 8)", valueName: "n"))
    var maxUnconfirmed: Int = 8

    @Option(name: .customLong("outbox"), help: ArgumentHelp("The station's outbox, a SQLite ledger on its own disk (default: $XDG_STATE_HOME/otaflash/outbox-STATION.sqlite)", valueName: "path"),
            completion: .file(extensions: ["sqlite"]))
    var outbox: String?

    init() {}

    /// With a `postgres://` ledger: the ledger with this station's outbox; nil for a file.
    func wrap(_ ledger: any LedgerStore, station: String) throws(CLIFailure) -> (any LedgerStore)? {
        guard ledger is PostgresLedger else { return nil }
        let safe = String(station.map { $0.isLetter || $0.isNumber || "._-".contains($0) ? $0 : "_" })
        let path = outbox ?? (Ledger.defaultPath() as NSString).deletingLastPathComponent + "/outbox-\(safe).sqlite"
        do {
            return try SpoolingLedger(shared: ledger, outbox: try Outbox(path: path))
        } catch {
            throw CLIFailure(.ledgerFailed, "the station's outbox: \(error.message)")
        }
    }

    var policy: RunRecords.WhenLedgerDown { RunRecords.WhenLedgerDown(spool: mode == .spool, maxUnconfirmed: maxUnconfirmed) }
}

extension Ranges {
    static let maxUnconfirmed = Bounds("--max-unconfirmed", 0...64)
    static let retryBackoff = Bounds("--retry-backoff", 0...3600.0, unit: " seconds")
    static let simDevices = Bounds("--sim-devices", 1...1_000_000)
    static let simArrivals = Bounds("--sim-arrivals", 1...1_000_000.0, unit: " per hour")
    static let simDwell = Bounds("--sim-dwell", 1...day, unit: " seconds")
    static let simFailShare = Bounds("--sim-fail share", 0...1.0)
}

/// The simulated line a station meets with --simulator (`Population`).
struct LineOptions: ParsableArguments {
    @Option(name: .customLong("sim-devices"), parsing: .unconditional, help: Ranges.simDevices.help("Devices that come along the line in the shift (default 100)", valueName: "n"))
    var devices: Int?

    @Option(name: .customLong("sim-arrivals"), parsing: .unconditional, help: Ranges.simArrivals.help("Mean arrivals per hour, at random (Poisson) times (default 600)", valueName: "per-hour"))
    var arrivals: Double?

    @Option(name: .customLong("sim-dwell"), parsing: .unconditional, help: Ranges.simDwell.help("Seconds a device stays in range waiting to be flashed before it leaves (default 600)", valueName: "seconds"))
    var dwell: Double?

    @Option(name: .customLong("sim-fail"), help: ArgumentHelp("A share of the devices that fail: MODE:SHARE, MODE one of no-ota-service, small-slot, gone (every attempt fails), flaky (the first attempt fails), SHARE 0 to 1; the shares add up to at most 1. Repeatable.", valueName: "mode:share"))
    var fail: [String] = []

    init() {}

    func check(simulator: Bool) throws(ValidationError) {
        if !simulator, let given = [(devices != nil, "--sim-devices"), (arrivals != nil, "--sim-arrivals"), (dwell != nil, "--sim-dwell"),
                                    (!fail.isEmpty, "--sim-fail")].first(where: \.0) {
            throw ValidationError("\(given.1) describes a simulated line: add --simulator, or drop it")
        }
        try Ranges.simDevices.check(devices)
        try Ranges.simArrivals.check(arrivals)
        try Ranges.simDwell.check(dwell)
        var total = 0.0
        for spec in fail {
            guard let (_, share) = Self.parse(spec) else {
                throw ValidationError("--sim-fail takes MODE:SHARE with MODE \(Population.Fault.allCases.map(\.rawValue).joined(separator: ", ")) and SHARE 0 to 1, got '\(spec)'")
            }
            total += share
        }
        if total > 1 { throw ValidationError("--sim-fail shares add up to \(total.optionText), more than 1") }
    }

    static func parse(_ spec: String) -> (Population.Fault, Double)? {
        let parts = spec.split(separator: ":", maxSplits: 1).map(String.init)
        guard parts.count == 2, let fault = Population.Fault(rawValue: parts[0]), let share = Double(parts[1]),
              Ranges.simFailShare.range.contains(share) else { return nil }
        return (fault, share)
    }

    func population(seed: UInt64) -> Population {
        var faults: [Population.Fault: Double] = [:]
        for (fault, share) in fail.compactMap(Self.parse) { faults[fault, default: 0] += share }
        return Population(devices: devices ?? 100, arrivalsPerHour: arrivals ?? 600, dwell: .milliseconds(Int64((dwell ?? 600) * 1000)),
                          faults: faults, seed: seed)
    }
}

// MARK: where devices come from

/// A device seen in range: where, and (on a simulated line) which member of the population.
struct Sighting: Sendable {
    let address: DeviceAddress
    let adapter: String?
    let central: (any GATTCentral)?
    let member: Population.Member?
}

/// What a station scans: radios, or a simulated line on virtual time.
protocol LineSource: AnyObject, Sendable {
    var adapters: [String] { get }
    /// Adapters whose last scan worked (`--metrics`' `otaflash_adapters_up`).
    var adaptersUp: Int { get }
    /// The devices in range now (a scan of the radios waits its window; cancelled, it ends early).
    func scan(now: Duration) async -> (seen: [Sighting], problem: String?)
}

/// The adapters' radios: each pass scans all of them for the window, at once.
final class RadioLine: LineSource {
    let centrals: [(String?, any GATTCentral)]
    let filter: ScanFilter
    let window: Duration

    init(centrals: [(String?, any GATTCentral)], filter: ScanFilter, window: Duration) {
        self.centrals = centrals
        self.filter = filter
        self.window = window
    }

    var adapters: [String] { centrals.map { $0.0 ?? "default" } }

    /// Adapters whose last scan failed.
    private let failing = Mutex<Set<String>>([])
    var adaptersUp: Int { centrals.count - failing.withLock { $0.count } }

    func scan(now: Duration) async -> (seen: [Sighting], problem: String?) {
        let (filter, window) = (filter, window)
        return await withTaskGroup(of: (String?, any GATTCentral, Result<[Advertisement], GATTError>).self) { group in
            for (adapter, central) in centrals {
                group.addTask {
                    do throws(GATTError) { return (adapter, central, .success(try await central.scan(filter: filter, timeout: window))) }
                    catch { return (adapter, central, .failure(error)) }
                }
            }
            var best: [DeviceAddress: (Int, Sighting)] = [:]
            var problem: String?
            var failed: Set<String> = []
            for await (adapter, central, result) in group {
                switch result {
                case .success(let ads):
                    for ad in ads where (best[ad.address]?.0 ?? .min) < (ad.rssi ?? .min) {
                        best[ad.address] = (ad.rssi ?? .min, Sighting(address: ad.address, adapter: adapter, central: central, member: nil))
                    }
                case .failure(let error):
                    problem = "scanning on \(adapter ?? "the default adapter") failed: \(error.message)"
                    failed.insert(adapter ?? "default")
                }
            }
            failing.withLock { [failed] in $0 = failed }
            return (best.values.sorted { $0.0 > $1.0 }.map(\.1), problem)
        }
    }
}

/// A simulated line: the population's members in range at a virtual time.
final class SimulatedLine: LineSource, @unchecked Sendable {
    // Used by the station's loop only, one call at a time.
    private var arrivals: Population.Arrivals
    /// In order of arrival (and so of leaving: every device stays the same time).
    private var inRange: [Population.Member] = []
    private let dwell: Duration

    init(_ population: Population, scanDwell: Duration) {
        arrivals = population.arrivals()
        dwell = scanDwell
    }

    var adapters: [String] { ["sim"] }
    var adaptersUp: Int { 1 }

    func scan(now: Duration) async -> (seen: [Sighting], problem: String?) {
        while let next = arrivals.nextArrival, next <= now, let member = arrivals.next() { inRange.append(member) }
        return (inRange.map { Sighting(address: $0.address, adapter: "sim", central: nil, member: $0) }, nil)
    }

    /// Members whose time in range is over at `now`, except those `staying` (being flashed, or
    /// held by another station): they leave.
    func leave(at now: Duration, staying: (DeviceAddress) -> Bool) -> [Population.Member] {
        guard let first = inRange.first, first.leaves <= now else { return [] }
        let gone = inRange.filter { $0.leaves <= now && !staying($0.address) }
        let left = Set(gone.map(\.address))
        inRange.removeAll { left.contains($0.address) }
        return gone
    }

    /// When the next device arrives; nil once the whole population has.
    var nextArrival: Duration? { arrivals.nextArrival }
    var isEmpty: Bool { inRange.isEmpty && arrivals.nextArrival == nil }
}
