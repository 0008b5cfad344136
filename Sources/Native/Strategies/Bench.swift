import Foundation
import GATT
import OTA
import OTAWire
import Simulator

/// How the bench measures the native protocol: the checkpoint interval sweep, the link efficiency
/// grid against centrals that do not pipeline, protocol version 2, a batch of native devices in
/// parallel, and the engine's CPU path (docs/PERFORMANCE.md explains each figure).
public struct NativeBench: BenchStrategy {
    public init() {}

    public var sections: [BenchSection] {
        [
            BenchSection(flag: "--interval-sweep") { image in try await Self.intervalSweep(image) },
            BenchSection(flag: "--grid") { image in try await Self.grid(image) },
            BenchSection(flag: "--v2") { image in try await Self.version2(image) },
            BenchSection(flag: "--batch") { image in try await Self.batch(image) },
            BenchSection(flag: "--engine-cpu") { _ in try await Self.engineCPU() },
        ]
    }

    static func device(_ link: LinkModel, dataProperties: CharacteristicProperties = [.writeWithoutResponse, .write],
                       version2: OTATarget.Version2? = nil) -> SimulatedDevice {
        SimulatedDevice(SimulatedDeviceConfig(slotSize: 4 << 20, link: link), native: NativeDeviceOptions(dataProperties: dataProperties, version2: version2))
    }

    /// Goodput of otaflash's engine: image bytes over the streaming time (BEGIN reply to last checkpoint reply).
    static func engineGoodput(_ image: FirmwareImage, _ link: LinkModel, interval: Int = OTAEngine.Settings.defaultCheckpointInterval,
                              version2: OTATarget.Version2? = nil) async throws -> Double {
        let d = device(link, version2: version2)
        let central = SimulatedCentral(devices: [d])
        let session = OTASession(central: central, address: d.config.address, image: image,
                                 profile: NativeProfile(settings: OTAEngine.Settings(checkpointInterval: interval)))
        let result = try await session.run()
        guard d.activatedImage == image.bytes else { throw BenchFailure("engine run did not activate the image") }
        return Double(image.size) / result.transferSeconds
    }

