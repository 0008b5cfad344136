import ArgumentParser
import Crypto
import GATT
import OTA
import OTACommandLine
import OTADevice
import OTAWire
import Simulator

extension ProtocolCommandLine {
    /// Silicon Labs' Bluetooth OTA: GBL files, an EFR32 with the application OTA DFU component, or
    /// with the in-place component and its AppLoader, as the simulated device.
    public static let silabsOTA: ProtocolCommandLine = {
        var silabs = ProtocolCommandLine(
            profile: SilabsOTAProfile(), loader: Loader(detector: .gbl) { claimed, request throws(CLIFailure) in
                try SilabsOTARegistration.load(claimed, request: request)
            },
            takes: Set(["--sim-firmware-version", "--gbl-key", "--silabs-write-commands", "--silabs-settle"] + SimulatedSilabsOptions.names),
            refuses: ["--checkpoint-interval": "Silicon Labs' OTA has no checkpoints: each write request is answered, or nothing is",
                      "--restart": "Silicon Labs' OTA cannot resume: every run sends the whole GBL",
                      "--no-activate": "the AppLoader boots the image and the bootloader installs it as soon as the link closes",
                      "--image-version": "a GBL's application tag carries its own"],
            device: "EFR32 with Silicon Labs' Bluetooth OTA",
            texts: Texts(
                title: "Silicon Labs' Bluetooth OTA", images: "a GBL file (`commander gbl create`, .gbl)",
                devices: "an EFR32 with Silicon Labs' application or in-place OTA DFU (its AppLoader)", extensions: ["gbl"],
                served: "serves an EFR32 with Silicon Labs' Bluetooth OTA (service 1d14d6ee-…, docs/SILABS.md): the application OTA DFU "
                    + "component by default (--sim-silabs-kind app: the GBL goes into a storage slot of --sim-slot-size and is checked once "
                    + "the link closes), or its AppLoader (--sim-silabs-kind apploader: it checks the GBL at 0x03 and boots it; served from "
                    + "the AppLoader on, as after the in-place application rebooted into it). It cannot resume: a lost link sends the whole GBL again.",
                servedName: "Empty Example, as Silicon Labs' SoC Empty example (\(SilabsOTAService.appLoaderName) for the AppLoader)",
                slot: "its storage slot (app) or application area (apploader)",
                mainOptions: [("--gbl-key <file>", "the key a GBL's signature is checked with")],
                flashNote: "An EFR32 that runs an application with in-place OTA DFU is asked into its AppLoader first.",
                imageVersion: "a GBL's application tag",
                exitCodes: [.imageFile: "a GBL that does not check out, or a .s37, .hex or .bin of the application (make a GBL with `commander gbl create`)",
                            .imageTooLarge: "a GBL larger than the device's storage slot or flash (ATT error 0x82 or 0x83)",
                            .verifyFailed: "the AppLoader refused the GBL at 0x03 (ATT error 0x80 or 0x84), or the device still runs its old application after --verify-timeout",
                            .protocolError: "a write refused with an ATT error (its meaning in the message)",
                            .notConfirmed: "a device that reports no application version after its update"]),
            simulatedDevice: { request in
                SilabsOTARegistration.simulatedDevice(request.config, device: request.options(SilabsOTAOptions.self)?.simulated ?? SimulatedSilabsOptions())
            })
        silabs.configure = { request in
            request.options(SilabsOTAOptions.self)?.profile(imageVersion: nil) ?? SilabsOTAProfile()
        }
        silabs.fileHints = [.silabsS37]
        silabs.rangeTexts = SilabsRanges.texts
        silabs.bench = SilabsOTABench()
        silabs.soak = SilabsOTASoak()
        return silabs
    }()
}

/// Silicon Labs' OTA's own options.
public struct SilabsOTAOptions: ProtocolOptionGroup {
    @Option(name: .customLong("gbl-key"), help: ArgumentHelp("silabs-ota: a P-256 public key (PEM, as `commander util genkey` writes it): a signed GBL's signature is checked with it before any radio time (exit 3 when it does not check out).", valueName: "file"), completion: .file())
    var gblKey: String?

    @Flag(name: .customLong("silabs-write-commands"), help: "silabs-ota: OTA Data as write commands where the device flags them: faster, but the device's refusals are not seen, and a write lost on the way is found only by its check at the end.")
    var writeCommands = false

