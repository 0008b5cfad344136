import ArgumentParser
import Foundation
import GATT
import OTA
import OTAWire
import Simulator
import Synchronization

/// Options for flashing many devices in one run.
public struct BatchCLIOptions: ParsableArguments {
    @Option(name: .customLong("devices-file"), help: ArgumentHelp("A file with one device address per line; # starts a comment.", valueName: "file"))
    public var devicesFile: String?

    @Flag(name: .long, help: "Flash every device that advertises the OTA service and matches --name-prefix/--min-rssi, seen within --scan-window.")
    public var scan = false

    @Option(name: .customLong("scan-window"), help: "Seconds to scan for devices with --scan.")
    public var scanWindow: Double = 10

    @Option(name: .customLong("name-prefix"), help: "With --scan: only devices whose name starts with this.")
    public var namePrefix: String?

    @Option(name: .customLong("min-rssi"), help: "With --scan: only devices at least this strong (dBm).")
    public var minRSSI: Int?

    @Option(name: .long, help: "With --simulator: flash this many simulated devices (C0:FF:EE:00:00:01 and up).")
    public var count: Int?

    @Option(name: .long, help: "Devices flashed at once, over all adapters.")
    public var parallel: Int = 4

    @Option(name: .customLong("per-adapter"), help: "Devices flashed at once on one adapter.")
    public var perAdapter: Int = 4

    @Option(name: .long, help: "Whole-session retries per device after its reconnects gave up.")
    public var retries: Int = 1

    @Option(name: .customLong("log-dir"), help: ArgumentHelp("Write one JSON Lines log per device into this folder.", valueName: "dir"))
    public var logDir: String?

    @Option(name: .customLong("skip-if-version"), help: ArgumentHelp("Leave devices that already report this firmware version alone.", valueName: "version"))
    public var skipIfVersion: String?

    @Option(name: .long, help: ArgumentHelp("Write a CSV summary (one row per device) to this file.", valueName: "file"))
    public var report: String?

    @Option(name: .customLong("sim-device-fault"), help: ArgumentHelp("Make simulated device N (1-based) fail: N:no-ota-service, N:small-slot or N:gone (its link drops and it never comes back). Repeatable.", valueName: "N:mode"))
    public var simDeviceFault: [String] = []

    public init() {}

    public func validate() throws {
        guard parallel >= 1 else { throw ValidationError("--parallel must be at least 1, got \(parallel)") }
        guard perAdapter >= 1 else { throw ValidationError("--per-adapter must be at least 1, got \(perAdapter)") }
        guard retries >= 0 else { throw ValidationError("--retries must not be negative, got \(retries)") }
        guard scanWindow > 0 else { throw ValidationError("--scan-window must be positive") }
        if let count, !(1...1000).contains(count) { throw ValidationError("--count must be between 1 and 1000, got \(count)") }
        if let skipIfVersion, FirmwareVersion(skipIfVersion) == nil {
            throw ValidationError("--skip-if-version must look like 1.2.3, got '\(skipIfVersion)'")
        }
        for spec in simDeviceFault where Self.parseFault(spec) == nil {
            throw ValidationError("--sim-device-fault takes N:no-ota-service, N:small-slot or N:gone, got '\(spec)'")
        }
    }

    enum SimFault: String { case noOTAService = "no-ota-service", smallSlot = "small-slot", gone }

    static func parseFault(_ spec: String) -> (Int, SimFault)? {
        let parts = spec.split(separator: ":", maxSplits: 1).map(String.init)
        guard parts.count == 2, let n = Int(parts[0]), n >= 1, let mode = SimFault(rawValue: parts[1]) else { return nil }
        return (n, mode)
    }

    /// True when these options ask for more than one device.
    func isBatch(devices: [String]) -> Bool {
        devices.count > 1 || devicesFile != nil || scan || count != nil
    }
}

