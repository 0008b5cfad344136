import Foundation
import OTA
internal import ZIPFoundation

/// The MCUboot images of one multi-image update, by image number: nRF Connect SDK's
/// `dfu_application.zip`, or the images given one by one (`--image N=FILE`).
///
/// nRF Connect SDK writes the zip with `manifest.json` (sdk-nrf `scripts/bootloader/generate_zip.py`):
/// a `files` array whose entries name each image's `file` and `image_index` (0: the application
/// core, 1: the network core of an nRF5340), with `size`, `version_MCUBOOT`, `load_address`,
/// `slot_index_primary`/`secondary`, `type`, `board`, `soc` besides. Numbers may be written as
/// strings ("0") or as numbers (0); both are read. Everything is checked before any radio time:
/// each named file is in the archive and is an MCUboot image that checks out, the image numbers are
/// unique and in range, and the manifest's size and version agree with the image.
public struct SMPPackage: Sendable {
    /// One image: its image number on the device and the file it came from.
    public struct Part: Sendable {
        public let imageNumber: UInt32
        public let image: MCUbootImage
        /// The file's name in the archive, or its path.
        public let file: String

        /// "application core (image 0)", "network core (image 1)", "image 2".
        public var label: String { Self.label(imageNumber) }

        static func label(_ number: UInt32) -> String {
            switch number {
            case 0: "application core (image 0)"
            case 1: "network core (image 1)"
            default: "image \(number)"
            }
        }
    }

    /// Where the images came from, for messages.
    public let source: String
    /// By image number, lowest first.
    public let parts: [Part]

    /// Image numbers taken: MCUboot's updateable images as nRF Connect SDK numbers them (0 the
    /// application, 1 the network core, 2 and 3 MCUboot's own slots or a third core).
    public static let imageNumbers: ClosedRange<UInt32> = 0...3
    static let maximumManifestSize = 64 << 10
    /// Refuse archives larger than this before reading them (four images at most).
    public static let maximumPackageSize = 4 * FirmwareImage.maximumSize

    /// The order the images are marked in (and uploaded in): every other image before the
    /// application's (image 0), which goes last. MCUboot on an nRF5340 skips the network core's
    /// update when the application core's image was marked first (sdk-nrf pull request 30274,
    /// NCSDK-34106; docs/SMP.md, "Multi-image updates").
    public var markingOrder: [Part] { parts.filter { $0.imageNumber != 0 } + parts.filter { $0.imageNumber == 0 } }

    public init(source: String, parts: [Part]) throws(MCUbootImageError) {
        guard !parts.isEmpty else { throw MCUbootImageError(.badPackage, source, "names no image; \(Self.regenerate)") }
        var seen: [UInt32: String] = [:]
        for part in parts {
            guard Self.imageNumbers.contains(part.imageNumber) else {
                throw MCUbootImageError(.badPackage, source, "\(part.file) is for image \(part.imageNumber), outside \(Self.imageNumbers.lowerBound)–\(Self.imageNumbers.upperBound) (0: the application core, 1: the network core)")
            }
            if let other = seen[part.imageNumber] {
                throw MCUbootImageError(.badPackage, source, "\(other) and \(part.file) are both for image \(part.imageNumber); give one image per image number")
            }
            seen[part.imageNumber] = part.file
        }
        self.source = source
        self.parts = parts.sorted { $0.imageNumber < $1.imageNumber }
    }

    static let regenerate = "rebuild it (west build makes dfu_application.zip with SB_CONFIG_BOOTLOADER_MCUBOOT)"

    // MARK: The zip

    /// Reads and checks `dfu_application.zip` at `path`.
    public static func load(path: String) throws(MCUbootImageError) -> SMPPackage {
        let data: Data
        do {
            let size = try FileManager.default.attributesOfItem(atPath: path)[.size] as? Int ?? 0
            guard size <= maximumPackageSize else {
                throw MCUbootImageError(.badPackage, path, "is \(size) bytes; packages over \(maximumPackageSize >> 20) MiB are not supported")
            }
            data = try Data(contentsOf: URL(fileURLWithPath: path))
        } catch let error as MCUbootImageError {
            throw error
        } catch {
            throw MCUbootImageError(.unreadable, path, FileManager.default.fileExists(atPath: path) ? "cannot be read (check its permissions)" : "does not exist")
        }
        return try SMPPackage(zip: [UInt8](data), source: path)
    }

    /// Reads and checks a `dfu_application.zip` `FirmwareImage.read` claimed
    /// (`ImageFormat.Detector.smpFiles`), from the bytes it read.
    public init(_ claimed: ClaimedImage) throws(MCUbootImageError) {
        try self.init(zip: claimed.bytes { MCUbootImageError(.badPackage, claimed.path, $0.reason) }, source: claimed.path)
    }

