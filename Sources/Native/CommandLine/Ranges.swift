import OTACommandLine

/// The ranges of the native protocol's own numeric options: stated in their help texts, checked in
/// `validate()`, and registered (`ProtocolCommandLine.rangeTexts`) for the line that refuses a
/// value that is not a number at all.
public enum NativeRanges {
    public static let checkpointInterval = Bounds("--checkpoint-interval", 256...(16 << 20), unit: " bytes")
    /// The native device's OTA protocol version (docs/PROTOCOL.md): 1, or 2 with its flash declaration.
    public static let simDeviceVersion = Bounds("--sim-device-version", 1...2)
    /// `simulate`'s former name of --sim-device-version.
    public static let deviceVersion = Bounds("--device-version", simDeviceVersion.range)

    /// Each option's range as text, for the line that reports a value that is not a number at all.
    public static let texts = Ranges.texts(whole: [checkpointInterval, simDeviceVersion, deviceVersion])
}
