import Crypto
import Foundation
import OTAWire

/// An ESP-IDF partition table, read as ESP-IDF's `gen_esp32part.py` reads it: the CSV of the
/// build (`partitions.csv`: name, type, subtype, offset, size, flags; `#` comments; numbers in
/// decimal, 0x hex or with a K or M suffix; an empty offset follows the previous partition, an app
/// partition aligned to 64 KiB) or the binary it writes (`build/partition_table/partition-table.bin`,
/// flashed at 0x8000: 32-byte entries `AA 50`, type, subtype, offset, size (LE u32), a 16-byte
/// name, flags; then `EB EB` and the MD5 of the entries; then 0xFF).
///
/// What otaflash needs of it is the OTA app partitions (type app, subtypes ota_0…ota_15: 0x10…0x1F):
/// `esp_ota_get_next_update_partition` writes the one after the running one, so an image must fit
/// each of them.
public struct ESPPartitionTable: Sendable, Hashable {
    public struct Partition: Sendable, Hashable {
        public var name: String
        public var type: UInt8
        public var subtype: UInt8
        public var offset: Int
        public var size: Int

        /// ota_0…ota_15.
        public var isOTAApp: Bool { type == ESPPartitionTable.appType && (0x10...0x1F).contains(subtype) }
    }

    public static let appType: UInt8 = 0x00
    public static let dataType: UInt8 = 0x01
    /// The table sits at 0x8000 and takes a 4 KiB sector: the first partition starts after it.
    static let tableEnd = 0x8000 + 0x1000
    /// The binary table's largest size (`MAX_PARTITION_LENGTH`).
    static let maximumBinarySize = 0xC00

    public let partitions: [Partition]
    public let source: String

    /// The OTA app partitions, in the table's order.
    public var otaApps: [Partition] { partitions.filter(\.isOTAApp) }

    /// The largest image every OTA app partition holds (the smallest of them), and which that is;
    /// nil: the table has none, and a device built with it takes no OTA update.
    public var updatePartition: Partition? { otaApps.min { $0.size < $1.size } }

    /// Why a partition table file cannot be used.
    public struct Error: Swift.Error, Sendable, Hashable, CustomStringConvertible {
        public var description: String
        init(_ description: String) { self.description = description }
    }

    /// Reads the file at `path`: binary when it starts with an entry's magic `AA 50`, CSV otherwise.
    public static func load(path: String) throws(Error) -> ESPPartitionTable {
        // A regular file only: opening a FIFO would wait for a writer.
        let type = (try? FileManager.default.attributesOfItem(atPath: path))?[.type] as? FileAttributeType
        guard type == .typeRegular, let handle = FileHandle(forReadingAtPath: path) else {
            throw Error("\(path): cannot be read (no such file, not a regular file, or no permission)")
        }
        defer { try? handle.close() }
        // A partition table is a few hundred bytes; anything much larger is another file.
        let data = (try? handle.read(upToCount: 64 << 10)) ?? Data()
        return try parse(Array(data), source: path)
    }

    public static func parse(_ bytes: [UInt8], source: String) throws(Error) -> ESPPartitionTable {
        if bytes.starts(with: [0xAA, 0x50]) { return try binary(bytes, source: source) }
        guard bytes.count < 64 << 10, let text = String(bytes: bytes, encoding: .utf8), !text.contains("\0") else {
            throw Error("\(source) is neither a partition table CSV nor the binary table (it starts with \(hexDump(bytes.prefix(4)))): pass the build's partitions.csv or build/partition_table/partition-table.bin")
        }
        return try csv(text, source: source)
    }

