import Crypto
import Foundation
import GATT
import OTA
import OTADevice
import OTAWire
import SMP
import Simulator
import Testing

/// What a device reports and refuses as Zephyr's img_mgmt and MCUboot's bootutil do, and the
/// engine recovering from a corrupted upload on its own: the sample images through the server
/// model and through the session on the simulator.
@Suite("SMP sturdiness")
struct SMPSturdinessTests {
    static func key(_ file: String) throws -> MCUbootImage.PublicKey {
        try MCUbootImage.PublicKey(pem: String(decoding: try MCUbootSamples.bytes(file), as: UTF8.self), source: file)
    }

    /// A server whose slot 1 holds `bytes` marked for test, with MCUboot's `key`.
    static func pending(_ bytes: [UInt8], key: MCUbootImage.PublicKey?) -> SMPServer {
        SMPServer(leftover: .pending(bytes), signatureKey: key)
    }

    /// A simulated device and a session flashing `bytes` to it.
    static func flash(_ bytes: [UInt8], faults: FaultPlan = .none, key: MCUbootImage.PublicKey? = nil,
                      encoding: SMPReplyEncoding = .zephyr) async throws -> (Result<OTAResult, OTAError>, SMPPeripheral?) {
        let image = try MCUbootImage(bytes: bytes, source: "sample")
        let config = SimulatedDeviceConfig(link: .default)
        let server = SMPServer(config: SMPServer.Config(encoding: encoding), signatureKey: key)
        let device = SimulatedDevice(config, model: SMPPeripheral(server: server, faults: faults, resetDelay: config.bootDelay))
        let central = SimulatedCentral(devices: [device], clock: VirtualClock())
        let settings = SMPUploadSettings(fileSHA256: image.sha256, imageHash: image.imageHash)
        let session = OTASession(central: central, address: device.config.address, image: image.firmware,
                                 profile: SMPProfile(settings: settings))
        let result: Result<OTAResult, OTAError>
        do throws(OTAError) {
            result = .success(try await session.run())
        } catch {
            result = .failure(error)
        }
        return (result, device.model(as: SMPPeripheral.self))
    }

    // MARK: The hash a slot reports

    /// img_mgmt reads the slot's hash TLV: SHA-256 for the signed samples, SHA-512 (64 bytes)
    /// for the one signed with `--sha 512`; the value imgtool wrote, as the manifest lists it.
    @Test(arguments: [MCUbootSamples.ecdsa, MCUbootSamples.ed25519, MCUbootSamples.unsigned])
    func aSlotReportsTheImagesOwnHashTLV(file: String) throws {
        let bytes = try MCUbootSamples.bytes(file)
        let entry = try #require(MCUbootSamples.entries.first { $0.file == file })
        let slot = SMPSlotImage(bytes)
        #expect(slot.hash.map { String(format: "%02x", $0) }.joined() == entry.image_hash)
        #expect(slot.hash.count == (entry.hash_type == "sha512" ? 64 : 32))
        var server = Self.pending(bytes, key: nil)
        #expect(server.states.images.last?.hash == slot.hash)
        // And it is what a state write names the image by.
        #expect(server.handle(.imageStateWrite(hash: slot.hash, confirm: true)) != .error(.image(.hashNotFound)))
    }

    /// The TLV is read, not computed: a flipped byte of the firmware leaves the reported hash as
    /// it was; MCUboot's check at boot is what refuses the image.
    @Test func aCorruptedFirmwareReportsItsTLVAndMCUbootRefusesToBootIt() throws {
        let good = try MCUbootSamples.bytes(MCUbootSamples.unsigned)
        var bad = good
        bad[0x200 + 100] ^= 0x01
        #expect(SMPSlotImage(bad).hash == SMPSlotImage(good).hash)
        var server = Self.pending(bad, key: nil)
        let before = server.primary
        guard case .refused(let why) = server.boot() else { Issue.record("booted a corrupted image: \(server.lastBoot)"); return }
        #expect(why.contains("SHA-512"), "\(why)")
        #expect(server.primary == before && server.confirmed)
        #expect(server.secondary == nil && !server.pending, "bootutil erases the invalid slot")
    }

    // MARK: MCUboot's signature check

    @Test func mcubootWithAKeyBootsOnlyImagesItsKeySigned() throws {
        let ed25519 = try Self.key("ed25519-public.pem")
        var signed = Self.pending(try MCUbootSamples.bytes(MCUbootSamples.ed25519), key: ed25519)
        #expect(signed.boot() == .swapped(permanent: false))
        #expect(signed.primary.versionText == "1.2.3.4")

        for (file, says) in [(MCUbootSamples.ecdsa, "another key"), (MCUbootSamples.unsigned, "not signed")] {
            var server = Self.pending(try MCUbootSamples.bytes(file), key: ed25519)
            guard case .refused(let why) = server.boot() else { Issue.record("\(file) booted: \(server.lastBoot)"); continue }
            #expect(why.contains(says), "\(file): \(why)")
            #expect(server.primary.versionText == "1.0.0" && server.secondary == nil)
        }
        // Without a key (CONFIG_BOOT_SIGNATURE_TYPE_NONE) MCUboot checks the hash only.
        var hashOnly = Self.pending(try MCUbootSamples.bytes(MCUbootSamples.ecdsa), key: nil)
        #expect(hashOnly.boot() == .swapped(permanent: false))
    }

