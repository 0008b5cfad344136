import OTACommandLine

/// The ranges of Silicon Labs' OTA's own numeric options.
public enum SilabsRanges {
    /// The wait before 0x00 on a reconnect to an application OTA DFU device, which erases its slot
    /// again after a lost link (a 1 MiB slot of 8 KiB pages at 20–40 ms a page: up to about 5 s).
    public static let settle = Bounds("--silabs-settle", 0...60.0, unit: " seconds")
    /// An OTA Data write's index since the simulated device booted.
    public static let writeIndex = Bounds("--sim-silabs-drop-write", 0...1_000_000)
    public static let storageErrorIndex = Bounds("--sim-silabs-storage-error", writeIndex.range)
    public static let lostResponseIndex = Bounds("--sim-silabs-lose-response", writeIndex.range)

    /// Each option's range as text, for the line that reports a value that is not a number at all.
    public static let texts = Ranges.texts(whole: [writeIndex, storageErrorIndex, lostResponseIndex], numbers: [settle])
}
