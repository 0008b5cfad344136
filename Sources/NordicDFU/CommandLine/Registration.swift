import ArgumentParser
import Foundation
import GATT
import OTA
import OTACommandLine
import OTAWire
import Simulator

extension ProtocolCommandLine {
    /// Nordic Secure DFU: nrfutil packages, a Secure DFU bootloader (behind its buttonless
    /// application with `--sim-buttonless`) as the simulated device.
    public static let nordicDFU: ProtocolCommandLine = {
        var nordic = ProtocolCommandLine(
            profile: NordicDFUProfile(), loader: Loader(detector: .nordicDFUPackage, load: loadPackage),
            takes: Set(["--sim-buttonless"]).union(NordicDFUFlashOptions.names).union(SecureDFUSimulatorOptions.names),
            refuses: ["--checkpoint-interval": "a Secure DFU bootloader confirms each object itself",
                      "--restart": "a Secure DFU bootloader says itself where a transfer resumes",
                      "--no-activate": "the bootloader activates an image as soon as it has validated it",
                      "--image-version": "a package's init packets carry its versions",
                      "--sim-firmware-version": "a Secure DFU bootloader's application version is --sim-app-version"],
            device: "Secure DFU bootloader",
            texts: Texts(
                title: "Nordic Secure DFU", images: "a Nordic Secure DFU package (.zip from `nrfutil pkg generate`)",
                devices: "an nRF5 SDK bootloader, or an application with buttonless DFU", extensions: ["zip"],
                served: "serves a Secure DFU bootloader (service 0xFE59, nRF5 SDK rules: object sizes, init packet checks of "
                    + "hardware, SoftDevice, version and signature, the image's SHA-256), so `otaflash --device <address> "
                    + "app_dfu_package.zip` can be tried without a Nordic board. It activates an image once its hash matched and "
                    + "resets into it. With --sim-buttonless unbonded it serves the device's application first, with Nordic's "
                    + "buttonless service (8EC90003 in 0xFE59), on --adapter. After Enter Bootloader it resets and its Secure DFU "
                    + "bootloader answers at the address whose least significant octet is one higher. A BlueZ adapter cannot change "
                    + "its address, so the bootloader is served and advertised on --bootloader-adapter, a second adapter whose "
                    + "address must be --adapter's + 1 (e.g. random static addresses set with `btmgmt static-addr`); once it "
                    + "activated an application, the device answers on --adapter again. --name is the application's name; the "
                    + "bootloader advertises DfuTarg, or the name the central gave it.",
                servedName: "DfuTarg, as Nordic's bootloaders (otaflash-app for --sim-buttonless's application)",
                slot: "its bootloader's bank",
                mainOptions: [("--hw-version, --sd-req", "the device's hardware, SoftDevice")],
                flashNote: "A Nordic device that runs its application with the buttonless DFU service is asked into its bootloader "
                    + "first, which is then flashed where it answers (the application's address with its last octet one higher).",
                exitCodes: [.imageFile: "a package that does not check out (zip, manifest, init packet, sizes, hash, the legacy SDK 11 format)",
                            .imageTooLarge: "the bootloader's bank or object size",
                            .incompatibleDevice: "a bootloader that refuses the package: other hardware, another SoftDevice, a downgrade, "
                                + "a missing or untrusted signature (or --hw-version/--sd-req shows it would, before any radio time)"]),
            simulatedDevice: { request in
                let options = request.options(NordicDFUOptions.self)
                return try simulatedSecureDFUDevice(config: request.config, options: options?.simulated, buttonless: options?.application.buttonless,
                                                    softDeviceAfterUpdate: softDeviceInstalled(by: request.plan))
            })
        nordic.fileHints = [.nordicPackageWithoutManifest]
        nordic.applicationFirst = "--sim-buttonless"
        nordic.rangeTexts = NordicDFURanges.texts
        nordic.describe = { simulated in
            simulated.model(as: NordicButtonlessDevice.self).map { model in
                "runs its \(model.mode) at \(simulated.address)"
                    + (model.application.map { ", the application flashed with CRC32 \(hex32(CRC32.checksum($0)))" } ?? "")
            }
        }
        nordic.bench = NordicDFUBench()
        nordic.soak = NordicDFUSoak()
        return nordic
    }()

    /// A Nordic package: checked against `--hw-version`/`--sd-req` before any radio time.
    ///
    /// - Throws: `CLIFailure` `.imageFile` (exit 3) for a package that does not check out;
    ///   `.incompatibleDevice` (exit 7) for one `--hw-version`/`--sd-req` say the device would refuse.
    private static func loadPackage(_ claimed: ClaimedImage, _ request: FlashRequest) throws(CLIFailure) -> FlashPlan {
        let path = claimed.path
        let expect = request.options(NordicDFUOptions.self)?.flash.expectations ?? DFUPackage.Expectations()
        let resolution: ProtocolRegistry.Resolution
        do {
            resolution = try request.registry.resolve(request.protocolName, format: .nordicDFUPackage)
        } catch {
            throw CLIFailure(.imageFile, FlashPlan.refusal(path, error))
        }
        let package: DFUPackage
        do {
            package = try DFUPackage(claimed)
            try package.check(expect)
        } catch {
            throw CLIFailure(ExitCode(error.otaError.code), "\(error)")
        }
        let parts = package.images.map { image in
            UpdatePlan.Part(firmware: image.firmware, profile: NordicDFUProfile(image: image), label: image.kind.description)
        }
        let kinds = parts.map(\.label).joined(separator: ", then ")
        let contents = parts.count == 1 ? "; the package's image: \(kinds)" : "; the package's images, in order: \(kinds)"
        return FlashPlan(update: UpdatePlan(parts: parts, format: .nordicDFUPackage, reason: resolution.reason, contents: contents),
                         warnings: package.warnings)
    }
}