/// Reads `--devices-file`: one address per line, `#` comments, blank lines ignored.
func readDevicesFile(_ path: String) throws -> [DeviceAddress] {
    guard let data = FileManager.default.contents(atPath: path) else {
        throw CLIFailure(.usage, "cannot read the devices file \(path)")
    }
    var out: [DeviceAddress] = []
    for (n, raw) in String(decoding: data, as: UTF8.self).split(separator: "\n", omittingEmptySubsequences: false).enumerated() {
        let line = raw.split(separator: "#", maxSplits: 1, omittingEmptySubsequences: false).first.map { $0.trimmingCharacters(in: .whitespaces) } ?? ""
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
    func batchTargets(printer: EventPrinter) async throws -> [BatchTarget] {
        var addresses = target.device.compactMap(DeviceAddress.init)
        if let file = batch.devicesFile { addresses += try readDevicesFile(file) }
        if target.simulator.enabled {
            if let count = batch.count {
                addresses += (1...count).map { i in DeviceAddress(String(format: "C0:FF:EE:00:%02X:%02X", i >> 8, i & 0xFF))! }
            }
            if addresses.isEmpty { addresses = [SimulatorOptions.defaultAddress] }
            return simulatedTargets(unique(addresses))
        }
        let adapters = target.adapter.map { $0.split(separator: ",").map(String.init) } ?? [nil as String?].compactMap { $0 }
        let centrals: [(String?, any GATTCentral)] = adapters.isEmpty
            ? [(nil, target.bluezCentral(adapter: nil))]
            : adapters.map { ($0, target.bluezCentral(adapter: $0)) }
        var targets: [BatchTarget] = []
        if batch.scan {
            let filter = ScanFilter(serviceUUIDs: [OTAProtocol.serviceUUID], namePrefix: batch.namePrefix, minimumRSSI: batch.minRSSI)
            printer.note("scanning for \(batch.scanWindow) s on \(centrals.map { $0.0 ?? "the default adapter" }.joined(separator: ", "))…")
            var seen: [DeviceAddress: (Int, String?, any GATTCentral)] = [:]
            for (adapter, central) in centrals {
                let found: [Advertisement]
                do {
                    found = try await central.scan(filter: filter, timeout: seconds(batch.scanWindow))
                } catch {
                    throw CLIFailure(OTAError.from(error, device: adapter ?? "the adapter"))
                }
                for ad in found where (seen[ad.address]?.0 ?? .min) < (ad.rssi ?? .min) {
                    seen[ad.address] = (ad.rssi ?? .min, adapter, central)
                }
            }
            targets += seen.sorted { $0.key.description < $1.key.description }.map { BatchTarget(address: $0.key, adapter: $0.value.1, central: $0.value.2) }
            if targets.isEmpty { throw CLIFailure(.deviceNotFound, "no device advertising the OTA service was found within \(batch.scanWindow) s") }
        }
        // Spread the listed devices over the adapters in turn.
        for (i, address) in unique(addresses).enumerated() where !targets.contains(where: { $0.address == address }) {
            let (adapter, central) = centrals[i % centrals.count]
            targets.append(BatchTarget(address: address, adapter: adapter, central: central))
        }
        return targets
    }

    private func unique(_ addresses: [DeviceAddress]) -> [DeviceAddress] {
        var seen = Set<DeviceAddress>()
        return addresses.filter { seen.insert($0).inserted }
    }

    /// One simulated device per address, each with its own central (and so its own clock: a
    /// virtual clock serves one session at a time).
    private func simulatedTargets(_ addresses: [DeviceAddress]) -> [BatchTarget] {
        var faults: [Int: BatchCLIOptions.SimFault] = [:]
        for spec in batch.simDeviceFault { if let (n, mode) = BatchCLIOptions.parseFault(spec) { faults[n] = mode } }
        return addresses.enumerated().map { i, address in
            var config = target.simulator.deviceConfig(address: address)
            config.name = "otaflash-sim-\(i + 1)"
            config.faults.seed &+= UInt64(i)
            switch faults[i + 1] {
            case .noOTAService?: config.hasOTAService = false
            case .smallSlot?: config.slotSize = 1024
            case .gone?:
                config.faults.disconnectAt.append(4096)
                config.faults.refuseConnectionsAfter = 1
            case nil: break
            }
            let central = SimulatedCentral(devices: [SimulatedDevice(config)], clock: target.simulator.clock)
            return BatchTarget(address: address, adapter: "sim", central: central)
        }
    }

    /// Flashes every target and reports; throws the batch's exit code unless all succeeded.
    func runBatch(_ targets: [BatchTarget], image firmware: FirmwareImage, config: EngineConfig, printer: EventPrinter) async throws {
        // Simulated devices share no radio: only --parallel limits them.
        let perAdapter = target.simulator.enabled ? batch.parallel : batch.perAdapter
        let options = BatchOptions(parallel: batch.parallel, perAdapter: perAdapter, retries: batch.retries, config: config,
                                   timeouts: SessionTimeouts(connect: seconds(target.connectTimeout)),
                                   reconnect: ReconnectPolicy(window: seconds(reconnectWindow), seed: target.simulator.seed),
                                   journal: target.simulator.enabled ? nil : JournalStore(directory: journalDir ?? JournalStore.defaultDirectory))
        let logs = try batch.logDir.map { try DeviceLogs(directory: $0) }
        printer.json(FlashEvents.Batch(devices: targets.count, parallel: batch.parallel,
                                       adapters: Set(targets.map { $0.adapter ?? "default" }).sorted()))
        printer.note("flashing \(targets.count) devices, \(batch.parallel) at a time")
        let runner = BatchRunner(image: firmware, options: options, logger: output.logger("otaflash.batch"))
        let work = Task {
            await runner.run(targets) { event in
                printer.session(event)
                logs?.record(event)
            }
        }
        let interrupts = InterruptHandler { _ in
            printer.note("stopping every device after its current write (press Ctrl-C again to exit at once)…")
            work.cancel()
        }
        let outcomes = await work.value
        interrupts.cancel()
        for outcome in outcomes {
            let done = FlashEvents.Done(outcome)
            printer.json(done)
            logs?.finish(outcome.device, done.line)
        }
        let ok = outcomes.filter { if case .ok = $0.result { true } else { false } }.count
        let skipped = outcomes.filter { if case .skipped = $0.result { true } else { false } }.count
        let failed = outcomes.count - ok - skipped
        let code: ExitCode = failed == 0 ? .success : (failed == outcomes.count ? .allFailed : .someFailed)
        printer.json(FlashEvents.Summary(devices: outcomes.count, ok: ok, skipped: skipped, failed: failed, exitCode: code,
                                         seconds: outcomes.map(\.seconds).max() ?? 0))
        printer.table(summaryTable(outcomes))
        if let path = batch.report { try writeReport(outcomes, to: path) }
        if code != .success {
            throw CLIFailure(code, failed == outcomes.count ? "all \(failed) devices failed (see the table above, or --log-dir)"
                                                             : "\(failed) of \(outcomes.count) devices failed (see the table above, or --log-dir)")
                .markedReported()
        }
    }

    private func summaryRow(_ o: BatchOutcome) -> [String] {
        let (result, rate): (String, String) = switch o.result {
        case .ok(let r): ("ok", formatRate(r.throughput))
        case .skipped: ("skipped", "-")
        case .failed(let e): ("FAILED: \(e.description)", "-")
        }
        return [o.device, o.adapter ?? "-", result, "\(o.attempts)", String(format: "%.1f s", o.seconds), rate,
                o.firmwareBefore?.description ?? "-", o.firmwareAfter?.description ?? "-"]
    }

    private func summaryTable(_ outcomes: [BatchOutcome]) -> [[String]] {
        [["device", "adapter", "result", "attempts", "time", "throughput", "before", "after"]] + outcomes.map(summaryRow)
    }

    private func writeReport(_ outcomes: [BatchOutcome], to path: String) throws {
        func csv(_ s: String) -> String { s.contains(where: { ",\"\n".contains($0) }) ? "\"" + s.replacingOccurrences(of: "\"", with: "\"\"") + "\"" : s }
        var text = "device,adapter,result,error,attempts,seconds,throughput_bytes_per_s,firmware_before,firmware_after\n"
        for o in outcomes {
            let (result, error, rate): (String, String, String) = switch o.result {
            case .ok(let r): ("ok", "", String(format: "%.0f", r.throughput))
            case .skipped: ("skipped", "", "")
            case .failed(let e): ("error", e.description, "")
            }
            text += [o.device, o.adapter ?? "", result, error, "\(o.attempts)", String(format: "%.3f", o.seconds), rate,
                     o.firmwareBefore?.description ?? "", o.firmwareAfter?.description ?? ""].map(csv).joined(separator: ",") + "\n"
        }
        do {
            try Data(text.utf8).write(to: URL(fileURLWithPath: path), options: .atomic)
        } catch {
            throw CLIFailure(.usage, "cannot write the report \(path): \(error.localizedDescription)")
        }
    }
}

/// One JSON Lines log per device (`--log-dir`).
final class DeviceLogs: Sendable {
    let directory: String
    private let handles = Mutex<[String: FileHandle]>([:])

    init(directory: String) throws {
        self.directory = directory
        do {
            try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        } catch {
            throw CLIFailure(.usage, "cannot create the log folder \(directory): \(error.localizedDescription)")
        }
    }

    func record(_ event: SessionEvent) {
        guard let device = event.device else { return }
        write(device, EventPrinter.jsonLine(event) + "\n")
    }

    func finish(_ device: String, _ line: String) {
        write(device, line + "\n")
        handles.withLock { $0.removeValue(forKey: device).map { try? $0.close() } }
    }

    private func write(_ device: String, _ text: String) {
        handles.withLock { h in
            if h[device] == nil {
                let path = directory + "/" + device.replacingOccurrences(of: ":", with: "") + ".jsonl"
                // A log that cannot be created is skipped: the device's events still reach stdout.
                h[device] = FileManager.default.createFile(atPath: path, contents: nil) ? FileHandle(forWritingAtPath: path) : nil
            }
            h[device]?.write(Data(text.utf8))
        }
    }
}

extension SessionEvent {
    /// The device an event is about.
    var device: String? {
        switch self {
        case .connecting(let d), .verifying(let d), .activating(let d): d
        case .connected(let d, _, _), .deviceInfo(let d, _), .transferStarted(let d, _, _), .reconnecting(let d, _, _, _): d
        case .progress(let p): p.device
        }
    }
}
