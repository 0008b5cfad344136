import Foundation
import OTA
import OTAWire
import Testing
import ZIPFoundation
@testable import NordicDFU

func nordicSample(_ name: String) -> String {
    repositoryRoot.appendingPathComponent("firmware-samples/nordic/\(name)").path
}

/// The signed application sample with the byte at `offset` of the zip file flipped.
func damagedSample(at offset: Int) throws -> Data {
    var bytes = try Data(contentsOf: URL(fileURLWithPath: nordicSample("blinky-app.zip")))
    bytes[offset] ^= 0xFF
    return bytes
}

/// Writes a zip in memory from (name, bytes) pairs, deflated like nrfutil's.
func makeZip(_ files: [(String, [UInt8])]) throws -> Data {
    let archive = try Archive(data: Data(), accessMode: .create)
    for (name, bytes) in files {
        let data = Data(bytes)
        try archive.addEntry(with: name, type: .file, uncompressedSize: Int64(data.count), compressionMethod: .deflate) { position, size in
            data.subdata(in: Int(position)..<Int(position) + size)
        }
    }
    return archive.data!
}

func manifest(_ entries: [String: (bin: String, dat: String)]) -> [UInt8] {
    let body = entries.sorted { $0.key < $1.key }.map { "\"\($0.key)\": {\"bin_file\": \"\($0.value.bin)\", \"dat_file\": \"\($0.value.dat)\"}" }
    return Array("{\"manifest\": {\(body.joined(separator: ", "))}}".utf8)
}

/// A seeded firmware image of `count` bytes.
func firmwareBytes(_ count: Int, seed: UInt64 = 1) -> [UInt8] {
    var state = seed
    return (0..<count).map { _ in
        state = state &* 6364136223846793005 &+ 1442695040888963407
        return UInt8(truncatingIfNeeded: state >> 33)
    }
}

/// A signature-shaped placeholder: the model bootloader's `.accept` check takes it.
let placeholderSignature = DFUInitPacket.Signature(type: 0, bytes: Array(repeating: 0x5A, count: 64))

func applicationPackage(firmware: [UInt8], version: UInt32 = 2, edit: (inout DFUInitCommand) -> Void = { _ in },
                        bin: [UInt8]? = nil, signed: Bool = true) throws -> Data {
    var c = DFUInitCommand.application(firmware: firmware, version: version, softDeviceRequirements: [0xAF])
    edit(&c)
    let dat = DFUInitPacket(command: c, signature: signed ? placeholderSignature : nil).bytes
    return try makeZip([("manifest.json", manifest(["application": ("app.bin", "app.dat")])), ("app.dat", dat), ("app.bin", bin ?? firmware)])
}

@Suite struct PackageSampleTests {
    @Test func signedApplicationSampleIsAccepted() throws {
        let p = try DFUPackage.load(path: nordicSample("blinky-app.zip"))
        #expect(p.images.map(\.kind) == [.application])
        #expect(p.warnings.isEmpty)
        let image = try #require(p.images.first)
        #expect(image.initPacket.isSigned)
        #expect(image.initPacket.command.hardwareVersion == 52)
        #expect(image.initPacket.command.softDeviceRequirements == [0xAF])
        let blinky = try #require(FileManager.default.contents(atPath: repositoryRoot.appendingPathComponent("firmware-samples/blinky-cortex-m4.bin").path))
        #expect(image.firmware.bytes == [UInt8](blinky))
    }

    @Test func unsignedDebugSampleWarnsTwice() throws {
        let p = try DFUPackage.load(path: nordicSample("blinky-app-unsigned-debug.zip"))
        #expect(p.warnings.count == 2)
        #expect(p.warnings.contains { $0.contains("unsigned") && $0.contains("0x08") })
        #expect(p.warnings.contains { $0.contains("debug") })
    }

    @Test func combinedSampleComesInNrfutilsOrder() throws {
        let p = try DFUPackage.load(path: nordicSample("blinky-sd-bl-app.zip"))
        #expect(p.images.map(\.kind) == [.softDeviceBootloader, .application])
        let sdbl = p.images[0].initPacket.command
        #expect(sdbl.type == .softDeviceBootloader)
        #expect(UInt64(p.images[0].firmware.size) == UInt64(sdbl.softDeviceSize!) + UInt64(sdbl.bootloaderSize!))
        #expect(sdbl.firmwareVersion == 3)
        #expect(p.images[1].initPacket.command.softDeviceRequirements == [0xB6])
    }