    @Option(name: .customLong("silabs-settle"), parsing: .unconditional, help: SilabsRanges.settle.help("silabs-ota: seconds to wait before starting over on an application OTA DFU device after a lost link, while it erases its slot again (default 5)", valueName: "seconds"))
    var settle: Double?

    @OptionGroup(title: "Simulated EFR32 (silabs-ota)") var simulated: SimulatedSilabsOptions

    public init() {}

    public static var commandLine: ProtocolCommandLine { .silabsOTA }

    public func given(withSimulator: Bool) -> [String] {
        [gblKey != nil ? "--gbl-key" : nil, writeCommands ? "--silabs-write-commands" : nil, settle != nil ? "--silabs-settle" : nil].compactMap { $0 }
            + (withSimulator ? simulated.given : [])
    }

    public func check(protocolName: String) throws {
        try SilabsRanges.settle.check(settle)
    }

    /// The profile these options configure, for a GBL of `imageVersion`.
    func profile(imageVersion: UInt32?) -> SilabsOTAProfile {
        SilabsOTAProfile(imageVersion: imageVersion, writeCommands: writeCommands,
                         settle: settle.map { SilabsRanges.settle.duration($0) } ?? .seconds(5))
    }
}

/// The simulated EFR32's own options, for `flash --simulator` and `otaflash simulate`.
public struct SimulatedSilabsOptions: ParsableArguments, Sendable {
    @Option(name: .customLong("sim-silabs-kind"), help: ArgumentHelp("The simulated EFR32: app (an application with application OTA DFU, the default) or apploader (an application with in-place OTA DFU, which reboots into its AppLoader).", valueName: "kind"))
    var kind: SilabsDeviceKind?

    @Flag(name: .customLong("sim-silabs-no-versions"), help: "The simulated EFR32 serves no version characteristics (no Application version: an application OTA DFU device's update is then not confirmed).")
    var noVersions = false

    @Flag(name: .customLong("sim-silabs-requests-only"), help: "The simulated EFR32's OTA Data is flagged write only (no write without response).")
    var requestsOnly = false

    @Flag(name: .customLong("sim-silabs-refuse"), help: "The simulated EFR32's bootloader refuses the GBL at its check.")
    var refuse = false

    @Option(name: .customLong("sim-silabs-drop-write"), help: SilabsRanges.writeIndex.help("The simulated EFR32's stack drops the OTA Data write command with this index (0: the first since boot); repeatable", valueName: "index"))
    var dropWrite: [Int] = []

    @Option(name: .customLong("sim-silabs-storage-error"), help: SilabsRanges.storageErrorIndex.help("The flash write of the OTA Data write with this index fails; repeatable", valueName: "index"))
    var storageError: [Int] = []

    @Option(name: .customLong("sim-silabs-lose-response"), help: SilabsRanges.lostResponseIndex.help("The response to the OTA Data write request with this index is lost, and the link with it; repeatable", valueName: "index"))
    var loseResponse: [Int] = []

    public init() {}

    static let names = ["--sim-silabs-kind", "--sim-silabs-no-versions", "--sim-silabs-requests-only", "--sim-silabs-refuse",
                        "--sim-silabs-drop-write", "--sim-silabs-storage-error", "--sim-silabs-lose-response"]

    public func validate() throws {
        try SilabsRanges.writeIndex.check(dropWrite)
        try SilabsRanges.storageErrorIndex.check(storageError)
        try SilabsRanges.lostResponseIndex.check(loseResponse)
    }

    var given: [String] {
        let set = [kind != nil, noVersions, requestsOnly, refuse, !dropWrite.isEmpty, !storageError.isEmpty, !loseResponse.isEmpty]
        return zip(Self.names, set).filter(\.1).map(\.0)
    }

    /// The device's configuration; `served`: it starts in its AppLoader.
    func config(slotSize: Int, served: Bool) -> SilabsOTAPeripheral.Config {
        SilabsOTAPeripheral.Config(kind: kind ?? .app, slotSize: slotSize, versionCharacteristics: !noVersions, dataWriteCommands: !requestsOnly,
                                   startsInAppLoader: served,
                                   faults: SilabsDeviceFaults(dropWriteAt: Set(dropWrite), storageErrorAt: Set(storageError),
                                                              loseResponseAt: Set(loseResponse), refuseImage: refuse))
    }
}

extension SilabsDeviceKind: ExpressibleByArgument {}

