import Foundation
import OTAWire

/// A small record of a transfer's confirmed progress, kept per device and image so that running
/// the same command again after Ctrl-C, a crash or a power cut knows where it stood.
///
/// It is a hint, never an authority: the device's reply to BEGIN says what it really holds, the
/// engine checks that against the image, and only the device's own VERIFY lets an image activate.
public struct TransferJournal: Codable, Sendable, Hashable {
    public var device: String
    public var imageSize: Int
    public var imageCRC: String
    /// The last checkpoint the device confirmed, and the CRC of the image up to it.
    public var confirmedOffset: Int
    public var confirmedCRC: UInt32
    public var updated: Date
}

/// Where journals live: one JSON file per device and image, replaced atomically on each update.
public struct JournalStore: Sendable {
    public let directory: String

    public init(directory: String) { self.directory = directory }

    /// `$XDG_STATE_HOME/otaflash/journal`, or `~/.local/state/otaflash/journal`.
    public static var defaultDirectory: String {
        let env = ProcessInfo.processInfo.environment
        let base = env["XDG_STATE_HOME"].flatMap { $0.isEmpty ? nil : $0 }
            ?? (env["HOME"].map { $0 + "/.local/state" } ?? "/tmp")
        return base + "/otaflash/journal"
    }

    public func path(device: String, image: FirmwareImage) -> String {
        let name = device.replacingOccurrences(of: ":", with: "") + "-\(image.size)-\(hex32(image.crc32)).json"
        return directory + "/" + name
    }

    public func load(device: String, image: FirmwareImage) -> TransferJournal? {
        guard let data = FileManager.default.contents(atPath: path(device: device, image: image)),
              let journal = try? JSONDecoder.journal.decode(TransferJournal.self, from: data),
              journal.device == device, journal.imageSize == image.size, journal.imageCRC == hex32(image.crc32),
              journal.confirmedOffset > 0, journal.confirmedOffset <= image.size
        else { return nil }
        return journal
    }

    public func save(_ journal: TransferJournal, image: FirmwareImage) throws {
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        let data = try JSONEncoder.journal.encode(journal)
        try data.write(to: URL(fileURLWithPath: path(device: journal.device, image: image)), options: .atomic)
    }

    public func remove(device: String, image: FirmwareImage) {
        try? FileManager.default.removeItem(atPath: path(device: device, image: image))
    }
}

extension JSONEncoder {
    static var journal: JSONEncoder {
        let e = JSONEncoder()
        e.outputFormatting = [.prettyPrinted, .sortedKeys]
        e.dateEncodingStrategy = .iso8601
        return e
    }
}

extension JSONDecoder {
    static var journal: JSONDecoder {
        let d = JSONDecoder()
        d.dateDecodingStrategy = .iso8601
        return d
    }
}
