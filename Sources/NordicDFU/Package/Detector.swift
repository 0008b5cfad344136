import OTA

extension ImageFormat.Kind {
    /// A Nordic Secure DFU package: a zip with `manifest.json` at its root (nrfutil pkg generate).
    public static let nordicDFUPackage = ImageFormat.Kind("nordic-dfu-package")
}

extension ImageFormat.Detector {
    /// A zip archive (local header or end-of-central-directory magic) that lists `manifest.json`
    /// at its root and an init packet (`.dat`): every image of a Secure DFU package has one, and
    /// nRF Connect SDK's `dfu_application.zip` (MCUboot images, also with `manifest.json`) has none.
    public static let nordicDFUPackage = ImageFormat.Detector(kind: .nordicDFUPackage, detect: { head, tail in
        guard starts(head, [0x50, 0x4B, 0x03, 0x04]) || starts(head, [0x50, 0x4B, 0x05, 0x06]) else { return nil }
        let names = ImageFormat.zipEntryNames(head: head, tail: tail)
        guard names.contains(where: { $0 == "manifest.json" || $0 == "./manifest.json" }),
              names.contains(where: { $0.lowercased().hasSuffix(".dat") }) else { return nil }
        return ImageFormat(.nordicDFUPackage, "a Nordic Secure DFU package (a zip with manifest.json)", entries: names,
                           limit: ImageFormat.SizeLimit(bytes: DFUPackage.maximumPackageSize, what: "packages"))
    }, refusal: { format, _ in
        "is \(format.description), not a single image; it goes over Nordic Secure DFU (`otaflash flash` sends it with `--protocol nordic-dfu` or `auto`; in code, `DFUPackage.load`)"
    })
}

extension ImageFormat.Hint {
    /// A zip with init packets (.dat) but no manifest.json: a Secure DFU package that lost its
    /// manifest, which no protocol sends.
    public static let nordicPackageWithoutManifest = ImageFormat.Hint { format, _, _ in
        guard format.kind == .zip, format.entries.contains(where: { $0.lowercased().hasSuffix(".dat") }),
              !format.entries.contains(where: { $0 == "manifest.json" || $0 == "./manifest.json" }) else { return nil }
        return "is \(format.description) with init packets (.dat) but no manifest.json, so not a Nordic DFU package; regenerate it with nrfutil pkg generate"
    }
}