    /// The binary table (`PartitionTable.from_binary`).
    static func binary(_ bytes: [UInt8], source: String) throws(Error) -> ESPPartitionTable {
        var partitions: [Partition] = []
        var md5 = Insecure.MD5()
        var at = 0
        while true {
            guard at + 32 <= bytes.count, at < maximumBinarySize else {
                throw Error("\(source): the binary partition table has no end marker (32 bytes of 0xFF) within \(min(bytes.count, maximumBinarySize)) bytes: pass the build's partition-table.bin whole")
            }
            let entry = Array(bytes[at..<(at + 32)])
            at += 32
            if entry.allSatisfy({ $0 == 0xFF }) { break }
            if entry[0] == 0xEB, entry[1] == 0xEB {
                guard entry[16...].elementsEqual(md5.finalize()) else {
                    throw Error("\(source): the MD5 of the binary partition table does not match its entries: the file is damaged, build it again")
                }
                md5 = Insecure.MD5()
                continue
            }
            guard entry[0] == 0xAA, entry[1] == 0x50 else {
                throw Error("\(source): entry \(partitions.count + 1) of the binary partition table does not start with AA 50: the file is damaged, build it again")
            }
            md5.update(data: entry)
            func le32(_ i: Int) -> Int { Int(entry[i]) | Int(entry[i + 1]) << 8 | Int(entry[i + 2]) << 16 | Int(entry[i + 3]) << 24 }
            let name = String(decoding: entry[12..<28].prefix { $0 != 0 }, as: UTF8.self)
            partitions.append(Partition(name: name, type: entry[2], subtype: entry[3], offset: le32(4), size: le32(8)))
        }
        return ESPPartitionTable(partitions: partitions, source: source)
    }

    /// The CSV (`PartitionTable.from_csv`), with its offsets filled in and negative sizes (an end
    /// address) made sizes.
    static func csv(_ text: String, source: String) throws(Error) -> ESPPartitionTable {
        var partitions: [Partition] = []
        var lastEnd = tableEnd
        for (index, raw) in text.split(omittingEmptySubsequences: false, whereSeparator: \.isNewline).enumerated() {
            let line = raw.trimmingCharacters(in: .whitespaces)
            if line.isEmpty || line.hasPrefix("#") { continue }
            func fail(_ what: String) -> Error { Error("\(source), line \(index + 1): \(what) (`\(line)`)") }
            let fields = (line + ",,,,").split(separator: ",", omittingEmptySubsequences: false).map { $0.trimmingCharacters(in: .whitespaces) }
            let name = fields[0]
            guard let type = typeValue(fields[1]) else {
                throw fail("the type '\(fields[1])' is not app, data or a number")
            }
            guard let subtype = subtypeValue(fields[2], type: type) else {
                throw fail("the subtype '\(fields[2])' is none ESP-IDF knows for this type")
            }
            guard let size = number(fields[4]) else {
                throw fail(fields[4].isEmpty ? "the size is empty" : "the size '\(fields[4])' is not a number (decimal, 0x hex, or with K or M)")
            }
            var offset: Int
            if fields[3].isEmpty {
                let align = type == appType ? 0x10000 : 4
                offset = (lastEnd + align - 1) / align * align
            } else {
                guard let given = number(fields[3]) else { throw fail("the offset '\(fields[3])' is not a number") }
                offset = given
            }
            let length = size < 0 ? -size - offset : size
            guard length > 0 else { throw fail("the partition has no room") }
            partitions.append(Partition(name: name, type: type, subtype: subtype, offset: offset, size: length))
            lastEnd = offset + length
        }
        guard !partitions.isEmpty else { throw Error("\(source) lists no partition: pass the build's partitions.csv") }
        return ESPPartitionTable(partitions: partitions, source: source)
    }

    static func typeValue(_ text: String) -> UInt8? {
        switch text.lowercased() {
        case "app": appType
        case "data": dataType
        default: number(text).flatMap { UInt8(exactly: $0) }
        }
    }

    static func subtypeValue(_ text: String, type: UInt8) -> UInt8? {
        let key = text.lowercased()
        if type == appType {
            if key == "factory" { return 0x00 }
            if key == "test" { return 0x20 }
            if key.hasPrefix("ota_"), let n = Int(key.dropFirst(4)), (0...15).contains(n) { return UInt8(0x10 + n) }
        } else if type == dataType {
            let names: [String: UInt8] = ["ota": 0x00, "phy": 0x01, "nvs": 0x02, "coredump": 0x03, "nvs_keys": 0x04, "efuse": 0x05,
                                          "undefined": 0x06, "esphttpd": 0x80, "fat": 0x81, "spiffs": 0x82, "littlefs": 0x83]
            if key.isEmpty { return 0x06 }
            if let value = names[key] { return value }
        }
        return number(text).flatMap { UInt8(exactly: $0) }
    }

