// otaflash-bench: throughput and CPU figures on the simulator's link model.
//
//   swift run -c release otaflash-bench [--grid] [--interval-sweep] [--nordic] [--smp] [--v2] [--engine-cpu] [--json FILE]
//
// Every figure comes from one run of this program, so ratios are measured side by side.
// docs/PERFORMANCE.md explains the link model and each figure.

import Foundation
import GATT
import Native
import NordicDFU
import OTA
import OTADevice
import OTAWire
import Simulator

struct Options {
    var grid = false
    var sweep = false
    var cpu = false
    var batch = false
    var nordic = false
    var smp = false
    var v2 = false
    var ledger = false
    var json: String?
    var imageSize = 256 * 1024

    init(_ args: [String]) {
        var i = 0
        while i < args.count {
            switch args[i] {
            case "--grid": grid = true
            case "--interval-sweep": sweep = true
            case "--engine-cpu": cpu = true
            case "--batch": batch = true
            case "--nordic": nordic = true
            case "--smp": smp = true
            case "--v2": v2 = true
            case "--ledger": ledger = true
            case "--json": i += 1; json = i < args.count ? args[i] : nil
            case "--image-kib": i += 1; imageSize = (Int(args[i]) ?? 256) * 1024
            case "--help", "-h":
                print("usage: otaflash-bench [--grid] [--interval-sweep] [--nordic] [--smp] [--v2] [--engine-cpu] [--batch] [--ledger] [--image-kib N] [--json FILE]")
                exit(0)
            default:
                FileHandle.standardError.write(Data("otaflash-bench: unknown argument \(args[i])\n".utf8))
                exit(2)
            }
            i += 1
        }
        if !grid && !sweep && !cpu && !batch && !nordic && !smp && !v2 && !ledger {
            grid = true; sweep = true; cpu = true; batch = true; nordic = true; smp = true; v2 = true; ledger = true
        }
    }
}

let options = Options(Array(CommandLine.arguments.dropFirst()))
var rng = SeededGenerator(seed: 2024)
let image = FirmwareImage(bytes: (0..<options.imageSize).map { _ in UInt8.random(in: 0...255, using: &rng) })
var report: [(String, Any)] = []
var notes: [String] = []

func device(_ link: LinkModel, dataProperties: CharacteristicProperties = [.writeWithoutResponse, .write],
            version2: OTATarget.Version2? = nil) -> SimulatedDevice {
    SimulatedDevice(SimulatedDeviceConfig(slotSize: 4 << 20, link: link), native: NativeDeviceOptions(dataProperties: dataProperties, version2: version2))
}

/// Goodput of otaflash's engine: image bytes over the streaming time (BEGIN reply to last checkpoint reply).
func engineGoodput(_ link: LinkModel, interval: Int = EngineConfig.defaultCheckpointInterval,
                   version2: OTATarget.Version2? = nil) async throws -> Double {
    let d = device(link, version2: version2)
    let central = SimulatedCentral(devices: [d])
    let session = OTASession(central: central, address: d.config.address, image: image,
                             config: EngineConfig(checkpointInterval: interval), profile: NativeProfile())
    let result = try await session.run()
    guard d.activatedImage == image.bytes else { throw BenchError("engine run did not activate the image") }
    return Double(image.size) / result.transferSeconds
}

struct BenchError: Error, CustomStringConvertible {
    let description: String
    init(_ d: String) { description = d }
}

