import Crypto
import Foundation
import OTA
import SMP
import Testing

/// firmware-samples/mcuboot/: images signed by imgtool 2.5.0 (scripts/make-mcuboot-samples) and
/// their manifest, whose hashes the script computed from the header and checked with `imgtool verify`.
enum MCUbootSamples {
    struct Entry: Decodable, Sendable, CustomTestStringConvertible {
        let file: String
        let format: String
        let size: Int
        let crc32: String
        let base_address: String?
        let sha256: String
        let image_hash: String
        let hash_type: String
        let version: String
        let key: String?
        var testDescription: String { file }
    }

    static let directory = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent().appendingPathComponent("firmware-samples/mcuboot")

    static func path(_ file: String) -> String { directory.appendingPathComponent(file).path }

    static func bytes(_ file: String) throws -> [UInt8] { try [UInt8](Data(contentsOf: URL(fileURLWithPath: path(file)))) }

    /// The manifest's entries; empty (and the tests using them fail) when it cannot be read.
    static let entries: [Entry] = {
        struct Manifest: Decodable { let files: [Entry] }
        guard let data = FileManager.default.contents(atPath: path("manifest.json")),
              let manifest = try? JSONDecoder().decode(Manifest.self, from: data) else { return [] }
        return manifest.files
    }()

    static let ecdsa = "blinky-ec256-v1.2.3+4.bin"
    static let ed25519 = "blinky-ed25519-v1.2.3+4.bin"
    static let unsigned = "blinky-unsigned-sha512-v1.2.3+4.bin"
}

private func hex(_ bytes: [UInt8]) -> String { bytes.map { String(format: "%02x", $0) }.joined() }

/// The refusal of `bytes`, or nil when they are accepted.
private func refusal(_ bytes: [UInt8]) -> MCUbootImageError? {
    do {
        _ = try MCUbootImage(bytes: bytes, source: "img.bin")
        return nil
    } catch {
        return error
    }
}

/// `bytes` with their SHA-256 TLV rewritten to match the hashed region: an image as a signer with
/// other header fields would have made it (the signature no longer matches).
private func rehashed(_ bytes: [UInt8]) throws -> [UInt8] {
    let layout = try MCUbootImage.Layout(parsing: bytes)
    let tlv = try #require(layout.tlvs.first { $0.type == .sha256 })
    let h = layout.header
    var out = bytes
    out.replaceSubrange(tlv.offset..<(tlv.offset + 32),
                        with: Array(SHA256.hash(data: bytes[0..<(Int(h.headerSize) + Int(h.imageSize) + Int(h.protectedTLVSize))])))
    return out
}

private func le16(_ value: Int, into bytes: inout [UInt8], at offset: Int) {
    bytes[offset] = UInt8(value & 0xFF)
    bytes[offset + 1] = UInt8(value >> 8 & 0xFF)
}

