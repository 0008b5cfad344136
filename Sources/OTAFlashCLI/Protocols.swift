import Foundation
import GATT
import Native
import NordicDFU
import OTA
import Crypto
import OTAWire
import Simulator
import SMP
import ESPOTA

extension ProtocolRegistry {
    /// Every protocol the command line speaks, in order of preference: otaflash's own, Nordic
    /// Secure DFU, then MCUmgr's SMP.
    static let cli = ProtocolRegistry(CLIProtocol.all.map(\.profile))

    /// The same, each protocol configured as `request` asks (the native protocol's checkpoint
    /// interval and image version).
    static func cli(for request: FlashRequest) -> ProtocolRegistry {
        ProtocolRegistry(CLIProtocol.all.map { $0.configured(request) })
    }
}

/// One protocol as the command line drives it: its profile, the loader of its own image format,
/// the options that are its own, and its simulated device for `flash --simulator` and for
/// `otaflash simulate`. The command line loops over `CLIProtocol.all`; this file is the one
/// place it names a protocol's types.
struct CLIProtocol: Sendable {
    let profile: any OTAProfile
    /// The format of its own and its loader, which reads the file when the generic image loader
    /// finds it is that format (the content detector: `FirmwareImage.load` refuses it naming the
    /// format); nil: it sends raw binaries and Intel HEX as the generic loader reads them.
    let loader: Loader?

    struct Loader: Sendable {
        let format: ImageFormat.Kind
        let load: @Sendable (_ path: String, _ request: FlashRequest) throws(CLIFailure) -> FlashPlan
    }
    /// The options only some protocols take (`flash`'s and its simulated device's) that this one
    /// takes; a given one this protocol does not take is refused.
    let takes: Set<String>
    /// Why it does not take an option some other protocol takes, where that is worth a word.
    let refuses: [String: String]
    /// `otaflash simulate`'s device options that are this protocol's own.
    let servedOptions: Set<String>
    /// What its simulated device is, for the line that refuses another protocol's options.
    let device: String
    /// The device `flash --simulator` sends a plan of this protocol to.
    let simulatedDevice: @Sendable (SimulatorOptions, FlashPlan, SimulatedDeviceConfig, NativeDeviceOptions) throws -> SimulatedDevice
    /// The device `otaflash simulate --protocol <name>` serves; `address` is the adapter's.
    let served: @Sendable (Simulate, _ address: DeviceAddress?) throws -> Simulate.ServedDevice
    /// Its profile as a request configures it; nil: as registered.
    var configure: (@Sendable (FlashRequest) -> any OTAProfile)?
    /// What a simulated device of its own runs after a flash, when that is worth a line.
    var describe: @Sendable (SimulatedDevice) -> String? = { _ in nil }

    var name: String { profile.name }

    /// Its profile as `request` configures it.
    func configured(_ request: FlashRequest) -> any OTAProfile { configure?(request) ?? profile }

    static let all: [CLIProtocol] = [native, nordicDFU, smp, espOTA]

    static func named(_ name: String) -> CLIProtocol? { all.first { $0.name == name } }

    /// The options some protocols take and others do not.
    static let specificOptions: Set<String> = all.reduce(into: []) { $0.formUnion($1.takes) }

    /// The protocols that take `option`, for the refusal.
    static func owners(of option: String) -> [String] { all.filter { $0.takes.contains(option) }.map(\.name) }

