import GATT
import Native
import OTA
import OTADevice
import Simulator
import Synchronization
import Testing
@testable import NordicDFU

// Secure DFU through the shared session and the simulator: `NordicDFUProfile` on the central,
// `NordicDFUPeripheral` (the bootloader model) on the device.

private final class EventLog: Sendable {
    let events = Mutex<[SessionEvent]>([])
}

/// Flashes `firmware` into a simulated bootloader through the shared session; the outcome
/// either way, and the device to inspect.
func attemptNordicFlash(initPacket: [UInt8], firmware: FirmwareImage, bootloader: NordicDFUBootloader = NordicDFUBootloader(),
                        faults: FaultPlan = .none, link: LinkModel = .default, reconnect: ReconnectPolicy = .never,
                        events: @escaping @Sendable (SessionEvent) -> Void = { _ in }) async -> (Result<OTAResult, OTAError>, SimulatedDevice) {
    let config = SimulatedDeviceConfig(link: link)
    let device = SimulatedDevice(config, model: NordicDFUPeripheral(bootloader: bootloader, faults: faults, resetDelay: config.bootDelay))
    let central = SimulatedCentral(devices: [device], clock: VirtualClock())
    let session = OTASession(central: central, address: device.config.address, image: firmware,
                             profile: NordicDFUProfile(initPacket: initPacket), reconnect: reconnect)
    do throws(OTAError) {
        return (.success(try await session.run(events: events)), device)
    } catch {
        return (.failure(error), device)
    }
}

@Suite struct NordicDFUProfileTests {
    struct Run {
        let result: OTAResult
        let device: SimulatedDevice
        let events: [SessionEvent]
        var bootloader: NordicDFUBootloader? { device.model(as: NordicDFUPeripheral.self)?.bootloader }
    }

    func flash(initPacket: [UInt8], firmware: FirmwareImage, bootloader: NordicDFUBootloader,
               faults: FaultPlan = .none, reconnect: ReconnectPolicy = .never) async throws -> Run {
        let log = EventLog()
        let (result, device) = await attemptNordicFlash(initPacket: initPacket, firmware: firmware, bootloader: bootloader,
                                                        faults: faults, reconnect: reconnect) { event in log.events.withLock { $0.append(event) } }
        return Run(result: try result.get(), device: device, events: log.events.withLock { $0 })
    }

    @Test func theSignedSampleFlashesThroughTheSessionAndIsActivatedByteIdentical() async throws {
        let package = try DFUPackage.load(path: nordicSample("blinky-app.zip"))
        let image = try #require(package.images.first)
        var config = NordicDFUBootloader.Config()
        config.signatureCheck = try sampleKeyCheck()
        let run = try await flash(initPacket: image.initPacket.bytes, firmware: image.firmware,
                                  bootloader: NordicDFUBootloader(config: config))
        let activations = try #require(run.bootloader?.activations)
        #expect(activations.map(\.image) == [image.firmware.bytes])
        #expect(activations.first?.type == .application)
        #expect(run.result.chunkSize == 244)
        let summaries = run.events.compactMap { event -> DeviceSummary? in
            if case .deviceInfo(_, let info) = event { return info } else { return nil }
        }
        #expect(summaries.map(\.protocolName) == ["nordic-dfu"])
        #expect(run.events.contains { if case .verifying = $0 { true } else { false } })
    }

    /// The simulator's link keeps write order, and the profile tells the engine, so an object's
    /// packets follow its CREATE without waiting for the answer.
    @Test func anOrderedLinkLetsPacketsFollowCreateAtOnce() async throws {
        let device = SimulatedDevice(SimulatedDeviceConfig(), model: NordicDFUPeripheral())
        let central = SimulatedCentral(devices: [device], clock: VirtualClock())
        let connection = try await central.connect(to: device.config.address, timeout: .seconds(5))
        let profile = NordicDFUProfile(initPacket: [1, 2, 3])
        let link = try await profile.attach(to: connection, device: "sim", discoveryTimeout: .seconds(5))
        #expect(connection.keepsWriteOrder)
        #expect(link.peer.keepsWriteOrder)
        var engine = profile.makeEngine(image: FirmwareImage(bytes: firmwareBytes(100)), config: EngineConfig())
        #expect(!engine.streamsBeforeCreateResponse)
        _ = engine.handle(.connected(link.peer, mtu: 247))
        #expect(engine.streamsBeforeCreateResponse)
        await connection.disconnect()
    }

