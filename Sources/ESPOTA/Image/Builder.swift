import Crypto
import OTAWire

extension ESPAppImage {
    /// Writes an app image to ESP-IDF's layout, for the simulated device's running image, the
    /// soak and tests: a DROM segment that starts with an `esp_app_desc_t` (`version`, `project`)
    /// followed by `body`, a small IRAM segment, the checksum and, with `hashAppended`, the SHA-256.
    /// scripts/make-esp32-sample writes the committed sample the same way, and esptool's
    /// `image-info` reads it.
    public static func build(chip: ESPChip = .esp32, version: String = "1.0.0", project: String = "otaflash-sample",
                             body: [UInt8], hashAppended: Bool = true) -> [UInt8] {
        var description: [UInt8] = []
        description.appendLE(appDescriptionMagic)
        description.appendLE(UInt32(0))  // secure_version
        description += [UInt8](repeating: 0, count: 8)
        func field(_ text: String, _ size: Int) -> [UInt8] {
            Array(Array(text.utf8).prefix(size - 1)) + [UInt8](repeating: 0, count: size - min(text.utf8.count, size - 1))
        }
        description += field(version, 32) + field(project, 32) + field("00:00:00", 16) + field("Jan  1 2026", 16) + field("v5.3", 32)
        description += [UInt8](repeating: 0, count: 256 - description.count)  // app_elf_sha256, reserved
        func padded(_ data: [UInt8]) -> [UInt8] { data + [UInt8](repeating: 0, count: (4 - data.count % 4) % 4) }
        let segments: [(UInt32, [UInt8])] = [
            (0x3F40_0020, padded(description + body)),
            (0x4008_0000, padded(Array("otaflash \(project) \(version) iram".utf8))),
        ]
        var out: [UInt8] = [magic, UInt8(segments.count), 0x02, 0x20]
        out.appendLE(UInt32(0x4008_0000))  // entry
        out += [0xEE, 0, 0, 0]  // wp_pin disabled, spi_pin_drv
        out.appendLE(chip.rawValue)
        out.append(0)  // min_chip_rev
        out.appendLE(UInt16(0))  // min_chip_rev_full
        out.appendLE(UInt16(0xFFFF))  // max_chip_rev_full
        out += [0, 0, 0, 0]
        out.append(hashAppended ? 1 : 0)
        var checksum: UInt8 = 0xEF
        for (load, data) in segments {
            out.appendLE(load)
            out.appendLE(UInt32(data.count))
            out += data
            for b in data { checksum ^= b }
        }
        out += [UInt8](repeating: 0, count: 15 - out.count % 16)
        out.append(checksum)
        if hashAppended { out += Array(SHA256.hash(data: out)) }
        return out
    }
}