    @Test func expectationsCatchWrongHardwareAndSoftDevice() throws {
        let p = try DFUPackage.load(path: nordicSample("blinky-app.zip"))
        try p.check(.init(hardwareVersion: 52, softDevices: [0xAF]))
        do {
            try p.check(.init(hardwareVersion: 40))
            Issue.record("another hardware version passed")
        } catch {
            #expect(error.code == .incompatible)
            #expect(error.otaError.code == .incompatibleDevice)
            #expect(error.reason.contains("is for hardware version 52 but the device is hardware version 40"), "\(error)")
            #expect(error.reason.contains("--hw-version 40"), "\(error)")
        }
        do {
            try p.check(.init(softDevices: [0x101]))
            Issue.record("a SoftDevice the package does not list passed")
        } catch {
            #expect(error.code == .incompatible)
            #expect(error.reason.contains("accepts SoftDevice 0xAF but the device may run 0x101"), "\(error)")
            #expect(error.reason.contains("--sd-req 0xAF,0x101"), "\(error)")
        }
    }

    /// A fleet on either of two SoftDevices: the package must accept each; the combined sample's
    /// first image lists 0xB6 and 0xAF, its application (run on the new SoftDevice) 0xB6 only.
    @Test(arguments: [
        ([0xAF], true), ([0xB6], true), ([0xAF, 0xB6], true), ([0xAF, 0x101], false), ([0x101], false),
    ] as [([UInt32], Bool)])
    func everySoftDeviceTheDeviceMayRunMustBeAcceptedByTheFirstImage(softDevices: [UInt32], accepted: Bool) throws {
        let p = try DFUPackage.load(path: nordicSample("blinky-sd-bl-app.zip"))
        let passed = (try? p.check(.init(softDevices: softDevices))) != nil
        #expect(passed == accepted)
    }

    @Test func looksLikePackageSniffsTheZipMagic() throws {
        let bytes = try [UInt8](Data(contentsOf: URL(fileURLWithPath: nordicSample("blinky-app.zip"))))
        #expect(DFUPackage.looksLikePackage(bytes))
        #expect(!DFUPackage.looksLikePackage([0x3A, 0x31, 0x30]))
    }
}

@Suite struct PackageRefusalTests {
    struct Case: Sendable, CustomStringConvertible {
        let name: String
        let code: DFUPackageError.Code
        let says: String
        let zip: @Sendable () throws -> Data
        var description: String { name }
    }

    static let fw = firmwareBytes(5000)