/// `otaflash simulate`'s options for a Secure DFU device: its bootloader's (as `flash
/// --simulator` takes them), the SoftDevice it reports after installing one, and whether it
/// starts in its application with the buttonless service.
public struct NordicDFUServedOptions: ServedOptionGroup {
    @OptionGroup(title: "Secure DFU bootloader") var bootloader: SecureDFUSimulatorOptions

    @Option(name: .customLong("sd-after-update"), parsing: .unconditional, help: NordicDFURanges.sdAfterUpdate.help("nordic-dfu: the SoftDevice FWID the bootloader reports once it installed a SoftDevice (what the package's application requires, e.g. 0xB6); default: unchanged", valueName: "fwid"))
    var softDeviceAfterUpdate: FWID?

    @Option(name: .customLong("sim-buttonless"), help: ArgumentHelp("nordic-dfu: serve the device's application with the buttonless service first; Enter Bootloader resets it into its bootloader on --bootloader-adapter. " + SimulatedButtonless.kinds, valueName: "kind"))
    var buttonlessKind: SimulatedButtonless?

    @Option(name: .customLong("public-key"), help: ArgumentHelp("The former name of --sim-public-key.", visibility: .hidden))
    var formerPublicKey: String?

    @Flag(name: .customLong("buttonless"), help: ArgumentHelp("The former name of --sim-buttonless unbonded.", visibility: .hidden))
    var formerButtonless = false

    public init() {}

    public static var commandLine: ProtocolCommandLine { .nordicDFU }

    var buttonless: SimulatedButtonless? { buttonlessKind ?? (formerButtonless ? .unbonded : nil) }

    public func validate() throws {
        try NordicDFURanges.sdAfterUpdate.check(softDeviceAfterUpdate)
        for (former, formerGiven, current, currentGiven) in [("--public-key", formerPublicKey != nil, "--sim-public-key", bootloader.publicKey != nil),
                                                             ("--buttonless", formerButtonless, "--sim-buttonless", buttonlessKind != nil)]
        where formerGiven && currentGiven {
            throw ValidationError("\(former) is the former name of \(current); give \(current) once")
        }
    }

    public var given: [String] {
        bootloader.given + [("--sd-after-update", softDeviceAfterUpdate != nil), ("--public-key", formerPublicKey != nil),
                            ("--sim-buttonless", buttonlessKind != nil), ("--buttonless", formerButtonless)].filter(\.1).map(\.0)
    }

    public var startsInApplication: Bool { buttonless != nil }

    /// The former `--firmware-version` is the application's version here: a number, and not
    /// given with `--sim-app-version`.
    public func check(_ request: ServeRequest, slotOption: String) throws {
        guard let version = request.firmwareVersion else { return }
        guard bootloader.applicationVersion == nil else {
            throw ValidationError("--firmware-version is the former name of --sim-app-version; give --sim-app-version once")
        }
        guard UInt32(version) != nil else {
            throw ValidationError("--firmware-version for \(Self.commandLine.name) is the application version, a number 0-\(UInt32.max), got '\(version)'")
        }
    }

    /// A Secure DFU bootloader, behind its application with the buttonless service with
    /// `--sim-buttonless`; the former `--firmware-version` is the application's version.
    public func served(_ request: ServeRequest) throws -> ServedDevice {
        var config = try bootloader.bootloaderConfig(bankSize: request.slotSize)
        if bootloader.applicationVersion == nil, let version = request.firmwareVersion.flatMap({ UInt32($0) }) {
            config.applicationVersion = version
        }
        if let formerPublicKey {
            config.signatureCheck = try SecureDFUSimulatorOptions.signatureCheck(publicKeyFile: formerPublicKey, option: "--public-key")
        }
        let model = NordicDFUPeripheral(bootloader: NordicDFUBootloader(config: config), faults: request.faults,
                                        softDeviceAfterUpdate: softDeviceAfterUpdate?.value)
        guard let buttonless else {
            return ServedDevice(model: model, name: request.name ?? "DfuTarg", firmwareVersion: "\(config.applicationVersion)", what: "Secure DFU bootloader")
        }
        guard let address = request.address else {
            throw CLIFailure(.bluetoothUnavailable, "--sim-buttonless: BlueZ did not report \(request.adapter ?? "the adapter")'s address, which the bootloader's is derived from")
        }
        let device = buttonless.device(address: address, bootloader: model)
        return ServedDevice(model: device, name: request.name ?? "otaflash-app", firmwareVersion: "\(config.applicationVersion)",
                            what: "Secure DFU application with the buttonless service", bootloaderAddress: device.bootloaderAddress,
                            bootloaderServices: device.bootloader.services)
    }
}
