import ArgumentParser
import OTA
import OTACommandLine
import Simulator

/// The exit codes (OTACommandLine's, not ArgumentParser's of the same name).
public typealias ExitCode = OTACommandLine.ExitCode

extension ProtocolCommandLine {
    /// Every protocol the command line speaks, in order of preference: those `ProtocolOptions` holds.
    public static let all: [ProtocolCommandLine] = ProtocolOptions.protocolsHeld

    static func named(_ name: String) -> ProtocolCommandLine? { all.first { $0.name == name } }

    /// The options some protocols take and others do not.
    static let specificOptions: Set<String> = all.reduce(into: []) { $0.formUnion($1.takes) }

    /// The protocols that take `option`, for the refusal.
    static func owners(of option: String) -> [String] { all.filter { $0.takes.contains(option) }.map(\.name) }

    /// The protocol whose simulated device an option starts in its application (`applicationFirst`:
    /// Secure DFU's `--sim-buttonless`).
    static var applicationFirstProtocol: ProtocolCommandLine? { all.first { $0.applicationFirst != nil } }
}

extension ProtocolRegistry {
    /// Every protocol the command line speaks, in order of preference.
    static let cli = ProtocolRegistry(ProtocolCommandLine.all.map(\.profile))

    /// The same, each protocol configured as `request` asks (the native protocol's checkpoint
    /// interval and image version).
    static func cli(for request: FlashRequest) -> ProtocolRegistry {
        ProtocolRegistry(ProtocolCommandLine.all.map { $0.configured(request) })
    }
}

extension FlashPlan {
    /// Loads `path` and picks its protocol with `request.protocolName` (`auto` or a registered
    /// one) from what the file is, reading it once: a format of a protocol's own goes, as read, to
    /// that protocol's loader; a raw binary or HEX image to the protocol the registry resolves.
    ///
    /// - Throws: `CLIFailure` `.imageFile` (exit 3) for an image no protocol sends or a package
    ///   that does not check out; `.incompatibleDevice` (exit 7) for a package the options say the
    ///   device would refuse.
    static func load(path: String, _ request: FlashRequest) throws(CLIFailure) -> FlashPlan {
        let firmware: FirmwareImage
        switch try ImageDetection.detect(path: path, among: ProtocolCommandLine.all) {
        case .own(let registration, let claimed):
            return try registration.load(claimed, request)
        case .image(let image):
            firmware = image
        }
        if let asIs = ProtocolCommandLine.named(request.protocolName)?.sendsAsIs?(firmware, request) { return asIs }
        let format: ImageFormat.Kind = firmware.baseAddress == nil ? .rawBinary : .intelHex
        do {
            let resolution = try ProtocolRegistry.cli(for: request).resolve(request.protocolName, format: format)
            return FlashPlan(update: UpdatePlan(firmware: firmware, profile: resolution.profile, format: format, reason: resolution.reason))
        } catch {
            throw CLIFailure(.imageFile, refusal(path, error))
        }
    }
}

extension Flash {
    /// What this command line asks of the loaders and the protocols: the registry holds each
    /// protocol as the options configure it, so that a loader that hands a file to another
    /// protocol hands it to that one as configured.
    var request: FlashRequest {
        let plain = FlashRequest(protocolName: protocolName, registry: .cli, options: protocols.protocolGroups)
        return FlashRequest(protocolName: protocolName, registry: .cli(for: plain), options: plain.options)
    }
}

extension SimulatorOptions {
    /// The simulated device `plan` goes to, with `config`'s address, link and faults: the one its
    /// protocol registers (a device without the OTA service, `--sim-no-ota-service`, exposes none;
    /// a device a protocol's options start in its application, as `--sim-buttonless` does, is that
    /// protocol's whatever the image, and refuses another's).
    func device(for plan: FlashPlan, config: SimulatedDeviceConfig, settings: SimulatedDeviceSettings? = nil,
                options: [any ProtocolOptionGroup]) throws -> SimulatedDevice {
        let request = SimulatedDeviceRequest(plan: plan, config: config, settings: settings ?? self.settings, options: options)
        guard request.settings.hasOTAService else { return try device.lookedAtDevice(config, settings: request.settings, options: options) }
        if let starter = options.first(where: { $0.applicationDevice != nil }) {
            return try type(of: starter).commandLine.simulatedDevice(request)
        }
        guard let registration = ProtocolCommandLine.named(plan.profile.name) else {
            throw CLIFailure(.internalError, "the \(plan.profile.name) protocol registers no simulated device; please report this")
        }
        return try registration.simulatedDevice(request)
    }
}