    static let cases: [Case] = [
        Case(name: "not a zip", code: .corruptArchive, says: "not a readable zip") { Data(firmwareBytes(300)) },
        Case(name: "truncated zip", code: .corruptArchive, says: "zip") {
            let z = try applicationPackage(firmware: fw)
            return z.prefix(z.count / 2)
        },
        Case(name: "directory offset past the end", code: .corruptArchive, says: "lies outside the file") {
            // Found by fuzz-nordic: ZIPFoundation's in-memory reader traps on such offsets.
            var z = [UInt8](try applicationPackage(firmware: fw))
            let eocd = z.count - 22
            z[eocd + 16] = 0xFF
            z[eocd + 17] = 0xFF
            return Data(z)
        },
        Case(name: "local header offset past the end", code: .corruptArchive, says: "header lies outside the file") {
            var z = [UInt8](try applicationPackage(firmware: fw))
            let eocd = z.count - 22
            let directory = Int(z[eocd + 16]) | Int(z[eocd + 17]) << 8 | Int(z[eocd + 18]) << 16
            z[directory + 42] = 0xF0
            z[directory + 43] = 0xFF
            return Data(z)
        },
        // nrfutil stores the sample's entries uncompressed: the .bin's bytes at 50..<286, the
        // .dat's at 336..<476. A flipped byte in the .dat's signature passes every other check.
        Case(name: "damaged .bin entry", code: .corruptArchive, says: "blinky-cortex-m4.bin fails the archive's CRC-32 check") {
            try damagedSample(at: 150)
        },
        Case(name: "damaged .dat entry", code: .corruptArchive, says: "blinky-cortex-m4.dat fails the archive's CRC-32 check") {
            try damagedSample(at: 470)
        },
        Case(name: "no manifest", code: .missingFile, says: "manifest.json") { try makeZip([("app.bin", fw)]) },
        Case(name: "manifest not JSON", code: .badManifest, says: "\"manifest\" key") { try makeZip([("manifest.json", Array("{nope".utf8))]) },
        Case(name: "manifest lists nothing", code: .badManifest, says: "lists no image") { try makeZip([("manifest.json", Array("{\"manifest\": {}}".utf8))]) },
        Case(name: "unknown manifest key", code: .badManifest, says: "unknown entry \"app\"") {
            try makeZip([("manifest.json", manifest(["app": ("a.bin", "a.dat")]))])
        },
        Case(name: "missing .bin", code: .missingFile, says: "app.bin") {
            let dat = DFUInitPacket(command: .application(firmware: fw, version: 1), signature: placeholderSignature).bytes
            return try makeZip([("manifest.json", manifest(["application": ("app.bin", "app.dat")])), ("app.dat", dat)])
        },
        Case(name: "missing .dat", code: .missingFile, says: "app.dat") {
            try makeZip([("manifest.json", manifest(["application": ("app.bin", "app.dat")])), ("app.bin", fw)])
        },
        Case(name: "wrong hash", code: .hashMismatch, says: "SHA-256 does not match") {
            var other = fw
            other[100] ^= 0x01
            return try applicationPackage(firmware: fw, bin: other)
        },
        Case(name: "truncated .bin", code: .sizeMismatch, says: "app_size = 5000 bytes but app.bin is 4000") {
            try applicationPackage(firmware: fw, bin: Array(fw.prefix(4000)))
        },
        Case(name: "type mismatch", code: .typeMismatch, says: "announces SOFTDEVICE but the manifest lists it as application") {
            try applicationPackage(firmware: fw) { $0.type = .softDevice }
        },
        Case(name: "no hash", code: .badInitPacket, says: "no SHA-256") {
            try applicationPackage(firmware: fw) { $0.hashType = .crc }
        },
        Case(name: "garbage .dat", code: .badInitPacket, says: "not a Secure DFU init packet") {
            try makeZip([("manifest.json", manifest(["application": ("app.bin", "app.dat")])), ("app.dat", [0xff, 0xff, 0xff]), ("app.bin", fw)])
        },
        Case(name: "legacy manifest", code: .legacyFormat, says: "legacy DFU package (dfu_version 0.5)") {
            let m = "{\"manifest\": {\"application\": {\"bin_file\": \"app.bin\", \"dat_file\": \"app.dat\", \"init_packet_data\": {\"application_version\": 4294967295}}, \"dfu_version\": 0.5}}"
            return try makeZip([("manifest.json", Array(m.utf8)), ("app.dat", [0x52, 0x00, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01, 0x00, 0xfe, 0xff, 0xcc, 0x16]), ("app.bin", fw)])
        },
        Case(name: "legacy .dat", code: .legacyFormat, says: "legacy (SDK 11 or older) init packet") {
            try makeZip([("manifest.json", manifest(["application": ("app.bin", "app.dat")])),
                         ("app.dat", [0x52, 0x00, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01, 0x00, 0xfe, 0xff, 0xcc, 0x16]), ("app.bin", fw)])
        },
        Case(name: "oversize .dat", code: .tooLarge, says: "over the limit of 4096") {
            try makeZip([("manifest.json", manifest(["application": ("app.bin", "app.dat")])), ("app.dat", [UInt8](repeating: 0, count: 5000)), ("app.bin", fw)])
        },
        Case(name: "SoftDevice+bootloader with a zero size", code: .sizeMismatch, says: "both must be non-zero") {
            var c = DFUInitCommand.application(firmware: fw, version: 1)
            c.type = .softDeviceBootloader
            c.applicationSize = 0
            c.softDeviceSize = 5000
            c.bootloaderSize = 0
            let dat = DFUInitPacket(command: c, signature: placeholderSignature).bytes
            return try makeZip([("manifest.json", manifest(["softdevice_bootloader": ("sd_bl.bin", "sd_bl.dat")])), ("sd_bl.dat", dat), ("sd_bl.bin", fw)])
        },
    ]

    @Test(arguments: cases)
    func badPackagesAreRefusedWithOneLine(c: Case) throws {
        let data = try c.zip()
        do {
            _ = try DFUPackage(zip: data, source: "pkg.zip")
            Issue.record("\(c.name) was accepted")
        } catch {
            #expect(error.code == c.code, "\(error)")
            #expect(error.description.hasPrefix("pkg.zip"))
            #expect(error.description.contains(c.says), "\(error)")
            #expect(!error.description.contains("\n"))
            #expect(error.otaError.code == .image)
        }
    }