    /// `parse_int`: decimal, 0x hex, with a K (1024) or M (1024 × 1024) suffix; a leading minus sign.
    public static func number(_ text: String) -> Int? {
        var t = text.trimmingCharacters(in: .whitespaces).lowercased()
        guard !t.isEmpty else { return nil }
        var negative = false
        if t.hasPrefix("-") {
            negative = true
            t.removeFirst()
        }
        var multiplier = 1
        if t.hasSuffix("k") {
            multiplier = 1024
            t.removeLast()
        } else if t.hasSuffix("m") {
            multiplier = 1024 * 1024
            t.removeLast()
        }
        let value = t.hasPrefix("0x") ? Int(t.dropFirst(2), radix: 16) : Int(t)
        guard let value, value <= Int(UInt32.max) else { return nil }
        return (negative ? -1 : 1) * value * multiplier
    }
}

/// The largest app image a device takes, as far as otaflash knows before any radio time: its OTA
/// partition (Espressif's BLE OTA cannot report it; `--esp-partition-size` or the build's partition
/// table gives it), else a ceiling.
public struct ESPPartitionLimit: Sendable, Hashable {
    /// The partition's size in bytes.
    public var size: Int
    /// The partition, as a phrase: "the OTA partition --esp-partition-size gives".
    public var what: String

    public init(size: Int, what: String) {
        self.size = size
        self.what = what
    }

    /// Without a partition size, larger images are refused: no ESP-IDF layout otaflash knows gives
    /// an app partition more than 4 MiB unless the build asks for it, and sending 10 MiB into a
    /// 1 MiB partition takes minutes before the device refuses it.
    public static let ceiling = 4 << 20
    /// ESP-IDF's two-OTA layout (`partitions_two_ota.csv`) gives ota_0 and ota_1 1 MiB each: an
    /// image larger than that gets a warning when the partition is not known.
    public static let commonSize = 1 << 20

    /// The OTA partition the device writes next, from its build's partition table: the smallest of
    /// its OTA app partitions, as otaflash cannot tell which of them the device runs from.
    public init(table: ESPPartitionTable) throws(ESPPartitionTable.Error) {
        let apps = table.otaApps
        guard let smallest = table.updatePartition else {
            throw ESPPartitionTable.Error("\(table.source) has no OTA app partition (ota_0, ota_1, …): a device built with it cannot take an update over the air; pass the table of a build with OTA partitions (e.g. ESP-IDF's partitions_two_ota.csv)")
        }
        let names = apps.map(\.name).joined(separator: ", ")
        let which = apps.count == 1 ? "its OTA partition \(smallest.name)" : apps.allSatisfy({ $0.size == smallest.size })
            ? "its OTA partitions (\(names))" : "its smallest OTA partition, \(smallest.name) (of \(names))"
        self.init(size: smallest.size, what: "\(which) in \(table.source)")
    }

    /// Refuses an app image of `appSize` bytes (in a file of `fileSize`, `source`) that `limit`
    /// does not hold, or, with no limit known, one over `ceiling`; the warnings for one that may
    /// not fit.
    public static func check(appSize: Int, source: String, limit: ESPPartitionLimit?) throws(ESPImageError) -> [String] {
        if let limit {
            guard appSize <= limit.size else {
                throw ESPImageError(.imageTooLarge, "\(source) holds a \(appSize)-byte app image, more than \(limit.what) (\(limit.size) bytes): the device would take every byte and then refuse it (esp_ota_write past the partition's end); shrink the app, or give the OTA partitions more room in partitions.csv")
            }
            return []
        }
        guard appSize <= ceiling else {
            throw ESPImageError(.imageTooLarge, "\(source) holds a \(appSize)-byte app image, more than \(ceiling >> 20) MiB, which no OTA partition holds unless its build asks for it, and the device cannot say its partition size; give it (--esp-partition-size, or the build's partition table with --partition-table) to send it")
        }
        guard appSize <= commonSize else {
            return ["\(source) holds a \(appSize)-byte app image, more than the 1 MiB OTA partitions of ESP-IDF's two-OTA layout; the device cannot say its partition size, and one too small takes every byte and then does not restart: give --esp-partition-size or --partition-table to check it before sending"]
        }
        return []
    }
}
