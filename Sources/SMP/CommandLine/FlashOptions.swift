import ArgumentParser
import Foundation
import OTACommandLine

/// What `flash` does with an SMP device once it holds the image.
public struct SMPFlashOptions: ParsableArguments, Sendable {
    @Flag(name: .long, help: "SMP: confirm the image at once instead of marking it for test (MCUboot keeps it without the application confirming it).")
    var confirm = false

    @Flag(name: .customLong("no-reset"), help: "SMP: mark the image but do not reset the device; it runs the image at its next reset (otaflash reset).")
    var noReset = false

    @Option(name: .customLong("smp-window"), parsing: .unconditional, help: SMPRanges.window.help("SMP: upload requests in flight at most (never more than the device's buffers)", valueName: "n"))
    var window = SMPEngine.defaultMaxWindow

    @Flag(name: .customLong("smp-any-image"), help: "SMP: send a file that is not an MCUboot image as it is (with --protocol smp); only the device's own SHA-256 check verifies it.")
    var anyImage = false

    @Flag(name: .customLong("upgrade-only"), help: "SMP: set the upload's upgrade flag: the device refuses an image not newer than the one it runs (MCUmgr image error 27, exit 7) before it erases its slot.")
    var upgradeOnly = false

    @Flag(name: .customLong("confirm-after-check"), help: "SMP: mark the image for test, reset, and confirm it only once it runs: active in slot 0, answering an SMP echo and, with --check-command, that command exiting 0; otherwise it is left unconfirmed for MCUboot to revert at the next reset (exit 19, check_failed).")
    var confirmAfterCheck = false

    @Option(name: .customLong("check-command"), help: ArgumentHelp("With --confirm-after-check (one device): a shell command (/bin/sh -c) run once the new image answers, with OTAFLASH_DEVICE and OTAFLASH_VERSION set; the image is confirmed only when it exits 0 within --check-timeout.", valueName: "command"))
    var checkCommand: String?

    @Option(name: .customLong("image"), help: ArgumentHelp("SMP, multi-image: one more MCUboot image for image number N (1: an nRF5340's network core), as N=FILE; repeat it for each. The command's image is image 0, the application core's; the images go as nRF Connect SDK's dfu_application.zip does.", valueName: "N=file"))
    var images: [String] = []

    @Option(name: .customLong("check-timeout"), parsing: .unconditional, help: SMPRanges.checkTimeout.help("Seconds --check-command may run before it counts as failed and is stopped (default 60)", valueName: "seconds"))
    var checkTimeout: Double?

    public init() {}

    public func check(protocolName: String) throws {
        try SMPRanges.window.check(window)
        if anyImage, protocolName != SMPProfile.name {
            throw ValidationError("--smp-any-image sends a file over SMP as it is: it needs --protocol smp")
        }
        try SMPRanges.checkTimeout.check(checkTimeout)
        if confirmAfterCheck, confirm {
            throw ValidationError("--confirm confirms before the image ever ran, --confirm-after-check once it ran and passed its check; give one")
        }
        if confirmAfterCheck, noReset {
            throw ValidationError("--confirm-after-check resets the device to run the new image before it confirms it; drop --no-reset")
        }
        if let checkCommand {
            guard confirmAfterCheck else { throw ValidationError("--check-command is the check before the confirm; add --confirm-after-check") }
            guard !checkCommand.trimmingCharacters(in: .whitespaces).isEmpty else {
                throw ValidationError("--check-command is empty; give a shell command that exits 0 when the new image works")
            }
        }
        if checkTimeout != nil, checkCommand == nil {
            throw ValidationError("--check-timeout bounds --check-command; add --check-command")
        }
        _ = try extraImages()
    }