    static let native = CLIProtocol(
        profile: NativeProfile(), loader: nil,
        takes: ["--checkpoint-interval", "--image-version", "--restart", "--no-activate", "--sim-buttonless", "--sim-firmware-version",
                "--sim-data-without-write-without-response", "--sim-device-version", "--sim-state"],
        refuses: [:], servedOptions: ["--sim-device-version", "--device-version"], device: "native OTA device",
        simulatedDevice: { options, plan, config, native in
            // A --sim-buttonless device is a Secure DFU device whatever the image: it refuses this one.
            guard options.buttonless == nil else { return try CLIProtocol.nordicDFU.simulatedDevice(options, plan, config, native) }
            return SimulatedDevice(config, native: native)
        },
        served: { simulate, _ in
            let version = simulate.firmwareVersion.flatMap(FirmwareVersion.init) ?? FirmwareVersion(major: 1, minor: 0, patch: 0)
            var config = OTAPeripheralConfig(name: simulate.name ?? "otaflash-sim", slotSize: simulate.slotSize, firmwareVersion: version,
                                             faults: simulate.faults.plan)
            if simulate.deviceVersion == 2 {
                config.version2 = OTATarget.Version2()
                config.runsCLibrary = true
            }
            return Simulate.ServedDevice(model: config.nativeModel, name: config.name, firmwareVersion: version.description,
                                         what: simulate.deviceVersion == 2 ? "OTA target (protocol version 2 on NOR flash, the C device library in lockstep)" : "OTA target")
        },
        configure: { request in NativeProfile(settings: request.native) })

    static let nordicDFU = CLIProtocol(
        profile: NordicDFUProfile(), loader: Loader(format: .nordicDFUPackage, load: FlashPlan.loadPackage),
        takes: Set(["--sim-buttonless"]).union(NordicDFUFlashOptions.names).union(SecureDFUSimulatorOptions.names),
        refuses: ["--checkpoint-interval": "a Secure DFU bootloader confirms each object itself",
                  "--restart": "a Secure DFU bootloader says itself where a transfer resumes",
                  "--no-activate": "the bootloader activates an image as soon as it has validated it",
                  "--image-version": "a package's init packets carry its versions"],
        servedOptions: ["--sim-public-key", "--public-key", "--sd-after-update", "--sim-app-version", "--sim-buttonless"],
        device: "Secure DFU bootloader",
        simulatedDevice: { options, plan, config, _ in
            try options.nordicDevice(config: config, softDeviceAfterUpdate: plan.softDeviceAfterUpdate)
        },
        served: { simulate, address in try simulate.servedSecureDFU(address: address) },
        describe: { simulated in
            simulated.model(as: NordicButtonlessDevice.self).map { model in
                "runs its \(model.mode) at \(simulated.address)"
                    + (model.application.map { ", the application flashed with CRC32 \(hex32(CRC32.checksum($0)))" } ?? "")
            }
        })

    static let smp = CLIProtocol(
        profile: SMPProfile(), loader: Loader(format: .mcuboot, load: FlashPlan.loadMCUboot),
        takes: Set(["--restart", "--no-activate", "--sim-firmware-version"]).union(SMPFlashOptions.names).union(SimulatedSMPOptions.names),
        refuses: ["--checkpoint-interval": "an SMP device confirms each chunk itself", "--image-version": "an MCUboot image carries its own"],
        servedOptions: ["--sim-smp-buf-size", "--buf-size", "--sim-smp-buf-count", "--buf-count", "--sim-smp-cbor", "--cbor", "--sim-smp-key",
                         "--sim-smp-mode", "--sim-smp-no-downgrade"],
        device: "SMP server",
        simulatedDevice: { options, _, config, _ in try SimulatedSMP.device(config: config, options: options.smp) },
        served: { simulate, _ in
            let version = simulate.firmwareVersion.flatMap(FirmwareVersion.init) ?? FirmwareVersion(major: 1, minor: 0, patch: 0)
            let key = try simulate.smpKey.map { path throws(CLIFailure) in try SimulatedSMP.signatureKey(file: path, option: "--sim-smp-key") }
            var config = SMPServer.Config(bufferSize: simulate.bufferSize ?? SMPServer.Config().bufferSize,
                                          bufferCount: simulate.bufferCount ?? SMPServer.Config().bufferCount, slotSize: simulate.slotSize,
                                          encoding: simulate.cbor ?? .zephyr)
            SimulatedBootMode.configure(&config, mode: simulate.smpMode, noDowngrade: simulate.smpNoDowngrade)
            let model = SMPPeripheral(config: config, firmwareVersion: version, signatureKey: key, faults: simulate.faults.plan)
            let server = model.server.config
            return Simulate.ServedDevice(model: model, name: simulate.name ?? "otaflash-smp", firmwareVersion: model.server.primary.versionText,
                                         what: "SMP server (MCUmgr with MCUboot, \(server.bufferCount) × \(server.bufferSize) B buffers, \(server.encoding) answers)")
        })
}

