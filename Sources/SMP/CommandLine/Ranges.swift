import OTACommandLine

/// The ranges of SMP's own numeric options: stated in their help texts, checked in `validate()`,
/// and registered (`ProtocolCommandLine.rangeTexts`) for the line that refuses a value that is not
/// a number at all.
public enum SMPRanges {
    /// MCUmgr image slots: 0 and 1 per image, up to four images (Zephyr's img_mgmt).
    public static let slot = Bounds("--slot", 0...7)
    /// SMP requests kept in flight, at most (the device's buffer count bounds it too).
    public static let window = Bounds("--smp-window", 1...32)
    /// Zephyr's MCUmgr netbuf: 64 bytes at the least, 65,535 + 8 the most the SMP header can say.
    public static let bufferSize = Bounds("--sim-smp-buf-size", 64...65543)
    public static let bufferCount = Bounds("--sim-smp-buf-count", 1...32)
    /// The image management group's error codes (Zephyr's `IMG_MGMT_ERR_*`, 1 to 33).
    public static let refuseUpload = Bounds("--sim-smp-refuse-upload", 1...33)
    public static let busyAbove = Bounds("--sim-smp-busy-above", 1...32)
    /// The simulated SMP server's slot erase at a new upload: up to ten minutes.
    public static let eraseSeconds = Bounds("--sim-smp-erase-seconds", 0...600.0, unit: " seconds")
    /// How long `--check-command` may run: at least a second, at most an hour.
    public static let checkTimeout = Bounds("--check-timeout", 1.0...3600.0, unit: " seconds")
    /// An SMP frame is its 8-byte header and at most 65,535 bytes of CBOR; below 64 bytes no upload
    /// request with data fits. (`simulate`'s former name of --sim-smp-buf-size.)
    public static let formerBufferSize = Bounds("--buf-size", bufferSize.range, unit: " bytes")
    /// Zephyr's CONFIG_MCUMGR_TRANSPORT_NETBUF_COUNT, as --sim-smp-buf-count (its former name).
    public static let formerBufferCount = Bounds("--buf-count", bufferCount.range)

    /// Each option's range as text, for the line that reports a value that is not a number at all.
    public static let texts = Ranges.texts(whole: [slot, window, bufferSize, bufferCount, refuseUpload, busyAbove,
                                                   formerBufferSize, formerBufferCount],
                                           numbers: [eraseSeconds, checkTimeout])
}
