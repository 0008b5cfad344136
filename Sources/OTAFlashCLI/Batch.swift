import ArgumentParser
import BlueZ
import Foundation
import GATT
import OTA
import OTACommandLine
import OTAWire
import Simulator
import Synchronization

/// Options for flashing many devices in one run.
public struct BatchCLIOptions: ParsableArguments {
    @Option(name: .customLong("devices-file"), help: ArgumentHelp("A file with one device address per line (LF or CRLF, a UTF-8 BOM is fine); # starts a comment.", valueName: "file"), completion: .file())
    public var devicesFile: String?

    @Flag(name: .long, help: "Flash every device that advertises the OTA service and matches --name-prefix/--min-rssi, seen within --scan-window.")
    public var scan = false

    @Option(name: .customLong("scan-window"), parsing: .unconditional, help: Ranges.scanWindow.help("Seconds to scan for devices with --scan", valueName: "seconds"))
    public var scanWindow: Double = 10

    @Option(name: .customLong("name-prefix"), help: "With --scan: only devices whose name starts with this.")
    public var namePrefix: String?

    @Option(name: .customLong("min-rssi"), parsing: .unconditional, help: Ranges.minRSSI.help("With --scan: only devices at least this strong", valueName: "dBm"))
    public var minRSSI: Int?

    @Option(name: .long, parsing: .unconditional, help: Ranges.count.help("With --simulator: flash this many simulated devices, C0:FF:EE:00:00:01 and up", valueName: "n"))
    public var count: Int?

    @Option(name: .long, parsing: .unconditional, help: Ranges.parallel.help("Devices flashed at once, over all adapters", valueName: "n"))
    public var parallel: Int = 4

    @Option(name: .customLong("per-adapter"), parsing: .unconditional, help: Ranges.perAdapter.help("Devices flashed at once on one adapter", valueName: "n"))
    public var perAdapter: Int = 4

    @Option(name: .customLong("retries"), parsing: .unconditional, help: Ranges.retries.help("Whole-session retries per device after its reconnects gave up or its image failed a check a new session can pass (default 1; a single --device: 0)", valueName: "n"))
    public var retriesOption: Int?

    /// `--retries` for each device of a batch (1 by default).
    public var retries: Int { retriesOption ?? 1 }
    /// `--retries` for a single device: none unless given (the run says what failed and how to go on).
    var singleDeviceRetries: Int { retriesOption ?? 0 }

    @Option(name: .customLong("log-dir"), help: ArgumentHelp("Write one JSON Lines log per device into this folder (closed as each device ends).", valueName: "dir"), completion: .directory)
    public var logDir: String?

    @Option(name: .customLong("skip-if-version"), help: ArgumentHelp(ProtocolTexts.skipIfVersion(ProtocolCommandLine.all), valueName: "version|image"))
    var skipIfVersion: SkipVersion?

    @Option(name: .long, help: ArgumentHelp("Append a CSV row per device to this file as each device ends (docs/EVENTS.md, \"The report\"); a new file gets a header.", valueName: "file"), completion: .file(extensions: ["csv"]))
    public var report: String?

    @Option(name: .customLong("sim-device-fault"), help: ArgumentHelp("Make simulated device N (1-based) fail: N:no-ota-service, N:small-slot or N:gone (its link drops and it never comes back). Repeatable.", valueName: "N:mode"))
    var simDeviceFault: [SimulatedDeviceFault] = []

    public init() {}

    public func validate() throws {
        try Ranges.parallel.check(parallel)
        try Ranges.perAdapter.check(perAdapter)
        try Ranges.retries.check(retriesOption)
        try Ranges.scanWindow.check(scanWindow)
        try Ranges.minRSSI.check(minRSSI)
        try Ranges.count.check(count)
    }

    /// True when these options ask for more than one device.
    func isBatch(devices: [String]) -> Bool {
        devices.count > 1 || devicesFile != nil || scan || count != nil
    }
}