extension CLIProtocol {
    static let espOTA = CLIProtocol(
        profile: ESPOTAProfile(), loader: Loader(format: .espAppImage) { path, request throws(CLIFailure) in
            do throws(OTAError) {
                let loaded = try ESPOTARegistration.load(path: path, protocolName: request.protocolName, registry: .cli)
                return FlashPlan(update: loaded.plan, warnings: loaded.warnings, imageVersion: loaded.version)
            } catch {
                throw CLIFailure(ExitCode(error.code), "\(error)")
            }
        },
        takes: ["--sim-firmware-version"],
        refuses: ["--checkpoint-interval": "an ESP32 ACKs each 4 KiB sector itself", "--restart": "Espressif's BLE OTA cannot resume: every run sends the whole image",
                  "--no-activate": "an ESP32 restarts into an image as soon as its application checked it", "--image-version": "an ESP-IDF app image carries its own"],
        servedOptions: [], device: "ESP32 with Espressif's BLE OTA",
        simulatedDevice: { _, _, config, _ in ESPOTARegistration.simulatedDevice(config) },
        served: { simulate, _ in
            let d = ESPOTARegistration.served(name: simulate.name, partitionSize: simulate.slotSize, firmwareVersion: simulate.firmwareVersion, faults: simulate.faults.plan)
            return Simulate.ServedDevice(model: d.model, name: d.name, firmwareVersion: d.firmwareVersion, what: d.what)
        })
}

/// What `flash` asks of the loaders besides the path: the protocol asked for (or `auto`), what
/// `--hw-version`/`--sd-req` say the device is, and the SMP options.
struct FlashRequest: Sendable {
    var protocolName: String
    var expect: DFUPackage.Expectations = .init()
    /// `--checkpoint-interval` and `--image-version`.
    var native = OTAEngine.Settings()
    var smp: SMPFlashOptions.Settings = .init()

    static let defaultCheckpointInterval = OTAEngine.Settings.defaultCheckpointInterval
}

extension Flash {
    /// What this command line asks of the loaders and the protocols.
    var request: FlashRequest {
        FlashRequest(protocolName: protocolName, expect: nordic.expectations,
                     native: OTAEngine.Settings(checkpointInterval: checkpointInterval ?? FlashRequest.defaultCheckpointInterval,
                                                imageVersion: imageVersion.flatMap(FirmwareVersion.init)),
                     smp: smp.settings(noReset: smp.noReset))
    }
}

/// What `flash` sends (`UpdatePlan`: one image, or a package's images in its order, and the
/// protocol they go over), with what the command line says about it before any radio time.
struct FlashPlan {
    var update: UpdatePlan
    /// What the user should know about the image before it is sent (an unsigned package…).
    var warnings: [String] = []
    /// For the simulator: the SoftDevice a simulated bootloader runs once it installed the
    /// package's SoftDevice (what the package's last image requires).
    var softDeviceAfterUpdate: UInt32?
    /// The version the image carries (an MCUboot header's major.minor.revision), for
    /// `--skip-if-version image`.
    var imageVersion: FirmwareVersion?

    var parts: [UpdatePlan.Part] { update.parts }
    var firmware: FirmwareImage { update.firmware }
    var profile: any OTAProfile { update.profile }
    var size: Int { update.size }
    var crc32: UInt32 { update.crc32 }
}