    /// At MTU 517 a packet is 510 bytes, not 514: BlueZ drops longer write commands.
    @Test func aPacketNeverExceedsWhatOneWriteCarries() async throws {
        let firmware = firmwareBytes(4096 + 1000)
        let dat = DFUInitPacket(command: .application(firmware: firmware, version: 2, softDeviceRequirements: [0xAF]),
                                signature: placeholderSignature).bytes
        var config = SimulatedDeviceConfig()
        config.link = LinkModel(mtu: 517)
        let device = SimulatedDevice(config, model: NordicDFUPeripheral(bootloader: NordicDFUBootloader()))
        let session = OTASession(central: SimulatedCentral(devices: [device], clock: VirtualClock()), address: config.address,
                                 image: FirmwareImage(bytes: firmware), profile: NordicDFUProfile(initPacket: dat))
        let log = EventLog()
        let result = try await session.run { event in log.events.withLock { $0.append(event) } }
        let chunks = log.events.withLock { $0 }.compactMap { event -> Int? in
            if case .connected(_, 517, let chunk) = event { chunk } else { nil }
        }
        #expect(chunks == [510])
        #expect(NordicDFUProfile().chunkSize(mtu: 517) == 510 && NordicDFUProfile().chunkSize(mtu: 247) == 244)
        #expect(result.activated)
        #expect(device.model(as: NordicDFUPeripheral.self)?.bootloader.activations.map(\.image) == [firmware])
    }

    /// What BlueZ gets (its writes keep no order with requests): CREATE's answer is waited for,
    /// then the object's packets, the last one's receipt confirming it. Nothing is sent twice.
    @Test func waitingForCreateAtMTU517SendsEachObjectOnce() async throws {
        let firmware = firmwareBytes(4096 * 6 + 2048)
        let dat = DFUInitPacket(command: .application(firmware: firmware, version: 2, softDeviceRequirements: [0xAF]),
                                signature: placeholderSignature).bytes
        var config = SimulatedDeviceConfig()
        config.link = LinkModel(mtu: 517)
        let device = SimulatedDevice(config, model: NordicDFUPeripheral(bootloader: NordicDFUBootloader()))
        let profile = NordicDFUProfile(initPacket: dat, dfuConfig: NordicDFUConfig(streamBeforeCreateResponse: false))
        let session = OTASession(central: SimulatedCentral(devices: [device], clock: VirtualClock()), address: config.address,
                                 image: FirmwareImage(bytes: firmware), profile: profile)
        let result = try await session.run { _ in }
        #expect(result.activated)
        #expect(result.stats.bytesResent == 0)
        #expect(result.stats.rollbacks == 0)
        #expect(device.model(as: NordicDFUPeripheral.self)?.bootloader.dataExecutes == 7)
    }

    @Test func anImageOfSeveralObjectsGoesObjectByObject() async throws {
        let firmware = firmwareBytes(4096 * 3 + 500)
        let dat = DFUInitPacket(command: .application(firmware: firmware, version: 2, softDeviceRequirements: [0xAF]),
                                signature: placeholderSignature).bytes
        let run = try await flash(initPacket: dat, firmware: FirmwareImage(bytes: firmware), bootloader: NordicDFUBootloader())
        #expect(run.bootloader?.activations.map(\.image) == [firmware])
        #expect(run.bootloader?.dataExecutes == 4)
        #expect(run.result.stats.bytesResent == 0)
        #expect(run.result.stats.connections == 1)
    }

    @Test func aLinkLossMidObjectResumesThroughTheSharedSupervisor() async throws {
        let firmware = firmwareBytes(4096 * 3 + 500)
        let dat = DFUInitPacket(command: .application(firmware: firmware, version: 2, softDeviceRequirements: [0xAF]),
                                signature: placeholderSignature).bytes
        let run = try await flash(initPacket: dat, firmware: FirmwareImage(bytes: firmware), bootloader: NordicDFUBootloader(),
                                  faults: FaultPlan(disconnectAt: [4096 + 1500]), reconnect: ReconnectPolicy(seed: 3))
        #expect(run.bootloader?.activations.map(\.image) == [firmware])
        #expect(run.result.stats.connections == 2)
        #expect(run.events.contains { if case .reconnecting = $0 { true } else { false } })
        // SELECT on the second connection reports where the device stands, mid-object.
        let resumedAt = try #require(run.result.stats.resumedFrom.last)
        #expect(resumedAt > 4096 && resumedAt < 8192)
        // Never more than the object in progress is sent again.
        #expect(run.result.stats.bytesResent <= 4096)
    }

    @Test func aDeviceWithoutTheDFUServiceGetsOneLine() async throws {
        let device = SimulatedDevice(SimulatedDeviceConfig())
        let central = SimulatedCentral(devices: [device], clock: VirtualClock())
        let session = OTASession(central: central, address: device.config.address, image: FirmwareImage(bytes: firmwareBytes(100)),
                                 profile: NordicDFUProfile(initPacket: [1, 2, 3]), reconnect: .never)
        let error = await #expect(throws: OTAError.self) { try await session.run() }
        #expect(error?.message.contains("Secure DFU") == true)
    }
}
