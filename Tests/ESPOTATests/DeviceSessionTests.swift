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

    @Test(arguments: [ESPOTAHost.nimble, .bluedroid], [23, 247])
    func theImageIsBootedByteForByteOnEitherHost(host: ESPOTAHost, mtu: Int) async throws {
        let rig = Rig(.init(host: host), link: LinkModel(mtu: mtu))
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

    @Test func nimbleCatchesACorruptedSectorByItsCRCAndTheSectorIsSentAgain() async throws {
        let rig = Rig(.init(host: .nimble), faults: FaultPlan(corruptAt: [5000]))
        let result = try await rig.flash().get()
        #expect(result.stats.rewinds >= 1)
        #expect(rig.model?.activations == [Self.image])
    }

    @Test func bluedroidChecksNoSectorCRCSoTheApplicationRefusesTheCorruptedImage() async throws {
        let rig = Rig(.init(host: .bluedroid), faults: FaultPlan(corruptAt: [5000]))
        let failure = try #require(await rig.flash().failure)
        #expect(failure.code == .verifyFailed)
        #expect(rig.model?.activations.isEmpty == true)
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

    @Test func aDeviceThatNeverACKsEndsWithinTheReplyTimeout() async throws {
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