/// Reads `--devices-file`: one address per line, `#` comments, blank lines ignored; lines may end
/// in LF or CRLF and the file may start with a UTF-8 byte order mark (a list saved on Windows).
func readDevicesFile(_ path: String) throws -> [DeviceAddress] {
    guard let data = FileManager.default.contents(atPath: path) else {
        throw CLIFailure(.usage, "cannot read the devices file \(path)")
    }
    var text = String(decoding: data, as: UTF8.self)
    if text.hasPrefix("\u{FEFF}") { text.removeFirst() }
    var out: [DeviceAddress] = []
    // "\r\n" is one Character in Swift: split on every line end, not on "\n" alone.
    for (n, raw) in text.split(omittingEmptySubsequences: false, whereSeparator: \.isNewline).enumerated() {
        let line = raw.split(separator: "#", maxSplits: 1, omittingEmptySubsequences: false).first.map { $0.trimmingCharacters(in: .whitespacesAndNewlines) } ?? ""
        if line.isEmpty { continue }
        guard let address = DeviceAddress(line) else {
            throw CLIFailure(.usage, "\(path):\(n + 1): '\(line)' is not a device address like AA:BB:CC:DD:EE:FF")
        }
        out.append(address)
    }
    guard !out.isEmpty else { throw CLIFailure(.usage, "the devices file \(path) lists no device") }
    return out
}

extension Flash {
    /// The devices of a batch, each with the central that reaches it.
    func batchTargets(plan: FlashPlan, printer: EventPrinter) async throws -> [BatchTarget] {
        var addresses = target.device.compactMap(DeviceAddress.init)
        if let file = batch.devicesFile { addresses += try readDevicesFile(file) }
        if target.simulator.enabled {
            if let count = batch.count {
                addresses += (1...count).map { i in DeviceAddress(0xC0, 0xFF, 0xEE, 0x00, UInt8(truncatingIfNeeded: i >> 8), UInt8(truncatingIfNeeded: i)) }
            }
            if addresses.isEmpty { addresses = [SimulatorOptions.defaultAddress] }
            return try simulatedTargets(unique(addresses), plan: plan)
        }
        let centrals = try await adapterCentrals()
        var targets: [BatchTarget] = []
        if batch.scan {
            // A device in its update mode, or running an application that moves it there, advertises
            // the protocol's service (Secure DFU: 0xFE59 from the bootloader and the buttonless application).
            let filter = ScanFilter(serviceUUIDs: [plan.profile.serviceUUID], namePrefix: batch.namePrefix, minimumRSSI: batch.minRSSI)
            printer.note("scanning for \(batch.scanWindow) s on \(centrals.map { $0.0 ?? "the default adapter" }.joined(separator: ", "))…")
            var seen: [DeviceAddress: (Int, String?, any GATTCentral)] = [:]
            for (adapter, central) in centrals {
                let found: [Advertisement]
                do {
                    found = try await central.scan(filter: filter, timeout: Ranges.scanWindow.duration(batch.scanWindow))
                } catch {
                    throw CLIFailure(OTAError.from(error, device: adapter ?? "the adapter"))
                }
                for ad in found where (seen[ad.address]?.0 ?? .min) < (ad.rssi ?? .min) {
                    seen[ad.address] = (ad.rssi ?? .min, adapter, central)
                }
            }
            targets += seen.sorted { $0.key.description < $1.key.description }.map { BatchTarget(address: $0.key, adapter: $0.value.1, central: $0.value.2) }
            if targets.isEmpty {
                throw CLIFailure(.deviceNotFound, "no device advertising the \(plan.profile.name) service (\(plan.profile.serviceUUID)) was found within \(batch.scanWindow) s")
            }
        }
        // Spread the listed devices over the adapters in turn.
        for (i, address) in unique(addresses).enumerated() where !targets.contains(where: { $0.address == address }) {
            let (adapter, central) = centrals[i % centrals.count]
            targets.append(BatchTarget(address: address, adapter: adapter, central: central))
        }
        return targets
    }