    /// The images `--image N=FILE` adds, checked for their form, range and uniqueness.
    func extraImages() throws -> [(number: UInt32, path: String)] {
        var out: [(number: UInt32, path: String)] = []
        let range = SMPPackage.imageNumbers
        for text in images {
            guard let pair = SMPPackage.imageArgument(text) else {
                throw ValidationError("--image \(text) is not N=FILE; give an image number and an MCUboot image, e.g. --image 1=net_core_app_update.bin")
            }
            guard range.contains(pair.number) else {
                throw ValidationError("--image \(text): image number \(pair.number) is outside \(range.lowerBound)–\(range.upperBound) (1: an nRF5340's network core)")
            }
            guard pair.number != 0 else {
                throw ValidationError("--image \(text): image 0 is the command's own image (the application core's); give it as the image, and the others with --image")
            }
            guard !out.contains(where: { $0.number == pair.number }) else {
                throw ValidationError("--image gives image \(pair.number) twice; give one file per image number")
            }
            out.append(pair)
        }
        return out
    }

    /// What `--confirm-after-check` cannot go with besides the SMP options: `--no-activate`
    /// (nothing would run), and `--check-command` in a batch (it runs for one device).
    func checkConfirmAfterCheck(noActivate: Bool, batch: Bool) throws {
        if confirmAfterCheck, noActivate {
            throw ValidationError("--confirm-after-check runs the new image before it confirms it; drop --no-activate")
        }
        if checkCommand != nil, batch {
            throw ValidationError("--check-command checks one device; flash one --device, or drop it (each device of a batch is still checked by its SMP echo)")
        }
    }

    /// The options as the plan takes them.
    struct Settings: Sendable {
        var confirm = false
        var reset = true
        var window = SMPEngine.defaultMaxWindow
        var anyImage = false
        var confirmAfterCheck = false
        var checkCommand: String?
        var checkTimeout = 60.0
        var upgradeOnly = false
        var extraImages: [(number: UInt32, path: String)] = []
    }

    func settings(noReset: Bool) -> Settings {
        Settings(confirm: confirm, reset: !noReset, window: window, anyImage: anyImage, confirmAfterCheck: confirmAfterCheck,
                 checkCommand: checkCommand, checkTimeout: checkTimeout ?? 60, upgradeOnly: upgradeOnly,
                 extraImages: (try? extraImages()) ?? [])
    }

    /// The SMP options given, by name, for a refusal when the image does not go over SMP.
    public static let names: Set<String> = ["--confirm", "--no-reset", "--smp-any-image", "--smp-window", "--confirm-after-check", "--check-command",
                                     "--check-timeout", "--upgrade-only", "--image"]

    var given: [String] {
        [confirm ? "--confirm" : nil, noReset ? "--no-reset" : nil, anyImage ? "--smp-any-image" : nil,
         window != SMPEngine.defaultMaxWindow ? "--smp-window" : nil, confirmAfterCheck ? "--confirm-after-check" : nil,
         checkCommand != nil ? "--check-command" : nil, checkTimeout != nil ? "--check-timeout" : nil,
         upgradeOnly ? "--upgrade-only" : nil, images.isEmpty ? nil : "--image"].compactMap { $0 }
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

    public func check(protocolName: String, noActivate: Bool, batch: Bool) throws {
        try flash.check(protocolName: protocolName)
        try flash.checkConfirmAfterCheck(noActivate: noActivate, batch: batch)
    }

    /// The upload settings `options` give an image of `fileSHA256` (and `imageHash`, an MCUboot
    /// image's); without options, the defaults.
    static func uploadSettings(_ options: SMPOptions?, fileSHA256: [UInt8], imageHash: [UInt8]?) -> SMPUploadSettings {
        let smp = options.map { $0.flash.settings(noReset: $0.flash.noReset) } ?? SMPFlashOptions.Settings()
        return SMPUploadSettings(fileSHA256: fileSHA256, imageHash: imageHash, confirm: smp.confirm, reset: smp.reset, maxWindow: smp.window,
                                 confirmAfterCheck: smp.confirmAfterCheck, holdsConfirm: smp.checkCommand != nil, upgrade: smp.upgradeOnly)
    }
}
