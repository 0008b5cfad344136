import Foundation
import GATT
import OTA
import OTADevice
import OTAWire
import SMP
import Simulator
import Testing

/// MCUboot's modes as os_mgmt's bootloader info reports them (Zephyr's `os_mgmt_bootloader_info`),
/// the device model's behaviour in each (bootutil: swap, upgrade-only, direct-XIP) and the engine
/// honouring them.
@Suite("SMP bootloader modes")
struct SMPBootloaderModeTests {
    static func image(_ major: UInt8, _ minor: UInt8, flags: UInt32 = 0, loadAddress: UInt32 = 0) -> [UInt8] {
        SMPSlotImage.build(major: major, minor: minor, revision: 0, body: Array("app \(major).\(minor) at \(loadAddress)".utf8),
                           flags: flags, loadAddress: loadAddress)
    }

    static func config(_ mode: SMPBootloaderMode, noDowngrade: Bool = false) -> SMPServer.Config {
        var config = SMPServer.Config()
        config.mode = mode
        config.reportsBootloaderInfo = true
        config.noDowngrade = noDowngrade
        return config
    }

    static func flash(_ bytes: [UInt8], config: SMPServer.Config, running: [UInt8]? = nil,
                      confirmAfterCheck: Bool = false) async throws -> (Result<OTAResult, OTAError>, SMPPeripheral?) {
        let image = try MCUbootImage(bytes: bytes, source: "image")
        let device = SimulatedDevice(SimulatedDeviceConfig(link: .default), model: SMPPeripheral(server: SMPServer(config: config, running: running)))
        let central = SimulatedCentral(devices: [device], clock: VirtualClock())
        let settings = SMPUploadSettings(fileSHA256: image.sha256, imageHash: image.imageHash, confirmAfterCheck: confirmAfterCheck)
        let session = OTASession(central: central, address: device.config.address, image: image.firmware, profile: SMPProfile(settings: settings))
        let result: Result<OTAResult, OTAError>
        do throws(OTAError) {
            result = .success(try await session.run())
        } catch {
            result = .failure(error)
        }
        return (result, device.model(as: SMPPeripheral.self))
    }

    // MARK: The command

    @Test func theBootloaderInfoQueryIsAnOSGroupRead() throws {
        let frame = try SMPRequest.bootloaderInfo(query: "mode").frame(sequence: 3)
        #expect(Array(frame.encoded.prefix(8)) == [0x08, 0x00, 0x00, UInt8(frame.payload.count), 0x00, 0x00, 0x03, 0x08])
        #expect(try SMPRequest(decoding: frame) == .bootloaderInfo(query: "mode"))
        // Zephyr's zcbor answer: {_ "mode": 2, "no-downgrade": true}, indefinite.
        let payload: [UInt8] = [0xBF, 0x64] + Array("mode".utf8) + [0x02, 0x6C] + Array("no-downgrade".utf8) + [0xF5, 0xFF]
        let answer = try SMPFrame(decoding: [0x09, 0x00, 0x00, UInt8(payload.count), 0x00, 0x00, 0x03, 0x08] + payload)
        #expect(try SMPResponse(decoding: answer) == .bootloaderInfo(SMPBootloaderInfo(mode: .overwriteOnly, noDowngrade: true)))
    }

    @Test func aServerWithoutTheCommandAnswersNotSupported() {
        var server = SMPServer()
        #expect(server.handle(.bootloaderInfo(query: "mode")) == .error(.general(.notSupported)))
        var told = SMPServer(config: Self.config(.directXIP))
        #expect(told.handle(.bootloaderInfo(query: nil)) == .bootloaderInfo(SMPBootloaderInfo(bootloader: "MCUboot")))
        #expect(told.handle(.bootloaderInfo(query: "mode")) == .bootloaderInfo(SMPBootloaderInfo(mode: .directXIP)))
    }