/// A reference central that does not pipeline: `batch` packets without response, then a
/// checkpoint it waits for (batch 12 = a Nordic-style receipt every 12 packets); batch 0 = every
/// packet written with response (stop-and-wait, as naive scripts do).
func baselineGoodput(_ link: LinkModel, batch: Int) async throws -> Double {
    let d = device(link)
    let central = SimulatedCentral(devices: [d])
    let conn = try await central.connect(to: d.config.address, timeout: .seconds(5))
    let chars = try await NativeProfile.discover(on: conn)
    try await conn.setNotifications(true, for: chars.controlPoint)
    let chunk = OTAProtocol.chunkSize(mtu: try await conn.mtu())
    let clock = conn.clock

    func command(_ request: ControlRequest) async throws -> ControlResponse {
        try await conn.write(request.encoded, to: chars.controlPoint, type: .withResponse)
        while let event = await conn.nextEvent(timeout: .seconds(5)) {
            if case .notification(_, let value) = event, case .response(let r)? = try? ControlNotification(decoding: value) {
                return r
            }
        }
        throw BenchError("no reply to \(request.opcode)")
    }

    _ = try await command(.begin(.init(imageSize: UInt32(image.size), imageCRC: image.crc32, version: FirmwareVersion(packed: 0), restart: true)))
    let start = clock.now
    var offset = 0
    var crc = CRC32()
    var inBatch = 0
    while offset < image.size {
        let n = min(chunk, image.size - offset)
        let slice = image.bytes[offset..<(offset + n)]
        let packet = DataPacket.encode(offset: UInt32(offset), payload: slice)
        crc.update(slice)
        offset += n
        if batch == 0 {
            try await conn.write(packet, to: chars.data, type: .withResponse)
            continue
        }
        try await conn.write(packet, to: chars.data, type: .withoutResponse)
        inBatch += 1
        if inBatch == batch || offset == image.size {
            inBatch = 0
            let r = try await command(.checkpoint(offset: UInt32(offset), crc: crc.value))
            guard r.status == .success else { throw BenchError("checkpoint refused: \(r.status)") }
        }
    }
    if batch == 0 {
        let r = try await command(.checkpoint(offset: UInt32(offset), crc: crc.value))
        guard r.status == .success else { throw BenchError("checkpoint refused: \(r.status)") }
    }
    let seconds = (clock.now - start).seconds
    let v = try await command(.verify)
    guard v.status == .success else { throw BenchError("baseline image failed verify: \(v.status)") }
    await conn.disconnect()
    return Double(image.size) / seconds
}

func pct(_ x: Double) -> String { String(format: "%.3f", x) }

// MARK: Interval sweep

if options.sweep {
    print("Checkpoint interval sweep: goodput / capacity, \(image.size / 1024) KiB image, virtual time")
    let links: [(String, LinkModel)] = [
        ("MTU 247 2M 7.5ms", LinkModel(mtu: 247, phy: .le2M, connectionInterval: .microseconds(7500))),
        ("MTU 247 2M 15ms", LinkModel.default),
        ("MTU 247 1M 50ms", LinkModel(mtu: 247, phy: .le1M, connectionInterval: .milliseconds(50))),
        ("MTU 517 2M 30ms", LinkModel(mtu: 517, phy: .le2M, connectionInterval: .milliseconds(30))),
    ]
    let intervals = [2048, 4096, 8192, 16384, 32768, 65536]
    print("interval".padding(toLength: 10, withPad: " ", startingAt: 0) + links.map { $0.0.padding(toLength: 18, withPad: " ", startingAt: 0) }.joined())
    var rows: [[String: Any]] = []
    for interval in intervals {
        var line = String(interval).padding(toLength: 10, withPad: " ", startingAt: 0)
        for (name, link) in links {
            let eff = try await engineGoodput(link, interval: interval) / link.capacityBytesPerSecond
            line += pct(eff).padding(toLength: 18, withPad: " ", startingAt: 0)
            rows.append(["interval": interval, "link": name, "efficiency": eff])
        }
        print(line)
    }
    report.append(("interval_sweep", rows))
    print()
}

// MARK: Link efficiency grid

