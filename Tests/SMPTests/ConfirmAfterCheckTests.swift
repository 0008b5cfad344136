import Foundation
import GATT
import OTA
import OTADevice
import OTAWire
import SMP
import Simulator
import Testing

/// `confirmAfterCheck`: mark for test, reset, check the new image runs and answers, and only then
/// confirm; a failed check leaves it unconfirmed, for MCUboot to revert at the next reset.
@Suite("SMP confirm after check")
struct SMPConfirmAfterCheckTests {
    /// A session flashing `bytes` with `settings` to a simulated device whose server has `config`.
    static func flash(_ bytes: [UInt8], config: SMPServer.Config = SMPServer.Config(), holdsConfirm: Bool = false,
                      confirmAfterCheck: Bool = true) async throws -> (Result<OTAResult, OTAError>, SMPPeripheral?) {
        let image = try MCUbootImage(bytes: bytes, source: "sample")
        let device = SimulatedDevice(SimulatedDeviceConfig(link: .default), model: SMPPeripheral(server: SMPServer(config: config)))
        let central = SimulatedCentral(devices: [device], clock: VirtualClock())
        let settings = SMPUploadSettings(fileSHA256: image.sha256, imageHash: image.imageHash,
                                         confirmAfterCheck: confirmAfterCheck, holdsConfirm: holdsConfirm)
        let session = OTASession(central: central, address: device.config.address, image: image.firmware, profile: SMPProfile(settings: settings))
        let result: Result<OTAResult, OTAError>
        do throws(OTAError) {
            result = .success(try await session.run())
        } catch {
            result = .failure(error)
        }
        return (result, device.model(as: SMPPeripheral.self))
    }

    @Test func theImageIsConfirmedOnlyAfterItRanAndAnswered() async throws {
        let bytes = try MCUbootSamples.bytes(MCUbootSamples.ecdsa)
        let (result, model) = try await Self.flash(bytes)
        _ = try result.get()
        let server = try #require(model?.server)
        // Marked for test first (never confirmed before it booted), confirmed once it ran.
        #expect(server.marks.map(\.confirm) == [false, true])
        #expect(server.marks.allSatisfy { $0.bytes == bytes })
        #expect(server.primary.bytes == bytes && server.confirmed)
        // Confirmed: the next reset keeps it.
        var next = server
        #expect(next.boot() == .unchanged && next.primary.bytes == bytes)
    }

    @Test func withoutTheCheckTheTestImageIsNotConfirmed() async throws {
        let bytes = try MCUbootSamples.bytes(MCUbootSamples.ecdsa)
        let (result, model) = try await Self.flash(bytes, confirmAfterCheck: false)
        _ = try result.get()
        let server = try #require(model?.server)
        #expect(server.marks.map(\.confirm) == [false])
        #expect(server.primary.bytes == bytes && !server.confirmed)
    }

    /// A broken test image (it crashes when asked, its watchdog resets the device): the check
    /// fails with its own code, nothing was confirmed, and MCUboot reverted to the old image.
    @Test func aTestImageThatCrashesAtItsCheckIsNotConfirmedAndReverts() async throws {
        let bytes = try MCUbootSamples.bytes(MCUbootSamples.ecdsa)
        var config = SMPServer.Config()
        config.testImageCrashes = true
        let (result, model) = try await Self.flash(bytes, config: config)
        guard case .failure(let error) = result else { Issue.record("a crashing image was reported ok"); return }
        #expect(error.code == .checkFailed && !error.resumable, "\(error)")
        #expect(error.message.contains("failed its check") && error.message.contains("reverts it to 1.0.0"), "\(error.message)")
        let server = try #require(model?.server)
        #expect(server.marks.map(\.confirm) == [false], "never confirmed")
        #expect(server.lastBoot == .reverted && server.primary.versionText == "1.0.0" && server.confirmed)
        #expect(model?.activations.map(\.image) == [bytes], "it was swapped in once, for its test")
    }

    /// `holdsConfirm` (the caller's own check follows): the engine stops after the echo with the
    /// image running unconfirmed, so a reset would still revert it.
    @Test func holdingTheConfirmLeavesTheImageToRevert() async throws {
        let bytes = try MCUbootSamples.bytes(MCUbootSamples.ed25519)
        let (result, model) = try await Self.flash(bytes, holdsConfirm: true)
        _ = try result.get()
        var server = try #require(model?.server)
        #expect(server.marks.map(\.confirm) == [false])
        #expect(server.primary.bytes == bytes && !server.confirmed)
        #expect(server.boot() == .reverted && server.primary.versionText == "1.0.0")
    }
}