    /// A reference central that does not pipeline: `batch` packets without response, then a
    /// checkpoint it waits for (batch 12 = a Nordic-style receipt every 12 packets); batch 0 = every
    /// packet written with response (stop-and-wait, as naive scripts do).
    static func baselineGoodput(_ image: FirmwareImage, _ link: LinkModel, batch: Int) async throws -> Double {
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
            throw BenchFailure("no reply to \(request.opcode)")
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
                guard r.status == .success else { throw BenchFailure("checkpoint refused: \(r.status)") }
            }
        }
        if batch == 0 {
            let r = try await command(.checkpoint(offset: UInt32(offset), crc: crc.value))
            guard r.status == .success else { throw BenchFailure("checkpoint refused: \(r.status)") }
        }
        let seconds = (clock.now - start).seconds
        let v = try await command(.verify)
        guard v.status == .success else { throw BenchFailure("baseline image failed verify: \(v.status)") }
        await conn.disconnect()
        return Double(image.size) / seconds
    }

    static func pct(_ x: Double) -> String { String(format: "%.3f", x) }

    static func intervalSweep(_ image: FirmwareImage) async throws -> [(key: String, value: Any)] {
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
                let eff = try await engineGoodput(image, link, interval: interval) / link.capacityBytesPerSecond
                line += pct(eff).padding(toLength: 18, withPad: " ", startingAt: 0)
                rows.append(["interval": interval, "link": name, "efficiency": eff])
            }
            print(line)
        }
        print()
        return [("interval_sweep", rows)]
    }

    static func grid(_ image: FirmwareImage) async throws -> [(key: String, value: Any)] {
        print("Link efficiency: goodput / model capacity, \(image.size / 1024) KiB image, virtual time")
        print("MTU  PHY interval  capacity kB/s  otaflash  receipt/12  stop-and-wait")
        var rows: [[String: Any]] = []
        var minExcl23 = Double.infinity
        for mtu in [23, 185, 247, 517] {
            for phy in LinkModel.PHY.allCases {
                for ci in [7500, 15000, 30000, 50000] {
                    let link = LinkModel(mtu: mtu, phy: phy, connectionInterval: .microseconds(Int64(ci)))
                    let cap = link.capacityBytesPerSecond
                    let ours = try await engineGoodput(image, link) / cap
                    let prn = try await baselineGoodput(image, link, batch: 12) / cap
                    let saw = try await baselineGoodput(image, link, batch: 0) / cap
                    if mtu != 23 { minExcl23 = min(minExcl23, ours) }
                    rows.append(["mtu": mtu, "phy": phy.rawValue, "interval_ms": Double(ci) / 1000, "capacity": cap,
                                 "otaflash": ours, "receipt12": prn, "stop_and_wait": saw])
                    print(String(format: "%3d  %@  %5.1f ms  %10.1f      %.3f     %.3f       %.3f",
                                 mtu, phy.rawValue, Double(ci) / 1000, cap / 1000, ours, prn, saw))
                }
            }
        }
        let def = LinkModel.default
        let defEff = try await engineGoodput(image, def) / def.capacityBytesPerSecond
        let defSaw = try await baselineGoodput(image, def, batch: 0) / def.capacityBytesPerSecond
        let defPrn = try await baselineGoodput(image, def, batch: 12) / def.capacityBytesPerSecond
        print(String(format: "default link (MTU 247, 2M, 15 ms): otaflash %.3f, receipt/12 %.3f, stop-and-wait %.3f; grid minimum excluding MTU 23: %.3f",
                     defEff, defPrn, defSaw, minExcl23))
        print()
        return [
            ("grid", rows),
            ("link_efficiency_default", defEff),
            ("link_efficiency_grid_min_excluding_mtu23", minExcl23),
            ("stop_and_wait_efficiency_default", defSaw),
            ("receipt12_efficiency_default", defPrn),
        ]
    }

    /// Version 2 with the flash's time left out measures what the protocol costs (checkpoints on
    /// erase-unit boundaries); with NOR timing the flash is the bottleneck, and the figure to
    /// compare with is the flash's own bound: one unit per (erase + unit / 4 words).
    static func version2(_ image: FirmwareImage) async throws -> [(key: String, value: Any)] {
        let def = LinkModel.default
        let cap = def.capacityBytesPerSecond
        let v1 = try await engineGoodput(image, def) / cap
        let instant = OTATarget.Version2(eraseTimeMs: 0, wordProgramTime: .zero)
        let v2 = try await engineGoodput(image, def, version2: instant) / cap
        let nor = OTATarget.Version2()
        let norGoodput = try await engineGoodput(image, def, version2: nor)
        let unitTime = Duration.milliseconds(Int(nor.eraseTimeMs)) + nor.wordProgramTime * (nor.eraseUnit / 4)
        let flashBound = Double(nor.eraseUnit) / unitTime.seconds
        print("Protocol v2 link efficiency: goodput / model capacity, \(image.size / 1024) KiB image, default link (MTU 247, 2M, 15 ms), virtual time")
        print(String(format: "v1 %.3f; v2 (4 KiB erase units, flash time left out) %.3f", v1, v2))
        print(String(format: "v2 on NOR flash (85 ms per 4 KiB erase, 40 us per word): %.1f kB/s = %.3f of the link, %.3f of the flash's own bound (%.1f kB/s)",
                     norGoodput / 1000, norGoodput / cap, norGoodput / flashBound, flashBound / 1000))
        print()
        return [
            ("v1_link_efficiency_default", v1),
            ("v2_link_efficiency_default", v2),
            ("v2_nor_goodput", norGoodput),
            ("v2_nor_fraction_of_flash_bound", norGoodput / flashBound),
        ]
    }

    /// Native devices flashed at once by `BatchRunner` on the link model in real time: the wall
    /// time of 1 and of 32, and the peak memory each extra device adds.
    static func batch(_ image: FirmwareImage) async throws -> [(key: String, value: Any)] {
        /// Peak resident memory of this process so far, in bytes.
        func peakRSS() -> Int {
            var usage = rusage()
            getrusage(RUSAGE_SELF.rawValue, &usage)
            return usage.ru_maxrss * 1024
        }
        /// Flashes `count` simulated devices at once; returns wall seconds.
        func batchWall(_ count: Int) async throws -> Double {
            let targets = (1...count).map { i -> BatchTarget in
                let address = DeviceAddress(0xC0, 0xFF, 0xEE, 0x00, UInt8(truncatingIfNeeded: i >> 8), UInt8(truncatingIfNeeded: i))
                let device = SimulatedDevice(SimulatedDeviceConfig(address: address, link: .default))
                return BatchTarget(address: address, adapter: nil, central: SimulatedCentral(devices: [device], clock: SystemClock()))
            }
            let runner = BatchRunner(plan: UpdatePlan(firmware: image, profile: NativeProfile()),
                                     options: BatchOptions(parallel: count, perAdapter: count, readBackVersion: false))
            let t0 = ContinuousClock.now
            let outcomes = await runner.run(targets)
            guard outcomes.allSatisfy(\.succeeded) else { throw BenchFailure("a batch device failed") }
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
        return [("batch_one_device_seconds", one), ("batch_32_devices_seconds", many), ("batch_wall_ratio", many / one), ("batch_mib_per_device", perDevice)]
    }

    /// The engine and the simulated device on an unlimited link: MiB/s of wall time and CPU
    /// seconds per MiB for a 32 MiB image, best of 3.
    static func engineCPU() async throws -> [(key: String, value: Any)] {
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
                                     profile: NativeProfile(settings: OTAEngine.Settings()))
            let c0 = cpuSeconds()
            let t0 = ContinuousClock.now
            _ = try await session.run()
            let wall = (ContinuousClock.now - t0).seconds
            let cpu = cpuSeconds() - c0
            guard d.activatedImage?.count == big.size else { throw BenchFailure("CPU run did not activate the image") }
            best = max(best, Double(big.size) / 1048576 / wall)
            cpuPerMiB = min(cpuPerMiB, cpu / (Double(big.size) / 1048576))
        }
        print(String(format: "Engine CPU path (unlimited link, MTU 517, 32 MiB, best of 3): %.1f MiB/s, %.4f CPU-s per MiB (engine + simulated device)", best, cpuPerMiB))
        return [("engine_mib_per_s", best), ("engine_cpu_seconds_per_mib", cpuPerMiB)]
    }
}
