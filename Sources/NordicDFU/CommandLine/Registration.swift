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
                      "--image-version": "a package's init packets carry its versions"],
            servedOptions: ["--sim-public-key", "--public-key", "--sd-after-update", "--sim-app-version", "--sim-buttonless"],
            device: "Secure DFU bootloader",
            simulatedDevice: { request in
                try simulatedSecureDFUDevice(config: request.config, options: request.options(NordicDFUOptions.self)?.simulated,
                                             buttonless: request.settings.buttonless, softDeviceAfterUpdate: request.plan?.softDeviceAfterUpdate)
            },
            served: served)
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
    private static func loadPackage(path: String, _ request: FlashRequest) throws(CLIFailure) -> FlashPlan {
        let expect = request.options(NordicDFUOptions.self)?.flash.expectations ?? DFUPackage.Expectations()
        let resolution: ProtocolRegistry.Resolution
        do {
            resolution = try request.registry.resolve(request.protocolName, format: .nordicDFUPackage)
        } catch {
            throw CLIFailure(.imageFile, FlashPlan.refusal(path, error))
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

    /// A Secure DFU bootloader as `simulate --protocol nordic-dfu` serves it, behind its
    /// application with the buttonless service with `--sim-buttonless`.
    private static func served(_ request: ServeRequest) throws -> ServedDevice {
        var config = NordicDFUBootloader.Config()
        config.bankSize = request.slotSize
        config.applicationVersion = request.firmwareVersion.flatMap { UInt32($0) } ?? 0
        if let publicKey = request.publicKey {
            config.signatureCheck = try SecureDFUSimulatorOptions.signatureCheck(publicKeyFile: publicKey, option: request.publicKeyOption)
        }
        let model = NordicDFUPeripheral(bootloader: NordicDFUBootloader(config: config), faults: request.faults,
                                        softDeviceAfterUpdate: request.softDeviceAfterUpdate)
        guard let buttonless = request.buttonless else {
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
