import Crypto
import Foundation
import OTA
internal import ZIPFoundation

/// A Secure DFU package as `nrfutil pkg generate` writes it: a zip with `manifest.json` and, per
/// image, a firmware `.bin` and an init packet `.dat`.
///
/// Reading checks everything that can be checked before any radio time (docs/NORDIC-DFU.md,
/// "Packages"): the manifest's entries and files, each init packet's type against its manifest
/// key, the sizes it announces against the `.bin`, and its SHA-256 (stored byte-reversed) against
/// the `.bin`. Unsigned and debug packages are accepted with a warning; the legacy format of
/// SDK 11 and older is refused. Images come in the order nrfutil sends them.
public struct DFUPackage: Sendable {
    /// A manifest key: which part of the device's flash an image replaces.
    public struct Kind: RawRepresentable, Hashable, Sendable, CustomStringConvertible, CaseIterable {
        public let rawValue: String
        public init(rawValue: String) { self.rawValue = rawValue }

        public static let softDeviceBootloader = Kind(rawValue: "softdevice_bootloader")
        public static let softDevice = Kind(rawValue: "softdevice")
        public static let bootloader = Kind(rawValue: "bootloader")
        public static let application = Kind(rawValue: "application")

        /// nrfutil's sending order (`dfu.py`, `dfu_send_images`).
        public static var allCases: [Kind] { [.softDeviceBootloader, .softDevice, .bootloader, .application] }

        public var description: String { rawValue }

        /// The init packet types this manifest key may carry.
        var firmwareTypes: [DFUFirmwareType] {
            switch self {
            case .softDeviceBootloader: [.softDeviceBootloader]
            case .softDevice: [.softDevice]
            case .bootloader: [.bootloader]
            default: [.application, .externalApplication]
            }
        }
    }

    /// One image: the init packet to send as the command object and the firmware for the data objects.
    public struct Image: Sendable {
        public let kind: Kind
        public let initPacket: DFUInitPacket
        public let firmware: FirmwareImage
        public let binFile: String
        public let datFile: String
    }

    /// Where the package came from, for messages.
    public let source: String
    /// In sending order: SoftDevice+bootloader, SoftDevice, bootloader, application.
    public let images: [Image]
    /// One line each: unsigned or debug init packets.
    public let warnings: [String]

    /// Refuse package files larger than this before reading them.
    public static let maximumPackageSize = 3 * FirmwareImage.maximumSize
    static let maximumManifestSize = 64 << 10
    /// Signed init packets are about 140 bytes; bootloaders accept a few hundred.
    public static let maximumInitPacketSize = 4096

    /// True when the bytes start like a zip archive (`PK\3\4`): what `--protocol auto` looks at.
    public static func looksLikePackage(_ prefix: some Collection<UInt8>) -> Bool {
        Array(prefix.prefix(4)) == [0x50, 0x4B, 0x03, 0x04]
    }

    /// Reads and checks a package file.
    public static func load(path: String) throws(DFUPackageError) -> DFUPackage {
        var isDirectory: ObjCBool = false
        guard FileManager.default.fileExists(atPath: path, isDirectory: &isDirectory) else {
            throw DFUPackageError(.unreadable, path, "no such file")
        }
        guard !isDirectory.boolValue else { throw DFUPackageError(.unreadable, path, "is a directory, not a DFU package") }
        let size = (try? FileManager.default.attributesOfItem(atPath: path)[.size] as? Int) ?? 0
        guard size <= maximumPackageSize else {
            throw DFUPackageError(.tooLarge, path, "is \(size) bytes; packages over \(maximumPackageSize >> 20) MiB are not supported")
        }
        guard let data = FileManager.default.contents(atPath: path) else {
            throw DFUPackageError(.unreadable, path, "cannot be read (check its permissions)")
        }
        return try DFUPackage(zip: data, source: path)
    }

    /// Reads and checks a package `FirmwareImage.read` claimed (`ImageFormat.Detector.nordicDFUPackage`),
    /// from the bytes it read.
    public init(_ claimed: ClaimedImage) throws(DFUPackageError) {
        try self.init(zip: Data(claimed.bytes { DFUPackageError(.tooLarge, claimed.path, $0.reason) }), source: claimed.path)
    }

