import Crypto
import Foundation
import GATT
import OTA
import OTACommandLine
import OTAWire
import Simulator

extension ProtocolCommandLine {
    /// MCUmgr's SMP: MCUboot images (or any file with `--smp-any-image`), a Zephyr SMP server with
    /// MCUboot's two slots as the simulated device.
    public static let smp: ProtocolCommandLine = {
        var smp = ProtocolCommandLine(
            profile: SMPProfile(), loader: Loader(detector: .mcuboot, load: loadMCUboot),
            takes: Set(["--restart", "--no-activate", "--sim-firmware-version"]).union(SMPFlashOptions.names).union(SimulatedSMPOptions.names),
            refuses: ["--checkpoint-interval": "an SMP device confirms each chunk itself", "--image-version": "an MCUboot image carries its own"],
            servedOptions: ["--sim-smp-buf-size", "--buf-size", "--sim-smp-buf-count", "--buf-count", "--sim-smp-cbor", "--cbor", "--sim-smp-key",
                            "--sim-smp-mode", "--sim-smp-no-downgrade"],
            device: "SMP server",
            simulatedDevice: { request in try SimulatedSMP.device(config: request.config, options: request.options(SMPOptions.self)?.simulated) },
            served: { request in
                let version = request.firmwareVersion.flatMap(FirmwareVersion.init) ?? FirmwareVersion(major: 1, minor: 0, patch: 0)
                let key = try request.signatureKey.map { path throws(CLIFailure) in try SimulatedSMP.signatureKey(file: path, option: "--sim-smp-key") }
                var config = SMPServer.Config(bufferSize: request.bufferSize ?? SMPServer.Config().bufferSize,
                                              bufferCount: request.bufferCount ?? SMPServer.Config().bufferCount, slotSize: request.slotSize,
                                              encoding: request.replyEncoding.flatMap(SMPReplyEncoding.init(argument:)) ?? .zephyr)
                SimulatedBootMode.configure(&config, mode: request.bootMode.flatMap(SimulatedBootMode.init(argument:)), noDowngrade: request.noDowngrade)
                let model = SMPPeripheral(config: config, firmwareVersion: version, signatureKey: key, faults: request.faults)
                let server = model.server.config
                return ServedDevice(model: model, name: request.name ?? "otaflash-smp", firmwareVersion: model.server.primary.versionText,
                                    what: "SMP server (MCUmgr with MCUboot, \(server.bufferCount) × \(server.bufferSize) B buffers, \(server.encoding) answers)")
            })
        smp.sendsAsIs = { firmware, request in
            // smpmgr's --format any: the bytes as they are, checked only by the server's SHA-256.
            guard request.protocolName == SMPProfile.name, let options = request.options(SMPOptions.self), options.flash.anyImage else { return nil }
            let settings = SMPOptions.uploadSettings(options, fileSHA256: Array(SHA256.hash(data: firmware.bytes)), imageHash: nil)
            return FlashPlan(update: UpdatePlan(firmware: firmware, profile: SMPProfile(settings: settings), format: nil,
                                                reason: "using smp: asked for with --protocol, the image sent as it is (--smp-any-image)"))
        }
        smp.afterActivation = SMPOptions.checkThenConfirm
        smp.commands = smpCommands
        smp.eventSamples = smpEventSamples
        smp.bench = SMPBench()
        smp.soak = SMPSoak()
        return smp
    }()

    /// An MCUboot image, over SMP with `flash`'s SMP options.
    ///
    /// - Throws: `CLIFailure` `.imageFile` (exit 3) for an image that does not check out or that
    ///   the protocol asked for does not send.
    private static func loadMCUboot(path: String, _ request: FlashRequest) throws(CLIFailure) -> FlashPlan {
        let resolution: ProtocolRegistry.Resolution
        do {
            resolution = try request.registry.resolve(request.protocolName, format: .mcuboot)
        } catch {
            throw CLIFailure(.imageFile, FlashPlan.refusal(path, error))
        }
        let image: MCUbootImage
        do {
            image = try MCUbootImage.load(path: path)
        } catch {
            throw CLIFailure(ExitCode(error.otaError.code), "\(error)")
        }
        let settings = SMPOptions.uploadSettings(request.options(SMPOptions.self), fileSHA256: image.sha256, imageHash: image.imageHash)
        let firmware = image.firmware
        let contents = "; an MCUboot image, version \(image.version), \(image.hashAlgorithm) \(hexString(image.imageHash))"
        let version = FirmwareVersion(major: image.version.major, minor: image.version.minor, patch: image.version.revision)
        return FlashPlan(update: UpdatePlan(parts: [UpdatePlan.Part(firmware: firmware, profile: SMPProfile(settings: settings), label: "image")],
                                            format: .mcuboot, reason: resolution.reason, contents: contents),
                         warnings: image.warnings, imageVersion: version)
    }
}
