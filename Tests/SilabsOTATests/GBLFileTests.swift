import Crypto
import Foundation
import OTA
import OTAWire
import Testing
@testable import SilabsOTA

/// GBL files refused and taken as the Gecko Bootloader's parser does (`btl_gbl_parser.c`,
/// `btl_gbl_format.c`): each malformed case refused with a line naming the damage.
@Suite struct GBLFileTests {
    static let body = (0..<1000).map { UInt8(truncatingIfNeeded: $0 &* 13 &+ 5) }
    static let product: [UInt8] = Array("otaflash-tests!!".utf8)
    static let app = GBLFile.ApplicationData(version: 0x0001_0203, productID: product)
    static let good = GBLFile.build(application: app, body: body)

    static func prog(_ data: [UInt8] = body, address: UInt32 = 0x0800_6000, id: GBLTag.ID = .prog) -> [UInt8] {
        var value: [UInt8] = []
        value.appendLE(address)
        return GBLFile.tag(id, value + data)
    }

    static let header = GBLFile.headerTag()
    static let application = GBLFile.tag(.application, app.bytes)

    /// `b` with its last four bytes (the end tag's value) made the CRC-32 of the bytes before them.
    static func withCRC(_ b: [UInt8]) -> [UInt8] {
        var crc: [UInt8] = []
        crc.appendLE(CRC32.checksum(b[0..<(b.count - 4)]))
        return Array(b.dropLast(4)) + crc
    }

    func refusal(_ bytes: [UInt8], key: P256.Signing.PublicKey? = nil) -> GBLError? {
        do {
            _ = try GBLFile(parsing: bytes, key: key, source: "app.gbl")
            return nil
        } catch {
            return error
        }
    }

    @Test func builtFileParsesWithItsApplication() throws {
        let file = try GBLFile(parsing: Self.good)
        #expect(file.applicationVersion == 0x0001_0203)
        #expect(file.productID == Self.product)
        #expect(file.applicationType == 0x20)
        #expect(!file.isEncrypted && !file.isSigned && !file.signatureChecked)
        #expect(file.contents == ["application"])
        #expect(file.tags.map(\.id) == [.header, .application, .prog, .end])
        #expect(file.bytes == Self.good)
        // The parser's CRC runs over the whole file, the end tag's value included, to 0xDEBB20E3.
        var crc = CRC32()
        crc.update(Self.good)
        #expect(crc.value == 0x2144_DF1C)  // zlib's finished CRC of a residue 0xDEBB20E3 (its complement)
    }