if options.grid {
    print("Link efficiency: goodput / model capacity, \(image.size / 1024) KiB image, virtual time")
    print("MTU  PHY interval  capacity kB/s  otaflash  receipt/12  stop-and-wait")
    var rows: [[String: Any]] = []
    var minExcl23 = Double.infinity
    for mtu in [23, 185, 247, 517] {
        for phy in LinkModel.PHY.allCases {
            for ci in [7500, 15000, 30000, 50000] {
                let link = LinkModel(mtu: mtu, phy: phy, connectionInterval: .microseconds(Int64(ci)))
                let cap = link.capacityBytesPerSecond
                let ours = try await engineGoodput(link) / cap
                let prn = try await baselineGoodput(link, batch: 12) / cap
                let saw = try await baselineGoodput(link, batch: 0) / cap
                if mtu != 23 { minExcl23 = min(minExcl23, ours) }
                rows.append(["mtu": mtu, "phy": phy.rawValue, "interval_ms": Double(ci) / 1000, "capacity": cap,
                             "otaflash": ours, "receipt12": prn, "stop_and_wait": saw])
                print(String(format: "%3d  %@  %5.1f ms  %10.1f      %.3f     %.3f       %.3f",
                             mtu, phy.rawValue, Double(ci) / 1000, cap / 1000, ours, prn, saw))
            }
        }
    }
    let def = LinkModel.default
    let defEff = try await engineGoodput(def) / def.capacityBytesPerSecond
    let defSaw = try await baselineGoodput(def, batch: 0) / def.capacityBytesPerSecond
    let defPrn = try await baselineGoodput(def, batch: 12) / def.capacityBytesPerSecond
    print(String(format: "default link (MTU 247, 2M, 15 ms): otaflash %.3f, receipt/12 %.3f, stop-and-wait %.3f; grid minimum excluding MTU 23: %.3f",
                 defEff, defPrn, defSaw, minExcl23))
    report.append(("grid", rows))
    report.append(("link_efficiency_default", defEff))
    report.append(("link_efficiency_grid_min_excluding_mtu23", minExcl23))
    report.append(("stop_and_wait_efficiency_default", defSaw))
    report.append(("receipt12_efficiency_default", defPrn))
    print()
}

// MARK: Protocol version 2

if options.v2 {
    // Version 2 with the flash's time left out measures what the protocol costs (checkpoints on
    // erase-unit boundaries); with NOR timing the flash is the bottleneck, and the figure to
    // compare with is the flash's own bound: one unit per (erase + unit / 4 words).
    let def = LinkModel.default
    let cap = def.capacityBytesPerSecond
    let v1 = try await engineGoodput(def) / cap
    let instant = OTATarget.Version2(eraseTimeMs: 0, wordProgramTime: .zero)
    let v2 = try await engineGoodput(def, version2: instant) / cap
    let nor = OTATarget.Version2()
    let norGoodput = try await engineGoodput(def, version2: nor)
    let unitTime = Duration.milliseconds(Int(nor.eraseTimeMs)) + nor.wordProgramTime * (nor.eraseUnit / 4)
    let flashBound = Double(nor.eraseUnit) / unitTime.seconds
    print("Protocol v2 link efficiency: goodput / model capacity, \(image.size / 1024) KiB image, default link (MTU 247, 2M, 15 ms), virtual time")
    print(String(format: "v1 %.3f; v2 (4 KiB erase units, flash time left out) %.3f", v1, v2))
    print(String(format: "v2 on NOR flash (85 ms per 4 KiB erase, 40 us per word): %.1f kB/s = %.3f of the link, %.3f of the flash's own bound (%.1f kB/s)",
                 norGoodput / 1000, norGoodput / cap, norGoodput / flashBound, flashBound / 1000))
    report.append(("v1_link_efficiency_default", v1))
    report.append(("v2_link_efficiency_default", v2))
    report.append(("v2_nor_goodput", norGoodput))
    report.append(("v2_nor_fraction_of_flash_bound", norGoodput / flashBound))
    print()
}

// MARK: Nordic Secure DFU

/// Goodput of one Secure DFU strategy through the real session, profile and engine against the
/// bootloader model on `link`: firmware bytes over the time from SELECT data's answer to the
/// confirmation of the last byte (`OTAResult.transferSeconds`; the last EXECUTE, where the
/// bootloader checks the image's SHA-256, is left out, as VERIFY is for the native protocol).
func secureDFUGoodput(_ link: LinkModel, _ config: NordicDFUConfig) async throws -> Double {
    var settings = NordicDFUBootloader.Config()
    // The synthetic package is unsigned; the model still checks its SHA-256 at the last EXECUTE.
    settings.requireSignature = false
    settings.bankSize = max(settings.bankSize, image.size)
    let d = SimulatedDevice(SimulatedDeviceConfig(link: link), model: NordicDFUPeripheral(bootloader: NordicDFUBootloader(config: settings)))
    let central = SimulatedCentral(devices: [d])
    let profile = NordicDFUProfile(initPacket: secureDFUInitPacket, dfuConfig: config)
    let session = OTASession(central: central, address: d.config.address, image: image, profile: profile)
    let result = try await session.run()
    guard d.model(as: NordicDFUPeripheral.self)?.bootloader.activations.last?.image == image.bytes else {
        throw BenchError("Secure DFU run did not activate the image")
    }
    guard result.stats.bytesResent == 0 else { throw BenchError("Secure DFU run sent \(result.stats.bytesResent) bytes again on a clean link") }
    return Double(image.size) / result.transferSeconds
}

