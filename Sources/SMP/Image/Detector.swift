import OTA

extension ImageFormat.Kind {
    /// An MCUboot image: header magic 0x96f3b83d, little-endian, at offset 0 (MCUboot
    /// docs/design.md, "Image Format"); flashed over MCUmgr/SMP.
    public static let mcuboot = ImageFormat.Kind("mcuboot")
}

extension ImageFormat.Detector {
    /// MCUboot's header magic at offset 0, in a binary or in the bytes of Intel HEX text.
    public static let mcuboot = ImageFormat.Detector(kind: .mcuboot, inIntelHex: true, detect: { head, _ in
        starts(head, [0x3D, 0xB8, 0xF3, 0x96]) ? ImageFormat(.mcuboot, "an MCUboot image (header magic 0x96f3b83d)") : nil
    }, refusal: { format, name in
        "is \(format.description), which goes over MCUmgr's SMP: flash it with `otaflash --protocol smp \(name)` (or --protocol auto)"
    })
}
