import ArgumentParser
import GATT
import OTACommandLine
import Simulator

/// The native device's protocol version (`--sim-device-version`), for every command with
/// `--simulator`: `flash`'s device, and the device `scan`, `info` and `pair` simulate.
public struct NativeDeviceVersionOptions: ProtocolOptionGroup {
    @Option(name: .customLong("sim-device-version"), parsing: .unconditional, help: NativeRanges.simDeviceVersion.help("The OTA protocol version the device speaks: 2 runs it on NOR flash (4 KiB erase units, 85 ms per erase, 40 µs per word) with the C device library in lockstep, and a difference between the two is exit 1", valueName: "n"))
    public var deviceVersion: Int = 1

    public init() {}

    public static var commandLine: ProtocolCommandLine { .native }

    public func validate() throws {
        try NativeRanges.simDeviceVersion.check(deviceVersion)
    }

    public func given(withSimulator: Bool) -> [String] {
        withSimulator && deviceVersion != 1 ? ["--sim-device-version"] : []
    }

    public func check(simulatedSlotSize: Int, slotOption: String) throws {
        try NativeDeviceVersionOptions.check(version: deviceVersion, slotSize: simulatedSlotSize, option: "--sim-device-version", slotOption: slotOption)
    }

    /// A version 2 device erases whole units, and the C library beside it takes only a slot of
    /// whole units: refused with another slot size (options named as given).
    static func check(version: Int, slotSize: Int, option: String, slotOption: String) throws(ValidationError) {
        let unit = OTATarget.Version2().eraseUnit
        guard version == 2, slotSize % unit != 0 else { return }
        throw ValidationError("\(option) 2 erases \(unit)-byte units: \(slotOption) must be a multiple of \(unit), got \(slotSize)")
    }
}

/// `flash --simulator`'s options for a native OTA device: its protocol version, its data
/// characteristic, and its state kept between runs.
public struct NativeSimulatorOptions: ParsableArguments, Sendable {
    @OptionGroup var version: NativeDeviceVersionOptions

    @Option(name: .customLong("sim-state"), help: ArgumentHelp("Keep the simulated device's flash and transfer state in this folder between runs, so a second run resumes (one native device, not a batch).", valueName: "dir"), completion: .directory)
    var stateDir: String?

    @Flag(name: .customLong("sim-data-without-write-without-response"), help: "native: the data characteristic lacks write-without-response.")
    var dataWithoutWriteWithoutResponse = false

    public init() {}

    public func validate() throws {
        if version.deviceVersion == 2, stateDir != nil {
            throw ValidationError("--sim-state keeps a version 1 device only; drop it or --sim-device-version 2")
        }
    }

    /// The options given, by name, for the refusal when the image goes over another protocol.
    var given: [String] {
        version.given(withSimulator: true) + [stateDir != nil ? "--sim-state" : nil,
                                              dataWithoutWriteWithoutResponse ? "--sim-data-without-write-without-response" : nil].compactMap { $0 }
    }

    /// Refuses what a native device cannot be in this run: a version 2 device in front of another
    /// protocol's application, or in a batch; a kept state for another protocol's application.
    func check(_ run: SimulatedRun) throws(CLIFailure) {
        if run.simulated, version.deviceVersion == 2 {
            if let other = run.applicationDevice {
                throw CLIFailure(.usage, "--sim-device-version 2 makes a native OTA device; \(run.image) goes to a \(other), drop it")
            }
            if run.batch {
                throw CLIFailure(.usage, "--sim-device-version 2 checks one simulated device against the C device library; flash one device (drop --count)")
            }
        }
        if stateDir != nil, let other = run.applicationDevice {
            throw CLIFailure(.usage, "--sim-state keeps the native simulated device only; drop it to flash a \(other) in the simulator")
        }
    }
}

extension SimulatedDeviceRequest {
    /// What makes the simulated device a native one: the service it exposes, and the native
    /// options of the command (`flash`'s, or the device version of `scan`'s, `info`'s and `pair`'s).
    var native: NativeDeviceOptions {
        let simulator = options(NativeFlashOptions.self)?.simulated
        let deviceVersion = simulator?.version.deviceVersion ?? options(NativeDeviceVersionOptions.self)?.deviceVersion ?? 1
        let version2 = deviceVersion == 2 ? OTATarget.Version2() : nil
        return NativeDeviceOptions(hasOTAService: settings.hasOTAService,
                                   dataProperties: simulator?.dataWithoutWriteWithoutResponse == true ? [.write] : [.writeWithoutResponse],
                                   version2: version2, runsCLibrary: version2 != nil)
    }
}