/// `otaflash simulate`'s options for an EFR32: the simulated device's.
public struct SilabsOTAServedOptions: ServedOptionGroup {
    @OptionGroup(title: "Simulated EFR32 (silabs-ota)") var simulated: SimulatedSilabsOptions

    public init() {}

    public static var commandLine: ProtocolCommandLine { .silabsOTA }

    public var given: [String] { simulated.given }

    public func served(_ request: ServeRequest) throws -> ServedDevice {
        let config = simulated.config(slotSize: request.slotSize, served: true)
        let version = request.firmwareVersion.flatMap(FirmwareVersion.init) ?? FirmwareVersion(major: 1, minor: 0, patch: 0)
        let model = SilabsOTAPeripheral(config: config, firmwareVersion: version.packed, faults: request.faults)
        let name = request.name ?? (config.kind == .apploader ? config.appLoaderName : SilabsOTARegistration.applicationName)
        let what = config.kind == .apploader ? "EFR32 in its AppLoader (in-place OTA DFU), \(request.slotSize)-byte application area"
            : "EFR32 with application OTA DFU, \(request.slotSize)-byte storage slot"
        return ServedDevice(model: model, name: name, firmwareVersion: "\(version)", what: what)
    }
}

/// What the command line needs of this protocol beyond its profile: the GBL loader and the
/// simulated device. Kept here so that a registration names only these.
public enum SilabsOTARegistration {
    /// The name Silicon Labs' SoC Empty example advertises.
    public static let applicationName = "Empty Example"

    /// The plan for a GBL `FirmwareImage.read` claimed: parsed (and its signature checked with
    /// `--gbl-key`) before any radio time.
    ///
    /// - Throws: `CLIFailure`: exit 2 for a key file that cannot be read, exit 3 for a GBL that
    ///   does not check out, or the registry's refusal.
    public static func load(_ claimed: ClaimedImage, request: FlashRequest) throws(CLIFailure) -> FlashPlan {
        let options = request.options(SilabsOTAOptions.self)
        let firmware: FirmwareImage
        do {
            firmware = try claimed.firmware()
        } catch {
            throw CLIFailure(.imageFile, "\(error)")
        }
        var key: P256.Signing.PublicKey?
        if let path = options?.gblKey {
            do {
                key = try GBLFile.publicKey(file: path)
            } catch {
                throw CLIFailure(.usage, "--gbl-key \(error.description)")
            }
        }
        let gbl: GBLFile
        do {
            gbl = try GBLFile(parsing: firmware.bytes, key: key, source: firmware.source)
        } catch {
            throw CLIFailure(ExitCode(error.code), error.description)
        }
        let resolution: ProtocolRegistry.Resolution
        do {
            resolution = try request.registry.resolve(request.protocolName, format: .gbl)
        } catch {
            throw CLIFailure(ExitCode(error.code), FlashPlan.refusal(firmware.source, error))
        }
        var warnings: [String] = []
        if gbl.isEncrypted { warnings.append("\(firmware.source) is an encrypted GBL: only the device can check what it holds") }
        if gbl.isSigned, !gbl.signatureChecked {
            warnings.append("\(firmware.source) is signed; its signature is checked by the device only (--gbl-key checks it before any radio time)")
        }
        if firmware.size % SilabsOTAService.wordSize != 0 {
            warnings.append("\(firmware.source) is \(firmware.size) bytes, not a whole number of 32-bit words: an application OTA DFU device refuses its last write (ATT error 0x83)")
        }
        let profile = options?.profile(imageVersion: gbl.applicationVersion) ?? SilabsOTAProfile(imageVersion: gbl.applicationVersion)
        let plan = UpdatePlan(parts: [UpdatePlan.Part(firmware: firmware, profile: profile, label: "app")], format: .gbl,
                              reason: resolution.reason, contents: "; " + gbl.contents.joined(separator: ", "))
        return FlashPlan(update: plan, warnings: warnings, imageVersion: gbl.applicationVersion.map(SilabsVersions.firmwareVersion))
    }

    /// The device `flash --simulator` sends a silabs-ota plan to (and `scan`, `info` look at).
    public static func simulatedDevice(_ config: SimulatedDeviceConfig, device: SimulatedSilabsOptions = SimulatedSilabsOptions()) -> SimulatedDevice {
        let model = SilabsOTAPeripheral(config: device.config(slotSize: config.slotSize, served: false),
                                        firmwareVersion: config.firmwareVersion.packed, faults: config.faults)
        return SimulatedDevice(config, model: model)
    }
}