    /// Inputs fuzz-nordic found trapping ZIPFoundation's in-memory reader (offsets past the end).
    @Test func fuzzFoundArchivesAreRefusedWithoutTrapping() throws {
        let folder = repositoryRoot.appendingPathComponent("Tests/NordicDFUTests/FuzzCrashes")
        let files = try FileManager.default.contentsOfDirectory(atPath: folder.path).filter { $0.hasSuffix(".bin") }
        #expect(files.count >= 2)
        for name in files {
            let data = try Data(contentsOf: folder.appendingPathComponent(name))
            #expect(throws: DFUPackageError.self, "\(name)") { try DFUPackage(zip: data, source: name) }
        }
    }

    @Test func missingAndDirectoryPathsAreRefused() {
        #expect(throws: DFUPackageError.self) { try DFUPackage.load(path: "/nonexistent/pkg.zip") }
        #expect(throws: DFUPackageError.self) { try DFUPackage.load(path: repositoryRoot.path) }
    }

    @Test func handBuiltPackageIsAccepted() throws {
        let fw = firmwareBytes(9000)
        let p = try DFUPackage(zip: applicationPackage(firmware: fw), source: "pkg.zip")
        #expect(p.images.count == 1)
        #expect(p.images[0].firmware.bytes == fw)
        #expect(p.warnings.isEmpty)
    }
}

/// A zip written the way a streaming archiver writes it (APPNOTE.TXT 4.3.9): entries stored, the
/// local headers with flag 3 set and no CRC or sizes, each entry's data followed by a data
/// descriptor, with or without its optional signature.
func streamedZip(_ files: [(String, [UInt8])], descriptorSignature: Bool) -> Data {
    var out: [UInt8] = []
    var directory: [UInt8] = []
    func le16(_ v: Int, _ b: inout [UInt8]) { b += [UInt8(v & 0xFF), UInt8(v >> 8 & 0xFF)] }
    func le32(_ v: Int, _ b: inout [UInt8]) { le16(v & 0xFFFF, &b); le16(v >> 16 & 0xFFFF, &b) }
    for (name, bytes) in files {
        let offset = out.count, crc = Int(CRC32.checksum(bytes)), nameBytes = Array(name.utf8)
        out += [0x50, 0x4B, 0x03, 0x04]
        le16(20, &out); le16(0x08, &out); le16(0, &out); le16(0, &out); le16(0x21, &out)
        le32(0, &out); le32(0, &out); le32(0, &out); le16(nameBytes.count, &out); le16(0, &out)
        out += nameBytes + bytes
        if descriptorSignature { out += [0x50, 0x4B, 0x07, 0x08] }
        le32(crc, &out); le32(bytes.count, &out); le32(bytes.count, &out)
        directory += [0x50, 0x4B, 0x01, 0x02]
        le16(20, &directory); le16(20, &directory); le16(0x08, &directory); le16(0, &directory); le16(0, &directory)
        le16(0x21, &directory); le32(crc, &directory); le32(bytes.count, &directory); le32(bytes.count, &directory)
        le16(nameBytes.count, &directory); le16(0, &directory); le16(0, &directory); le16(0, &directory); le16(0, &directory)
        le32(0, &directory); le32(offset, &directory)
        directory += nameBytes
    }
    let start = out.count
    out += directory
    out += [0x50, 0x4B, 0x05, 0x06]
    le16(0, &out); le16(0, &out); le16(files.count, &out); le16(files.count, &out)
    le32(directory.count, &out); le32(start, &out); le16(0, &out)
    return Data(out)
}

/// Packages a generator other than nrfutil, or a user re-zipping one, may legally produce.
@Suite struct PackageVariantTests {
    static let fw = firmwareBytes(3000, seed: 4)
    static let dat = DFUInitPacket(command: .application(firmware: fw, version: 3), signature: placeholderSignature).bytes

    static func accepts(_ zip: Data) throws {
        let p = try DFUPackage(zip: zip, source: "pkg.zip")
        #expect(p.images.map(\.kind) == [.application])
        #expect(p.images.first?.firmware.bytes == fw)
        #expect(p.images.first?.initPacket.bytes == dat)
    }

