import Foundation
import NordicDFU
import OTA

extension ProtocolRegistry {
    /// Every protocol the command line speaks, in order of preference: otaflash's own, then Nordic
    /// Secure DFU. (The OTA library cannot see NordicDFU, so the list is made here.)
    static let cli = ProtocolRegistry([NativeProfile(), NordicDFUProfile()])

    /// The values `--protocol` takes.
    static var choices: [String] { [auto] + cli.names }

    /// "auto, native or nordic-dfu".
    static var choicesText: String {
        let all = choices
        return all.dropLast().joined(separator: ", ") + " or " + (all.last ?? "")
    }
}

/// What `flash` sends: one image, and the protocol it goes over.
struct FlashPlan {
    let firmware: FirmwareImage
    let profile: any OTAProfile
    /// Why the protocol was chosen, for one note line.
    let reason: String
    /// What the user should know about the image before it is sent (an unsigned package…).
    var warnings: [String] = []
}

extension FlashPlan {
    /// Loads `path` and picks its protocol with `name` (`auto` or a registered one) from what the
    /// file is: a Nordic package goes over Secure DFU, a raw binary or HEX image over the native
    /// protocol.
    ///
    /// - Throws: `CLIFailure` `.imageFile` (exit 3) for an image no protocol sends, a package that
    ///   does not check out, or a combined package.
    static func load(path: String, protocol name: String) throws(CLIFailure) -> FlashPlan {
        let firmware: FirmwareImage
        do {
            firmware = try FirmwareImage.load(path: path)
        } catch let error where error.format == .nordicDFUPackage {
            return try loadPackage(path: path, protocol: name)
        } catch {
            throw CLIFailure(.imageFile, "\(error)")
        }
        let format: ImageFormat.Kind = firmware.baseAddress == nil ? .rawBinary : .intelHex
        do {
            let resolution = try ProtocolRegistry.cli.resolve(name, format: format)
            return FlashPlan(firmware: firmware, profile: resolution.profile, reason: resolution.reason)
        } catch {
            throw CLIFailure(.imageFile, refusal(path, error))
        }
    }

    private static func refusal(_ path: String, _ error: OTAError) -> String {
        "\(path): \(error.message)" + (error.hint.map { "; \($0)" } ?? "")
    }

    private static func loadPackage(path: String, protocol name: String) throws(CLIFailure) -> FlashPlan {
        let resolution: ProtocolRegistry.Resolution
        do {
            resolution = try ProtocolRegistry.cli.resolve(name, format: .nordicDFUPackage)
        } catch {
            throw CLIFailure(.imageFile, refusal(path, error))
        }
        let package: DFUPackage
        do {
            package = try DFUPackage.load(path: path)
        } catch {
            throw CLIFailure(.imageFile, "\(error)")
        }
        guard package.images.count == 1, let image = package.images.first else {
            let kinds = package.images.map(\.kind.description).joined(separator: " + ")
            throw CLIFailure(.imageFile, "\(path): a combined package (\(kinds)) needs one transfer per image with a reconnect between them, which otaflash does not do yet; generate one package per image with `nrfutil pkg generate` and flash them in that order")
        }
        return FlashPlan(firmware: image.firmware, profile: NordicDFUProfile(image: image),
                         reason: resolution.reason + " (its \(image.kind) image)", warnings: package.warnings)
    }
}
