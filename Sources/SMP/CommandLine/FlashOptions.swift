import ArgumentParser
import OTACommandLine

/// What `flash` does with an SMP device once it holds the image.
public struct SMPFlashOptions: ParsableArguments, Sendable {
    @Flag(name: .long, help: "SMP: confirm the image at once instead of marking it for test (MCUboot keeps it without the application confirming it).")
    var confirm = false

    @Flag(name: .customLong("no-reset"), help: "SMP: mark the image but do not reset the device; it runs the image at its next reset (otaflash reset).")
    var noReset = false

    @Option(name: .customLong("smp-window"), parsing: .unconditional, help: Ranges.smpWindow.help("SMP: upload requests in flight at most (never more than the device's buffers)", valueName: "n"))
    var window = SMPEngine.defaultMaxWindow

    @Flag(name: .customLong("smp-any-image"), help: "SMP: send a file that is not an MCUboot image as it is (with --protocol smp); only the device's own SHA-256 check verifies it.")
    var anyImage = false

    public init() {}

    public func check(protocolName: String) throws {
        try Ranges.smpWindow.check(window)
        if anyImage, protocolName != SMPProfile.name {
            throw ValidationError("--smp-any-image sends a file over SMP as it is: it needs --protocol smp")
        }
    }

    /// The options as the plan takes them.
    struct Settings: Sendable {
        var confirm = false
        var reset = true
        var window = SMPEngine.defaultMaxWindow
        var anyImage = false
    }

    func settings(noReset: Bool) -> Settings {
        Settings(confirm: confirm, reset: !noReset, window: window, anyImage: anyImage)
    }

    /// The SMP options given, by name, for a refusal when the image does not go over SMP.
    public static let names: Set<String> = ["--confirm", "--no-reset", "--smp-any-image", "--smp-window"]

    var given: [String] {
        [confirm ? "--confirm" : nil, noReset ? "--no-reset" : nil, anyImage ? "--smp-any-image" : nil,
         window != SMPEngine.defaultMaxWindow ? "--smp-window" : nil].compactMap { $0 }
    }
}

/// The options that are SMP's own: `flash`'s, and its simulated device's.
public struct SMPOptions: ProtocolOptionGroup {
    @OptionGroup(title: "SMP (MCUmgr) devices") var flash: SMPFlashOptions
    @OptionGroup(title: "SMP device (an MCUboot image)") var simulated: SimulatedSMPOptions

    public init() {}

    public static var commandLine: ProtocolCommandLine { .smp }

    public func given(withSimulator: Bool) -> [String] {
        flash.given + (withSimulator ? simulated.given : [])
    }

    public func check(protocolName: String) throws {
        try flash.check(protocolName: protocolName)
    }

    /// The upload settings `options` give an image of `fileSHA256` (and `imageHash`, an MCUboot
    /// image's); without options, the defaults.
    static func uploadSettings(_ options: SMPOptions?, fileSHA256: [UInt8], imageHash: [UInt8]?) -> SMPUploadSettings {
        let smp = options.map { $0.flash.settings(noReset: $0.flash.noReset) } ?? SMPFlashOptions.Settings()
        return SMPUploadSettings(fileSHA256: fileSHA256, imageHash: imageHash, confirm: smp.confirm, reset: smp.reset, maxWindow: smp.window)
    }
}