    /// A signature altered after signing: the hash still matches, the signature does not verify.
    @Test func aBrokenSignatureIsNotBooted() throws {
        var bytes = try MCUbootSamples.bytes(MCUbootSamples.ed25519)
        let signature = try #require(try MCUbootImage(bytes: bytes).signature)
        bytes[signature.offset + 5] ^= 0x80
        #expect((try? MCUbootImage(bytes: bytes)) != nil, "the hash is intact")
        var server = Self.pending(bytes, key: try Self.key("ed25519-public.pem"))
        guard case .refused(let why) = server.boot() else { Issue.record("booted a broken signature: \(server.lastBoot)"); return }
        #expect(why.contains("does not verify"), "\(why)")
        #expect(server.primary.versionText == "1.0.0")
    }

    // MARK: Through the session

    /// The SHA-512 sample flashes on the simulated device: the slot reports its SHA-512 TLV, the
    /// engine finds it, marks it and MCUboot swaps it in.
    @Test func theSHA512SampleFlashesAndIsSwappedIn() async throws {
        let bytes = try MCUbootSamples.bytes(MCUbootSamples.unsigned)
        let (result, model) = try await Self.flash(bytes)
        _ = try result.get()
        #expect(model?.activations.map(\.image) == [bytes])
    }

    /// A signed image flashes on a device whose MCUboot holds its key.
    @Test func aSignedSampleFlashesOnADeviceWithItsKey() async throws {
        let bytes = try MCUbootSamples.bytes(MCUbootSamples.ecdsa)
        let (result, model) = try await Self.flash(bytes, key: try Self.key("ec256-public.pem"))
        _ = try result.get()
        #expect(model?.activations.map(\.image) == [bytes])
    }

    /// `--sim-corrupt-at 5000` on the large sample: the server's SHA-256 check fails, the engine
    /// uploads the file again from 0 on its own, and the image sent is swapped in.
    @Test func aCorruptedUploadIsSentAgainAndSwappedIn() async throws {
        let bytes = try [UInt8](Data(contentsOf: MCUbootSamples.directory.deletingLastPathComponent()
            .appendingPathComponent("mcuboot-large/seeded96k-ed25519-v2.0.0.bin")))
        let (result, model) = try await Self.flash(bytes, faults: FaultPlan(corruptAt: [5000]))
        let done = try result.get()
        #expect(done.stats.restarts == 1)
        #expect(model?.server.marks.map(\.bytes) == [bytes])
        #expect(model?.activations.map(\.image) == [bytes])
    }

    /// Corrupted on both uploads: nothing is marked and the failure is resumable, so a retried
    /// attempt (`--retries`) sends the file anew.
    @Test func aCorruptionOnBothUploadsFailsResumablyMarkingNothing() async throws {
        let bytes = try MCUbootSamples.bytes(MCUbootSamples.ed25519)
        let (result, model) = try await Self.flash(bytes, faults: FaultPlan(corruptAt: [300, 300]))
        guard case .failure(let error) = result else { Issue.record("expected a failure"); return }
        #expect(error.code == .verifyFailed && error.resumable, "\(error)")
        #expect(error.message.contains("also after uploading it again from 0"))
        #expect(model?.server.marks.isEmpty == true)
        #expect(model?.activations.isEmpty == true)
    }

    /// An mcumgr server answers no `match` and reports the TLV, so the engine cannot see a
    /// corrupted upload before the reset; MCUboot refuses it at boot, the engine reads the old
    /// image running after the reset and uploads the file again, which is swapped in.
    @Test func withoutMatchAnImageMCUbootRefusedIsUploadedAgainAndSwappedIn() async throws {
        let bytes = try MCUbootSamples.bytes(MCUbootSamples.ed25519)
        let (result, model) = try await Self.flash(bytes, faults: FaultPlan(corruptAt: [300]), key: try Self.key("ed25519-public.pem"),
                                                   encoding: .tinycbor)
        let done = try result.get()
        #expect(done.stats.restarts == 1)
        #expect(done.firmwareBefore == FirmwareVersion("1.0.0"), "the version before is the first connection's")
        let marks = try #require(model?.server.marks)
        #expect(marks.count == 2 && marks.first?.bytes != bytes && marks.last?.bytes == bytes, "the corrupted upload, then the file, were marked")
        #expect(model?.activations.map(\.image) == [bytes])
    }

    /// Corrupted on both uploads past the server's sight: MCUboot refuses both, the old image
    /// runs on, and the run fails saying so (exit 8), never ok.
    @Test func withoutMatchAnImageMCUbootRefusesTwiceFailsSayingTheOldImageRuns() async throws {
        let bytes = try MCUbootSamples.bytes(MCUbootSamples.ed25519)
        let (result, model) = try await Self.flash(bytes, faults: FaultPlan(corruptAt: [300, 300]), key: try Self.key("ed25519-public.pem"),
                                                   encoding: .tinycbor)
        guard case .failure(let error) = result else { Issue.record("reported ok with the old image running"); return }
        #expect(error.code == .verifyFailed && error.resumable, "\(error)")
        #expect(error.message.hasPrefix("MCUboot refused the image at boot") && error.message.contains("runs its old image 1.0.0"), "\(error.message)")
        let server = try #require(model?.server)
        #expect(model?.activations.isEmpty == true)
        guard case .refused = server.lastBoot else { Issue.record("MCUboot did not refuse: \(server.lastBoot)"); return }
        #expect(server.primary.versionText == "1.0.0")
    }
}