/// The image as an application package would carry it (`nrfutil pkg generate --application`).
let secureDFUInitPacket = DFUInitPacket(command: .application(firmware: image.bytes, version: 1)).bytes

/// The least time any central keeping Secure DFU's rules needs on `link`, from SELECT data's
/// answer to the confirmation of the last byte, computed from the link model's formulas (no
/// simulation). The rules (docs/PERFORMANCE.md, "Nordic Secure DFU"): an object's packets follow
/// its CREATE (they may go at once, in order); EXECUTE follows the confirmation of the object's
/// CRC, at the cheapest the receipt of its last packet; the next CREATE follows EXECUTE's answer
/// (one ATT request at a time, and a CREATE before EXECUTE discards the object). An answer closes
/// its connection event when nothing else may be sent, so each EXECUTE has an event of its own.
func secureDFUBoundSeconds(_ link: LinkModel, imageSize: Int, objectSize: Int) -> Double {
    let ci = link.connectionInterval.seconds * 1e6
    var eventStart = 0.0
    var used = 0.0
    /// A central PDU of `value` bytes (a write's value; ATT adds 3): each LL fragment is a pair.
    func send(value: Int) {
        for f in link.fragments(attBytes: value + 3) {
            let cost = link.pairTime(payload: f)
            if used + cost > ci { eventStart += ci; used = 0 }
            used += cost
        }
    }
    /// A peripheral PDU of `att` bytes: its extra air time in a central packet's slot while the
    /// central has data queued, a whole pair otherwise.
    func answer(att: Int, riding: Bool) {
        let cost = link.fragments(attBytes: att).reduce(0.0) {
            $0 + (riding ? link.airTime(payload: $1) - link.airTime(payload: 0) : link.pairTime(payload: $1))
        }
        if used > 0, used + cost > ci { eventStart += ci; used = 0 }
        used += cost
    }
    func nextEvent() { eventStart += ci; used = 0 }
    // SELECT data (2-byte value) opens an event; its write response (1 byte) and notification
    // (15-byte value) answer it; the transfer's clock starts there and the event closes.
    send(value: 2)
    answer(att: 1, riding: false)
    answer(att: 15 + 3, riding: false)
    let start = used
    nextEvent()
    let chunk = ATTWriteLimit.value(mtu: link.mtu)
    var offset = 0
    while true {
        let size = min(objectSize, imageSize - offset)
        send(value: 6)  // CREATE, its packets queued right behind it
        answer(att: 1, riding: true)
        answer(att: 3 + 3, riding: true)
        var left = size
        while left > 0 {
            send(value: min(chunk, left))
            left -= min(chunk, left)
        }
        answer(att: 11 + 3, riding: false)  // the receipt of the last packet: offset and CRC
        offset += size
        if offset == imageSize { return (eventStart + used - start) / 1e6 }
        nextEvent()
        send(value: 1)  // EXECUTE, alone: nothing may follow it before its answer
        answer(att: 1, riding: false)
        answer(att: 3 + 3, riding: false)
        nextEvent()
    }
}