    /// The central of each `--adapter` (or the default adapter), each checked to be available.
    func adapterCentrals() async throws(CLIFailure) -> [(String?, any GATTCentral)] {
        let adapters = target.adapter.map { $0.split(separator: ",").map(String.init) } ?? [nil as String?].compactMap { $0 }
        let centrals: [(String?, any GATTCentral)] = adapters.isEmpty
            ? [(nil, target.bluezCentral(adapter: nil).refusingStackPairing(!pairing.policy.pair))]
            : adapters.map { ($0, target.bluezCentral(adapter: $0).refusingStackPairing(!pairing.policy.pair)) }
        // bluetoothd down or an adapter off fails every device alike: say it once, exit 11.
        for (adapter, central) in centrals {
            guard let bluez = central as? BlueZCentral else { continue }
            do {
                try await bluez.checkAvailable()
            } catch {
                throw CLIFailure(OTAError.from(error, device: adapter ?? "the adapter"))
            }
        }
        return centrals
    }

    private func unique(_ addresses: [DeviceAddress]) -> [DeviceAddress] {
        var seen = Set<DeviceAddress>()
        return addresses.filter { seen.insert($0).inserted }
    }

    /// One simulated device per address, each with its own central (and so its own clock: a
    /// virtual clock serves one session at a time): a native device, or for a Nordic package a
    /// Secure DFU bootloader (with --sim-buttonless, an application that moves into it).
    private func simulatedTargets(_ addresses: [DeviceAddress], plan: FlashPlan) throws -> [BatchTarget] {
        let faults = Dictionary(batch.simDeviceFault.map { ($0.device, $0.mode) }) { _, last in last }
        return try addresses.enumerated().map { i, address in
            let device = try simulatedDevice(address, number: i + 1, fault: faults[i + 1], plan: plan)
            let central = SimulatedCentral(devices: [device], clock: target.simulator.clock)
            return BatchTarget(address: address, adapter: "sim", central: central)
        }
    }

    /// Simulated device number `number` (1-based) of a batch or a station's population, with `fault`.
    func simulatedDevice(_ address: DeviceAddress, number: Int, fault: SimulatedDeviceFault.Mode?, plan: FlashPlan) throws -> SimulatedDevice {
        var config = target.simulator.deviceConfig(address: address)
        var settings = target.simulator.settings
        config.name = "otaflash-sim-\(number)"
        config.faults.seed &+= UInt64(number - 1)
        switch fault {
        case .noOTAService?: settings.hasOTAService = false
        case .smallSlot?: config.slotSize = 1024
        case .gone?:
            // Mid-transfer, for an image of any size.
            config.faults.disconnectAt.append(min(4096, plan.size / 2))
            config.faults.refuseConnectionsAfter = 1
        case nil: break
        }
        return try target.simulator.device(for: plan, config: config, settings: settings, options: protocols.protocolGroups)
    }

