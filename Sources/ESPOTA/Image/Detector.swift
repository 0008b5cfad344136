import OTA

extension ImageFormat.Kind {
    /// An ESP-IDF app image: magic 0xE9 and a plausible header (ESP-IDF "App Image Format"), or
    /// a merged flash image holding one; flashed over Espressif's BLE OTA.
    public static let espAppImage = ImageFormat.Kind("esp-app-image")
}

extension ImageFormat.Detector {
    /// An ESP-IDF app image (magic 0xE9, 1 to 16 segments, a chip id ESP-IDF uses, `hash_appended`
    /// 0 or 1, a first segment shorter than 16 MiB), or a merged flash image with a bootloader
    /// image at 0x0 or 0x1000 and a partition table at 0x8000.
    public static let espAppImage = ImageFormat.Detector(kind: .espAppImage, detect: { head, _ in
        if head.count > 0x8002, head[0x8000] == 0xAA, head[0x8001] == 0x50,
           head[0] == 0xE9 || (head[0x1000] == 0xE9 && head[0..<0x1000].allSatisfy { $0 == 0xFF || $0 == 0 }) {
            return ImageFormat(.espAppImage, "an ESP32 merged flash image (bootloader, partition table and app)")
        }
        func le(_ at: Int, _ count: Int) -> Int { (0..<count).reduce(0) { $0 | Int(head[at + $1]) << (8 * $1) } }
        guard head.count >= 32, head[0] == 0xE9, (1...16).contains(head[1]), le(12, 2) < 0x100, head[23] <= 1,
              le(28, 4) < 16 << 20 else { return nil }
        return ImageFormat(.espAppImage, "an ESP-IDF app image (magic 0xE9)")
    }, refusal: { format, _ in
        "is \(format.description), sent over Espressif's BLE OTA (`--protocol esp-ota` or `auto`)"
    })
}
