import ArgumentParser
import OTACommandLine

/// What `flash` checks a Nordic DFU package against before any radio time: what the device is.
public struct NordicDFUFlashOptions: ParsableArguments, Sendable {
    @Option(name: .customLong("hw-version"), parsing: .unconditional, help: NordicDFURanges.hwVersion.help("nordic-dfu: the device's hardware version. Every image's init packet must name it (nrfutil pkg generate --hw-version); checked before any radio time, so a package for other hardware costs no transfer", valueName: "n"))
    var hwVersion: Int?

    @Option(name: .customLong("sd-req"), parsing: .unconditional, help: ArgumentHelp("nordic-dfu: the SoftDevice FWID the device runs, or several separated by commas for devices on either (0xAF or 0xAF,0xB6; each \(NordicDFURanges.sdReq.text)). The first image's sd_req must list each, or 0xFFFE (any); checked before any radio time.", valueName: "fwid,..."))
    var sdReq: FWIDList?

    public init() {}

    public func validate() throws {
        try NordicDFURanges.hwVersion.check(hwVersion)
        try NordicDFURanges.sdReq.check(sdReq?.values ?? [])
    }

    public static let names: Set<String> = ["--hw-version", "--sd-req"]

    /// The options given, by name, for a refusal when the image does not go over Secure DFU.
    var given: [String] {
        [hwVersion != nil ? "--hw-version" : nil, sdReq != nil ? "--sd-req" : nil].compactMap { $0 }
    }

    /// What `--hw-version` and `--sd-req` say the device is.
    var expectations: DFUPackage.Expectations {
        DFUPackage.Expectations(hardwareVersion: hwVersion.map { UInt32(clamping: $0) }, softDevices: sdReq?.values.map(\.value) ?? [])
    }
}

/// The options that are Secure DFU's own: `flash`'s, and its simulated device's (its
/// application with the buttonless service, its bootloader).
public struct NordicDFUOptions: ProtocolOptionGroup {
    @OptionGroup(title: "Nordic Secure DFU devices") var flash: NordicDFUFlashOptions
    @OptionGroup(title: "Secure DFU bootloader (a Nordic .zip)") var application: SimulatedButtonlessOptions
    @OptionGroup(title: "Secure DFU bootloader (a Nordic .zip)") var simulated: SecureDFUSimulatorOptions

    public init() {}

    public static var commandLine: ProtocolCommandLine { .nordicDFU }

    public func given(withSimulator: Bool) -> [String] {
        flash.given + (withSimulator ? simulated.given + (application.buttonless != nil ? ["--sim-buttonless"] : []) : [])
    }

    public var applicationDevice: String? { application.buttonless != nil ? SimulatedButtonless.device : nil }
}