    /// Reads and checks a `dfu_application.zip` held in memory.
    public init(zip bytes: [UInt8], source: String = "<memory>") throws(MCUbootImageError) {
        if let problem = ZipLayout.problem(in: bytes) {
            throw MCUbootImageError(.badPackage, source, "is not a readable zip archive (\(problem)); \(Self.regenerate)")
        }
        let archive: Archive
        do {
            archive = try Archive(data: Data(bytes), accessMode: .read)
        } catch {
            throw MCUbootImageError(.badPackage, source, "is not a readable zip archive; \(Self.regenerate)")
        }
        let manifest = try Self.manifest(Self.read("manifest.json", from: archive, source: source, limit: Self.maximumManifestSize), source: source)
        var parts: [Part] = []
        for entry in manifest {
            let name = "\(source) (\(entry.file))"
            let bytes = try Self.read(entry.file, from: archive, source: source, limit: FirmwareImage.maximumSize)
            let image = try MCUbootImage(bytes: bytes, source: name)
            if let size = entry.size, size != bytes.count {
                throw MCUbootImageError(.badPackage, source, "the manifest gives \(entry.file) \(size) bytes, the archive holds \(bytes.count); \(Self.regenerate)")
            }
            if let version = entry.version, version != image.version {
                throw MCUbootImageError(.badPackage, source, "the manifest gives \(entry.file) version \(version), its MCUboot header \(image.version); \(Self.regenerate)")
            }
            parts.append(Part(imageNumber: entry.imageNumber, image: image, file: entry.file))
        }
        try self.init(source: source, parts: parts)
    }

    /// What a manifest entry says of one image.
    struct Entry {
        var file: String
        var imageNumber: UInt32
        var size: Int?
        var version: MCUbootImage.Version?
    }

    /// A JSON value as a manifest writes it: a number, a string, or something else.
    enum Value: Decodable, CustomStringConvertible {
        case number(Double)
        case text(String)
        case other

        init(from decoder: any Decoder) throws {
            let container = try decoder.singleValueContainer()
            if (try? container.decode(Bool.self)) != nil {
                self = .other
            } else if let number = try? container.decode(Double.self) {
                self = .number(number)
            } else if let text = try? container.decode(String.self) {
                self = .text(text)
            } else {
                self = .other
            }
        }

        /// A whole number, written as a number or as a string of digits ("0", "0x10000").
        var integer: Int? {
            switch self {
            case .number(let n): return n == n.rounded() ? Int(exactly: n) : nil
            case .text(let t):
                let trimmed = t.trimmingCharacters(in: .whitespaces)
                if trimmed.lowercased().hasPrefix("0x") { return Int(trimmed.dropFirst(2), radix: 16) }
                return Int(trimmed)
            case .other: return nil
            }
        }

        var description: String {
            switch self {
            case .number(let n): n == n.rounded() && abs(n) < 1e15 ? "\(Int(n))" : "\(n)"
            case .text(let t): "\"\(t)\""
            case .other: "(not a number or a string)"
            }
        }
    }

    /// manifest.json's top level: its `files`, and whether it has Secure DFU's `manifest` instead.
    struct Manifest: Decodable {
        var files: [[String: Value]]?
        var isSecureDFU: Bool

        enum Keys: String, CodingKey { case files, manifest }

        init(from decoder: any Decoder) throws {
            let container = try decoder.container(keyedBy: Keys.self)
            files = try container.decodeIfPresent([[String: Value]].self, forKey: .files)
            isSecureDFU = container.contains(.manifest)
        }
    }

