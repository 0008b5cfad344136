import ArgumentParser
import Foundation
import OTACommandLine

/// What the simulated Secure DFU bootloader (`NordicDFUBootloader`) is and holds: the values it
/// checks an init packet against, so that its refusals (wrong hardware, wrong SoftDevice, a
/// downgrade, a missing or invalid signature) can be produced without hardware. They apply only
/// when a Nordic package is flashed into the simulator; `--sim-slot-size` is its bank size there.
public struct SecureDFUSimulatorOptions: ParsableArguments, Sendable {
    public init() {}

    @Option(name: .customLong("sim-hw-version"), parsing: .unconditional, help: NordicDFURanges.simHWVersion.help("Simulated Secure DFU bootloader (a .zip package only): its hardware version; a package for another refuses with ext 0x06 (default 52, nrfutil's for the nRF52)", valueName: "n"))
    var hardwareVersion: Int?

    @Option(name: .customLong("sim-softdevice"), parsing: .unconditional, help: NordicDFURanges.simSoftDevice.help("Simulated Secure DFU bootloader: FWID of the SoftDevice it runs; a package whose sd_req lacks it refuses with ext 0x07 (default 0xAF)", valueName: "fwid"))
    var softDevice: FWID?

    @Option(name: .customLong("sim-app-version"), parsing: .unconditional, help: NordicDFURanges.simAppVersion.help("Simulated Secure DFU bootloader: version of the installed application; a lower application fw_version is a downgrade, ext 0x05 (default 0)", valueName: "n"))
    var applicationVersion: Int?

    @Option(name: .customLong("sim-bootloader-version"), parsing: .unconditional, help: NordicDFURanges.simBootloaderVersion.help("Simulated Secure DFU bootloader: its own version; a lower bootloader fw_version is a downgrade, ext 0x05 (default 0)", valueName: "n"))
    var bootloaderVersion: Int?

    @Option(name: .customLong("sim-public-key"), help: ArgumentHelp("Simulated Secure DFU bootloader: PEM file of the P-256 public key it verifies signatures with; a package signed with another key refuses with ext 0x0C (default: any signature passes).", valueName: "pem"), completion: .file(extensions: ["pem"]))
    var publicKey: String?

    @Flag(name: .customLong("sim-open-bootloader"), help: "Simulated Secure DFU bootloader: it takes unsigned packages (default: it refuses them with ext 0x08, as a secure bootloader does).")
    var openBootloader = false

    @Flag(name: .customLong("sim-debug-bootloader"), help: "Simulated Secure DFU bootloader: a debug one, which takes is_debug packages and skips the version checks for them (default: it refuses them with ext 0x04).")
    var debugBootloader = false

    public func validate() throws {
        try NordicDFURanges.simHWVersion.check(hardwareVersion)
        try NordicDFURanges.simSoftDevice.check(softDevice)
        try NordicDFURanges.simAppVersion.check(applicationVersion)
        try NordicDFURanges.simBootloaderVersion.check(bootloaderVersion)
    }

    public static let names: Set<String> = ["--sim-hw-version", "--sim-softdevice", "--sim-app-version", "--sim-bootloader-version",
                                     "--sim-public-key", "--sim-open-bootloader", "--sim-debug-bootloader"]

    /// The options given, by name: for the line that refuses them with another protocol's image.
    var given: [String] {
        [("--sim-hw-version", hardwareVersion != nil), ("--sim-softdevice", softDevice != nil),
         ("--sim-app-version", applicationVersion != nil), ("--sim-bootloader-version", bootloaderVersion != nil),
         ("--sim-public-key", publicKey != nil), ("--sim-open-bootloader", openBootloader),
         ("--sim-debug-bootloader", debugBootloader)].filter(\.1).map(\.0)
    }

    /// The simulated bootloader, with a bank of `bankSize` bytes.
    ///
    /// - Throws: `CLIFailure` `.usage` when `--sim-public-key` names no readable P-256 public key.
    func bootloaderConfig(bankSize: Int) throws(CLIFailure) -> NordicDFUBootloader.Config {
        var config = NordicDFUBootloader.Config()
        config.bankSize = bankSize
        if let hardwareVersion { config.hardwareVersion = UInt32(clamping: hardwareVersion) }
        if let softDevice { config.softDevice = softDevice.value }
        if let applicationVersion { config.applicationVersion = UInt32(clamping: applicationVersion) }
        if let bootloaderVersion { config.bootloaderVersion = UInt32(clamping: bootloaderVersion) }
        config.requireSignature = !openBootloader
        config.debugBootloader = debugBootloader
        if let publicKey { config.signatureCheck = try Self.signatureCheck(publicKeyFile: publicKey, option: "--sim-public-key") }
        return config
    }

    /// Verification with the P-256 public key in the PEM file at `path`, given with `option`.
    ///
    /// - Throws: `CLIFailure` `.usage` when the file cannot be read or holds no such key.
    static func signatureCheck(publicKeyFile path: String, option: String) throws(CLIFailure) -> NordicDFUBootloader.SignatureCheck {
        guard let data = FileManager.default.contents(atPath: path) else {
            throw CLIFailure(.usage, "\(option) \(path) cannot be read; give the PEM file of the bootloader's public key")
        }
        guard let check = NordicDFUBootloader.SignatureCheck.verify(pem: String(decoding: data, as: UTF8.self)) else {
            throw CLIFailure(.usage, "\(option) \(path) is not a PEM P-256 public key; make one with nrfutil keys display --key pk --format pem KEY.pem")
        }
        return check
    }
}
