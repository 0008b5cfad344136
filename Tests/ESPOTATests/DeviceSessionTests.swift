import GATT
import OTA
import OTADevice
import OTAWire
import Simulator
import Testing
@testable import ESPOTA

/// The real central (`OTASession` with `ESPOTAProfile`) against the example device model in the
/// simulator, on both hosts: the update, its restart, and the ends that need a reset.
@Suite("ESP BLE OTA device through the session")
struct ESPOTADeviceSessionTests {
    static let image = ESPAppImage.build(version: "2.0.0", body: (0..<30_000).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ 5) })

    struct Rig {
        let device: SimulatedDevice
        let central: SimulatedCentral
        var model: ESPOTAPeripheral? { device.model(as: ESPOTAPeripheral.self) }

        init(_ config: ESPOTAPeripheral.Config = .init(), faults: FaultPlan = .none, link: LinkModel = .default) {
            device = SimulatedDevice(SimulatedDeviceConfig(link: link), model: ESPOTAPeripheral(config: config, faults: faults))
            central = SimulatedCentral(devices: [device], clock: VirtualClock())
        }

        func flash(_ image: [UInt8] = ESPOTADeviceSessionTests.image, window: Int = ESPOTAEngine.defaultWindow,
                   reconnect: ReconnectPolicy = ReconnectPolicy()) async -> Result<OTAResult, OTAError> {
            let session = OTASession(central: central, address: device.config.address, image: FirmwareImage(bytes: image),
                                     profile: ESPOTAProfile(window: window), reconnect: reconnect)
            do throws(OTAError) {
                return .success(try await session.run())
            } catch {
                return .failure(error)
            }
        }
    }

    @Test(arguments: ESPOTAComponent.allCases, [23, 247])
    func theImageIsBootedByteForByteOnEachComponent(component: ESPOTAComponent, mtu: Int) async throws {
        let rig = Rig(.init(component: component), link: LinkModel(mtu: mtu))
        let result = try await rig.flash().get()
        #expect(result.bytes == Self.image.count)
        #expect(rig.model?.activations == [Self.image])
        #expect(rig.model?.running == Self.image)
        #expect(rig.model?.secondStarts == 0)
        #expect(rig.model?.startsPerBoot.first == 1)
        #expect(result.stats.rewinds == 0 && result.stats.bytesResent == 0)
    }

    @Test func theReferenceStrategyOfOneSectorThenItsACKAlsoWorks() async throws {
        let rig = Rig()
        _ = try await rig.flash(window: 1).get()
        #expect(rig.model?.activations == [Self.image])
    }

    @Test(arguments: [ESPOTAHost.nimble, .bluedroid])
    func aLinkLostMidTransferEndsTheRunWithTheResetItNeedsAndBootsNothing(host: ESPOTAHost) async throws {
        let rig = Rig(.init(host: host), faults: FaultPlan(disconnectAt: [10_000]))
        let failure = try #require(await rig.flash().failure)
        #expect(failure.code == .connection)
        #expect(!failure.resumable)
        #expect(failure.message.contains("cannot resume"))
        #expect(failure.hint?.contains("reset it") == true)
        #expect(rig.model?.activations.isEmpty == true)
        #expect(rig.model?.secondStarts == 0)
        #expect(rig.device.connectionCount == 1)
    }

    @Test(arguments: [ESPOTAHost.nimble, .bluedroid])
    func anImageTheApplicationRefusesIsAllACKedYetNotBooted(host: ESPOTAHost) async throws {
        // Built for an ESP32-C3, sent to an ESP32: esp_ota_end refuses it, and nothing says so.
        let rig = Rig(.init(host: host, chip: .esp32))
        let wrongChip = ESPAppImage.build(chip: .esp32c3, body: Array(repeating: 7, count: 9000))
        let failure = try #require(await rig.flash(wrongChip).failure)
        #expect(failure.code == .verifyFailed)
        #expect(failure.message.contains("did not restart"))
        #expect(rig.model?.activations.isEmpty == true)
        #expect(rig.model?.refusals.count == 1)
    }

    @Test func bleOTARawCatchesACorruptedSectorByItsCRCAndTheSectorIsSentAgain() async throws {
        let rig = Rig(.init(component: .raw), faults: FaultPlan(corruptAt: [5000]))
        let result = try await rig.flash().get()
        #expect(result.stats.rewinds >= 1)
        #expect(rig.model?.activations == [Self.image])
    }

    @Test(arguments: [ESPOTAComponent.nimble, .bluedroid])
    func bleOTAChecksNoSectorCRCSoTheApplicationRefusesTheCorruptedImage(component: ESPOTAComponent) async throws {
        let rig = Rig(.init(component: component), faults: FaultPlan(corruptAt: [5000]))
        let failure = try #require(await rig.flash().failure)
        #expect(failure.code == .verifyFailed)
        #expect(failure.message.contains("took every byte and refused"))
        #expect(rig.model?.activations.isEmpty == true)
        #expect(rig.model?.received ?? 0 >= Self.image.count)  // Bluedroid hands 4096 bytes a sector
    }

    /// The faults of a real link, one at a time, on the two paths: otaflash's pipelined stream to
    /// `ble_ota` on NimBLE (two sectors, each last packet held), and the window `ble_ota_raw`
    /// announces (12 KiB ring buffer: three sectors). Each line printed is a row of the fault table.
    enum Fault: String, CaseIterable, Sendable {
        case lostWriteCommand, lostWriteCommandBeforeTheLastPacket, lostLastPacket, sequenceError, wrongSectorPacket, lostACK, lostLastACK, linkLost
    }

    struct Path: Sendable, CustomStringConvertible {
        var component: ESPOTAComponent
        var mtu: Int
        var description: String { "\(component) MTU \(mtu)" }
        static let all = [ESPOTAComponent.nimble, .raw].flatMap { c in [23, 247].map { Path(component: c, mtu: $0) } }
    }

    @Test(arguments: Fault.allCases, Path.all)
    func eachFaultEndsWithTheImageBootedOrTheRightDiagnosis(fault: Fault, path: Path) async throws {
        let (component, mtu) = (path.component, path.mtu)
        // Write command indexes on RECV_FW: at MTU 23 a sector is 241 data packets, the empty one
        // and the last; at MTU 247, 17 + 1 + 1.
        let perSector = mtu == 23 ? 243 : 19
        let sectors = (Self.image.count + 4095) / 4096
        var seeded = SeededGenerator(seed: 32)
        let random = Int(seeded.next() % UInt64(perSector * (sectors - 1)))
        var faults = ESPDeviceFaults()
        var plan = FaultPlan()
        switch fault {
        case .lostWriteCommand: faults.dropWriteAt = [random]
        case .lostWriteCommandBeforeTheLastPacket: faults.dropWriteAt = [perSector * 2 - 3]
        case .lostLastPacket: faults.dropWriteAt = [perSector * 2 - 1]
        case .sequenceError: faults.duplicateAt = [random]
        case .wrongSectorPacket: faults.wrongSectorAt = [random]
        case .lostACK: faults.loseACKOfSector = [2]
        case .lostLastACK: faults.loseACKOfSector = [sectors - 1]
        case .linkLost: plan.disconnectAt = [Self.image.count * 2 / 5]
        }
        let rig = Rig(.init(component: component, faults: faults), faults: plan, link: LinkModel(mtu: mtu))
        let result = await rig.flash()
        let model = try #require(rig.model)
        let line: String
        switch result {
        case .success(let r): line = "ok, \(r.stats.rewinds) resends"
        case .failure(let e): line = "\(e.code): \(e.message.prefix(90))"
        }
        let received = model.activations.isEmpty ? model.received : Self.image.count
        print("FAULT \(fault.rawValue) | \(component == .nimble ? "pipelined (ble_ota NimBLE)" : "windowed (ble_ota_raw, 3)") | MTU \(mtu) | \(line) | device bytes \(received) of \(Self.image.count) | booted \(model.activations == [Self.image])")
        #expect(model.secondStarts == 0)
        if let failure = result.failure, failure.message.contains("took sector"), failure.message.contains("short") {
            // A packet refused just before a sector's last one (NimBLE resets, then takes the last
            // packet): no resend can mend it; the device waits for bytes and the line says so.
            #expect(fault == .wrongSectorPacket && component == .nimble)
            #expect(model.waitingForBytes && model.activations.isEmpty && model.shortSectors == 1)
            return
        }
        #expect(model.shortSectors == 0)
        switch fault {
        case .linkLost:
            let failure = try #require(result.failure)
            #expect(failure.code == .connection && failure.hint?.contains("reset") == true)
            #expect(model.activations.isEmpty)
            #expect(model.received < Self.image.count)
        case .lostLastACK:
            // The device restarts into the image; nothing tells the central so.
            let failure = try #require(result.failure)
            #expect(failure.code == .notConfirmed && failure.message.hasPrefix("sent and executed, not confirmed"))
            #expect(model.activations == [Self.image])
        default:
            #expect(result.failure == nil)
            #expect(model.activations == [Self.image])
        }
    }

    @Test func bluedroidTakesALostWriteCommandSilentlyAndTheRefusalSaysSo() async throws {
        let rig = Rig(.init(component: .bluedroid, faults: ESPDeviceFaults(dropWriteAt: [100])), link: LinkModel(mtu: 23))
        let failure = try #require(await rig.flash().failure)
        #expect(failure.code == .verifyFailed)
        #expect(failure.message.contains("a write command lost on the way"))
        #expect(rig.model?.activations.isEmpty == true)
    }

    @Test func aHostOutOfBuffersDropsWriteCommandsAndTheUpdateStillCompletes() async throws {
        // A slow flash blocks the host task; it keeps 4 write commands meanwhile.
        let rig = Rig(.init(component: .nimble, hostBufferPackets: 4, flashTimePerSector: .milliseconds(200)), link: LinkModel(mtu: 23))
        let result = try await rig.flash().get()
        #expect(try #require(rig.model).droppedWrites > 0)
        #expect(result.stats.rewinds > 0)
        #expect(rig.model?.activations == [Self.image])
    }

    @Test func simDropRateDropsWriteCommandsAndTheUpdateStillCompletes() async throws {
        let rig = Rig(.init(component: .nimble), faults: FaultPlan(seed: 7, dropRate: 0.03), link: LinkModel(mtu: 247))
        _ = try await rig.flash().get()
        #expect(try #require(rig.model).droppedWrites > 0)
        #expect(rig.model?.activations == [Self.image])
    }

    @Test func slowFlashHoldsTheACKsBackAndTheTransferStillCompletes() async throws {
        let rig = Rig(.init(flashTimePerSector: .milliseconds(400)))
        let result = try await rig.flash().get()
        #expect(rig.model?.activations == [Self.image])
        #expect(result.transferSeconds > 2)
    }

    @Test func aLargeImageOnASlowLinkIsNotCutShortByTheReplyTimeout() async throws {
        // 64 sectors at MTU 23 take far longer than one reply timeout: each sector's last packet
        // starts the wait for its ACK.
        let rig = Rig(.init(flashTimePerSector: .milliseconds(12)), link: LinkModel(mtu: 23))
        let big = ESPAppImage.build(body: (0..<256_000).map { UInt8(truncatingIfNeeded: $0 &* 7) })
        let result = try await rig.flash(big).get()
        #expect(result.transferSeconds > 5)
        #expect(rig.model?.activations == [big])
    }

    @Test func aCheckLongerThanTheReplyTimeoutStillEndsInTheRestart() async throws {
        let rig = Rig(.init(verifyTime: .seconds(12)))
        _ = try await rig.flash().get()
        #expect(rig.model?.activations == [Self.image])
    }

    @Test func aDeviceThatNeverACKsEndsWithinTheReplyTimeouts() async throws {
        let rig = Rig(faults: FaultPlan(stopAnsweringAt: 100))
        let failure = try #require(await rig.flash().failure)
        #expect(failure.code == .timeout)
        #expect(failure.hint?.contains("reset") == true)
    }
}

extension Result {
    var failure: Failure? {
        if case .failure(let error) = self { return error }
        return nil
    }
}
