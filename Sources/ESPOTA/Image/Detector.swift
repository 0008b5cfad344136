import OTA

extension ImageFormat.Kind {
    /// A file for Espressif's BLE OTA: an ESP-IDF app image (magic 0xE9), a pre-encrypted one
    /// (`esp_encrypted_img`, magic 0x0788b6cf), or a merged flash image holding one.
    public static let espAppImage = ImageFormat.Kind("esp-app-image")
}

extension ImageFormat.Detector {
    /// Every file that starts with the app image magic 0xE9, whether its header checks out (1 to
    /// 16 segments, a chip id ESP-IDF uses…) or not: a damaged app image is refused as one, naming
    /// the damage, rather than sent as a raw binary; a pre-encrypted image (magic 0x0788b6cf); a
    /// merged flash image with a bootloader image at 0x0 or 0x1000 and a partition table at 0x8000.
    public static let espAppImage = ImageFormat.Detector(kind: .espAppImage, detect: { head, _ in
        if head.count > 0x8002, ESPAppImage.isMergedFlashImage(head) {
            return ImageFormat(.espAppImage, "an ESP32 merged flash image (bootloader, partition table and app)")
        }
        if ESPEncryptedImage.isEncrypted(head) {
            return ImageFormat(.espAppImage, "a pre-encrypted ESP-IDF app image (esp_encrypted_img, magic 0x0788b6cf)")
        }
        guard head.first == ESPAppImage.magic else { return nil }
        guard head.count >= ESPAppImage.headerSize else {
            return ImageFormat(.espAppImage, "a file that starts with the ESP-IDF image magic 0xE9 but is shorter than its header")
        }
        if let damage = ESPAppImage.Header(head).damage {
            return ImageFormat(.espAppImage, "a damaged ESP-IDF app image (\(damage))")
        }
        return ImageFormat(.espAppImage, "an ESP-IDF app image (magic 0xE9)")
    }, refusal: { format, _ in
        "is \(format.description), sent over Espressif's BLE OTA (`--protocol esp-ota` or `auto`)"
    })
}

extension ImageFormat.Hint {
    /// An ESP-IDF build's linker output (an Xtensa ELF executable, e_machine 94: ESP32, -S2, -S3):
    /// the app image the build writes beside it is the file to pass.
    public static let espIDFLinkerOutput = ImageFormat.Hint { format, head, name in
        guard format.kind == .elf, let elf = ImageFormat.elfHeader(head), elf.type == 2 || elf.type == 3, elf.machine == 94 else { return nil }
        return "is an Xtensa ELF executable (an ESP-IDF build's linker output), not a firmware image; pass the app image ESP-IDF "
            + "builds beside it: build/\(ImageFormat.baseName(of: name)).bin (or make one with `esptool elf2image \(name)`)"
    }
}