    /// Flashes every target and reports; throws the batch's exit code unless all succeeded.
    func runBatch(_ targets: [BatchTarget], plan: FlashPlan, book: RunRecords, printer: EventPrinter) async throws {
        // Each device pairs with its own passkey when the file lists it.
        let passkeys = try pairing.answers.passkeys()
        let targets = targets.map {
            BatchTarget(address: $0.address, adapter: $0.adapter, central: $0.central,
                        credentials: pairing.answers.credentials(for: $0.address, file: passkeys))
        }
        // Simulated devices share no radio: only --parallel limits them.
        let options = try batchOptions(plan: plan, book: book, perAdapter: target.simulator.enabled ? batch.parallel : batch.perAdapter)
        printer.json(FlashEvents.Batch(devices: targets.count, parallel: batch.parallel,
                                       adapters: Set(targets.map { $0.adapter ?? "default" }).sorted()))
        printer.note("flashing \(targets.count) devices, \(batch.parallel) at a time")
        let runner = BatchRunner(plan: plan.update, options: options, logger: output.logger("otaflash.batch"))
        printer.startLive(devices: targets.map(\.address.description))
        let work = Task {
            await runner.run(targets, before: { await book.begin($0.address.description) }, finished: { await book.finish($0) }) { event in
                book.observe(event)
                switch event {
                case .session(let event):
                    printer.session(event)
                case .prepared(let device, _, let entry?):
                    printer.note("\(device): moved into \(entry.mode); it answers at \(entry.address)")
                case .pairing(let device, let note):
                    printer.note(note)
                    printer.json(FlashEvents.Note(device: device, message: note))
                case .prepared, .image, .identity:
                    break
                }
            }
        }
        let interrupts = InterruptHandler { _ in
            printer.note("stopping every device after its current write (press Ctrl-C again to exit at once)…")
            work.cancel()
        }
        CLIContext.output.onFailure { work.cancel() }
        let outcomes = await work.value
        interrupts.cancel()
        printer.finishLive(results: outcomes.map { ($0.device, $0.result) })
        let ok = outcomes.filter { if case .ok = $0.result { true } else { false } }.count
        let skipped = outcomes.filter { if case .skipped = $0.result { true } else { false } }.count
        let failed = outcomes.count - ok - skipped
        // Each device's record, done line, log and report row were written as it ended.
        let recordFailure = book.failure.withLock { $0 }
        let code: ExitCode = if interrupts.signalled { .interrupted }
            else if CLIContext.output.failure != nil { .outputFailed }
            else if let recordFailure { recordFailure.code }
            else if failed == 0 { .success }
            else if outcomes.allSatisfy({ if case .failed(let e) = $0.result { e.code == .heldElsewhere } else { true } }) { .heldElsewhere }
            else { failed == outcomes.count ? .allFailed : .someFailed }
        printer.json(FlashEvents.Summary(devices: outcomes.count, ok: ok, skipped: skipped, failed: failed, exitCode: code,
                                         seconds: outcomes.map(\.seconds).max() ?? 0))
        printer.table(summaryTable(outcomes))
        for o in outcomes {
            if case .failed(let e) = o.result { printer.note("\(o.device) failed: \(e.description)") }
        }
        if let recordFailure { throw recordFailure.markedReported() }
        if code == .interrupted {
            throw CLIFailure(.interrupted, "interrupted: \(ok) of \(outcomes.count) devices done; run the same command again to resume the others").markedReported()
        }
        if code == .heldElsewhere {
            throw CLIFailure(code, "\(failed) of \(outcomes.count) devices were not flashed: another station holds their claims (see the table above)").markedReported()
        }
        if code != .success {
            throw CLIFailure(code, failed == outcomes.count ? "all \(failed) devices failed (see the table above, or --log-dir)"
                                                             : "\(failed) of \(outcomes.count) devices failed (see the table above, or --log-dir)")
                .markedReported()
        }
    }

    /// How each device of a batch (or a station) is flashed.
    func batchOptions(plan: FlashPlan, book: RunRecords, perAdapter: Int, retries: Int? = nil) throws -> BatchOptions {
        var options = BatchOptions(parallel: batch.parallel, perAdapter: perAdapter, retries: retries ?? batch.retries, config: try engineConfig(for: plan),
                                   timeouts: sessionTimeouts,
                                   reconnect: ReconnectPolicy(window: Ranges.reconnectWindow.duration(reconnectWindow), seed: target.simulator.seed),
                                   registry: .cli(for: request), protocolName: protocolName,
                                   journal: target.simulator.enabled ? nil : JournalStore(directory: journalDir ?? JournalStore.defaultDirectory),
                                   pairing: pairing.policy)
        options.readsIdentity = book.ledger != nil
        return options
    }

    private func summaryRow(_ o: BatchOutcome) -> [String] {
        let (result, rate): (String, String) = switch o.result {
        case .ok(let r): ("ok", formatRate(r.throughput))
        case .skipped: ("skipped", "-")
        case .failed(let e): ("FAILED: \(e.description)", "-")
        }
        return [o.device, o.updateModeAddress ?? "-", o.adapter ?? "-", result, "\(o.attempts)", String(format: "%.1f s", o.seconds), rate,
                o.firmwareBefore?.description ?? "-", o.firmwareAfter?.description ?? "-"]
    }

