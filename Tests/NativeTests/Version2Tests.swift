import GATT
import Native
import OTA
import OTADevice
import OTAWire
import Simulator
import Testing

/// The central negotiates protocol version 2 from the info value (docs/PROTOCOL.md, "Versions"):
/// BEGIN carries the device's version, checkpoints fall on erase-unit boundaries, and a CHECKPOINT
/// waits long enough for a window's erases. Version 1 devices are unchanged (the other suites).
@Suite("Protocol version 2")
struct Version2Tests {
    static func info(unit: UInt32 = 4096, eraseMs: UInt16 = 85, erasesAhead: Bool = false) -> DeviceInfo {
        DeviceInfo(protocolVersion: 2, state: .idle, maxImageSize: 1 << 20, firmwareVersion: FirmwareVersion(packed: 0x0100_0000),
                   received: 0, pendingImageSize: 0,
                   flash: .init(eraseUnit: unit, reorderCapacity: 32 * 1024, reorderRanges: 16, eraseTimeMs: eraseMs, erasesAhead: erasesAhead))
    }

    @Test func beginCarriesTheDevicesVersion() throws {
        var engine = OTAEngine(image: testImage(5000))
        let actions = engine.handle(.connected(info: Self.info(), mtu: 247))
        guard case .begin(let begin)? = actions.first?.request else {
            Issue.record("expected BEGIN, got \(actions)")
            return
        }
        #expect(begin.protocolVersion == 2)
    }

    /// Every checkpoint but the last is the first packet edge at or past a multiple of the interval
    /// rounded up to the erase unit (so the device commits that multiple), packets stay full, and
    /// every byte is sent once.
    @Test(arguments: [(16 * 1024, 4096, 247), (10_000, 4096, 185), (4096, 8192, 23), (1024, 4096, 517)])
    func checkpointsCommitEraseUnitBoundaries(interval: Int, unit: Int, mtu: Int) {
        let image = testImage(100_000, seed: UInt64(interval))
        let chunk = OTAProtocol.chunkSize(mtu: mtu)
        var engine = OTAEngine(image: image, settings: .init(checkpointInterval: interval))
        var actions = engine.handle(.connected(info: Self.info(unit: UInt32(unit)), mtu: mtu))
        #expect(actions.count == 1)
        actions = engine.handle(Device.begin(offset: 0, crc: 0))
        #expect(actions.isEmpty)
        let step = (max(interval, chunk) + unit - 1) / unit * unit
        var checkpoints: [Int] = []
        var next = 0
        for _ in 0..<10_000 {
            for s in engine.streamUntilIdle() {
                if let d = s.data {
                    #expect(d.offset == next)
                    #expect(d.count == min(chunk, image.size - d.offset), "packet \(d.offset)+\(d.count) is not full")
                    next += d.count
                }
            }
            guard case .checkpoint(let offset, let c)? = engine.commandInFlight else { break }
            checkpoints.append(Int(offset))
            _ = engine.handle(Device.checkpoint(.success, offset: Int(offset), crc: c))
            if Int(offset) == image.size { break }
        }
        #expect(next == image.size)
        #expect(checkpoints.last == image.size)
        let commits = checkpoints.dropLast().map { $0 / step * step }
        #expect(commits == Array(stride(from: step, through: commits.last ?? 0, by: step)), "\(checkpoints)")
        #expect(checkpoints.dropLast().allSatisfy { $0 % step < chunk }, "\(checkpoints)")
        #expect(commits.count == (image.size - 1) / step)
    }

    @Test func checkpointTimeoutCoversAWindowOfErases() {
        let image = testImage(100_000)
        let config = EngineConfig()
        for (info, extra) in [(Self.info(eraseMs: 85), Duration.milliseconds(9 * 85)),
                              (Self.info(eraseMs: 85, erasesAhead: true), .zero), (Device.info(), .zero)] {
            var engine = OTAEngine(image: image, config: config)
            _ = engine.handle(.connected(info: info, mtu: 247))
            _ = engine.handle(Device.begin(offset: 0, crc: 0))
            _ = engine.streamUntilIdle()
            #expect(engine.commandInFlight?.opcode == .checkpoint)
            #expect(engine.currentTimeout == config.replyTimeout + extra)
        }
    }

    /// A version 2 device that holds early CHECKPOINTs, with the C library in lockstep.
    static func device(faults: FaultPlan = .none, unit: Int = 4096) -> SimulatedDevice {
        SimulatedDevice(SimulatedDeviceConfig(slotSize: 1 << 20, faults: faults), native: NativeDeviceOptions(holdEarlyCheckpoint: .milliseconds(300), version2: .init(eraseUnit: unit, reorderCapacity: 32 * 1024, reorderRanges: 16, eraseTimeMs: 85), runsCLibrary: true))
    }

    /// Whole sessions against a version 2 device with NOR timing (85 ms per 4 KiB erase, 40 µs
    /// per word) and faults: the image activated is the image sent, and the C library, run in
    /// lockstep, answered every write as the Swift model did.
    @Test(arguments: [
        ("clean", FaultPlan.none),
        ("drops", FaultPlan(seed: 3, dropRate: 0.03)),
        ("corruption", FaultPlan(corruptAt: [1000, 50_000])),
        ("reboot mid-transfer", FaultPlan(rebootAt: [40_000])),
        ("lost notifications", FaultPlan(seed: 4, lostNotificationRate: 0.1)),
    ])
    func sessionActivatesTheImageOnAVersion2Device(name: String, faults: FaultPlan) async throws {
        let image = testImage(96 * 1024, seed: 41)
        let device = Self.device(faults: faults)
        let result = try await flash(image, to: device, reconnect: ReconnectPolicy(window: .seconds(60), seed: 1)).get()
        #expect(result.activated, "\(name)")
        #expect(device.activatedImage == image.bytes, "\(name)")
        #expect(device.target?.protocolVersion == 2)
        #expect((device.target?.erases ?? 0) >= image.size / 4096, "\(name): the device erased before it wrote")
        #expect(device.target?.runsCLibrary == true)
        #expect(device.target?.lockstepDivergence == nil, "\(name): \(device.target?.lockstepDivergence ?? "")")
    }

    /// Flash that rots after the transfer: both devices refuse the image at VERIFY, alike.
    @Test func flashBitFlipIsRefusedAlikeByBothDevices() async throws {
        let image = testImage(40_000, seed: 43)
        let device = Self.device(faults: FaultPlan(flashBitFlipAt: 5000))
        let result = await flash(image, to: device)
        guard case .failure(let error) = result else {
            Issue.record("a rotten image was reported as flashed")
            return
        }
        #expect(error.code == .verifyFailed)
        #expect(device.target?.lastActivation == nil)
        #expect(device.target?.lockstepDivergence == nil, "\(device.target?.lockstepDivergence ?? "")")
    }
}