@Suite("MCUboot images")
struct MCUbootImageTests {
    @Test func theManifestListsEverySampleKind() {
        #expect(Set(MCUbootSamples.entries.map(\.file)) == [
            "blinky-ec256-v1.2.3+4.bin", "blinky-ec256-v1.3.0.bin", "blinky-ed25519-v1.2.3+4.bin",
            "blinky-ed25519-v1.2.3+4.hex", "blinky-ed25519-v1.3.0.bin", "blinky-unsigned-sha512-v1.2.3+4.bin",
        ])
    }

    /// Each sample parses; its hash TLV matched the hashed region (or it would have been refused),
    /// and the values it exposes are the ones the script computed independently.
    @Test(arguments: MCUbootSamples.entries)
    func everySampleParsesWithTheManifestsHashesAndVersion(entry: MCUbootSamples.Entry) throws {
        let image = try MCUbootImage.load(path: MCUbootSamples.path(entry.file))
        #expect(hex(image.imageHash) == entry.image_hash)
        #expect(hex(image.sha256) == entry.sha256)
        #expect(image.bytes.count == entry.size)
        #expect(String(format: "%08x", image.firmware.crc32) == entry.crc32)
        #expect(image.version == MCUbootImage.Version(entry.version))
        #expect(image.hashAlgorithm.description.lowercased().replacingOccurrences(of: "-", with: "") == entry.hash_type)
        #expect(image.header.headerSize == 0x200)
        #expect(image.header.imageSize == 236)
        #expect(image.tlvAreaEnd == image.bytes.count)
        #expect(image.warnings.isEmpty)
        #expect(Array(image.bytes[0x200..<(0x200 + 236)]) == (try MCUbootSamples.bytes("../blinky-cortex-m4.bin")))
        #expect((image.signature != nil) == (entry.key != nil))
        #expect((image.keyHash != nil) == (entry.key != nil))
    }

    @Test func theEd25519SamplesCarryAProtectedSecurityCounter() throws {
        let image = try MCUbootImage.load(path: MCUbootSamples.path(MCUbootSamples.ed25519))
        #expect(image.header.protectedTLVSize == 12)
        #expect(image.protectedTLVs.map(\.type) == [.securityCounter])
        #expect(image.tlvs.map(\.type) == [.sha256, .keyHash, .ed25519])
        #expect(image.hashedSize == 0x200 + 236 + 12)
    }

    @Test func imgtoolsHexDecodesToTheBytesOfItsBinary() throws {
        let bin = try MCUbootImage.load(path: MCUbootSamples.path(MCUbootSamples.ed25519))
        let hexImage = try MCUbootImage.load(path: MCUbootSamples.path("blinky-ed25519-v1.2.3+4.hex"))
        #expect(hexImage.bytes == bin.bytes)
        #expect(hexImage.imageHash == bin.imageHash)
        #expect(hexImage.sha256 == bin.sha256)
        #expect(hexImage.firmware.baseAddress == 0xC000)
    }

    /// The image `FirmwareImage.read` claimed, binary or HEX, parses from the bytes read, the file
    /// deleted, to what the file gives.
    @Test(arguments: [MCUbootSamples.ed25519, "blinky-ed25519-v1.2.3+4.hex"])
    func aClaimedImageParsesFromTheValue(file: String) throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("otaflash-claim-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: dir) }
        let path = dir.appendingPathComponent(file).path
        try FileManager.default.copyItem(atPath: MCUbootSamples.path(file), toPath: path)
        let fromFile = try MCUbootImage.load(path: path)
        guard case .claimed(let claimed) = try FirmwareImage.read(path: path, detecting: [.smpFiles]) else {
            Issue.record("\(file) was not claimed")
            return
        }
        #expect(claimed.format.kind == .mcuboot)
        try FileManager.default.removeItem(atPath: path)
        let image = try MCUbootImage(claimed)
        #expect(image.bytes == fromFile.bytes && image.imageHash == fromFile.imageHash && image.sha256 == fromFile.sha256)
        #expect(image.firmware.baseAddress == fromFile.firmware.baseAddress)
        #expect(image.source == path)
    }

    /// The native protocol's loader refuses an MCUboot image whether it comes as a binary or as HEX.
    @Test(arguments: [MCUbootSamples.ecdsa, "blinky-ed25519-v1.2.3+4.hex"])
    func theNativeLoaderRefusesMCUbootImagesInBothForms(file: String) {
        do {
            _ = try FirmwareImage.load(path: MCUbootSamples.path(file), detecting: [.mcuboot])
            Issue.record("\(file) was loaded as a plain image")
        } catch {
            #expect(error.format == .mcuboot)
            #expect(error.description.contains("MCUboot image"), "\(error)")
            #expect(!error.description.contains("\n"))
        }
    }

    @Test func aPlainBinaryIsNotAnMCUbootImage() {
        do {
            _ = try MCUbootImage.load(path: MCUbootSamples.path("../blinky-cortex-m4.bin"))
            Issue.record("a raw binary was accepted")
        } catch {
            #expect(error.code == .notMCUboot)
            #expect(error.description.contains("starts with 0x20020000, not the MCUboot magic 0x96f3b83d"), "\(error)")
        }
    }

    @Test(arguments: ["/nonexistent/app.bin", "/tmp"])
    func anUnreadableFileIsRefused(path: String) {
        do {
            _ = try MCUbootImage.load(path: path)
            Issue.record("\(path) was accepted")
        } catch {
            #expect(error.code == .unreadable)
            #expect(error.otaError.code == .image)
        }
    }

    // MARK: Refusals

    struct Case: Sendable, CustomStringConvertible {
        let name: String
        let sample: String
        let code: MCUbootImageError.Code
        let says: String
        let damage: @Sendable ([UInt8]) throws -> [UInt8]
        var description: String { name }
    }

    // The ECDSA sample: header 0x200, firmware 236 bytes to 748, the TLV area at 748 (size 151):
    // SHA256 at 752, KEYHASH at 788, ECDSASIG at 824, ending at 899. The Ed25519 sample: a
    // 12-byte protected area at 748 (SEC_CNT), the TLV area at 760.
    static let cases: [Case] = [
        Case(name: "empty file", sample: MCUbootSamples.ecdsa, code: .truncated, says: "is 0 bytes, too short for an MCUboot image") { _ in [] },
        Case(name: "bad magic", sample: MCUbootSamples.ecdsa, code: .notMCUboot, says: "starts with 0x96f3b800, not the MCUboot magic 0x96f3b83d") {
            var b = $0
            b[0] = 0
            return b
        },
        Case(name: "shorter than a header", sample: MCUbootSamples.ecdsa, code: .truncated, says: "is 20 bytes, shorter than an MCUboot header") { Array($0.prefix(20)) },
        Case(name: "truncated in the firmware", sample: MCUbootSamples.ecdsa, code: .truncated, says: "then a TLV area at offset 748, but the file is 600 bytes; the file is truncated") {
            Array($0.prefix(600))
        },
        Case(name: "image size past the file", sample: MCUbootSamples.ecdsa, code: .truncated, says: "4294967295 bytes of firmware") {
            var b = $0
            b.replaceSubrange(12..<16, with: [0xFF, 0xFF, 0xFF, 0xFF])
            return b
        },
        Case(name: "header size under 32", sample: MCUbootSamples.ecdsa, code: .badHeader, says: "header size (hdr_size) is 16 bytes") {
            var b = $0
            le16(16, into: &b, at: 8)
            return b
        },
        Case(name: "TLV area overruns the file", sample: MCUbootSamples.ecdsa, code: .badTLVArea, says: "its TLV area at offset 748 says it is 151 bytes, running past the end of the 889-byte file") {
            Array($0.dropLast(10))
        },
        Case(name: "no TLV magic", sample: MCUbootSamples.ecdsa, code: .badTLVArea, says: "no TLV area at offset 748") {
            var b = $0
            b[748] = 0
            return b
        },
        Case(name: "TLV area smaller than its info", sample: MCUbootSamples.ecdsa, code: .badTLVArea, says: "says it is 3 bytes, less than its own 4-byte info") {
            var b = $0
            le16(3, into: &b, at: 750)
            return b
        },
        Case(name: "garbage TLV length", sample: MCUbootSamples.ecdsa, code: .badTLVArea, says: "its KEYHASH (0x1) at offset 788 says it is 65535 bytes, running 65428 bytes past the end of the TLV area at offset 899") {
            var b = $0
            le16(0xFFFF, into: &b, at: 790)
            return b
        },
        Case(name: "last TLV cut by the area's end", sample: MCUbootSamples.ecdsa, code: .badTLVArea, says: "its ECDSASIG (0x22) at offset 824 says it is 71 bytes, running 2 bytes past the end of the TLV area") {
            var b = $0
            le16(149, into: &b, at: 750)
            return b
        },
        Case(name: "area ends inside a TLV header", sample: MCUbootSamples.ecdsa, code: .badTLVArea, says: "the TLV area ends 2 bytes into a TLV's 4-byte header at offset 788") {
            var b = $0
            le16(42, into: &b, at: 750)
            return b
        },
        Case(name: "wrong hash", sample: MCUbootSamples.ecdsa, code: .hashMismatch, says: "but its hash TLV says d341c1df846ce9dc…; the file is corrupt") {
            var b = $0
            b[0x200 + 10] ^= 0x01
            return b
        },
        Case(name: "wrong SHA-512 hash", sample: MCUbootSamples.unsigned, code: .hashMismatch, says: "the SHA-512 of its header, firmware and protected TLVs") {
            var b = $0
            b[30] ^= 0x80
            return b
        },
        Case(name: "no hash TLV", sample: MCUbootSamples.ecdsa, code: .noHash, says: "carries no SHA256, SHA384 or SHA512 TLV") {
            var b = $0
            le16(0x77, into: &b, at: 752)
            return b
        },
        Case(name: "two hash TLVs", sample: MCUbootSamples.ecdsa, code: .badTLVArea, says: "carries 2 hash TLVs (SHA256 (0x10), SHA256 (0x10))") {
            var b = $0
            le16(0x10, into: &b, at: 788)
            return b
        },
        Case(name: "hash TLV of the wrong length", sample: MCUbootSamples.ecdsa, code: .badTLVArea, says: "its SHA384 (0x11) TLV is 32 bytes, but a SHA-384 hash is 48") {
            var b = $0
            le16(0x11, into: &b, at: 752)
            return b
        },
        Case(name: "protected area announced but absent", sample: MCUbootSamples.ecdsa, code: .badTLVArea, says: "announces 12 bytes of protected TLVs at offset 748, but no protected TLV area starts there") {
            var b = $0
            le16(12, into: &b, at: 10)
            return b
        },
        Case(name: "protected area not announced", sample: MCUbootSamples.ed25519, code: .badTLVArea, says: "a protected TLV area (magic 0x6908) follows the firmware at offset 748, but the header announces none") {
            var b = $0
            le16(0, into: &b, at: 10)
            return b
        },
        Case(name: "protected area sizes disagree", sample: MCUbootSamples.ed25519, code: .badTLVArea, says: "its protected TLV area says it is 12 bytes, the header says 16") {
            var b = $0
            le16(16, into: &b, at: 10)
            return b
        },
        Case(name: "garbage protected TLV length", sample: MCUbootSamples.ed25519, code: .badTLVArea, says: "its SEC_CNT (0x50) at offset 752 says it is 300 bytes, running 296 bytes past the end of the protected TLV area at offset 760") {
            var b = $0
            le16(300, into: &b, at: 754)
            return b
        },
        Case(name: "encrypted with AES-128", sample: MCUbootSamples.ecdsa, code: .encrypted, says: "is encrypted (AES-128, flag 0x04); otaflash uploads plain images only") {
            var b = $0
            b[16] = 0x04
            return try rehashed(b)
        },
        Case(name: "encrypted with AES-256", sample: MCUbootSamples.ecdsa, code: .encrypted, says: "is encrypted (AES-256, flag 0x08)") {
            var b = $0
            b[16] = 0x08
            return try rehashed(b)
        },
        Case(name: "non-bootable", sample: MCUbootSamples.ecdsa, code: .nonBootable, says: "is marked non-bootable (flag 0x10)") {
            var b = $0
            b[16] = 0x10
            return try rehashed(b)
        },
    ]

    @Test(arguments: cases)
    func damagedImagesAreRefusedWithOneLine(c: Case) throws {
        let bytes = try c.damage(MCUbootSamples.bytes(c.sample))
        let error = try #require(refusal(bytes), "\(c.name) was accepted")
        #expect(error.code == c.code, "\(error)")
        #expect(error.description.hasPrefix("img.bin: "))
        #expect(error.description.contains(c.says), "\(error)")
        #expect(!error.description.contains("\n"))
        #expect(error.otaError.code == .image)
        #expect(error.otaError.description == error.description)
    }

    /// An encrypted flag left unhashed is corruption, not encryption: the hash is checked first.
    @Test func aFlagChangedAfterSigningIsAHashMismatch() throws {
        var bytes = try MCUbootSamples.bytes(MCUbootSamples.ecdsa)
        bytes[16] = 0x04
        #expect(refusal(bytes)?.code == .hashMismatch)
    }

    /// imgtool hashes an image before it encrypts it, and adds the wrapped key as an ENC TLV: a
    /// real `imgtool sign --encrypt` image fails the hash check, and was called corrupt. It is
    /// refused as encrypted, which it is.
    @Test(arguments: [(0x04, 0x31, "AES-128, flag 0x04"), (0x08, 0x32, "AES-256, flag 0x08"), (0x04, 0x34, "AES-128, flag 0x04")])
    func anEncryptedImageIsCalledEncryptedNotCorrupt(flag: UInt8, keyTLV: Int, says: String) throws {
        var bytes = try MCUbootSamples.bytes(MCUbootSamples.ecdsa)
        bytes[16] = flag
        bytes = try rehashed(bytes)
        let layout = try MCUbootImage.Layout(parsing: bytes)
        let h = layout.header
        for i in Int(h.headerSize)..<(Int(h.headerSize) + Int(h.imageSize)) { bytes[i] ^= 0xA5 }  // "encrypted" after hashing
        let info = Int(h.headerSize) + Int(h.imageSize) + Int(h.protectedTLVSize)
        let tlv = [UInt8(keyTLV), 0, 24, 0] + [UInt8](repeating: 0x3C, count: 24)
        bytes.insert(contentsOf: tlv, at: layout.tlvAreaEnd)
        le16(layout.tlvAreaEnd - info + tlv.count, into: &bytes, at: info + 2)
        let error = try #require(refusal(bytes))
        #expect(error.code == .encrypted, "\(error)")
        #expect(error.description.contains("is encrypted (\(says))"), "\(error)")
    }

    @Test(arguments: [(898, false), (899, true), (0x20000, true)] as [(Int, Bool)])
    func anImageLargerThanTheSlotIsRefused(slotSize: Int, fits: Bool) throws {
        let path = MCUbootSamples.path(MCUbootSamples.ecdsa)
        do {
            _ = try MCUbootImage.load(path: path, slotSize: slotSize)
            #expect(fits)
        } catch {
            #expect(!fits)
            #expect(error.code == .overSlot)
            #expect(error.description.contains("is 899 bytes but the slot holds \(slotSize)"), "\(error)")
            #expect(error.otaError.code == .imageTooLarge)
        }
    }

    /// Bytes after the TLV area (imgtool --pad) are kept and uploaded, with a warning.
    @Test func paddingAfterTheTLVAreaIsUploadedWithAWarning() throws {
        let bytes = try MCUbootSamples.bytes(MCUbootSamples.ecdsa) + [UInt8](repeating: 0xFF, count: 100)
        let image = try MCUbootImage(bytes: bytes, source: "padded.bin")
        #expect(image.bytes == bytes)
        #expect(image.tlvAreaEnd == 899)
        #expect(image.warnings == ["padded.bin: 100 bytes follow the TLV area (imgtool --pad?); they are uploaded with the image"])
        #expect(hex(image.sha256) == hex(Array(SHA256.hash(data: bytes))))
    }

    // MARK: Signatures

    @Test(arguments: [
        (MCUbootSamples.ecdsa, "ec256-public.pem"), (MCUbootSamples.ecdsa, "ec256.pem"),
        ("blinky-ec256-v1.3.0.bin", "ec256-public.pem"),
        (MCUbootSamples.ed25519, "ed25519-public.pem"), (MCUbootSamples.ed25519, "ed25519.pem"),
        ("blinky-ed25519-v1.2.3+4.hex", "ed25519-public.pem"),
    ])
    func signaturesVerifyWithTheTestKeys(file: String, keyFile: String) throws {
        let image = try MCUbootImage.load(path: MCUbootSamples.path(file))
        let key = try MCUbootImage.PublicKey(pem: String(decoding: MCUbootSamples.bytes(keyFile), as: UTF8.self), source: keyFile)
        #expect(image.keyHash == Array(SHA256.hash(data: key.subjectPublicKeyInfo)))
        try image.verifySignature(with: key, keyName: keyFile)
    }

    /// `imgtool sign --pad-sig` appends zeros to the DER signature, up to 72 bytes; MCUboot reads
    /// the SEQUENCE and ignores them. Before, such an image failed verification as corrupt.
    @Test(arguments: [1, 2, 6])
    func aZeroPaddedECDSASignatureVerifies(padding: Int) throws {
        var bytes = try MCUbootSamples.bytes(MCUbootSamples.ecdsa)
        let layout = try MCUbootImage.Layout(parsing: bytes)
        let signature = try #require(layout.tlvs.first { $0.type == .ecdsaSignature })
        let info = Int(layout.header.headerSize) + Int(layout.header.imageSize) + Int(layout.header.protectedTLVSize)
        bytes.insert(contentsOf: [UInt8](repeating: 0, count: padding), at: signature.offset + signature.value.count)
        le16(signature.value.count + padding, into: &bytes, at: signature.offset - 2)
        le16(layout.tlvAreaEnd - info + padding, into: &bytes, at: info + 2)
        let image = try MCUbootImage(bytes: bytes, source: "padded.bin")
        #expect(image.signature?.value.count == signature.value.count + padding)
        let key = try MCUbootImage.PublicKey(pem: String(decoding: MCUbootSamples.bytes("ec256-public.pem"), as: UTF8.self))
        try image.verifySignature(with: key)
    }

    @Test(arguments: [
        (MCUbootSamples.ecdsa, "ed25519-public.pem", "was signed with another key: its KEYHASH is"),
        (MCUbootSamples.ed25519, "ec256-public.pem", "was signed with another key: its KEYHASH is"),
        (MCUbootSamples.unsigned, "ec256-public.pem", "is not signed (no signature TLV), but ec256-public.pem was given"),
    ])
    func aSignatureIsRefusedForAnotherKey(file: String, keyFile: String, says: String) throws {
        let image = try MCUbootImage.load(path: MCUbootSamples.path(file))
        let key = try MCUbootImage.PublicKey(pem: String(decoding: MCUbootSamples.bytes(keyFile), as: UTF8.self), source: keyFile)
        do {
            try image.verifySignature(with: key, keyName: keyFile)
            Issue.record("verified with the wrong key")
        } catch {
            #expect(error.code == .badSignature)
            #expect(error.description.contains(says), "\(error)")
        }
    }

    /// The signature lies outside the hashed region: a damaged one passes the hash check and
    /// fails verification.
    @Test(arguments: [MCUbootSamples.ecdsa, MCUbootSamples.ed25519])
    func aDamagedSignatureDoesNotVerify(file: String) throws {
        var bytes = try MCUbootSamples.bytes(file)
        bytes[bytes.count - 5] ^= 0x01
        let image = try MCUbootImage(bytes: bytes, source: "img.bin")
        let keyFile = file == MCUbootSamples.ecdsa ? "ec256-public.pem" : "ed25519-public.pem"
        let key = try MCUbootImage.PublicKey(pem: String(decoding: MCUbootSamples.bytes(keyFile), as: UTF8.self))
        do {
            try image.verifySignature(with: key, keyName: keyFile)
            Issue.record("a damaged signature verified")
        } catch {
            #expect(error.code == .badSignature)
            #expect(error.description.contains("signature does not verify with \(keyFile)"), "\(error)")
        }
    }

    @Test(arguments: ["", "not a key", "-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n"])
    func somethingElseIsNotAKey(pem: String) {
        do {
            _ = try MCUbootImage.PublicKey(pem: pem, source: "key.pem")
            Issue.record("accepted as a key")
        } catch {
            #expect(error.code == .badSignature)
            #expect(error.description.hasPrefix("key.pem: is not an ECDSA P-256 or Ed25519 key"))
        }
    }

    // MARK: Versions

    @Test(arguments: [
        ("1.2.3+4", 1, 2, 3, 4), ("1.2.3.4", 1, 2, 3, 4), ("1.2.3", 1, 2, 3, 0), ("1.2", 1, 2, 0, 0), ("7", 7, 0, 0, 0),
        ("255.255.65535+4294967295", 255, 255, 65535, 4_294_967_295), ("0.0.0+0", 0, 0, 0, 0),
    ] as [(String, UInt8, UInt8, UInt16, UInt32)])
    func versionsParseInImgtoolsAndZephyrsForms(text: String, major: UInt8, minor: UInt8, revision: UInt16, build: UInt32) {
        #expect(MCUbootImage.Version(text) == MCUbootImage.Version(major: major, minor: minor, revision: revision, build: build))
    }

    @Test(arguments: ["", "1.", ".1", "1..3", "256.0.0", "1.256", "1.2.65536", "1.2.3+4294967296", "1.2.3+", "+4",
                      "1.2.3.4.5", "1.2.3.4+5", "a.b.c", " 1.2.3", "1.2.3 ", "-1.2.3", "1.2.3+-4"])
    func malformedVersionsAreRefused(text: String) {
        #expect(MCUbootImage.Version(text) == nil)
    }

    @Test func versionsOrderFieldByFieldAndPrintLikeImgtool() throws {
        let v = try #require(MCUbootImage.Version("1.2.3+4"))
        #expect(v < MCUbootImage.Version(major: 1, minor: 3))
        #expect(MCUbootImage.Version(major: 1, minor: 2, revision: 3) < v)
        #expect(MCUbootImage.Version(major: 1, minor: 2, revision: 4) > v)
        #expect(MCUbootImage.Version(major: 2) > MCUbootImage.Version(major: 1, minor: 255, revision: 65535, build: 9))
        #expect(v.description == "1.2.3+4")
        #expect(MCUbootImage.Version(major: 1, minor: 3).description == "1.3.0")
    }
}