    /// The manifest's `files`, each checked for the fields the update needs.
    static func manifest(_ bytes: [UInt8], source: String) throws(MCUbootImageError) -> [Entry] {
        func refuse(_ why: String) -> MCUbootImageError { MCUbootImageError(.badPackage, source, "\(why); \(regenerate)") }
        let manifest: Manifest
        do {
            manifest = try JSONDecoder().decode(Manifest.self, from: Data(bytes))
        } catch DecodingError.dataCorrupted {
            throw refuse("manifest.json is not JSON")
        } catch {
            throw refuse("manifest.json is not a JSON object with a \"files\" array of objects")
        }
        guard let files = manifest.files else {
            if manifest.isSecureDFU {
                throw MCUbootImageError(.badPackage, source, "is a Nordic Secure DFU package (its manifest.json has \"manifest\") without its init packets (.dat); regenerate it with nrfutil pkg generate")
            }
            throw refuse("manifest.json has no \"files\" array, so it is not an nRF Connect SDK DFU package")
        }
        guard !files.isEmpty else { throw refuse("manifest.json lists no files") }
        var entries: [Entry] = []
        for (index, fields) in files.enumerated() {
            guard case .text(let file)? = fields["file"], !file.isEmpty else { throw refuse("manifest.json's files[\(index)] names no \"file\"") }
            guard let raw = fields["image_index"] else { throw refuse("manifest.json gives \(file) no \"image_index\"") }
            guard let number = raw.integer, let imageNumber = UInt32(exactly: number) else {
                throw refuse("manifest.json gives \(file) image_index \(raw), not an image number")
            }
            var entry = Entry(file: file, imageNumber: imageNumber)
            if let raw = fields["size"] {
                guard let size = raw.integer, size >= 0 else { throw refuse("manifest.json gives \(file) size \(raw), not a byte count") }
                entry.size = size
            }
            if let raw = fields["version_MCUBOOT"] {
                guard case .text(let text) = raw, let version = MCUbootImage.Version(text) else {
                    throw refuse("manifest.json gives \(file) version_MCUBOOT \(raw), not an MCUboot version (1.2.3+4)")
                }
                entry.version = version
            }
            entries.append(entry)
        }
        return entries
    }

    /// An entry's bytes, checked against the archive's sizes and CRC-32, at most `limit`.
    static func read(_ name: String, from archive: Archive, source: String, limit: Int) throws(MCUbootImageError) -> [UInt8] {
        switch ZipLayout.read(name, from: archive, limit: limit) {
        case .success(let bytes):
            return bytes
        case .failure(.missing), .failure(.notAFile):
            throw MCUbootImageError(.badPackage, source, "the manifest names \(name), which the archive lacks; \(regenerate)")
        case .failure(.overLimit):
            throw MCUbootImageError(.badPackage, source, "\(name) holds more than \(limit >> 10) KiB, over the limit")
        case .failure(.unreadable(let error)):
            throw MCUbootImageError(.badPackage, source, "\(name) cannot be extracted (\(error)); the archive is damaged, \(regenerate)")
        case .failure(.sizeMismatch), .failure(.crcMismatch):
            throw MCUbootImageError(.badPackage, source, "\(name) fails the archive's size or CRC-32 check; the archive is damaged, \(regenerate)")
        }
    }

    // MARK: Images one by one

    /// The images given one by one (`--image N=FILE`, and the command's image as image 0), each
    /// read and checked.
    public static func images(_ pairs: [(number: UInt32, path: String)], source: String) throws(MCUbootImageError) -> SMPPackage {
        try images(adding: pairs, to: [], source: source)
    }

    /// The images given one by one after `parts`, which were read already.
    static func images(adding pairs: [(number: UInt32, path: String)], to parts: [Part], source: String) throws(MCUbootImageError) -> SMPPackage {
        var parts = parts
        for (number, path) in pairs {
            parts.append(Part(imageNumber: number, image: try MCUbootImage.load(path: path), file: path))
        }
        return try SMPPackage(source: source, parts: parts)
    }

    /// Parses one `--image` value, `N=FILE`.
    public static func imageArgument(_ text: String) -> (number: UInt32, path: String)? {
        guard let equals = text.firstIndex(of: "="), let number = UInt32(text[..<equals]) else { return nil }
        let path = String(text[text.index(after: equals)...])
        return path.isEmpty ? nil : (number, path)
    }
}

extension MCUbootImageError.Code {
    /// A multi-image package (or a list of images) that does not check out.
    public static let badPackage = Self("bad-package")
}

extension ImageFormat.Detector {
    /// What `flash` sends over SMP: an MCUboot image (`.mcuboot`), or nRF Connect SDK's
    /// `dfu_application.zip` (a zip with `manifest.json` and no init packets, which a Nordic
    /// Secure DFU package has), reported as the same kind so that SMP's loader reads both.
    public static let smpFiles = ImageFormat.Detector(kind: .mcuboot, inIntelHex: true, detect: { head, tail in
        if let image = mcuboot.detect(head, tail) { return image }
        guard starts(head, [0x50, 0x4B, 0x03, 0x04]) || starts(head, [0x50, 0x4B, 0x05, 0x06]) else { return nil }
        let names = ImageFormat.zipEntryNames(head: head, tail: tail)
        guard names.contains(where: { ZipLayout.samePath($0, "manifest.json") }),
              !names.contains(where: { $0.lowercased().hasSuffix(".dat") }) else { return nil }
        return ImageFormat(.mcuboot, "an nRF Connect SDK DFU package (dfu_application.zip: MCUboot images and manifest.json)", entries: names,
                           limit: ImageFormat.SizeLimit(bytes: SMPPackage.maximumPackageSize, what: "packages"))
    }, refusal: mcuboot.refusal)
}
