import Crypto
import Foundation
import OTA
import OTAWire
import Testing
@testable import SilabsOTA

/// firmware-samples/silabs/ (scripts/make-silabs-sample) and the detector against every other sample.
@Suite struct GBLSampleTests {
    static let samples = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent().appendingPathComponent("firmware-samples")
    static let silabs = samples.appendingPathComponent("silabs")

    static func read(_ name: String) throws -> [UInt8] { Array(try Data(contentsOf: silabs.appendingPathComponent(name))) }

    @Test func theSamplesParseWithTheirVersionAndProductID() throws {
        let key = try GBLFile.publicKey(file: Self.silabs.appendingPathComponent("test-signing-pubkey.pem").path)
        let tokenKey = try GBLFile.publicKey(file: Self.silabs.appendingPathComponent("test-signing-pubkey-tokens.txt").path)
        #expect(key.rawRepresentation == tokenKey.rawRepresentation)
        let product = Array("otaflash-efr32".utf8) + [0, 2]

        let plain = try GBLFile(parsing: try Self.read("blinky-efr32-v2.gbl"))
        #expect(plain.applicationVersion == 2 && plain.productID == product && plain.applicationType == 0x20)
        #expect(!plain.isSigned && !plain.isEncrypted && plain.contents == ["application"])
        // The application's bytes are the blinky's, at the EFR32xG24's application start.
        let blinky = Array(try Data(contentsOf: Self.samples.appendingPathComponent("blinky-cortex-m4.bin")))
        let prog = try #require(plain.tags.first { $0.id == .prog })
        #expect(Array(plain.bytes[(prog.valueRange.lowerBound + 4)..<prog.valueRange.upperBound]) == blinky)
        #expect(GBLFile.le32(plain.bytes, prog.valueRange.lowerBound) == 0x0800_6000)

        let signedBytes = try Self.read("blinky-efr32-v2-signed.gbl")
        let signed = try GBLFile(parsing: signedBytes, key: key)
        #expect(signed.isSigned && signed.signatureChecked && signed.applicationVersion == 2)
        #expect(try GBLFile(parsing: signedBytes).signatureChecked == false)
        #expect(throws: GBLError.self) { try GBLFile(parsing: signedBytes, key: P256.Signing.PrivateKey().publicKey) }
        #expect(throws: GBLError.self) { try GBLFile(parsing: plain.bytes, key: key) }

        let encrypted = try GBLFile(parsing: try Self.read("blinky-efr32-v2-encrypted.gbl"))
        #expect(encrypted.isEncrypted && encrypted.applicationVersion == nil && encrypted.productID == nil)
        #expect(encrypted.tags.map(\.id) == [.header, .encryptionInit, .encryptedData, .end])

        // What parsing costs: the figure the report quotes (no bound asserted here).
        let clock = ContinuousClock()
        var parsed = 0
        let elapsed = clock.measure {
            for _ in 0..<10_000 where (try? GBLFile(parsing: signedBytes, key: key)) != nil { parsed += 1 }
        }
        #expect(parsed == 10_000)
        print("GBL parse with signature check, \(signedBytes.count) bytes: \(elapsed / 10_000) each")
    }

    @Test func theDetectorTakesTheSamplesAndNamesTheirKind() throws {
        #expect(ImageFormat.detect(try Self.read("blinky-efr32-v2.gbl"), using: [.gbl]).description == "a Silicon Labs GBL file")
        #expect(ImageFormat.detect(try Self.read("blinky-efr32-v2-signed.gbl"), using: [.gbl]).description == "a Silicon Labs GBL file (signed)")
        let encrypted = ImageFormat.detect(try Self.read("blinky-efr32-v2-encrypted.gbl"), using: [.gbl])
        #expect(encrypted.kind == .gbl && encrypted.description == "a Silicon Labs GBL file (encrypted)")
        #expect(encrypted.limit.bytes == 8 << 20)
    }

    /// Damaged GBLs are claimed as GBLs (refused as one, never sent as a raw binary).
    @Test func aDamagedGBLIsClaimedAsOne() {
        let good = GBLFile.build(body: [1, 2, 3, 4])
        var version = good
        version[11] = 0x04
        var length = good
        length[4] = 9
        let noHeader = Array(good[16...])
        for (bytes, says) in [(version, "version 0x04000000"), (length, "holds 9 bytes"), (noHeader, "starts with the application tag"),
                              (Array(good.prefix(10)), "shorter than it")] {
            let format = ImageFormat.detect(bytes, using: [.gbl])
            #expect(format.kind == .gbl && format.description.contains(says), "\(format.description)")
        }
        #expect(ImageFormat.detect([0xEB, 0x17, 0xA6], using: [.gbl]).kind == .rawBinary)
    }

    /// Every other sample is detected as it was without the GBL detector: it claims none of them.
    @Test func theDetectorClaimsNoOtherSample() throws {
        let files = try #require(FileManager.default.enumerator(at: Self.samples, includingPropertiesForKeys: [.isRegularFileKey]))
        var checked = 0
        for case let url as URL in files where !url.path.contains("/silabs/") && !url.path.contains("/src/") {
            guard (try? url.resourceValues(forKeys: [.isRegularFileKey]).isRegularFile) == true else { continue }
            let bytes = Array(try Data(contentsOf: url))
            let without = ImageFormat.detect(bytes)
            let with = ImageFormat.detect(bytes, using: [.gbl])
            #expect(with == without, "\(url.lastPathComponent): \(with.description)")
            #expect(with.kind != .gbl, "\(url.lastPathComponent)")
            checked += 1
        }
        #expect(checked >= 30)
    }

    @Test func aSimplicityStudioS37NamesTheGBLToMake() {
        let srec = Array("S00F000068656C6C6F202020202000003C\nS11F00007C0802A6900100049421FFF07C6C1B787C8C23783C6000003863000026\n".utf8)
        let format = ImageFormat.detect(srec)
        #expect(format.kind == .srecord)
        let line = ImageFormat.Hint.silabsS37.refusal(format, srec, "blinky.s37")
        #expect(line?.contains("`commander gbl create blinky.gbl --app blinky.s37`") == true, "\(line ?? "nil")")
        #expect(line?.contains("--sign") == true && line?.contains("--encrypt") == true)
        #expect(ImageFormat.Hint.silabsS37.refusal(format, srec, "blinky.srec") == nil)
        #expect(ImageFormat.Hint.silabsS37.refusal(ImageFormat.detect([0x7F, 0x45, 0x4C, 0x46]), [], "blinky.s37") == nil)
    }

    @Test func aSilabsApplicationIsToldFromItsApplicationProperties() {
        let app = [UInt8](repeating: 0, count: 100) + [0x13] + GBLFile.applicationPropertiesMagic + [UInt8](repeating: 0xFF, count: 20)
        #expect(GBLFile.isSilabsApplication(app))
        #expect(!GBLFile.isSilabsApplication(Array(GBLFile.applicationPropertiesMagic.dropLast()) + [0]))
        #expect(GBLFile.howToMake(from: "app.hex").contains("commander gbl create app.gbl --app app.hex"))
    }
}