    /// Keys in another order, whitespace and CRLF line ends, a byte-order mark, keys nrfutil does
    /// not write (beside "manifest", inside an entry, and inside "manifest" when they name no
    /// file), `info_read_only_metadata` on an application: Nordic's Android and iOS libraries read
    /// all of these. Before, a key inside "manifest" that was not an image refused the package.
    @Test(arguments: [
        "{\"manifest\":{\"application\":{\"dat_file\":\"app.dat\",\"bin_file\":\"app.bin\"}}}",
        "{\r\n    \"manifest\": {\r\n        \"application\": {\r\n            \"bin_file\": \"app.bin\",\r\n            \"dat_file\": \"app.dat\"\r\n        }\r\n    }\r\n}\r\n",
        "\u{FEFF}{\"manifest\": {\"application\": {\"bin_file\": \"app.bin\", \"dat_file\": \"app.dat\"}}}",
        "{\"generator\": \"custom 1.0\", \"manifest\": {\"application\": {\"bin_file\": \"app.bin\", \"dat_file\": \"app.dat\", \"sha256\": \"…\"}}}",
        "{\"manifest\": {\"comment\": \"built by CI\", \"version\": 2, \"application\": {\"bin_file\": \"app.bin\", \"dat_file\": \"app.dat\"}}}",
        "{\"manifest\": {\"application\": {\"bin_file\": \"app.bin\", \"dat_file\": \"app.dat\", \"info_read_only_metadata\": {\"bl_size\": 0, \"sd_size\": 0}}}}",
    ])
    func manifestVariantsAreRead(json: String) throws {
        try Self.accepts(makeZip([("manifest.json", Array(json.utf8)), ("app.bin", Self.fw), ("app.dat", Self.dat)]))
    }

    /// A key of no known kind that names files is still refused: it is an image otaflash would
    /// silently not send.
    @Test func anUnknownKeyThatNamesFilesIsStillRefused() throws {
        let json = "{\"manifest\": {\"application\": {\"bin_file\": \"app.bin\", \"dat_file\": \"app.dat\"}, \"softdevice_application\": {\"bin_file\": \"x.bin\", \"dat_file\": \"x.dat\"}}}"
        #expect {
            try DFUPackage(zip: makeZip([("manifest.json", Array(json.utf8)), ("app.bin", Self.fw), ("app.dat", Self.dat)]), source: "pkg.zip")
        } throws: { error in
            "\(error)".contains("unknown entry \"softdevice_application\"")
        }
    }

    /// A leading "./" on the archive's names, on the manifest's, or on both.
    @Test(arguments: [("./", ""), ("", "./"), ("./", "./")])
    func dotSlashPathsAreTheSameFiles(entryPrefix: String, manifestPrefix: String) throws {
        let json = "{\"manifest\": {\"application\": {\"bin_file\": \"\(manifestPrefix)app.bin\", \"dat_file\": \"\(manifestPrefix)app.dat\"}}}"
        let zip = try makeZip([(entryPrefix + "manifest.json", Array(json.utf8)), (entryPrefix + "app.bin", Self.fw), (entryPrefix + "app.dat", Self.dat)])
        try Self.accepts(zip)
        #expect(ImageFormat.detect([UInt8](zip), using: [.nordicDFUPackage]).kind == .nordicDFUPackage)
    }

    /// Entries whose CRC and sizes follow their data (flag 3), as streaming archivers write them.
    @Test(arguments: [true, false])
    func entriesWithDataDescriptorsAreRead(signature: Bool) throws {
        let json = Array("{\"manifest\": {\"application\": {\"bin_file\": \"app.bin\", \"dat_file\": \"app.dat\"}}}".utf8)
        let zip = streamedZip([("manifest.json", json), ("app.dat", Self.dat), ("app.bin", Self.fw)], descriptorSignature: signature)
        try Self.accepts(zip)
        #expect(ImageFormat.detect([UInt8](zip), using: [.nordicDFUPackage]).kind == .nordicDFUPackage)
    }
}

