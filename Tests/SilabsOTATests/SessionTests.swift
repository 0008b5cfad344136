import GATT
import OTA
import OTADevice
import OTAWire
import Simulator
import Testing
@testable import SilabsOTA

/// The real central (`OTASession` with `SilabsOTAProfile`) against the device models in the
/// simulator: both kinds, what real devices vary, and the faults the real stack makes.
@Suite("silabs-ota through the session")
struct SilabsSessionTests {
    static let gbl = TestGBL.bytes(version: 0x0200_0000, body: TestGBL.body(20_000))

    struct Rig {
        let device: SimulatedDevice
        let central: SimulatedCentral
        var model: SilabsOTAPeripheral? { device.model(as: SilabsOTAPeripheral.self) }

        init(_ config: SilabsOTAPeripheral.Config, faults: FaultPlan = .none, link: LinkModel = .default) {
            device = SimulatedDevice(SimulatedDeviceConfig(link: link), model: SilabsOTAPeripheral(config: config, faults: faults))
            central = SimulatedCentral(devices: [device], clock: VirtualClock())
        }

        func flash(_ bytes: [UInt8] = SilabsSessionTests.gbl, commands: Bool = false, reconnect: ReconnectPolicy = ReconnectPolicy(),
                   config: EngineConfig = EngineConfig()) async -> Result<OTAResult, OTAError> {
            let version = SilabsBootloaderCheck.check(bytes, requiresSignature: false).applicationVersion
            let session = OTASession(central: central, address: device.config.address, image: FirmwareImage(bytes: bytes), config: config,
                                     profile: SilabsOTAProfile(imageVersion: version ?? 0x0200_0000, writeCommands: commands, settle: .seconds(2)),
                                     reconnect: reconnect)
            do throws(OTAError) {
                return .success(try await session.run())
            } catch {
                return .failure(error)
            }
        }
    }

    @Test(arguments: SilabsDeviceKind.allCases, [23, 185, 247])
    func theGBLIsBootedByteForByteOnEachKindAtEachMTU(kind: SilabsDeviceKind, mtu: Int) async throws {
        let rig = Rig(.init(kind: kind, startsInAppLoader: true), link: LinkModel(mtu: mtu))
        let result = try await rig.flash().get()
        #expect(result.bytes == Self.gbl.count && result.chunkSize == SilabsOTAEngine.chunk(mtu: mtu))
        #expect(rig.model?.activations == [Self.gbl])
    }

    @Test(arguments: SilabsDeviceKind.allCases)
    func writeCommandsAndAWriteOnlyOTADataBothWork(kind: SilabsDeviceKind) async throws {
        let commands = Rig(.init(kind: kind, startsInAppLoader: true))
        _ = try await commands.flash(commands: true).get()
        #expect(commands.model?.activations == [Self.gbl])
        // Asked for, but the device flags OTA Data write only: requests.
        let requestsOnly = Rig(.init(kind: kind, dataWriteCommands: false, startsInAppLoader: true))
        _ = try await requestsOnly.flash(commands: true).get()
        #expect(requestsOnly.model?.activations == [Self.gbl])
    }

    @Test func withoutVersionCharacteristicsTheAppLoaderIsStillDoneAndAnApplicationNotConfirmed() async throws {
        let appLoader = Rig(.init(kind: .apploader, versionCharacteristics: false, startsInAppLoader: true))
        // No OTA version: taken for an application OTA DFU device, which the same sequence serves.
        let result = await appLoader.flash()
        #expect(appLoader.model?.activations == [Self.gbl])
        #expect(result.failure?.code == .notConfirmed)
        let application = Rig(.init(kind: .app, versionCharacteristics: false))
        let failure = try #require(await application.flash().failure)
        #expect(failure.code == .notConfirmed)
        #expect(application.model?.activations == [Self.gbl])
    }