    /// img_mgmt's slot info, as Zephyr's zcbor writes it, read back: the slot not running takes
    /// the upload (`upload_image_id`), the running one names none.
    @Test func slotInfoSaysWhichSlotTakesAnUpload() throws {
        var server = SMPServer(config: Self.config(.directXIP))
        let request = try SMPRequest.imageSlotInfo.frame(sequence: 1)
        #expect(try SMPRequest(decoding: request) == .imageSlotInfo)
        let decoded = try SMPResponse(decoding: server.reply(server.handle(request).response, to: request.header))
        guard case .slotInfo(let info) = decoded else { Issue.record("\(decoded)"); return }
        #expect(info.images.map(\.image) == [0])
        #expect(info.images.first?.slots.map(\.uploadImageID) == [nil, 0])
        #expect(info.images.first?.slots.allSatisfy { $0.size == UInt64(server.config.slotSize) } == true)
        var mcumgr = SMPServer(config: SMPServer.Config(encoding: .tinycbor))
        #expect(mcumgr.handle(.imageSlotInfo) == .error(.general(.notSupported)))
    }

    // MARK: The device model

    @Test func overwriteOnlyKeepsTheImageWithoutRevert() throws {
        let new = Self.image(2, 0)
        var server = SMPServer(config: Self.config(.overwriteOnly), leftover: .pending(new))
        #expect(server.boot() == .swapped(permanent: true))
        #expect(server.primary.bytes == new && server.confirmed && server.secondary == nil)
        #expect(server.boot() == .unchanged && server.primary.bytes == new, "nothing to revert to")
    }