    private func summaryTable(_ outcomes: [BatchOutcome]) -> [[String]] {
        // The bootloader column only when a device was moved into one.
        let rows = [["device", "bootloader", "adapter", "result", "attempts", "time", "throughput", "before", "after"]] + outcomes.map(summaryRow)
        return outcomes.contains { $0.updateModeAddress != nil } ? rows : rows.map { row in row.enumerated().filter { $0.offset != 1 }.map(\.element) }
    }
}

/// Writes `bytes` to `path`: a regular file is replaced atomically (a temporary file renamed over
/// it), anything else (a device such as /dev/stdout, a FIFO) is written in place.
/// - Returns: why it failed (strerror), or nil.
func writeFile(_ path: String, _ bytes: [UInt8]) -> String? {
    var info = stat()
    let regular = stat(path, &info) != 0 || (info.st_mode & S_IFMT) == S_IFREG
    let target = regular ? path + ".tmp-\(getpid())" : path
    let fd = open(target, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o644)
    guard fd >= 0 else { return String(cString: strerror(errno)) }
    var problem = writeAll(fd, bytes[...])
    if close(fd) != 0, problem == nil { problem = String(cString: strerror(errno)) }
    if regular {
        if problem == nil, rename(target, path) != 0 { problem = String(cString: strerror(errno)) }
        if problem != nil { unlink(target) }
    }
    return problem
}

/// write(2) until every byte is out. - Returns: why it failed (strerror), or nil.
func writeAll(_ fd: Int32, _ bytes: ArraySlice<UInt8>) -> String? {
    var rest = bytes
    while !rest.isEmpty {
        let written = rest.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
        if written < 0 {
            if errno == EINTR { continue }
            return String(cString: strerror(errno))
        }
        rest = rest.dropFirst(written)
    }
    return nil
}

/// One JSON Lines log per device (`--log-dir`, created and checked before the run). A log that
/// cannot be written (a full disk) costs one warning line; the flash goes on without it.
final class DeviceLogs: Sendable {
    let directory: String
    private let printer: EventPrinter
    /// Per device: its open log, or nil once it failed.
    private let files = Mutex<[String: Int32?]>([:])

    init(directory: String, printer: EventPrinter) {
        self.directory = directory
        self.printer = printer
    }

    func record(_ event: SessionEvent) {
        guard let device = event.device else { return }
        write(device, EventPrinter.jsonLine(event) + "\n")
    }

    func finish(_ device: String, _ line: String) {
        write(device, line + "\n")
        files.withLock { if case let fd?? = $0[device] { close(fd) }; $0[device] = .some(nil) }
    }

    private func write(_ device: String, _ text: String) {
        let warning = files.withLock { files -> String? in
            let path = directory + "/" + device.replacingOccurrences(of: ":", with: "") + ".jsonl"
            if files[device] == nil {
                let fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o644)
                files[device] = .some(fd >= 0 ? fd : nil)
                if fd < 0 { return "cannot create the log \(path): \(String(cString: strerror(errno)))" }
            }
            guard case let fd?? = files[device] else { return nil }
            guard let problem = writeAll(fd, Array(text.utf8)[...]) else { return nil }
            close(fd)
            files[device] = .some(nil)
            return "cannot write the log \(path): \(problem)"
        }
        if let warning { printer.warning(warning + "; the flash goes on without it") }
    }
}

extension SessionEvent {
    /// The device an event is about.
    var device: String? {
        switch self {
        case .connecting(let d), .verifying(let d, _), .activating(let d), .notice(let d, _): d
        case .connected(let d, _, _), .deviceInfo(let d, _), .transferStarted(let d, _, _), .reconnecting(let d, _, _, _): d
        case .progress(let p): p.device
        }
    }
}
