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

/// docs/RELIABILITY.md's GBL rows (scripts/bad-inputs runs them once silabs-ota is registered):
/// the same files, made here as the script makes them, refused by GBLFile with the row's line.
@Suite struct GBLBadInputRowTests {
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()

    /// The files of scripts/bad-inputs' gbl_fixtures, by row, with the file name the row shows.
    static func fixture(_ row: String, good: [UInt8], signed: [UInt8]) -> (name: String, bytes: [UInt8], key: [UInt8]?)? {
        let header = Array(good[0..<16]), application = Array(good[16..<52]), prog = Array(good[52..<300])
        func closed(_ tags: [UInt8]) -> [UInt8] { GBLFile.closed(tags) }
        var flipped = good
        flipped[100] ^= 0x01
        var version = Array(good[0..<300])
        version[11] = 0x02
        // The P-256 base point: a valid key, not the sample's.
        let other = GBLFile.hexBytes("6B17D1F2E12C4247F8BCE6E563A440F277037D812DEB33A0F4A13945D898C296"
                                     + "4FE342E2FE1A7F9B8EE7EB4A7C0F9E162BCE33576B315ECECBB6406837BF51F5")
        let pem = try? Array(Data(contentsOf: root.appendingPathComponent("firmware-samples/silabs/test-signing-pubkey.pem")))
        switch row {
        case "GBL: end tag's CRC-32 does not match": return ("crc-mismatch.gbl", flipped, nil)
        case "GBL: a tag running past the end of the file": return ("cut.gbl", Array(good.prefix(200)), nil)
        case "GBL: no end tag": return ("no-end-tag.gbl", Array(good.prefix(300)), nil)
        case "GBL: header says version 2": return ("version-2.gbl", closed(version), nil)
        case "GBL: no header tag first": return ("no-header.gbl", Array(good[16...]), nil)
        case "GBL: a tag no bootloader parses":
            return ("unknown-tag.gbl", closed(header + application + GBLFile.tag(GBLTag.ID(rawValue: 0x1234_5678), [0, 0, 0, 0]) + prog), nil)
        case "GBL: prog tag before the application tag": return ("prog-first.gbl", closed(header + prog + application), nil)
        case "GBL: no application tag": return ("no-application.gbl", closed(header + prog), nil)
        case "GBL: bytes after the end tag": return ("trailing.gbl", good + [0, 1, 2], nil)
        case "GBL: signed, --gbl-key of another key": return ("firmware-samples/silabs/blinky-efr32-v2-signed.gbl", signed, other)
        case "GBL: unsigned, --gbl-key given": return ("firmware-samples/silabs/blinky-efr32-v2.gbl", good, pem)
        default: return nil
        }
    }

    @Test func eachGBLRowsLineIsTheParsersRefusal() throws {
        let table = try String(contentsOf: Self.root.appendingPathComponent("docs/RELIABILITY.md"), encoding: .utf8)
        let good = Array(try Data(contentsOf: Self.root.appendingPathComponent("firmware-samples/silabs/blinky-efr32-v2.gbl")))
        let signed = Array(try Data(contentsOf: Self.root.appendingPathComponent("firmware-samples/silabs/blinky-efr32-v2-signed.gbl")))
        var checked = 0
        for line in table.split(separator: "\n") where line.contains("| GBL: ") {
            let cells = line.split(separator: "|", omittingEmptySubsequences: false).map { $0.trimmingCharacters(in: .whitespaces) }
            guard cells.count >= 9, let fixture = Self.fixture(cells[2], good: good, signed: signed) else { continue }
            let expected = cells[8..<(cells.count - 1)].joined(separator: "|").replacingOccurrences(of: "\\", with: "")
            let key = try fixture.key.map { try GBLFile.publicKey(bytes: $0) }
            do {
                _ = try GBLFile(parsing: fixture.bytes, key: key, source: fixture.name)
                Issue.record("\(cells[2]): taken")
            } catch {
                #expect("otaflash: error: \(error.description)" == expected, "\(cells[2])")
            }
            checked += 1
        }
        #expect(checked == 11)
        // The .s37 row's line is the hint's.
        let s37 = try #require(table.split(separator: "\n").first { $0.contains("| GBL: a Simplicity Studio .s37") })
        let srec = Array("S00F000068656C6C6F202020202000003C\n".utf8)
        let hint = try #require(ImageFormat.Hint.silabsS37.refusal(ImageFormat.detect(srec), srec, "blinky.s37"))
        #expect(s37.hasSuffix("otaflash: error: blinky.s37: \(hint) |"))
    }
}
