import GATT
import OTADevice
import OTAWire
import Testing
@testable import SilabsOTA

/// The device models' paths, their error paths above all, written by hand against the
/// components' code: what each write is answered with, and what a closed link starts.
@Suite("silabs-ota device models")
struct SilabsDeviceTests {
    static let gbl = TestGBL.bytes(version: 0x0200_0000, body: TestGBL.body(2000))
    static let control = SilabsOTAService.controlUUID
    static let data = SilabsOTAService.dataUUID

    static func write(_ model: inout SilabsOTAPeripheral, _ bytes: [UInt8], to uuid: BluetoothUUID = data, response: Bool = true,
                      central: String? = "c", at now: Duration = .seconds(1)) -> PeripheralReply {
        model.write(bytes, to: uuid, withResponse: response, from: central, at: now).reply
    }

    static func ok(_ reply: PeripheralReply) -> Bool {
        if case .success = reply { true } else { false }
    }

    static func code(_ reply: PeripheralReply) -> UInt8? {
        if case .failure(let error, _) = reply { error.rawValue } else { nil }
    }

    static func upload(_ model: inout SilabsOTAPeripheral, _ bytes: [UInt8] = gbl, chunk: Int = 244, at now: Duration = .seconds(1)) {
        _ = write(&model, [0x00], to: control, at: now)
        var at = 0
        while at < bytes.count {
            _ = write(&model, Array(bytes[at..<min(bytes.count, at + chunk)]), at: now)
            at += chunk
        }
    }

    @Test func anApplicationOTADFUDeviceInstallsTheSlotOnceTheLinkCloses() {
        var model = SilabsOTAPeripheral(config: .init(kind: .app))
        Self.upload(&model)
        #expect(model.slotContents == Self.gbl)
        #expect(Self.write(&model, [0x03], to: Self.control) == .success(at: .seconds(1)))
        #expect(model.activations.isEmpty && model.awaitsClose)
        model.linkDropped(central: "c")
        #expect(model.activations == [Self.gbl])
        #expect(model.isAway(at: .seconds(1)))
        _ = model.wake(0, at: .seconds(30))
        #expect(model.read(SilabsOTAService.applicationVersionUUID) == [0, 0, 0, 2])
        #expect(!model.isAway(at: .seconds(30)))
    }

    @Test func itsErrorPathsAnswerAsTheComponentDoes() {
        // Data before 0x00 (no OTA connection yet): not answered at all.
        var before = SilabsOTAPeripheral(config: .init(kind: .app))
        #expect(Self.write(&before, [1, 2, 3, 4]) == .away)
        // A write that is not whole words: bootloader_writeStorage refuses it, 0x83.
        var unaligned = SilabsOTAPeripheral(config: .init(kind: .app))
        _ = Self.write(&unaligned, [0x00], to: Self.control)
        #expect(Self.code(Self.write(&unaligned, [1, 2, 3])) == 0x83)
        // The error state starts the component over: 0x00 is answered success but not taken
        // while it erases, and data then gets 0x81.
        #expect(Self.write(&unaligned, [0x00], to: Self.control) == .success(at: .seconds(1)))
        #expect(Self.write(&unaligned, [1, 2, 3, 4]) == .away)
        // A full slot: 0x82.
        var full = SilabsOTAPeripheral(config: .init(kind: .app, slotSize: 8))
        _ = Self.write(&full, [0x00], to: Self.control)
        #expect(Self.ok(Self.write(&full, [1, 2, 3, 4, 5, 6, 7, 8])))
        #expect(Self.code(Self.write(&full, [1, 2, 3, 4])) == 0x82)
        // A flash write that fails: 0x83.
        var failing = SilabsOTAPeripheral(config: .init(kind: .app, faults: SilabsDeviceFaults(storageErrorAt: [1])))
        _ = Self.write(&failing, [0x00], to: Self.control)
        #expect(Self.ok(Self.write(&failing, [1, 2, 3, 4])))
        #expect(Self.code(Self.write(&failing, [1, 2, 3, 4])) == 0x83)
    }

    @Test func closeAfterEndCancelsTheCheckAndAnUnknownValueLeavesTheDownload() {
        var model = SilabsOTAPeripheral(config: .init(kind: .app))
        Self.upload(&model)
        _ = Self.write(&model, [0x03], to: Self.control)
        _ = Self.write(&model, [0x04], to: Self.control)
        model.linkDropped(central: "c")
        #expect(model.activations.isEmpty)
        // An unknown value sets UNINIT: the download is over, and data is refused.
        var stuck = SilabsOTAPeripheral(config: .init(kind: .app))
        _ = Self.write(&stuck, [0x00], to: Self.control)
        #expect(Self.ok(Self.write(&stuck, [1, 2, 3, 4])))
        _ = Self.write(&stuck, [0x07], to: Self.control)
        #expect(Self.code(Self.write(&stuck, [1, 2, 3, 4])) == 0x81)
    }