/// The package's content detector (`ImageFormat.Detector.nordicDFUPackage`): a zip that lists
/// manifest.json, found wherever the archive lists it, and refused by a loader that does not send it.
@Suite("Nordic package detection")
struct NordicPackageDetectionTests {
    static let manifest = Array(#"{"manifest":{"application":{"bin_file":"app.bin","dat_file":"app.dat"}}}"#.utf8)

    /// nrfutil may write manifest.json anywhere in the archive: the central directory at the end
    /// finds it even when the local headers at the start do not show it.
    @Test func aPackageIsFoundFromTheCentralDirectory() throws {
        let big = [UInt8](repeating: 0xAB, count: ImageFormat.headSize * 2)
        let zip = [UInt8](try makeZip([("app.bin", big), ("app.dat", [1]), ("manifest.json", Self.manifest)]))
        let head = Array(zip.prefix(ImageFormat.headSize)), tail = Array(zip.suffix(1024))
        let format = ImageFormat.detect(head: head, tail: tail, using: [.nordicDFUPackage])
        #expect(format.kind == .nordicDFUPackage)
        #expect(format.entries.contains("manifest.json"))
        #expect(ImageFormat.detect(head: head, tail: tail).kind == .zip)
    }

    /// nRF Connect SDK's dfu_application.zip also has manifest.json, but MCUboot images and no
    /// init packets: it is left to the SMP detector.
    @Test func aZipWithAManifestButNoInitPacketIsNotAPackage() throws {
        let zip = [UInt8](try makeZip([("manifest.json", Array(#"{"files":[]}"#.utf8)), ("app_update.bin", [1, 2])]))
        #expect(ImageFormat.detect(zip, using: [.nordicDFUPackage]).kind == .zip)
    }

    @Test func aZipWithoutAManifestIsNotAPackage() throws {
        let zip = [UInt8](try makeZip([("app.bin", [1, 2]), ("app.dat", [3])]))
        #expect(ImageFormat.detect(zip, using: [.nordicDFUPackage]).kind == .zip)
    }

    /// The module's file hint: a zip with init packets but no manifest.json is a package that lost
    /// its manifest; the core alone calls it a zip to unzip.
    @Test func aZipWithInitPacketsButNoManifestGetsTheHint() throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("otaflash-hint-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: dir) }
        let path = dir.appendingPathComponent("app_dfu_package.zip").path
        try makeZip([("app.bin", [1]), ("app.dat", [2])]).write(to: URL(fileURLWithPath: path))
        func reason(_ hints: [ImageFormat.Hint]) -> String? {
            do {
                _ = try FirmwareImage.load(path: path, detecting: [.nordicDFUPackage], hints: hints)
                return nil
            } catch {
                #expect(error.format == .zip)
                return error.reason
            }
        }
        #expect(reason([.nordicPackageWithoutManifest])
                == "is a zip archive with init packets (.dat) but no manifest.json, so not a Nordic DFU package; regenerate it with nrfutil pkg generate")
        #expect(reason([])?.hasPrefix("is a zip archive, not a firmware image; unzip it") == true)
        // A package with its manifest is the detector's, not the hint's.
        let format = ImageFormat(.zip, "a zip archive", entries: ["manifest.json", "app.bin", "app.dat"])
        #expect(ImageFormat.Hint.nordicPackageWithoutManifest.refusal(format, [], "p.zip") == nil)
    }

    /// `FirmwareImage.read` hands a package over with its bytes and the package's size limit: the
    /// package is parsed from the value, the file deleted.
    @Test func aClaimedPackageIsReadFromTheValue() throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("otaflash-claim-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: dir) }
        let path = dir.appendingPathComponent("blinky-app.zip").path
        try FileManager.default.copyItem(atPath: nordicSample("blinky-app.zip"), toPath: path)
        guard case .claimed(let claimed) = try FirmwareImage.read(path: path, detecting: [.nordicDFUPackage]) else {
            Issue.record("the package was not claimed")
            return
        }
        #expect(claimed.format.kind == .nordicDFUPackage)
        #expect(claimed.format.limit == ImageFormat.SizeLimit(bytes: DFUPackage.maximumPackageSize, what: "packages"))
        try FileManager.default.removeItem(atPath: path)
        let package = try DFUPackage(claimed)
        let fromFile = try DFUPackage.load(path: nordicSample("blinky-app.zip"))
        #expect(package.images.map(\.firmware.bytes) == fromFile.images.map(\.firmware.bytes))

    }

    @Test func theImageLoaderRefusesAPackageNamingWhereItGoes() throws {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("otaflash-detect-\(UUID().uuidString).zip").path
        defer { try? FileManager.default.removeItem(atPath: path) }
        try makeZip([("manifest.json", Self.manifest), ("app.bin", [1]), ("app.dat", [2])]).write(to: URL(fileURLWithPath: path))
        #expect {
            try FirmwareImage.load(path: path, detecting: [.nordicDFUPackage])
        } throws: { error in
            guard let error = error as? ImageError else { return false }
            return error.format == .nordicDFUPackage && error.reason.contains("Nordic Secure DFU package")
                && error.reason.contains("goes over Nordic Secure DFU") && error.reason.contains("`DFUPackage.load`")
        }
    }
}