    /// One malformed case each: (what, the bytes, what the refusal says).
    static let malformed: [(String, [UInt8], String)] = {
        let g = GBLFileTests.good
        let header = GBLFileTests.header
        let application = GBLFileTests.application
        func prog() -> [UInt8] { GBLFileTests.prog() }
        func patched(_ at: Int, _ value: UInt8, recrc: Bool = true) -> [UInt8] {
            var b = g
            b[at] = value
            return recrc ? recrced(b) : b
        }
        func recrced(_ b: [UInt8]) -> [UInt8] { GBLFileTests.withCRC(b) }
        var flipped = g
        flipped[100] ^= 0x01
        var cases: [(String, [UInt8], String)] = [
            ("empty", [], "shorter than a tag's header"),
            ("four bytes", Array(g.prefix(4)), "shorter than a tag's header"),
            ("not a GBL", [0x00, 0x80, 0x00, 0x20] + [UInt8](repeating: 0, count: 60), "not a GBL file"),
            ("header not first", Array(g[16...]), "its first tag is the application tag, not the header tag"),
            ("header length", patched(4, 12), "header tag says it holds 12 bytes"),
            ("cut inside the header", Array(g.prefix(12)), "inside its 16-byte header tag"),
            ("version 2", patched(11, 0x02), "GBL version 0x02000000"),
            ("version 4", patched(11, 0x04), "parses major version 3"),
            ("cut inside a tag header", Array(g.prefix(20)), "inside the header of the tag at byte 16"),
            ("tag past the end", Array(g.prefix(200)), "says it holds 1004 bytes, but the file ends"),
            ("no end tag", Array(g.prefix(g.count - 12)), "has no end tag"),
            ("CRC mismatch", flipped, "CRC-32 is 0x"),
            ("data after the end", g + [0x00, 0x01, 0x02], "3 bytes follow its end tag"),
            ("padding after the end", g + [UInt8](repeating: 0xFF, count: 16), "16 bytes follow its end tag"),
            ("end tag length", recrced(Array(g.prefix(g.count - 8)) + [8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]), "it holds 4 (the file's CRC-32)"),
            ("blank after the header", GBLFile.closed(header + [UInt8](repeating: 0xFF, count: 8)), "followed by blank bytes"),
        ]
        func file(_ tags: [UInt8]) -> [UInt8] { GBLFile.closed(tags) }
        let unknown = GBLFile.tag(GBLTag.ID(rawValue: 0x1234_5678), [1, 2, 3, 4])
        cases += [
            ("unknown tag", file(header + application + unknown + prog()), "a tag with the id 0x12345678 at byte 52, which no Gecko Bootloader parses"),
            ("encryption header tag", file(header + GBLFile.tag(.encryptionHeader, [0, 0, 0, 0]) + application + prog()), "0xfb0505fb"),
            ("prog before application", file(header + prog() + application), "the application tag at byte 1028 comes after the prog tag"),
            ("second application", file(header + application + application + prog()), "second application tag"),
            ("signature before prog", file(header + application + GBLFile.tag(.signature, [UInt8](repeating: 1, count: 64)) + prog()), "comes after the signature tag"),
            ("bootloader after prog", file(header + application + prog() + GBLFile.tag(.bootloader, [UInt8](repeating: 0, count: 12))), "the bootloader tag at byte 1064 comes after the prog tag"),
            ("no application", file(header + prog()), "carries no application tag"),
            ("metadata only", file(header + GBLFile.tag(.metadata, [1, 2, 3])), "carries no application tag"),
            ("application without prog", file(header + application), "carries no application bytes"),
            ("application tag empty", file(header + GBLFile.tag(.application, []) + prog()), "says it holds 0 bytes"),
            ("application tag over 64", file(header + GBLFile.tag(.application, [UInt8](repeating: 0, count: 65)) + prog()), "64-byte buffer"),
            ("prog without its address", file(header + application + GBLFile.tag(.prog, [0, 0])), "fewer than its 4-byte flash address"),
            ("bootloader tag short", file(header + GBLFile.tag(.bootloader, [1, 2, 3, 4])), "fewer than its 8-byte header"),
            ("signature 63 bytes", file(header + application + prog() + GBLFile.tag(.signature, [UInt8](repeating: 1, count: 63))), "it holds 64"),
            ("certificate length", file(header + application + prog() + GBLFile.tag(.certificate, [UInt8](repeating: 1, count: 100))), "it holds 136"),
            ("version dependency length", file(header + GBLFile.tag(.versionDependency, [1, 0, 0, 0]) + application + prog()), "whole number of 8-byte statements"),
            ("version dependency image type", file(header + GBLFile.tag(.versionDependency, [9, 0, 0, 0, 1, 0, 0, 0]) + application + prog()), "image type 9"),
            ("version dependency operator", file(header + GBLFile.tag(.versionDependency, [1, 0x0A, 0, 0, 1, 0, 0, 0]) + application + prog()), "cannot evaluate"),
            ("signed header, no signature", file(GBLFile.headerTag(type: GBLFile.signedFlag) + application + prog()), "says it is signed"),
            ("encryption init length", file(GBLFile.headerTag(type: 1) + GBLFile.tag(.encryptionInit, [UInt8](repeating: 0, count: 12))), "it holds 16"),
            ("encrypted data before init", file(GBLFile.headerTag(type: 1) + GBLFile.tag(.encryptedData, [1, 2, 3])), "no encryption init tag before it"),
            ("encrypted file with clear prog", file(GBLFile.headerTag(type: 1) + GBLFile.tag(.encryptionInit, [UInt8](repeating: 0, count: 16)) + prog()), "the prog tag at byte 40 is in the clear"),
            ("encrypted, nothing inside", file(GBLFile.headerTag(type: 1) + GBLFile.tag(.encryptionInit, [UInt8](repeating: 0, count: 16))), "holds no encrypted data tag"),
        ]
        return cases
    }()

    @Test(arguments: malformed)
    func aMalformedFileIsRefusedNamingTheDamage(what: String, bytes: [UInt8], says: String) {
        let error = refusal(bytes)
        #expect(error != nil, "\(what) was taken")
        #expect(error?.code == .image, "\(what)")
        #expect(error?.description.hasPrefix("app.gbl is ") == true, "\(what): \(error?.description ?? "taken")")
        #expect(error?.description.contains(says) == true, "\(what): \(error?.description ?? "taken")")
        #expect(error?.description.contains("; ") == true || error?.description.contains(": ") == true, "\(what): says what to do")
    }