if options.nordic {
    print("Nordic Secure DFU link efficiency: goodput / model capacity, \(image.size / 1024) KiB image, 4096-byte objects, virtual time")
    print("MTU  PHY interval  capacity kB/s  otaflash  nrfutil  mobile/12  bound   otaflash÷best ref  otaflash÷bound  wait-CREATE")
    let strategies: [(key: String, config: NordicDFUConfig)] = [
        ("otaflash", NordicDFUConfig()),
        ("nrfutil", .nrfutilStrategy),
        ("mobile12", .mobileLibraryStrategy),
        ("otaflash_wait_create", NordicDFUConfig(streamBeforeCreateResponse: false)),
    ]
    var rows: [[String: Any]] = []
    var minVsBound = Double.infinity
    var maxVsBound = 0.0
    var defaultRow: [String: Any] = [:]
    for mtu in [23, 185, 247] {
        for phy in LinkModel.PHY.allCases {
            for ci in [7500, 15000, 30000, 50000] {
                let link = LinkModel(mtu: mtu, phy: phy, connectionInterval: .microseconds(Int64(ci)))
                let cap = link.capacityBytesPerSecond
                var eff: [String: Double] = [:]
                for s in strategies { eff[s.key] = try await secureDFUGoodput(link, s.config) / cap }
                let bound = Double(image.size) / secureDFUBoundSeconds(link, imageSize: image.size, objectSize: 4096) / cap
                if let beat = eff.first(where: { $0.value > bound * (1 + 1e-9) }) {
                    throw BenchError(String(format: "%@ beat the protocol's bound at MTU %d %@ %.1f ms (%.4f > %.4f): the bound is wrong",
                                            beat.key, mtu, phy.rawValue, Double(ci) / 1000, beat.value, bound))
                }
                let ours = eff["otaflash"]!
                let vsRef = ours / max(eff["nrfutil"]!, eff["mobile12"]!)
                let vsBound = ours / bound
                minVsBound = min(minVsBound, vsBound)
                maxVsBound = max(maxVsBound, vsBound)
                var row: [String: Any] = ["mtu": mtu, "phy": phy.rawValue, "interval_ms": Double(ci) / 1000, "capacity": cap,
                                          "bound": bound, "otaflash_vs_best_reference": vsRef, "otaflash_vs_bound": vsBound]
                for (k, v) in eff { row[k] = v }
                rows.append(row)
                if link == LinkModel.default { defaultRow = row }
                print(String(format: "%3d  %@  %5.1f ms  %10.1f      %.3f     %.3f    %.3f    %.3f   %.2f               %.3f           %.3f",
                             mtu, phy.rawValue, Double(ci) / 1000, cap / 1000, ours, eff["nrfutil"]!, eff["mobile12"]!, bound,
                             vsRef, vsBound, eff["otaflash_wait_create"]!))
            }
        }
    }
    if let vsRef = defaultRow["otaflash_vs_best_reference"] as? Double, let vsBound = defaultRow["otaflash_vs_bound"] as? Double {
        print(String(format: "default link (MTU 247, 2M, 15 ms): otaflash %.3f, nrfutil %.3f, mobile/12 %.3f, bound %.3f; otaflash ÷ best reference %.2f, otaflash ÷ bound %.3f; otaflash ÷ bound over the grid %.3f…%.3f",
                     defaultRow["otaflash"] as? Double ?? 0, defaultRow["nrfutil"] as? Double ?? 0, defaultRow["mobile12"] as? Double ?? 0,
                     defaultRow["bound"] as? Double ?? 0, vsRef, vsBound, minVsBound, maxVsBound))
        report.append(("nordic_vs_best_reference_default", vsRef))
        report.append(("nordic_vs_bound_default", vsBound))
    }
    report.append(("nordic_grid", rows))
    report.append(("nordic_default", defaultRow))
    report.append(("nordic_vs_bound_grid_min", minVsBound))
    print()
}

// MARK: MCUmgr SMP (SMP.swift)

if options.smp {
    let (rows, summary) = try await smpBench(imageSize: image.size)
    report.append(("smp_grid", rows))
    report += summary
}

// MARK: Batch

