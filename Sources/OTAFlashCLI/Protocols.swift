import Foundation
import Native
import NordicDFU
import OTA
import Crypto
import OTAWire
import SMP

extension ProtocolRegistry {
    /// Every protocol the command line speaks, in order of preference: otaflash's own, Nordic
    /// Secure DFU, then MCUmgr's SMP. (The OTA library cannot see NordicDFU or SMP, so the list is
    /// made here.)
    static let cli = ProtocolRegistry([NativeProfile(), NordicDFUProfile(), SMPProfile()])

    /// The values `--protocol` takes.
    static var choices: [String] { [auto] + cli.names }

    /// "auto, native or nordic-dfu".
    static var choicesText: String {
        let all = choices
        return all.dropLast().joined(separator: ", ") + " or " + (all.last ?? "")
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
    static func load(path: String, protocol name: String, expect: DFUPackage.Expectations = .init(),
                     smp: SMPFlashOptions.Settings = .init()) throws(CLIFailure) -> FlashPlan {
        let firmware: FirmwareImage
        do {
            firmware = try FirmwareImage.load(path: path)
        } catch let error where error.format == .nordicDFUPackage {
            return try loadPackage(path: path, protocol: name, expect: expect)
        } catch let error where error.format == .mcuboot {
            return try loadMCUboot(path: path, protocol: name, smp: smp)
        } catch {
            throw CLIFailure(.imageFile, "\(error)")
        }
        let format: ImageFormat.Kind = firmware.baseAddress == nil ? .rawBinary : .intelHex
        if name == SMPProfile.name, smp.anyImage {
            // smpmgr's --format any: the bytes as they are, checked only by the server's SHA-256.
            let settings = SMPUploadSettings(fileSHA256: Array(SHA256.hash(data: firmware.bytes)), imageHash: nil,
                                             confirm: smp.confirm, reset: smp.reset, maxWindow: smp.window)
            return FlashPlan(update: UpdatePlan(firmware: firmware, profile: SMPProfile(settings: settings), format: nil,
                                                reason: "using smp: asked for with --protocol, the image sent as it is (--smp-any-image)"))
        }
        do {
            let resolution = try ProtocolRegistry.cli.resolve(name, format: format)
            return FlashPlan(update: UpdatePlan(firmware: firmware, profile: resolution.profile, format: format, reason: resolution.reason))
        } catch {
            throw CLIFailure(.imageFile, refusal(path, error))
        }
    }

    private static func refusal(_ path: String, _ error: OTAError) -> String {
        "\(path): \(error.message)" + (error.hint.map { "; \($0)" } ?? "")
    }

    private static func loadMCUboot(path: String, protocol name: String, smp: SMPFlashOptions.Settings) throws(CLIFailure) -> FlashPlan {
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
                                         reset: smp.reset, maxWindow: smp.window)
        let firmware = image.firmware
        let contents = "; an MCUboot image, version \(image.version), \(image.hashAlgorithm) \(hexString(image.imageHash))"
        let version = FirmwareVersion(major: image.version.major, minor: image.version.minor, patch: image.version.revision)
        return FlashPlan(update: UpdatePlan(parts: [UpdatePlan.Part(firmware: firmware, profile: SMPProfile(settings: settings), label: "image")],
                                            format: .mcuboot, reason: resolution.reason, contents: contents),
                         warnings: image.warnings, imageVersion: version)
    }

    private static func loadPackage(path: String, protocol name: String, expect: DFUPackage.Expectations) throws(CLIFailure) -> FlashPlan {
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