extension FlashPlan {
    /// Loads `path` and picks its protocol with `name` (`auto` or a registered one) from what the
    /// file is: a Nordic package goes over Secure DFU, a raw binary or HEX image over the native
    /// protocol.
    ///
    /// A package is also checked against `expect` (`--hw-version`, `--sd-req`).
    ///
    /// - Throws: `CLIFailure` `.imageFile` (exit 3) for an image no protocol sends or a package
    ///   that does not check out; `.incompatibleDevice` (exit 7) for a package `expect` says the
    ///   device would refuse.
    static func load(path: String, _ request: FlashRequest) throws(CLIFailure) -> FlashPlan {
        let firmware: FirmwareImage
        do {
            firmware = try FirmwareImage.load(path: path)
        } catch {
            // The content detector found a format of a protocol's own: its loader reads it.
            guard let own = CLIProtocol.all.compactMap(\.loader).first(where: { $0.format == error.format }) else {
                throw CLIFailure(.imageFile, "\(error)")
            }
            return try own.load(path, request)
        }
        return try plan(firmware, path: path, request)
    }

    /// The plan for a raw binary or Intel HEX image, over the protocol `request` names or `auto` picks.
    private static func plan(_ firmware: FirmwareImage, path: String, _ request: FlashRequest) throws(CLIFailure) -> FlashPlan {
        let (name, smp) = (request.protocolName, request.smp)
        let format: ImageFormat.Kind = firmware.baseAddress == nil ? .rawBinary : .intelHex
        if name == SMPProfile.name, smp.anyImage {
            // smpmgr's --format any: the bytes as they are, checked only by the server's SHA-256.
            let settings = SMPUploadSettings(fileSHA256: Array(SHA256.hash(data: firmware.bytes)), imageHash: nil,
                                             confirm: smp.confirm, reset: smp.reset, maxWindow: smp.window,
                                             confirmAfterCheck: smp.confirmAfterCheck, holdsConfirm: smp.checkCommand != nil, upgrade: smp.upgradeOnly)
            return FlashPlan(update: UpdatePlan(firmware: firmware, profile: SMPProfile(settings: settings), format: nil,
                                                reason: "using smp: asked for with --protocol, the image sent as it is (--smp-any-image)"))
        }
        do {
            let resolution = try ProtocolRegistry.cli(for: request).resolve(name, format: format)
            return FlashPlan(update: UpdatePlan(firmware: firmware, profile: resolution.profile, format: format, reason: resolution.reason))
        } catch {
            throw CLIFailure(.imageFile, refusal(path, error))
        }
    }

    private static func refusal(_ path: String, _ error: OTAError) -> String {
        "\(path): \(error.message)" + (error.hint.map { "; \($0)" } ?? "")
    }

    static func loadMCUboot(path: String, _ request: FlashRequest) throws(CLIFailure) -> FlashPlan {
        let (name, smp) = (request.protocolName, request.smp)
        let resolution: ProtocolRegistry.Resolution
        do {
            resolution = try ProtocolRegistry.cli.resolve(name, format: .mcuboot)
        } catch {
            throw CLIFailure(.imageFile, refusal(path, error))
        }
        let image: MCUbootImage
        do {
            image = try MCUbootImage.load(path: path)
        } catch {
            throw CLIFailure(ExitCode(error.otaError.code), "\(error)")
        }
        let settings = SMPUploadSettings(fileSHA256: image.sha256, imageHash: image.imageHash, confirm: smp.confirm,
                                         reset: smp.reset, maxWindow: smp.window, confirmAfterCheck: smp.confirmAfterCheck,
                                         holdsConfirm: smp.checkCommand != nil, upgrade: smp.upgradeOnly)
        let firmware = image.firmware
        let contents = "; an MCUboot image, version \(image.version), \(image.hashAlgorithm) \(hexString(image.imageHash))"
        let version = FirmwareVersion(major: image.version.major, minor: image.version.minor, patch: image.version.revision)
        return FlashPlan(update: UpdatePlan(parts: [UpdatePlan.Part(firmware: firmware, profile: SMPProfile(settings: settings), label: "image")],
                                            format: .mcuboot, reason: resolution.reason, contents: contents),
                         warnings: image.warnings, imageVersion: version)
    }

