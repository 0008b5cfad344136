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
            profile: SMPProfile(), loader: Loader(detector: .smpFiles, load: loadMCUboot),
            takes: Set(["--restart", "--no-activate", "--sim-firmware-version"]).union(SMPFlashOptions.names).union(SimulatedSMPOptions.names),
            refuses: ["--checkpoint-interval": "an SMP device confirms each chunk itself", "--image-version": "an MCUboot image carries its own"],
            device: "SMP server",
            texts: Texts(
                title: "MCUmgr's SMP", images: "an MCUboot image (`imgtool sign`, .signed.bin or .signed.hex)",
                devices: "a Zephyr or nRF Connect SDK device", extensions: ["bin", "hex", "zip"],
                served: "serves a Zephyr device with MCUmgr's SMP server and MCUboot (the SMP service 8D53DC1D with its "
                    + "characteristic DA2E7828, write without response and notify): --sim-smp-buf-size and --sim-smp-buf-count are "
                    + "its SMP buffers (what the MCUmgr parameters read reports; Zephyr's default is 4 × 384), --sim-slot-size each "
                    + "of its two slots, --sim-firmware-version the version of the image it runs in slot 0, --sim-smp-cbor how it "
                    + "encodes its answers (Zephyr's zcbor by default; tinycbor for an mcumgr device). Uploads go to slot 1 and "
                    + "resume by the file's SHA-256; an image marked for test is swapped in at the next reset and runs unconfirmed, "
                    + "a second reset without a confirm reverts it; one confirmed stays. `smpmgr --ble <address> upgrade --slot 1 "
                    + "app.signed.bin` or `otaflash --protocol smp --device <address> app.signed.bin` can update it.",
                servedName: "otaflash-smp", slot: "each of its two slots",
                mainOptions: [("--confirm, --no-reset", "confirm at once; no reset after the upload")],
                imageVersion: "an MCUboot image's header",
                exitCodes: [.imageFile: "an MCUboot image that does not check out (magic, header, TLVs, hash, encrypted or non-bootable), "
                                + "or the device refusing its header or TLVs",
                            .imageTooLarge: "the device's slot (MCUmgr image error 30), or a file its file system cannot hold (`files put`)",
                            .incompatibleDevice: "a device that refuses a downgrade (MCUmgr image error 27) or lacks an MCUmgr command",
                            .verifyFailed: "the slot's hash or SHA-256",
                            .protocolError: "an MCUmgr error, e.g. no free slot while a test image waits or runs unconfirmed",
                            .checkFailed: "--confirm-after-check: no answer to an SMP echo, a reset during the check, or --check-command "
                                + "failed or ran out of time; MCUboot reverts the image at the next reset"]),
            simulatedDevice: { request in try SimulatedSMP.device(config: request.config, options: request.options(SMPOptions.self)?.simulated) })
        smp.sendsAsIs = { firmware, request in
            // smpmgr's --format any: the bytes as they are, checked only by the server's SHA-256.
            guard request.protocolName == SMPProfile.name, let options = request.options(SMPOptions.self), options.flash.anyImage else { return nil }
            let settings = SMPOptions.uploadSettings(options, fileSHA256: Array(SHA256.hash(data: firmware.bytes)), imageHash: nil)
            return FlashPlan(update: UpdatePlan(firmware: firmware, profile: SMPProfile(settings: settings), format: nil,
                                                reason: "using smp: asked for with --protocol, the image sent as it is (--smp-any-image)"))
        }
        smp.afterActivation = SMPOptions.checkThenConfirm
        smp.rangeTexts = SMPRanges.texts
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
    private static func loadMCUboot(_ claimed: ClaimedImage, _ request: FlashRequest) throws(CLIFailure) -> FlashPlan {
        let path = claimed.path
        let resolution: ProtocolRegistry.Resolution
        do {
            resolution = try request.registry.resolve(request.protocolName, format: .mcuboot)
        } catch {
            throw CLIFailure(.imageFile, FlashPlan.refusal(path, error))
        }
        let options = request.options(SMPOptions.self)
        let extra = options?.flash.settings(noReset: false).extraImages ?? []
        let package: SMPPackage?
        if claimed.head.starts(with: [0x50, 0x4B]) {
            guard extra.isEmpty else {
                throw CLIFailure(.usage, "\(path) is a package that names its own images; drop --image (it adds images to one MCUboot image)")
            }
            do {
                package = try SMPPackage(claimed)
            } catch {
                throw CLIFailure(ExitCode(error.otaError.code), "\(error)")
            }
        } else if !extra.isEmpty {
            do {
                package = try SMPPackage.images(adding: extra, to: [SMPPackage.Part(imageNumber: 0, image: MCUbootImage(claimed), file: path)], source: path)
            } catch {
                throw CLIFailure(ExitCode(error.otaError.code), "\(error)")
            }
        } else {
            package = nil
        }
        if let package { return multiImagePlan(package, options: options, reason: resolution.reason) }
        let image: MCUbootImage
        do {
            image = try MCUbootImage(claimed)
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

extension ProtocolCommandLine {
    /// Several MCUboot images over SMP (`SMPMultiImageEngine`): in `SMPPackage.markingOrder`,
    /// the application core's last, as one part whose bytes are every image's one after the other.
    static func multiImagePlan(_ package: SMPPackage, options: SMPOptions?, reason: String) -> FlashPlan {
        let order = package.markingOrder
        let images = order.map { part in
            SMPImagePlan(imageNumber: part.imageNumber, bytes: part.image.bytes, fileSHA256: part.image.sha256,
                         imageHash: part.image.imageHash, version: SMPSlotImage(part.image.bytes).versionText)
        }
        let settings = SMPOptions.uploadSettings(options, fileSHA256: [], imageHash: nil)
        let firmware = FirmwareImage(bytes: order.flatMap(\.image.bytes), source: package.source)
        let listed = order.map { "\($0.label) \($0.image.version) (\($0.file))" }.joined(separator: ", then ")
        let contents = "; \(order.count) MCUboot images, uploaded and marked in this order: \(listed); one reset"
        let application = package.parts.first { $0.imageNumber == 0 }?.image.version
        return FlashPlan(update: UpdatePlan(parts: [UpdatePlan.Part(firmware: firmware, profile: SMPMultiImageProfile(images: images, settings: settings),
                                                                    label: "images")],
                                            format: .mcuboot, reason: reason, contents: contents),
                         warnings: package.parts.flatMap(\.image.warnings),
                         imageVersion: application.map { FirmwareVersion(major: $0.major, minor: $0.minor, patch: $0.revision) })
    }
}
