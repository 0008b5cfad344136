import GATT
import OTA
import Testing
@testable import SilabsOTA

/// The wire: UUIDs, control values, version characteristics and ATT errors, in literal bytes.
@Suite("silabs-ota codec")
struct SilabsCodecTests {
    @Test func theServiceAndItsCharacteristicsAreTheHostExamplesUUIDs() {
        // The host example's byte arrays, least significant byte first, reversed.
        let service: [UInt8] = [0xf0, 0x19, 0x21, 0xb4, 0x47, 0x8f, 0xa4, 0xbf, 0xa1, 0x4f, 0x63, 0xfd, 0xee, 0xd6, 0x14, 0x1d]
        let control: [UInt8] = [0x63, 0x60, 0x32, 0xe0, 0x37, 0x5e, 0xa4, 0x88, 0x53, 0x4e, 0x6d, 0xfb, 0x64, 0x35, 0xbf, 0xf7]
        let data: [UInt8] = [0x53, 0xa1, 0x81, 0x1f, 0x58, 0x2c, 0xd0, 0xa5, 0x45, 0x40, 0xfc, 0x34, 0xf3, 0x27, 0x42, 0x98]
        let application: [UInt8] = [0xf8, 0x92, 0x7a, 0xac, 0x96, 0xcd, 0xa9, 0xbf, 0xf2, 0x49, 0xc1, 0x4a, 0x11, 0xcc, 0x77, 0x0d]
        #expect(SilabsOTAService.serviceUUID.bytes == service.reversed())
        #expect(SilabsOTAService.controlUUID.bytes == control.reversed())
        #expect(SilabsOTAService.dataUUID.bytes == data.reversed())
        #expect(SilabsOTAService.applicationVersionUUID.bytes == application.reversed())
    }

    @Test func controlValuesAreOneByte() {
        #expect(SilabsControl.begin.encoded == [0x00])
        #expect(SilabsControl.end.encoded == [0x03])
        #expect(SilabsControl.close.encoded == [0x04])
        #expect(SilabsControl(decoding: [0x03, 0xFF]) == .end)
        #expect(SilabsControl(decoding: [0x07]) == .other(7))
        #expect(SilabsControl(decoding: []) == nil)
    }

    @Test func versionCharacteristicsAreReadAsTheHostExampleReadsThem() {
        #expect(SilabsVersions.otaVersion([0x03]) == 3)
        #expect(SilabsVersions.otaVersion([0x03, 0x00]) == nil)
        #expect(SilabsVersions.apploader([0x02, 0x00, 0x0D, 0x00, 0x00, 0x00, 0x01, 0x00]) == [2, 13, 0, 1])
        #expect(SilabsVersions.word([0x00, 0x00, 0x02, 0x01]) == 0x0102_0000)
        #expect(SilabsVersions.word([0x00, 0x02, 0x01]) == nil)
        #expect(SilabsVersions.encode(word: 0x0102_0304) == [0x04, 0x03, 0x02, 0x01])
        #expect(SilabsVersions.encode(apploader: [2, 13, 0, 1]) == [0x02, 0x00, 0x0D, 0x00, 0x00, 0x00, 0x01, 0x00])
        #expect(SilabsVersions.firmwareVersion(0x0102_0003).description == "1.2.3")
    }

    @Test func attErrorsMeanWhatTheDeviceThatSentThemSays() {
        #expect(SilabsRefusal(code: 0x80, mode: .appLoader).failureCode == .verifyFailed)
        #expect(SilabsRefusal(code: 0x84, mode: .appLoader).failureCode == .verifyFailed)
        #expect(SilabsRefusal(code: 0x83, mode: .appLoader).failureCode == .imageTooLarge)
        #expect(SilabsRefusal(code: 0x82, mode: .application).failureCode == .imageTooLarge)
        #expect(SilabsRefusal(code: 0x83, mode: .application).failureCode == .protocolError)
        #expect(SilabsRefusal(code: 0x83, mode: .application).meaning.contains("bootloader_writeStorage"))
        #expect(SilabsRefusal(code: 0x83, mode: .appLoader).meaning.contains("overlaps the AppLoader"))
        let unknown = SilabsRefusal(code: 0x82, mode: nil).description
        #expect(unknown.hasPrefix("ATT error 0x82 (from an application OTA DFU device, ") && unknown.contains("; from the AppLoader, "))
        #expect(SilabsRefusal(code: 0x9F, mode: nil).meaning == "an application error neither documents")
    }

    @Test func theTestHelpersCRCIsTheIEEEOne() {
        #expect(TestGBL.crc32(Array("123456789".utf8)) == 0xCBF4_3926)
    }

    @Test func theBootloaderCheckFindsTheEndTagsCRCAndWhatIsMissing() {
        let gbl = TestGBL.bytes(version: 0x0203_0004)
        #expect(SilabsBootloaderCheck.check(gbl, requiresSignature: false) == .valid(length: gbl.count, applicationVersion: 0x0203_0004))
        // Bytes after the end tag are not the GBL's.
        #expect(SilabsBootloaderCheck.check(gbl + [0, 0, 0, 0], requiresSignature: false) == .valid(length: gbl.count, applicationVersion: 0x0203_0004))
        var flipped = gbl
        flipped[60] ^= 0x01
        guard case .crc = SilabsBootloaderCheck.check(flipped, requiresSignature: false) else { Issue.record("a flipped byte passed"); return }
        guard case .parse = SilabsBootloaderCheck.check(Array(gbl.dropLast(8)), requiresSignature: false) else { Issue.record("a cut GBL passed"); return }
        guard case .signature = SilabsBootloaderCheck.check(gbl, requiresSignature: true) else { Issue.record("an unsigned GBL passed secure boot"); return }
        #expect(SilabsBootloaderCheck.check(TestGBL.bytes(signed: true), requiresSignature: true).isValid)
        // The soak's GBLs are laid out alike.
        #expect(SilabsBootloaderCheck.check(SilabsSoakImage.gbl(version: 7, body: [1, 2, 3]), requiresSignature: false).isValid)
    }

    @Test func theGBLStandInReadsTheApplicationVersion() throws {
        let gbl = try GBLFile(parsing: TestGBL.bytes(version: 0x0102_0003))
        #expect(gbl.applicationVersion == 0x0102_0003)
        #expect(!gbl.isSigned && !gbl.isEncrypted)
        #expect(throws: GBLError.self) { try GBLFile(parsing: [0x7F, 0x45, 0x4C, 0x46, 0, 0, 0, 0]) }
        #expect(ImageFormat.Detector.gbl.detect(TestGBL.bytes(), [])?.kind == .gbl)
    }
}