    /// Reads and checks a package held in memory.
    public init(zip data: Data, source: String = "<memory>") throws(DFUPackageError) {
        self.source = source
        guard data.count <= Self.maximumPackageSize else {
            throw DFUPackageError(.tooLarge, source, "is \(data.count) bytes; packages over \(Self.maximumPackageSize >> 20) MiB are not supported")
        }
        if let problem = ZipLayout.problem(in: [UInt8](data)) {
            throw DFUPackageError(.corruptArchive, source, "is not a readable zip archive (\(problem)); regenerate it with nrfutil pkg generate")
        }
        let archive: Archive
        do {
            archive = try Archive(data: data, accessMode: .read)
        } catch {
            throw DFUPackageError(.corruptArchive, source, "is not a readable zip archive; regenerate it with nrfutil pkg generate")
        }
        func read(_ name: String, limit: Int) throws(DFUPackageError) -> [UInt8] {
            switch ZipLayout.read(name, from: archive, limit: limit) {
            case .success(let bytes):
                return bytes
            case .failure(.missing):
                throw DFUPackageError(.missingFile, source, "the manifest names \(name), which the archive lacks; regenerate the package with nrfutil pkg generate")
            case .failure(.notAFile):
                throw DFUPackageError(.missingFile, source, "\(name) is not a file in the archive")
            case .failure(.overLimit(let declared?)):
                throw DFUPackageError(.tooLarge, source, "\(name) is \(declared) bytes, over the limit of \(limit)")
            case .failure(.overLimit(nil)):
                throw DFUPackageError(.tooLarge, source, "\(name) inflates past the limit of \(limit) bytes")
            case .failure(.unreadable(let error)):
                throw DFUPackageError(.corruptArchive, source, "\(name) cannot be extracted (\(error)); the archive is damaged, regenerate or download it again")
            case .failure(.sizeMismatch(let read, let header)):
                throw DFUPackageError(.corruptArchive, source, "\(name) holds \(read) bytes, its header says \(header); the archive is damaged")
            case .failure(.crcMismatch(let read, let header)):
                throw DFUPackageError(.corruptArchive, source, "\(name) fails the archive's CRC-32 check (0x\(hex2(read)), the archive says 0x\(hex2(header))); the archive is damaged, download or regenerate it")
            }
        }

        let manifest = try Self.parseManifest(read("manifest.json", limit: Self.maximumManifestSize), source: source)
        var images: [Image] = []
        var warnings: [String] = []
        for (kind, entry) in manifest {
            let file = "\(source) (\(kind.rawValue))"
            let datBytes = try read(entry.dat, limit: Self.maximumInitPacketSize)
            let initPacket: DFUInitPacket
            do {
                initPacket = try DFUInitPacket(decoding: datBytes)
            } catch {
                if datBytes.count == 14 {
                    throw DFUPackageError(.legacyFormat, source, "\(entry.dat) is a legacy (SDK 11 or older) init packet; this bootloader format is not supported, generate a Secure DFU package with nrfutil 6 (nrfutil pkg generate)")
                }
                throw DFUPackageError(.badInitPacket, source, "\(entry.dat) is not a Secure DFU init packet: \(error); regenerate the package with nrfutil pkg generate")
            }
            let bin = try read(entry.bin, limit: FirmwareImage.maximumSize)
            try Self.check(initPacket.command, kind: kind, bin: bin, binName: entry.bin, datName: entry.dat, source: file)
            if !initPacket.isSigned {
                warnings.append("\(source): \(entry.dat) is unsigned; a secure bootloader refuses it (extended error 0x08), only an open bootloader takes it")
            }
            if initPacket.command.isDebug {
                warnings.append("\(source): \(entry.dat) is a debug init packet; only a debug bootloader takes it, and it skips the version checks")
            }
            images.append(Image(kind: kind, initPacket: initPacket, firmware: FirmwareImage(bytes: bin, source: "\(source):\(entry.bin)"),
                                binFile: entry.bin, datFile: entry.dat))
        }
        self.images = images
        self.warnings = warnings
    }


    private struct ManifestEntry {
        let bin: String
        let dat: String
    }