    @Test func directXIPRunsTheOtherSlotInPlaceAndChecksItsAddress() throws {
        var server = SMPServer(config: Self.config(.directXIP))
        let forSlot1 = Self.image(2, 0, flags: SMPSlotImage.romFixedFlag, loadAddress: SMPServer.slotAddresses[1])
        let forSlot0 = Self.image(2, 0, flags: SMPSlotImage.romFixedFlag, loadAddress: SMPServer.slotAddresses[0])
        #expect(server.uploadSlot == 1)
        #expect(server.handle(.imageUpload(.first(image: 0, length: UInt64(forSlot0.count), sha: [], data: forSlot0)))
                == .error(.image(.invalidFlashAddress)))
        _ = server.handle(.imageUpload(.first(image: 0, length: UInt64(forSlot1.count), sha: [], data: forSlot1)))
        #expect(server.secondary?.bytes == forSlot1)
        // No state write in direct-XIP: the highest version boots.
        #expect(server.handle(.imageStateWrite(hash: SMPSlotImage(forSlot1).hash, confirm: false)) == .error(.general(.notSupported)))
        #expect(server.boot() == .swapped(permanent: true))
        #expect(server.activeSlot == 1 && server.states.images.first(where: \.active)?.slot == 1)
        // The next upload goes to slot 0, and must be built for it.
        let next = Self.image(3, 0, flags: SMPSlotImage.romFixedFlag, loadAddress: SMPServer.slotAddresses[0])
        #expect(server.uploadSlot == 0)
        _ = server.handle(.imageUpload(.first(image: 0, length: UInt64(next.count), sha: [], data: next)))
        #expect(server.boot() == .swapped(permanent: true) && server.activeSlot == 0 && server.primary.bytes == next)
    }

    @Test func downgradePreventionRefusesAnOlderImageAtBoot() throws {
        var server = SMPServer(config: Self.config(.swapScratch, noDowngrade: true), running: Self.image(2, 0), leftover: .pending(Self.image(1, 9)))
        guard case .refused(let why) = server.boot() else { Issue.record("booted a downgrade: \(server.lastBoot)"); return }
        #expect(why.contains("downgrade prevention"), "\(why)")
        #expect(server.primary.versionText == "2.0.0" && server.secondary == nil)
    }

    // MARK: The engine

    @Test func overwriteOnlyFlashesAndTheImageIsKept() async throws {
        let bytes = Self.image(2, 0)
        let (result, model) = try await Self.flash(bytes, config: Self.config(.overwriteOnly))
        _ = try result.get()
        let server = try #require(model?.server)
        #expect(server.primary.bytes == bytes && server.confirmed)
    }

    @Test func overwriteOnlyRefusesConfirmAfterCheckBeforeUploading() async throws {
        let (result, model) = try await Self.flash(Self.image(2, 0), config: Self.config(.overwriteOnly), confirmAfterCheck: true)
        guard case .failure(let error) = result else { Issue.record("no refusal"); return }
        #expect(error.code == .incompatibleDevice && error.message.contains("overwrite-only"), "\(error)")
        #expect(model?.server.secondaryBytes.isEmpty == true, "nothing uploaded")
    }

    @Test func directXIPUploadsToTheSlotNotRunningWithoutAMark() async throws {
        let bytes = Self.image(2, 0, flags: SMPSlotImage.romFixedFlag, loadAddress: SMPServer.slotAddresses[1])
        let (result, model) = try await Self.flash(bytes, config: Self.config(.directXIP))
        _ = try result.get()
        let server = try #require(model?.server)
        #expect(server.marks.isEmpty, "no state write in direct-XIP")
        #expect(server.activeSlot == 1 && server.primary.bytes == bytes)
    }

    /// An mcumgr server (no bootloader info) on a direct-XIP MCUboot: the mark is answered
    /// NOT_SUPPORTED, so the engine resets without one and the higher version boots.
    @Test func aDirectXIPDeviceThatDoesNotSayItsModeIsResetWithoutAMark() async throws {
        var config = SMPServer.Config(encoding: .tinycbor)
        config.mode = .directXIP
        let bytes = Self.image(2, 0)
        let (result, model) = try await Self.flash(bytes, config: config)
        _ = try result.get()
        let server = try #require(model?.server)
        #expect(server.marks.isEmpty && server.activeSlot == 1 && server.primary.bytes == bytes)
    }

    @Test func directXIPRefusesAnImageBuiltForTheRunningSlot() async throws {
        let bytes = Self.image(2, 0, flags: SMPSlotImage.romFixedFlag, loadAddress: SMPServer.slotAddresses[0])
        let (result, _) = try await Self.flash(bytes, config: Self.config(.directXIP))
        guard case .failure(let error) = result else { Issue.record("no refusal"); return }
        #expect(error.code == .incompatibleDevice, "\(error)")
        #expect(error.message.contains("load address 0xc000") && error.message.contains("slot 1"), "\(error.message)")
    }

    @Test func directXIPRefusesAnImageNotNewerThanTheRunningOne() async throws {
        let (result, model) = try await Self.flash(Self.image(1, 0), config: Self.config(.directXIP), running: Self.image(1, 0))
        guard case .failure(let error) = result else { Issue.record("no refusal"); return }
        #expect(error.code == .incompatibleDevice && error.message.contains("highest version"), "\(error)")
        #expect(model?.server.secondaryBytes.isEmpty == true)
    }

    @Test func downgradePreventionIsReportedBeforeUploading() async throws {
        let (result, model) = try await Self.flash(Self.image(1, 5), config: Self.config(.swapScratch, noDowngrade: true), running: Self.image(2, 0))
        guard case .failure(let error) = result else { Issue.record("no refusal"); return }
        #expect(error.code == .incompatibleDevice && error.message.contains("refuses downgrades (no-downgrade)"), "\(error)")
        #expect(model?.server.secondaryBytes.isEmpty == true)
    }

    @Test func directXIPWithRevertTestsAndConfirmsAfterTheCheck() async throws {
        let bytes = Self.image(2, 0)
        let (result, model) = try await Self.flash(bytes, config: Self.config(.directXIPWithRevert), confirmAfterCheck: true)
        _ = try result.get()
        let server = try #require(model?.server)
        #expect(server.marks.map(\.confirm) == [false, true])
        #expect(server.activeSlot == 1 && server.confirmed && server.primary.bytes == bytes)
    }
}