if options.batch {
    /// Peak resident memory of this process so far, in bytes.
    func peakRSS() -> Int {
        var usage = rusage()
        getrusage(RUSAGE_SELF.rawValue, &usage)
        return usage.ru_maxrss * 1024
    }
    /// Flashes `count` simulated devices at once on the link model in real time; returns wall seconds.
    func batchWall(_ count: Int) async throws -> Double {
        let targets = (1...count).map { i -> BatchTarget in
            let address = DeviceAddress(String(format: "C0:FF:EE:00:%02X:%02X", i >> 8, i & 0xFF))!
            let device = SimulatedDevice(SimulatedDeviceConfig(address: address, link: .default))
            return BatchTarget(address: address, adapter: nil, central: SimulatedCentral(devices: [device], clock: SystemClock()))
        }
        let runner = BatchRunner(plan: UpdatePlan(firmware: image, profile: NativeProfile()), options: BatchOptions(parallel: count, perAdapter: count, readBackVersion: false))
        let t0 = ContinuousClock.now
        let outcomes = await runner.run(targets)
        guard outcomes.allSatisfy(\.succeeded) else { throw BenchError("a batch device failed") }
        return (ContinuousClock.now - t0).seconds
    }
    let rssBefore = peakRSS()
    let one = try await batchWall(1)
    let rssOne = peakRSS()
    let many = try await batchWall(32)
    let rssMany = peakRSS()
    let perDevice = Double(rssMany - rssOne) / 31 / 1048576
    print(String(format: "Batch on the link model (real time, %d KiB image, MTU 247 2M 15 ms): 1 device %.2f s, 32 devices in parallel %.2f s (ratio %.2f); peak RSS %.1f MiB -> %.1f MiB -> %.1f MiB, %.2f MiB per extra device",
                 image.size / 1024, one, many, many / one, Double(rssBefore) / 1048576, Double(rssOne) / 1048576, Double(rssMany) / 1048576, perDevice))
    report.append(("batch_one_device_seconds", one))
    report.append(("batch_32_devices_seconds", many))
    report.append(("batch_wall_ratio", many / one))
    report.append(("batch_mib_per_device", perDevice))
}

// MARK: Engine CPU

if options.cpu {
    func cpuSeconds() -> Double {
        var usage = rusage()
        getrusage(RUSAGE_SELF.rawValue, &usage)
        return Double(usage.ru_utime.tv_sec) + Double(usage.ru_utime.tv_usec) / 1e6
            + Double(usage.ru_stime.tv_sec) + Double(usage.ru_stime.tv_usec) / 1e6
    }
    var rngBig = SeededGenerator(seed: 99)
    let big = FirmwareImage(bytes: (0..<(32 << 20)).map { _ in UInt8(truncatingIfNeeded: rngBig.next()) })
    var best = 0.0
    var cpuPerMiB = Double.infinity
    for _ in 0..<3 {
        let d = SimulatedDevice(SimulatedDeviceConfig(slotSize: 64 << 20, link: .unlimited))
        let central = SimulatedCentral(devices: [d])
        let session = OTASession(central: central, address: d.config.address, image: big,
                                 config: EngineConfig(checkpointInterval: EngineConfig.defaultCheckpointInterval), profile: NativeProfile())
        let c0 = cpuSeconds()
        let t0 = ContinuousClock.now
        _ = try await session.run()
        let wall = (ContinuousClock.now - t0).seconds
        let cpu = cpuSeconds() - c0
        guard d.activatedImage?.count == big.size else { throw BenchError("CPU run did not activate the image") }
        best = max(best, Double(big.size) / 1048576 / wall)
        cpuPerMiB = min(cpuPerMiB, cpu / (Double(big.size) / 1048576))
    }
    print(String(format: "Engine CPU path (unlimited link, MTU 517, 32 MiB, best of 3): %.1f MiB/s, %.4f CPU-s per MiB (engine + simulated device)", best, cpuPerMiB))
    report.append(("engine_mib_per_s", best))
    report.append(("engine_cpu_seconds_per_mib", cpuPerMiB))
}

if options.ledger {
    for count in [100, 10_000] {
        let (perRecord, queryMs, bytes) = try await ledgerFigures(count: count)
        print(String(format: "Ledger (SQLite, WAL, synchronous FULL): %d records, %.0f µs per committed record, summary of all in %.1f ms, %.1f KiB on disk",
                     count, perRecord, queryMs, Double(bytes) / 1024))
        report.append(("ledger_\(count)_microseconds_per_record", perRecord))
    }
}

if let path = options.json {
    var object: [String: Any] = [:]
    for (k, v) in report { object[k] = v }
    for key in ["link_efficiency_default", "link_efficiency_grid_min_excluding_mtu23", "stop_and_wait_efficiency_default", "engine_mib_per_s", "bluez_vs_bleak_ratio"] where object[key] == nil {
        object[key] = NSNull()
        notes.append("\(key): not measured by this run of otaflash-bench" + (key == "bluez_vs_bleak_ratio" ? " (needs the BlueZ VM harness: scripts/bench)" : ""))
    }
    object["notes"] = notes
    let data = try JSONSerialization.data(withJSONObject: object, options: [.prettyPrinted, .sortedKeys])
    try data.write(to: URL(fileURLWithPath: path))
    print("wrote \(path)")
}