    /// The manifest's images in sending order.
    private static func parseManifest(_ bytes: [UInt8], source: String) throws(DFUPackageError) -> [(Kind, ManifestEntry)] {
        guard let json = try? JSONSerialization.jsonObject(with: Data(bytes)), let top = json as? [String: Any],
              let manifest = top["manifest"] as? [String: Any] else {
            throw DFUPackageError(.badManifest, source, "manifest.json is not a JSON object with a \"manifest\" key; regenerate the package with nrfutil pkg generate")
        }
        let legacy = manifest["dfu_version"] != nil || top["dfu_version"] != nil
            || manifest.values.contains { ($0 as? [String: Any])?["init_packet_data"] != nil }
        if legacy {
            let version = (manifest["dfu_version"] ?? top["dfu_version"]).map { " (dfu_version \($0))" } ?? ""
            throw DFUPackageError(.legacyFormat, source, "is a legacy DFU package\(version) for SDK 11 or older bootloaders, which otaflash does not support; generate a Secure DFU package with nrfutil 6 (nrfutil pkg generate)")
        }
        // A key of no known kind is refused when it names files: an image otaflash would not send.
        // Other keys (metadata a generator adds) are ignored, as Nordic's Android and iOS DFU
        // libraries ignore them.
        let known = Set(Kind.allCases.map(\.rawValue))
        func namesFiles(_ value: Any?) -> Bool {
            guard let entry = value as? [String: Any] else { return false }
            return entry["bin_file"] != nil || entry["dat_file"] != nil
        }
        if let unknown = manifest.keys.sorted().first(where: { !known.contains($0) && namesFiles(manifest[$0]) }) {
            throw DFUPackageError(.badManifest, source, "manifest.json has an unknown entry \"\(unknown)\" (known: \(Kind.allCases.map(\.rawValue).joined(separator: ", ")))")
        }
        var out: [(Kind, ManifestEntry)] = []
        for kind in Kind.allCases {
            guard let value = manifest[kind.rawValue] else { continue }
            guard let entry = value as? [String: Any], let bin = entry["bin_file"] as? String, let dat = entry["dat_file"] as? String else {
                throw DFUPackageError(.badManifest, source, "manifest.json's \"\(kind.rawValue)\" entry lacks bin_file or dat_file")
            }
            out.append((kind, ManifestEntry(bin: bin, dat: dat)))
        }
        guard !out.isEmpty else {
            throw DFUPackageError(.badManifest, source, "manifest.json lists no image (application, bootloader, softdevice or softdevice_bootloader)")
        }
        if manifest[Kind.softDeviceBootloader.rawValue] != nil,
           manifest[Kind.softDevice.rawValue] != nil || manifest[Kind.bootloader.rawValue] != nil {
            throw DFUPackageError(.badManifest, source, "manifest.json has softdevice_bootloader together with softdevice or bootloader; nrfutil never writes that, regenerate the package")
        }
        return out
    }

    /// The init command's type, sizes and hash against the manifest key and the `.bin`.
    private static func check(_ c: DFUInitCommand, kind: Kind, bin: [UInt8], binName: String, datName: String, source: String) throws(DFUPackageError) {
        guard let type = c.type, kind.firmwareTypes.contains(type) else {
            throw DFUPackageError(.typeMismatch, source, "\(datName) announces \(c.type.map(\.description) ?? "no type") but the manifest lists it as \(kind); regenerate the package with nrfutil pkg generate")
        }
        guard !bin.isEmpty else { throw DFUPackageError(.sizeMismatch, source, "\(binName) is empty") }
        let n = UInt64(bin.count)
        let sd = UInt64(c.softDeviceSize ?? 0), bl = UInt64(c.bootloaderSize ?? 0), app = UInt64(c.applicationSize ?? 0)
        let (announced, field): (UInt64, String) = switch type {
        case .softDevice: (sd, "sd_size")
        case .bootloader: (bl, "bl_size")
        case .softDeviceBootloader: (sd + bl, "sd_size + bl_size")
        default: (app, "app_size")
        }
        guard announced == n else {
            throw DFUPackageError(.sizeMismatch, source, "\(datName) announces \(field) = \(announced) bytes but \(binName) is \(n) bytes; the .bin is truncated or belongs to another package")
        }
        if type == .softDeviceBootloader, sd == 0 || bl == 0 {
            throw DFUPackageError(.sizeMismatch, source, "\(datName) is a SoftDevice+bootloader image with sd_size \(sd) and bl_size \(bl); both must be non-zero")
        }
        guard c.hashType == .sha256, let stored = c.hash, stored.count == 32 else {
            throw DFUPackageError(.badInitPacket, source, "\(datName) carries no SHA-256 hash of the firmware (hash type \(c.hashType?.rawValue ?? 0)); regenerate the package with nrfutil pkg generate")
        }
        let digest = Array(SHA256.hash(data: bin))
        guard Array(stored.reversed()) == digest else {
            throw DFUPackageError(.hashMismatch, source, "\(binName)'s SHA-256 does not match the hash in \(datName); the .bin is corrupt or was swapped, regenerate or download the package again")
        }
    }

