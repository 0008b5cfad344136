import ArgumentParser
import BlueZ
import GATT
import Ledger
import Logging
import OTA
import OTACommandLine
import OTAWire
import Simulator

/// The device a command connects to and the adapter it goes through (`flash`, `info`).
public struct ConnectionOptions: ParsableArguments {
    @Option(name: .long, help: ArgumentHelp("Bluetooth address of the device, e.g. AA:BB:CC:DD:EE:FF (flash: repeat it to flash several).", valueName: "address"))
    public var device: [String] = []

    @Option(name: .long, help: ArgumentHelp("Bluetooth adapter to use (default: the first powered one).", valueName: "hciN"), completion: .adapters)
    public var adapter: String?

    @Option(name: .customLong("connect-timeout"), parsing: .unconditional, help: Ranges.connectTimeout.help("Seconds to find and connect to the device", valueName: "seconds"))
    public var connectTimeout: Double = 20

    public init() {}

    public func validate() throws {
        for device in device where DeviceAddress(device) == nil {
            throw ValidationError("invalid device address '\(device)': expected six hex pairs like AA:BB:CC:DD:EE:FF")
        }
        try Ranges.connectTimeout.check(connectTimeout)
    }

    /// The one device address (the simulator has a default one).
    func address(simulator: Bool) throws(CLIFailure) -> DeviceAddress {
        if device.count > 1 {
            throw CLIFailure(.usage, "this command takes one --device, got \(device.count)")
        }
        if let device = device.first, let address = DeviceAddress(device) { return address }
        if simulator { return SimulatorOptions.defaultAddress }
        throw CLIFailure(.usage, "no device given: pass --device AA:BB:CC:DD:EE:FF, or --simulator to use the built-in simulated peripheral")
    }
}

/// Options of the commands that flash: the device, the simulated peripheral and the transport.
public struct TargetOptions: ParsableArguments {
    @OptionGroup public var connection: ConnectionOptions

    @OptionGroup(title: "Simulated peripheral")
    public var simulator: SimulatorOptions

    @OptionGroup(title: "BlueZ transport") public var bluez: BlueZTransportOptions

    public init() {}

    public var device: [String] { connection.device }
    public var adapter: String? { connection.adapter }
    public var connectTimeout: Double { connection.connectTimeout }

    /// The device address (the simulator has a default one).
    func address() throws -> DeviceAddress {
        try connection.address(simulator: simulator.enabled)
    }
}

/// Output options shared by commands.
public struct OutputOptions: ParsableArguments {
    @Flag(name: .long, help: "Print JSON Lines events on stdout, one object per line with an \"event\" field.")
    public var json = false

    @Flag(name: .shortAndLong, help: "Print nothing but errors.")
    public var quiet = false

    @Flag(name: .shortAndLong, help: "Log what happens on the link (debug level) to stderr.")
    public var verbose = false

    public init() {}

    public func validate() throws {
        if json && quiet { throw ValidationError("--json and --quiet cannot be used together") }
    }

    var mode: OutputMode { json ? .json : quiet ? .quiet : .human }

    /// A logger for the libraries: debug to stderr with --verbose, silent otherwise.
    func logger(_ label: String) -> Logger {
        guard verbose else { return Logger(label: label, factory: { _ in SwiftLogNoOpLogHandler() }) }
        var logger = Logger(label: label, factory: { StreamLogHandler.standardError(label: $0) })
        logger.logLevel = .debug
        return logger
    }
}