    @Test func aLinkLostMidTransferOrARefusedGBLBootsNothingAndTheComponentStartsOver() {
        var lost = SilabsOTAPeripheral(config: .init(kind: .app))
        Self.upload(&lost, Array(Self.gbl.prefix(488)))
        lost.linkDropped(central: "c")
        #expect(lost.activations.isEmpty && !lost.isAway(at: .seconds(1)))
        // Ready again once the slot is erased: the whole GBL is taken from 0x00.
        Self.upload(&lost, at: .seconds(20))
        _ = Self.write(&lost, [0x03], to: Self.control, at: .seconds(20))
        lost.linkDropped(central: "c")
        #expect(lost.activations == [Self.gbl])

        var refusing = SilabsOTAPeripheral(config: .init(kind: .app, faults: SilabsDeviceFaults(refuseImage: true)))
        Self.upload(&refusing)
        _ = Self.write(&refusing, [0x03], to: Self.control)
        refusing.linkDropped(central: "c")
        #expect(refusing.activations.isEmpty && refusing.refusals.count == 1)
        #expect(refusing.read(SilabsOTAService.applicationVersionUUID) == [0, 0, 0, 1])
    }

    @Test func theInPlaceApplicationRebootsIntoItsAppLoaderUnlessItWantsABond() {
        var model = SilabsOTAPeripheral(config: .init(kind: .apploader))
        #expect(model.services[0].characteristics.map(\.uuid) == [Self.control, SilabsOTAService.applicationVersionUUID])
        let result = model.write([0x00], to: Self.control, withResponse: true, from: "c", at: .seconds(1))
        #expect(result.reply == .success(at: .seconds(1)))
        guard case .reboot? = result.outputs.first?.output else { Issue.record("no reboot"); return }
        _ = model.wake(0, at: .seconds(2))
        #expect(model.inAppLoader && model.advertisedName == SilabsOTAService.appLoaderName)
        #expect(model.services[0].characteristics.contains { $0.uuid == SilabsOTAService.otaVersionUUID })

        var bonded = SilabsOTAPeripheral(config: .init(kind: .apploader, entryRequiresBond: true))
        #expect(Self.code(Self.write(&bonded, [0x00], to: Self.control)) == 0x80)
        bonded.linkEncrypted(true)
        #expect(Self.write(&bonded, [0x00], to: Self.control) == .success(at: .seconds(1)))
    }

    @Test func theAppLoaderChecksAt0x03AndBootsOnceTheLinkCloses() {
        var model = SilabsOTAPeripheral(config: .init(kind: .apploader, startsInAppLoader: true))
        #expect(Self.code(Self.write(&model, [1, 2, 3])) == 0x81)
        #expect(Self.code(Self.write(&model, [0x03], to: Self.control)) == 0x81)
        // The AppLoader takes writes of any length.
        Self.upload(&model, chunk: 183)
        guard case .success = Self.write(&model, [0x03], to: Self.control) else { Issue.record("0x03 refused"); return }
        model.linkDropped(central: "c")
        #expect(model.activations == [Self.gbl])
        _ = model.wake(0, at: .seconds(5))
        #expect(!model.inAppLoader)
    }

    @Test func theAppLoaderRefusesABadCRCACutGBLAndAnUnsignedOneUnderSecureBoot() {
        var flipped = Self.gbl
        flipped[100] ^= 0xFF
        for (bytes, requires, code) in [(flipped, false, UInt8(0x80)), (Array(Self.gbl.dropLast(12)), false, 0x84), (Self.gbl, true, 0x80)] {
            var model = SilabsOTAPeripheral(config: .init(kind: .apploader, requiresSignature: requires, startsInAppLoader: true))
            Self.upload(&model, bytes)
            #expect(Self.code(Self.write(&model, [0x03], to: Self.control)) == code)
            model.linkDropped(central: "c")
            // The application was overwritten: it stays in its AppLoader.
            #expect(model.activations.isEmpty && model.inAppLoader)
        }
        var tooLarge = SilabsOTAPeripheral(config: .init(kind: .apploader, slotSize: 1024, startsInAppLoader: true))
        _ = Self.write(&tooLarge, [0x00], to: Self.control)
        #expect(Self.code(Self.write(&tooLarge, Array(Self.gbl.prefix(1028)))) == 0x83)
    }

    @Test func aDroppedWriteCommandLeavesAGapTheCheckFinds() {
        var model = SilabsOTAPeripheral(config: .init(kind: .apploader, startsInAppLoader: true, faults: SilabsDeviceFaults(dropWriteAt: [3])))
        _ = Self.write(&model, [0x00], to: Self.control)
        var at = 0
        while at < Self.gbl.count {
            _ = Self.write(&model, Array(Self.gbl[at..<min(Self.gbl.count, at + 244)]), response: false)
            at += 244
        }
        #expect(model.droppedWrites == 1)
        #expect(Self.code(Self.write(&model, [0x03], to: Self.control)) != nil)
    }
}