    static func loadPackage(path: String, _ request: FlashRequest) throws(CLIFailure) -> FlashPlan {
        let (name, expect) = (request.protocolName, request.expect)
        let resolution: ProtocolRegistry.Resolution
        do {
            resolution = try ProtocolRegistry.cli.resolve(name, format: .nordicDFUPackage)
        } catch {
            throw CLIFailure(.imageFile, refusal(path, error))
        }
        let package: DFUPackage
        do {
            package = try DFUPackage.load(path: path)
            try package.check(expect)
        } catch {
            throw CLIFailure(ExitCode(error.otaError.code), "\(error)")
        }
        let parts = package.images.map { image in
            UpdatePlan.Part(firmware: image.firmware, profile: NordicDFUProfile(image: image), label: image.kind.description)
        }
        let kinds = parts.map(\.label).joined(separator: ", then ")
        let installsSoftDevice = package.images.dropLast().contains { $0.kind == .softDevice || $0.kind == .softDeviceBootloader }
        let contents = parts.count == 1 ? "; the package's image: \(kinds)" : "; the package's images, in order: \(kinds)"
        return FlashPlan(update: UpdatePlan(parts: parts, format: .nordicDFUPackage, reason: resolution.reason, contents: contents),
                         warnings: package.warnings,
                         softDeviceAfterUpdate: installsSoftDevice ? package.images.last?.initPacket.command.softDeviceRequirements.first : nil)
    }
}

extension SimulatorOptions {
    /// The simulated device `plan` goes to, with `config`'s address, link and faults: the one its
    /// protocol registers (a device without the OTA service, `--sim-no-ota-service`, exposes none).
    func device(for plan: FlashPlan, config: SimulatedDeviceConfig, native: NativeDeviceOptions? = nil) throws -> SimulatedDevice {
        let native = native ?? self.native
        guard native.hasOTAService else { return SimulatedDevice(config, native: native) }
        guard let registration = CLIProtocol.named(plan.profile.name) else {
            throw CLIFailure(.internalError, "the \(plan.profile.name) protocol registers no simulated device; please report this")
        }
        return try registration.simulatedDevice(self, plan, config, native)
    }
}

extension Simulate {
    /// A Secure DFU bootloader as `simulate --protocol nordic-dfu` serves it, behind its
    /// application with the buttonless service with `--sim-buttonless`.
    /// `address`: the served adapter's, where a `--sim-buttonless` application answers.
    func servedSecureDFU(address: DeviceAddress?) throws -> ServedDevice {
        var config = NordicDFUBootloader.Config()
        config.bankSize = slotSize
        config.applicationVersion = firmwareVersion.flatMap { UInt32($0) } ?? 0
        if let publicKey {
            config.signatureCheck = try SecureDFUSimulatorOptions.signatureCheck(publicKeyFile: publicKey, option: publicKeyOption != nil ? "--sim-public-key" : "--public-key")
        }
        let model = NordicDFUPeripheral(bootloader: NordicDFUBootloader(config: config), faults: faults.plan,
                                        softDeviceAfterUpdate: softDeviceAfterUpdate?.value)
        guard let buttonless else {
            return ServedDevice(model: model, name: name ?? "DfuTarg", firmwareVersion: "\(config.applicationVersion)", what: "Secure DFU bootloader")
        }
        guard let address else {
            throw CLIFailure(.bluetoothUnavailable, "--sim-buttonless: BlueZ did not report \(adapter ?? "the adapter")'s address, which the bootloader's is derived from")
        }
        let device = buttonless.device(address: address, bootloader: model)
        return ServedDevice(model: device, name: name ?? "otaflash-app", firmwareVersion: "\(config.applicationVersion)",
                            what: "Secure DFU application with the buttonless service", bootloaderAddress: device.bootloaderAddress,
                            bootloaderServices: device.bootloader.services)
    }
}