struct Flash: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Send a firmware image to a device, have it verified, and activate it (the default command).",
        discussion: ProtocolTexts.flashDescription(ProtocolCommandLine.all) + """
            An option that does not apply to the image's protocol is refused (exit 2).

            The simulated peripheral's options (--sim-*): `otaflash help simulator`.

            Examples:
              otaflash --device AA:BB:CC:DD:EE:FF app.bin
              otaflash --device AA:BB:CC:DD:EE:FF app_dfu_package.zip
              otaflash --device AA:BB:CC:DD:EE:FF zephyr.signed.bin
              otaflash --device AA:BB:CC:DD:EE:FF --chip esp32c3 build/app.bin
              otaflash --simulator --json firmware-samples/seeded-256k.bin
              otaflash --simulator --sim-drop-rate 0.01 --sim-disconnect-at 100000 app.hex

            \(Flash.exitCodesTitle)
            \(ExitCode.helpTable(ProtocolCommandLine.all))
            """
    )

    @Argument(help: ArgumentHelp(ProtocolTexts.imageArgument(ProtocolCommandLine.all), valueName: "image"),
              completion: .file(extensions: ProtocolTexts.imageExtensions(ProtocolCommandLine.all)))
    var image: String

    @Option(name: .customLong("protocol"), help: ArgumentHelp(ProtocolTexts.protocolOption(ProtocolCommandLine.all), valueName: "name"))
    var protocolChoice: ProtocolChoice = .auto

    @OptionGroup var target: TargetOptions
    @OptionGroup var output: OutputOptions
    @OptionGroup(title: "Several devices") var batch: BatchCLIOptions

    @OptionGroup(title: "Pairing") var pairing: PairingOptions

    @OptionGroup(title: "Records (docs/LEDGER.md)") var records: LedgerOptions

    @OptionGroup(title: "Results to a server (docs/EVENTS.md)") var post: PostResultsOptions

    /// Each protocol's own options (Protocols.swift).
    @OptionGroup var protocols: ProtocolOptions

    @Flag(name: .customLong("no-activate"), help: ArgumentHelp(ProtocolTexts.noActivate(ProtocolCommandLine.all)))
    var noActivate = false

    @Flag(name: .long, help: ArgumentHelp(ProtocolTexts.restart(ProtocolCommandLine.all)))
    var restart = false

    @Option(name: .customLong("reply-timeout"), parsing: .unconditional, help: Ranges.replyTimeout.help("Seconds to wait for the device's reply to a command", valueName: "seconds"))
    var replyTimeout: Double = 5

    @Option(name: .customLong("verify-timeout"), parsing: .unconditional, help: Ranges.verifyTimeout.help("Seconds to wait for the device to verify the image", valueName: "seconds"))
    var verifyTimeout: Double = 30

    @Option(name: .customLong("activate-timeout"), parsing: .unconditional, help: Ranges.activateTimeout.help("Seconds to wait for the device to accept activation", valueName: "seconds"))
    var activateTimeout: Double = 10

    @Option(name: .customLong("journal-dir"), help: ArgumentHelp("Where confirmed progress is recorded per device and image (default: $XDG_STATE_HOME/otaflash/journal).", valueName: "dir"), completion: .directory)
    var journalDir: String?

    @Option(name: .customLong("reconnect-window"), parsing: .unconditional, help: Ranges.reconnectWindow.help("Seconds to keep reconnecting after the link is lost; 0: do not reconnect", valueName: "seconds"))
    var reconnectWindow: Double = 60

    @Option(name: .customLong("stall-timeout"), parsing: .unconditional, help: Ranges.stallTimeout.help("Seconds of connected time without new data confirmed before the transfer gives up (never below --reply-timeout)", valueName: "seconds"))
    var stallTimeout: Double = 30

    var protocolName: String { protocolChoice.name }

    /// `--image-version` as given.
    var imageVersionText: String? { protocols.protocolGroups.lazy.compactMap(\.imageVersionText).first }

    mutating func validate() throws {
        try Ranges.replyTimeout.check(replyTimeout)
        try Ranges.verifyTimeout.check(verifyTimeout)
        try Ranges.activateTimeout.check(activateTimeout)
        try Ranges.reconnectWindow.check(reconnectWindow)
        try Ranges.stallTimeout.check(stallTimeout)
        for group in protocols.protocolGroups {
            try group.check(protocolName: protocolName, noActivate: noActivate, batch: batch.isBatch(devices: target.device))
        }
        try target.simulator.device.check(protocols.protocolGroups)
        if batch.count != nil, !target.simulator.enabled {
            throw ValidationError("--count needs --simulator; for real devices use --device (repeated), --devices-file or --scan")
        }
    }

    func run() async throws {
        let isBatch = batch.isBatch(devices: target.device)
        let printer = EventPrinter(mode: output.mode, bars: !isBatch, live: isBatch)
        do {
            try await flash(printer)
        } catch let failure as CLIFailure {
            // A device's `done` or a batch's `summary`, once printed, stays the last line.
            if failure.reported { throw failure }
            let single = batch.isBatch(devices: target.device) ? nil : try? target.address()
            printer.json(FlashEvents.Done(failure: failure, device: single?.description, adapter: target.adapter))
            throw failure
        }
    }

    /// The steps of a run: everything that can be checked is checked before any radio time.
    private func flash(_ printer: EventPrinter) async throws {
        try checkOutputPaths()
        let plan = try FlashPlan.load(path: image, request)
        try refuseOptionsThatDoNotApply(to: plan)
        let book = try openRecords(plan: plan, printer: printer)
        try await book.posting {
            try await book.prepare()
            if batch.isBatch(devices: target.device) {
                try await flashBatch(plan: plan, book: book, printer: printer)
            } else {
                try await flashOne(plan: plan, book: book, printer: printer)
            }
        }
    }

    /// Checks every path the run writes to, before any radio time.
    func checkOutputPaths() throws {
        if let logDir = batch.logDir { try OutputPaths.prepareDirectory(logDir, option: "--log-dir") }
        if let kept = keptState { try OutputPaths.prepareDirectory(kept.directory, option: kept.keeper.option) }
        if let journalDir { try OutputPaths.prepareDirectory(journalDir, option: "--journal-dir") }
    }

    /// What the run keeps of each device (ledger, report, logs), checked and opened before any radio time.
    func openRecords(plan: FlashPlan, printer: EventPrinter, skipsDone: Bool = false, whenDown: LedgerDownOptions? = nil) throws -> RunRecords {
        let ledger = try records.open(simulator: target.simulator.enabled)
        let spooling = try ledger.flatMap { ledger throws(CLIFailure) in try whenDown?.wrap(ledger, station: records.stationName) }
        return RunRecords(ledger: spooling ?? ledger, options: records,
                   image: try RunRecords.describe(imageAt: image, version: imageVersionText ?? plan.imageVersion?.description),
                   protocolName: plan.profile.name,
                   report: try batch.report.map { path throws(CLIFailure) in try ReportFile(path: path, printer: printer) },
                   results: try post.open(ledger: resultsLedger, printer: printer),
                   logs: batch.logDir.map { DeviceLogs(directory: $0, printer: printer) }, printer: printer, skipsDone: skipsDone,
                   whenDown: spooling == nil ? nil : whenDown?.policy)
    }

    /// The ledger file the results' outbox sits beside by default (`ResultsOutbox.defaultDirectory`).
    var resultsLedger: String? {
        if records.noLedger { return nil }
        return records.ledger ?? (target.simulator.enabled ? nil : Ledger.defaultPath())
    }

    private func flashBatch(plan: FlashPlan, book: RunRecords, printer: EventPrinter) async throws {
        // Each simulated device of a batch lives for the run only: a state folder would be ignored.
        if let option = keptState?.keeper.option {
            throw CLIFailure(.usage, "\(option) keeps one simulated device between runs; a batch's simulated devices live for the run only: drop \(option), or flash one device")
        }
        printer.note("\(image): \(formatBytes(plan.size)), CRC32 \(hex32(plan.crc32)); \(plan.update.reason)\(plan.update.contents)")
        for warning in plan.warnings { printer.note("warning: \(warning)") }
        printer.json(FlashEvents.Start(device: nil, image: image, size: plan.size, crc32: plan.crc32,
                                       simulator: target.simulator.enabled, protocol: plan.profile.name))
        let targets = try await batchTargets(plan: plan, printer: printer)
        try await runBatch(targets, plan: plan, book: book, printer: printer)
    }

    private func flashOne(plan: FlashPlan, book: RunRecords, printer: EventPrinter) async throws {
        let address = try target.address()
        var pairingPolicy = pairing.policy
        pairingPolicy.credentials = pairing.answers.credentials(for: address, file: try pairing.answers.passkeys())
        printer.note("\(image): \(formatBytes(plan.size)), CRC32 \(hex32(plan.crc32))")
        for warning in plan.warnings { printer.note("warning: \(warning)") }
        let (central, simulated) = try connection(for: plan, address: address, pairs: pairingPolicy.pair)
        switch await book.begin(address.description) {
        case nil: break
        case .failed(let refusal)?: throw CLIFailure(refusal)
        case .skipped?, .ok?:
            // The ledger shows it done with this image: said by `begin`, and ended with its own `done`.
            await book.finish(BatchOutcome(device: address.description, adapter: target.adapter, result: .skipped(nil),
                                           attempts: 0, seconds: 0, firmwareBefore: nil, firmwareAfter: nil))
            return
        }
        var updater = try updater(for: plan, pairing: pairingPolicy)
        updater.readsIdentity = book.ledger != nil
        let started = central.clock.now
        var (outcome, attempts) = await update(with: updater, central: central, address: address,
                                               events: events(plan: plan, address: address, book: book, printer: printer), printer: printer)
        if case .success(let result) = outcome.result, result.activated, !result.skipped,
           let afterActivation = ProtocolCommandLine.named(plan.profile.name)?.afterActivation {
            outcome.result = await afterActivation(AfterActivation(
                result: result, after: outcome.after, profile: plan.profile, central: central, address: address, options: protocols.protocolGroups,
                connectTimeout: Ranges.connectTimeout.duration(target.connectTimeout), replyTimeout: Ranges.replyTimeout.duration(replyTimeout),
                note: { printer.note($0) }))
        }
        if let simulated { try finish(simulated, address: address, printer: printer) }
        try await report(outcome, plan: plan, address: address, seconds: (central.clock.now - started).seconds, attempts: attempts,
                         book: book, printer: printer)
    }

    /// The central that reaches the device at `address`, and the simulated device when it is one
    /// (restored from the folder a protocol's options name, `--sim-state`: a native device, the only
    /// one that keeps state).
    private func connection(for plan: FlashPlan, address: DeviceAddress, pairs: Bool) throws -> (any GATTCentral, SimulatedDevice?) {
        let simulator = target.simulator
        guard simulator.enabled else { return (target.bluezCentral().refusingStackPairing(!pairs), nil) }
        if let kept = keptState { return try simulator.makeCentral(address: address, kept: kept, options: protocols.protocolGroups) }
        let device = try simulator.device(for: plan, config: simulator.deviceConfig(address: address), options: protocols.protocolGroups)
        return (SimulatedCentral(devices: [device], clock: simulator.clock), device)
    }

    /// The update of one device as the options describe it.
    private func updater(for plan: FlashPlan, pairing: PairingPolicy) throws -> DeviceUpdater {
        // A simulated device without --sim-state forgets everything when the process ends: no journal.
        let keepsState = !target.simulator.enabled || keptState != nil
        return DeviceUpdater(plan: plan.update, registry: .cli(for: request), protocolName: protocolName, config: try engineConfig(for: plan),
                             timeouts: sessionTimeouts,
                             reconnect: ReconnectPolicy(window: Ranges.reconnectWindow.duration(reconnectWindow), seed: target.simulator.seed),
                             journal: keepsState ? JournalStore(directory: journalDir ?? JournalStore.defaultDirectory) : nil,
                             logger: output.logger("otaflash.session"), readsBack: plan.profile.readsBackAfterActivation,
                             pairing: pairing)
    }

    /// What the run prints and records as the update goes.
    private func events(plan: FlashPlan, address: DeviceAddress, book: RunRecords, printer: EventPrinter) -> @Sendable (DeviceUpdater.Event) -> Void {
        let (image, simulator) = (image, target.simulator.enabled)
        let labels = plan.parts.map { "\($0.label), \(formatBytes($0.firmware.size))" }
        let (size, crc32, protocolUsed) = (plan.size, plan.crc32, plan.profile.name)
        return { event in
            book.observe(event)
            switch event {
            case .identity:
                break
            case .prepared(_, let reason, let entry):
                printer.json(FlashEvents.Start(device: address.description, bootloader: entry?.address.description, image: image,
                                               size: size, crc32: crc32, simulator: simulator, protocol: protocolUsed))
                if let reason { printer.note(reason) }
                if let entry {
                    printer.note("\(address) ran its application and was moved into \(entry.mode); "
                                 + "it answers at \(entry.address)\(entry.name.map { " (advertising as '\($0)')" } ?? "")")
                }
            case .image(_, let index, let count, _):
                printer.note("image \(index + 1) of \(count): \(labels[index])")
            case .session(let event):
                printer.session(event)
            case .pairing(let device, let note):
                printer.note(note)
                printer.json(FlashEvents.Note(device: device, message: note))
            }
        }
    }

    /// Runs the update until it ends or Ctrl-C (or failed output) stops it, and removes the bonds
    /// it should whatever its result. A failure a new session can overcome (resumable) gets
    /// `--retries` more attempts, each going on where the last left the device, as in a batch.
    private func update(with updater: DeviceUpdater, central: any GATTCentral, address: DeviceAddress,
                        events: @escaping @Sendable (DeviceUpdater.Event) -> Void,
                        printer: EventPrinter) async -> (DeviceUpdater.Outcome, attempts: Int) {
        let retries = batch.singleDeviceRetries
        let work = Task { () async -> (DeviceUpdater.Outcome, attempts: Int) in
            var outcome = await updater.run(central: central, address: address, events: events)
            var attempts = 1
            while attempts <= retries, case .failure(let error) = outcome.result, error.resumable, error.code != .interrupted, !Task.isCancelled {
                let line = "attempt \(attempts) failed: \(error.message); trying again (--retries \(retries)), from where it left the device"
                printer.note(line)
                printer.json(FlashEvents.Note(device: address.description, message: line))
                attempts += 1
                outcome = await updater.run(central: central, address: address, from: outcome.progress, events: events)
            }
            outcome.leave(await updater.removeBonds(central: central, address: address, updateModeAddress: outcome.progress.entry?.address, events: events))
            return (outcome, attempts)
        }
        let interrupts = InterruptHandler { _ in
            printer.note("stopping after the current write (press Ctrl-C again to exit at once)…")
            work.cancel()
        }
        defer { interrupts.cancel() }
        CLIContext.output.onFailure { work.cancel() }
        return await work.value
    }

    /// Saves the simulated device (`--sim-state`), has each protocol check a device of its own (a
    /// native device with the C device library in lockstep: any difference ends the run) and
    /// says what it runs.
    private func finish(_ simulated: SimulatedDevice, address: DeviceAddress, printer: EventPrinter) throws {
        if let kept = keptState { try target.simulator.save(simulated, kept) }
        for registration in ProtocolCommandLine.all {
            guard let line = try registration.check(simulated) else { continue }
            printer.json(FlashEvents.Note(device: address.description, message: line))
            printer.note(line)
        }
        if let state = ProtocolCommandLine.all.lazy.compactMap({ $0.describe(simulated) }).first {
            printer.note("simulated device: \(state)")
        }
    }

    /// Records the device's outcome and prints its result lines.
    private func report(_ outcome: DeviceUpdater.Outcome, plan: FlashPlan, address: DeviceAddress, seconds: Double, attempts: Int,
                        book: RunRecords, printer: EventPrinter) async throws {
        let entered = outcome.progress.entry?.address
        let result: OTAResult
        switch outcome.result {
        case .success(let success):
            result = success
        case .failure(let error):
            // The same record and `done` line a batch keeps of a failed device.
            await book.finish(BatchOutcome(device: address.description, updateModeAddress: entered?.description,
                                           adapter: target.adapter, result: .failed(error), attempts: attempts,
                                           seconds: seconds, firmwareBefore: nil, firmwareAfter: nil))
            throw CLIFailure(error).markedReported()
        }
        // A single device is read back only where its protocol's activation is a reset (SMP); a batch always is.
        let after = outcome.after
        await book.finish(BatchOutcome(result, updateModeAddress: entered?.description, adapter: target.adapter,
                                       attempts: attempts, seconds: result.seconds, firmwareAfter: after?.firmwareVersion))
        // The device as given, and where its bootloader answered when it was moved there.
        let device = address.description + (entered.map { " (bootloader \($0))" } ?? "")
        if result.skipped {
            printer.result("\(device): skipped, it already runs \(result.firmwareBefore.map { "\($0)" } ?? "that version") "
                           + "(--skip-if-version); nothing sent")
        } else {
            let what = result.activated ? "verified and activated" : "verified (not activated)"
            printer.result("\(device): \(formatBytes(result.bytes)) \(what), CRC32 \(hex32(result.crc32)), "
                           + String(format: "%.1f s, ", result.seconds) + formatRate(result.throughput))
            if let after {
                printer.result("\(device) now runs \(after.firmwareVersion.map { "\($0)" } ?? "a version it does not tell"): \(after.stateText)")
            } else if plan.profile.readsBackAfterActivation, result.activated {
                printer.note("\(device) did not come back within --connect-timeout after its reset; check it with otaflash image list")
            }
        }
        try book.throwFirstFailure()
    }
}