    @Test func theMalformedCasesAreCounted() {
        // The number the report quotes: every case a distinct refusal.
        #expect(Self.malformed.count == 39)
        #expect(Set(Self.malformed.map(\.0)).count == Self.malformed.count)
    }

    @Test func aFileLargerThanAnyStorageSlotIsTooLarge() {
        let huge = GBLFile.build(body: [UInt8](repeating: 0xA5, count: GBLFile.maximumSize))
        let error = refusal(huge)
        #expect(error?.code == .imageTooLarge)
        #expect(error?.description.contains("8 MiB") == true)
    }

    /// What the parser accepts is taken: tags in any order its table allows.
    @Test func tagOrdersAndTagsTheParserAcceptsAreTaken() throws {
        let metadata = GBLFile.tag(.metadata, Array("build 42".utf8))
        var versionDependency: [UInt8] = [1, 0x06, 0, 0]  // application version >= 1.0.0
        versionDependency.appendLE(UInt32(0x0001_0000))
        let interleaved = GBLFile.closed(Self.header + GBLFile.tag(.versionDependency, versionDependency) + Self.application
                                         + Self.prog(Array(Self.body[0..<500])) + metadata
                                         + Self.prog(Array(Self.body[500...]), address: 0x0800_61F4, id: .eraseProg) + metadata)
        let file = try GBLFile(parsing: interleaved)
        #expect(file.contents == ["version dependency", "application", "metadata"])
        #expect(file.applicationVersion == 0x0001_0203)

        let lz4 = try GBLFile(parsing: GBLFile.closed(Self.header + Self.application + GBLFile.tag(.progLZ4, [1, 2, 3, 4, 5])))
        #expect(lz4.contents.first?.contains("LZ4-compressed") == true)
        let delta = try GBLFile(parsing: GBLFile.closed(Self.header + Self.application + GBLFile.tag(.deltaLZMA, [1, 2, 3])))
        #expect(delta.contents.first?.contains("delta") == true)

        var seValue: [UInt8] = []
        seValue.appendLE(UInt32(4))
        seValue.appendLE(UInt32(0x0002_0203))
        var blValue: [UInt8] = []
        blValue.appendLE(UInt32(0x0002_0400))
        blValue.appendLE(UInt32(0))
        let upgrades = try GBLFile(parsing: GBLFile.closed(Self.header + Self.application + GBLFile.tag(.seUpgrade, seValue + [9, 9, 9, 9])
                                                           + GBLFile.tag(.bootloader, blValue + [1, 2, 3, 4]) + Self.prog()))
        #expect(upgrades.contents == ["SE upgrade", "bootloader", "application"])
        #expect(upgrades.seUpgradeVersion == 0x0002_0203 && upgrades.bootloaderVersion == 0x0002_0400)
        // A bootloader upgrade alone needs no application tag.
        let bootloaderOnly = try GBLFile(parsing: GBLFile.closed(Self.header + GBLFile.tag(.bootloader, blValue + [1, 2, 3, 4])))
        #expect(bootloaderOnly.applicationVersion == nil && bootloaderOnly.productID == nil)
        // A short application tag (the parser zero-fills its buffer): the version, no product id.
        var short: [UInt8] = []
        short.appendLE(UInt32(0x20))
        short.appendLE(UInt32(7))
        let shortApp = try GBLFile(parsing: GBLFile.closed(Self.header + GBLFile.tag(.application, short) + Self.prog()))
        #expect(shortApp.applicationVersion == 7 && shortApp.productID == nil)
        // A prog tag of its address alone (the parser programs nothing from it).
        #expect(throws: Never.self) { try GBLFile(parsing: GBLFile.closed(Self.header + Self.application + Self.prog([]) + Self.prog())) }
    }

    @Test func aSignedFileIsCheckedWithTheKeyGiven() throws {
        let key = P256.Signing.PrivateKey()
        let signed = GBLFile.build(application: Self.app, body: Self.body, signingKey: key)
        let unchecked = try GBLFile(parsing: signed)
        #expect(unchecked.isSigned && !unchecked.signatureChecked)
        let checked = try GBLFile(parsing: signed, key: key.publicKey)
        #expect(checked.isSigned && checked.signatureChecked)
        #expect(checked.tags.map(\.id) == [.header, .application, .prog, .signature, .end])

        let other = P256.Signing.PrivateKey().publicKey
        #expect(refusal(signed, key: other)?.description.contains("does not verify") == true)
        #expect(refusal(Self.good, key: key.publicKey)?.description.contains("unsigned GBL file") == true)
        // A byte changed after signing, its CRC made good again: only the signature finds it.
        var changed = signed
        changed[100] ^= 0x40
        changed = Self.withCRC(changed)
        #expect(throws: Never.self) { try GBLFile(parsing: changed) }
        #expect(refusal(changed, key: key.publicKey)?.description.contains("changed after signing") == true)
        // Signed without the header's flag: the parser checks the flag only where it enforces signatures.
        let unflagged = GBLFile.closed(Self.header + Self.application + Self.prog(), signingKey: key)
        #expect(try GBLFile(parsing: unflagged, key: key.publicKey).signatureChecked)
    }