    /// What the device is known to be (`flash --hw-version`, `--sd-req`): checked against the
    /// package before any radio time, as the bootloader would check it after the init packet
    /// went over the air (`nrf_dfu_validation_prevalidate`).
    public struct Expectations: Sendable, Hashable {
        /// The device's hardware version (`--hw-version` when the package was made).
        public var hardwareVersion: UInt32?
        /// The FWIDs of the SoftDevices the device may run now: the first image must accept each.
        public var softDevices: [UInt32]
        public init(hardwareVersion: UInt32? = nil, softDevices: [UInt32] = []) {
            self.hardwareVersion = hardwareVersion
            self.softDevices = softDevices
        }

        public var isEmpty: Bool { hardwareVersion == nil && softDevices.isEmpty }
    }

    /// Checks the hardware version of every image, and the SoftDevice requirement of the first
    /// (later images run on the SoftDevice the first one installs). 0xFFFE in `sd_req` accepts
    /// any SoftDevice, as the bootloader's check does.
    ///
    /// - Throws: `DFUPackageError` `.incompatible`: one line naming the package's value, the
    ///   device's, and how to regenerate the package.
    public func check(_ expected: Expectations) throws(DFUPackageError) {
        for (i, image) in images.enumerated() {
            let c = image.initPacket.command
            if let hw = expected.hardwareVersion, c.hardwareVersion != hw {
                let what = c.hardwareVersion.map { "is for hardware version \($0)" } ?? "names no hardware version"
                throw DFUPackageError(.incompatible, source, "\(image.datFile) \(what) but the device is hardware version \(hw); the bootloader would refuse it (extended error 0x06): regenerate the package with nrfutil pkg generate --hw-version \(hw), or check the device's hardware version")
            }
            let required = c.softDeviceRequirements
            if i == 0, !required.contains(Self.anySoftDevice),
               let sd = expected.softDevices.first(where: { !required.contains($0) }) {
                let listed = required.isEmpty ? "none" : required.map(Self.fwid).joined(separator: ", ")
                let wanted = (required + expected.softDevices.filter { !required.contains($0) }).map(Self.fwid).joined(separator: ",")
                throw DFUPackageError(.incompatible, source, "\(image.datFile) accepts SoftDevice \(listed) but the device may run \(Self.fwid(sd)); the bootloader would refuse it (extended error 0x07): regenerate the package with nrfutil pkg generate --sd-req \(wanted), or update the device's SoftDevice first")
            }
        }
    }

    /// The `sd_req` value that accepts any SoftDevice.
    public static let anySoftDevice: UInt32 = 0xFFFE

    /// A SoftDevice FWID as nrfutil prints it: 0xAF, 0x101.
    public static func fwid(_ value: UInt32) -> String { "0x" + hex2(value) }
}

/// A package that cannot be used: why, and the file and step to take in one line.
public typealias DFUPackageError = ImageFileError

extension ImageFileError.Code {
    /// The package file, or a file in it, is over its size limit.
    public static let tooLarge = Self("too-large")
    public static let corruptArchive = Self("corrupt-archive")
    public static let badManifest = Self("bad-manifest")
    public static let missingFile = Self("missing-file")
    public static let legacyFormat = Self("legacy-format")
    public static let badInitPacket = Self("bad-init-packet")
    public static let typeMismatch = Self("type-mismatch")
    public static let sizeMismatch = Self("size-mismatch")
    /// The package does not fit the device's stated hardware or SoftDevice (exit code 7).
    public static let incompatible = Self("incompatible", failure: .incompatibleDevice)
}