extension GATTCentral {
    /// Without --pair the user gave no consent to pairing: a BlueZ central refuses the pairings
    /// its stack starts by itself and reports them (`BlueZCentral.refusesStackPairing`).
    func refusingStackPairing(_ refuses: Bool) -> any GATTCentral {
        guard var bluez = self as? BlueZCentral else { return self }
        bluez.refusesStackPairing = refuses
        return bluez
    }
}

extension Flash {
    var sessionTimeouts: SessionTimeouts {
        SessionTimeouts(connect: Ranges.connectTimeout.duration(target.connectTimeout), stall: Ranges.stallTimeout.duration(stallTimeout))
    }

    /// The engine's settings for `plan`: `--skip-if-version image` takes the version the image carries.
    func engineConfig(for plan: FlashPlan) throws -> EngineConfig {
        var config = engineConfig
        if batch.skipIfVersion == .imageOwn {
            guard let version = plan.imageVersion else {
                throw CLIFailure(.usage, "--skip-if-version image takes the version an image carries, and \(image) carries none (the version is read from \(ProtocolTexts.imageVersions(ProtocolCommandLine.all)) only); give the version, e.g. --skip-if-version 1.2.3")
            }
            config.skipIfVersion = version
        }
        return config
    }

    var engineConfig: EngineConfig {
        EngineConfig(activate: !noActivate, restart: restart,
                     replyTimeout: Ranges.replyTimeout.duration(replyTimeout), verifyTimeout: Ranges.verifyTimeout.duration(verifyTimeout),
                     activateTimeout: Ranges.activateTimeout.duration(activateTimeout),
                     skipIfVersion: batch.skipIfVersion.flatMap { if case .version(let v) = $0 { v } else { nil } })
    }
}