    @Test(arguments: SilabsDeviceKind.allCases)
    func aLinkLostMidTransferSendsTheWholeGBLAgain(kind: SilabsDeviceKind) async throws {
        let rig = Rig(.init(kind: kind, startsInAppLoader: true), faults: FaultPlan(disconnectAt: [9_000]))
        let result = try await rig.flash().get()
        #expect(rig.model?.activations == [Self.gbl])
        #expect(result.stats.connections >= 2 && result.stats.bytesResent >= 9_000)
    }

    @Test func withoutReconnectingALostLinkEndsWithTheAdviceToRunAgain() async throws {
        let rig = Rig(.init(kind: .app), faults: FaultPlan(disconnectAt: [9_000]))
        let failure = try #require(await rig.flash(reconnect: ReconnectPolicy(window: .zero)).failure)
        #expect(failure.code == .connection && failure.message.contains("cannot resume"))
        #expect(failure.hint?.contains("run the same command again") == true)
        #expect(rig.model?.activations.isEmpty == true)
    }

    @Test func aLostResponseDropsTheLinkAndTheGBLGoesAgain() async throws {
        let rig = Rig(.init(kind: .app, faults: SilabsDeviceFaults(loseResponseAt: [10])))
        _ = try await rig.flash().get()
        #expect(rig.model?.activations == [Self.gbl])
    }

    @Test func aStorageWriteErrorIsReportedWithItsMeaning() async throws {
        let app = Rig(.init(kind: .app, faults: SilabsDeviceFaults(storageErrorAt: [5])))
        let appFailure = try #require(await app.flash().failure)
        #expect(appFailure.code == .protocolError && appFailure.message.contains("ATT error 0x83") && appFailure.message.contains("bootloader_writeStorage"))
        let appLoader = Rig(.init(kind: .apploader, startsInAppLoader: true, faults: SilabsDeviceFaults(storageErrorAt: [5])))
        let appLoaderFailure = try #require(await appLoader.flash().failure)
        #expect(appLoaderFailure.message.contains("ATT error 0x85") && appLoaderFailure.message.contains("could not erase or write flash"))
    }

    @Test func aGBLTheBootloaderRefusesIsAVerifyFailureOnBothKinds() async throws {
        let appLoader = Rig(.init(kind: .apploader, startsInAppLoader: true, faults: SilabsDeviceFaults(refuseImage: true)))
        let appLoaderFailure = try #require(await appLoader.flash().failure)
        #expect(appLoaderFailure.code == .verifyFailed && appLoaderFailure.message.contains("ATT error 0x80"))
        let app = Rig(.init(kind: .app, faults: SilabsDeviceFaults(refuseImage: true)))
        let appFailure = try #require(await app.flash(config: EngineConfig(verifyTimeout: .seconds(5))).failure)
        #expect(appFailure.code == .verifyFailed && appFailure.message.contains("still runs application version 0x01000000"))
        #expect(app.model?.activations.isEmpty == true && app.model?.refusals.count == 1)
    }

    @Test func aDroppedWriteCommandIsFoundByTheChecksOnly() async throws {
        let appLoader = Rig(.init(kind: .apploader, startsInAppLoader: true, faults: SilabsDeviceFaults(dropWriteAt: [7])))
        #expect(try #require(await appLoader.flash(commands: true).failure).code == .verifyFailed)
        let app = Rig(.init(kind: .app, faults: SilabsDeviceFaults(dropWriteAt: [7])))
        // With write commands nothing tells a refusal from a transfer never taken.
        #expect(try #require(await app.flash(commands: true, config: EngineConfig(verifyTimeout: .seconds(5))).failure).code == .protocolError)
        #expect(app.model?.activations.isEmpty == true)
    }
}

extension Result {
    var failure: Failure? { if case .failure(let e) = self { e } else { nil } }
}

extension SilabsBootloaderCheck.Outcome {
    var applicationVersion: UInt32? { if case .valid(_, let v) = self { v } else { nil } }
}