    /// A certificate tag: the GBL is signed by the certificate's key, the certificate by the
    /// bootloader's (the key given).
    @Test func aCertificateChainIsCheckedThroughTheCertificate() throws {
        let root = P256.Signing.PrivateKey()
        let signer = P256.Signing.PrivateKey()
        var certificate: [UInt8] = [1, 0, 0, 0] + Array(signer.publicKey.rawRepresentation)
        certificate.appendLE(UInt32(3))
        certificate += Array(try root.signature(for: SHA256.hash(data: certificate)).rawRepresentation)
        let tags = GBLFile.headerTag(type: GBLFile.signedFlag) + Self.application + Self.prog() + GBLFile.tag(.certificate, certificate)
        let file = GBLFile.closed(tags, signingKey: signer)
        let parsed = try GBLFile(parsing: file, key: root.publicKey)
        #expect(parsed.signatureChecked && parsed.contents.contains("certificate"))
        #expect(refusal(file, key: signer.publicKey)?.description.contains("certificate (at byte") == true)
        let forged = GBLFile.closed(tags, signingKey: P256.Signing.PrivateKey())
        #expect(refusal(forged, key: root.publicKey)?.description.contains("does not verify with the key of its certificate") == true)
    }

    @Test func anEncryptedFileIsRecognisedAndItsVersionUnread() throws {
        var initValue: [UInt8] = []
        initValue.appendLE(UInt32(40))
        initValue += [UInt8](repeating: 0x5A, count: 12)
        let encrypted = GBLFile.closed(GBLFile.headerTag(type: GBLFile.encryptedFlag) + GBLFile.tag(.encryptionInit, initValue)
                                       + GBLFile.tag(.encryptedData, [UInt8](repeating: 0xC3, count: 40)))
        let file = try GBLFile(parsing: encrypted)
        #expect(file.isEncrypted && file.applicationVersion == nil && file.productID == nil)
        #expect(file.contents.first?.contains("readable by the device only") == true)
        // An SE upgrade for a bootloader without staging lies before the init tag, in the clear.
        var se: [UInt8] = []
        se.appendLE(UInt32(4))
        se.appendLE(UInt32(0x0001_0000))
        let withSE = GBLFile.closed(GBLFile.headerTag(type: GBLFile.encryptedFlag) + GBLFile.tag(.seUpgrade, se + [1, 2, 3, 4])
                                    + GBLFile.tag(.encryptionInit, initValue) + GBLFile.tag(.encryptedData, [1, 2, 3]))
        #expect(try GBLFile(parsing: withSE).seUpgradeVersion == 0x0001_0000)
    }

    @Test func keysAreReadInCommandersForms() throws {
        let key = P256.Signing.PrivateKey()
        let raw = Array(key.publicKey.rawRepresentation)
        let x = raw[0..<32].map { String(format: "%02X", $0) }.joined()
        let y = raw[32...].map { String(format: "%02X", $0) }.joined()
        let token = "# comment\nMFG_SIGNED_BOOTLOADER_KEY_X : \(x)\nMFG_SIGNED_BOOTLOADER_KEY_Y : \(y)\n"
        for bytes in [Array(key.publicKey.pemRepresentation.utf8), Array(token.utf8), raw, [0x04] + raw, Array(key.pemRepresentation.utf8)] {
            #expect(try GBLFile.publicKey(bytes: bytes).rawRepresentation == key.publicKey.rawRepresentation)
        }
        for junk in [Array("hello".utf8), [UInt8](repeating: 7, count: 64), Array("MFG_SIGNED_BOOTLOADER_KEY_X : 12\n".utf8)] {
            #expect(throws: GBLError.self) { try GBLFile.publicKey(bytes: junk, name: "key.txt") }
        }
        do {
            _ = try GBLFile.publicKey(file: "/nonexistent/key.pem")
            Issue.record("a missing key file was read")
        } catch {
            #expect(error.description.contains("--gbl-key /nonexistent/key.pem"))
        }
    }
}
