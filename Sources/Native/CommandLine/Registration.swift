import ArgumentParser
import GATT
import OTA
import OTACommandLine
import OTAWire
import Simulator

/// `flash`'s options that are the native protocol's own.
public struct NativeFlashOptions: ProtocolOptionGroup {
    @Option(name: .customLong("image-version"), help: ArgumentHelp("native: the version the image carries (e.g. 1.2.3); the device reports it after activation.", valueName: "version"))
    var imageVersion: String?

    @Option(name: .customLong("checkpoint-interval"), parsing: .unconditional, help: NativeRanges.checkpointInterval.help("native: bytes between checkpoints (write with response carrying offset and CRC32; default \(OTAEngine.Settings.defaultCheckpointInterval))", valueName: "bytes"))
    var checkpointInterval: Int?

    @OptionGroup(title: "Native OTA device (a .bin or .hex)") var simulated: NativeSimulatorOptions

    public init() {}

    public static var commandLine: ProtocolCommandLine { .native }

    public func validate() throws {
        try NativeRanges.checkpointInterval.check(checkpointInterval)
        if let imageVersion, FirmwareVersion(imageVersion) == nil {
            throw ValidationError("--image-version must look like 1.2.3, got '\(imageVersion)'")
        }
    }

    public func given(withSimulator: Bool) -> [String] {
        [checkpointInterval != nil ? "--checkpoint-interval" : nil, imageVersion != nil ? "--image-version" : nil].compactMap { $0 }
            + (withSimulator ? simulated.given : [])
    }

    public var imageVersionText: String? { imageVersion }

    public func check(simulatedSlotSize: Int, slotOption: String) throws {
        try simulated.version.check(simulatedSlotSize: simulatedSlotSize, slotOption: slotOption)
    }

    public func check(_ run: SimulatedRun) throws(CLIFailure) { try simulated.check(run) }

    public var stateDirectory: String? { simulated.stateDir }

    /// The engine's settings: `--checkpoint-interval` and `--image-version`.
    var settings: OTAEngine.Settings {
        OTAEngine.Settings(checkpointInterval: checkpointInterval ?? OTAEngine.Settings.defaultCheckpointInterval,
                           imageVersion: imageVersion.flatMap(FirmwareVersion.init))
    }
}

extension ProtocolCommandLine {
    /// otaflash's own protocol: raw binaries and Intel HEX, its OTA target as the simulated device.
    public static let native: ProtocolCommandLine = {
        var native = ProtocolCommandLine(
            profile: NativeProfile(), loader: nil,
            takes: ["--checkpoint-interval", "--image-version", "--restart", "--no-activate", "--sim-buttonless", "--sim-firmware-version",
                    "--sim-data-without-write-without-response", "--sim-device-version", "--sim-state"],
            refuses: [:], device: "native OTA device",
            texts: Texts(
                title: "otaflash's own protocol", images: "a raw binary (.bin) or Intel HEX (.hex)",
                devices: "firmware with otaflash's device side", extensions: ["bin", "hex"],
                served: "serves otaflash's own OTA service and the Device Information Service: after an ACTIVATE it answers, "
                    + "then reboots into the image, refusing centrals for the reboot time. One central's transfer at a time: a second "
                    + "central's commands fail with ATT error 0x89 (busy). --sim-device-version 2 serves a protocol version 2 device on "
                    + "NOR flash (docs/PROTOCOL.md) with the C device library (Sources/COTADevice) in lockstep: every write goes to "
                    + "both, and any difference between their answers is reported when serving stops, with exit 1.",
                servedName: "otaflash-sim",
                exitCodes: [.internalError: "a simulated version 2 device's C device library answered differently from its Swift model",
                            .verifyFailed: "the CRC32 of the whole image"]),
            simulatedDevice: { request in SimulatedDevice(request.config, native: request.native) })
        native.configure = { request in NativeProfile(settings: request.options(NativeFlashOptions.self)?.settings ?? OTAEngine.Settings()) }
        native.check = { simulated throws(CLIFailure) in
            // With the C device library in lockstep, any difference between the two models ends the run.
            guard let lockstep = simulated.target, lockstep.runsCLibrary else { return nil }
            if let divergence = lockstep.lockstepDivergence {
                throw CLIFailure(.internalError, "the C device library and the Swift device model answered differently: \(divergence)")
            }
            return "simulated device: the C device library answered every write as the Swift model did"
        }
        native.info = { connection, services in
            guard let ota = services.first(where: { $0.uuid == OTAProtocol.serviceUUID }),
                  let c = ota.characteristic(OTAProtocol.infoUUID),
                  let bytes = try? await connection.read(c), let info = try? DeviceInfo(decoding: bytes) else { return nil }
            return [("ota_protocol", "\(info.protocolVersion)"), ("ota_state", info.state.description),
                    ("ota_slot_size", "\(info.maxImageSize)"), ("ota_firmware_version", info.firmwareVersion.description),
                    ("ota_received", "\(info.received)")]
        }
        native.rangeTexts = NativeRanges.texts
        native.bench = NativeBench()
        native.soak = NativeSoak()
        native.state = SimulatorStateKeeper(option: "--sim-state", load: SimulatorState.load, save: SimulatorState.save)
        return native
    }()
}

/// `otaflash simulate`'s options for a native OTA device: the protocol version it speaks.
public struct NativeServedOptions: ServedOptionGroup {
    @Option(name: .customLong("sim-device-version"), parsing: .unconditional, help: NativeRanges.simDeviceVersion.help("native: the OTA protocol version the device speaks: 2 runs it on NOR flash (4 KiB erase units, 85 ms per erase, 40 µs per word) with the C device library in lockstep; a difference between the two is a note and, at the end, exit 1 (default 1)", valueName: "n"))
    var deviceVersionOption: Int?

    @Option(name: .customLong("device-version"), parsing: .unconditional, help: ArgumentHelp("The former name of --sim-device-version.", visibility: .hidden))
    var formerDeviceVersion: Int?

    public init() {}

    public static var commandLine: ProtocolCommandLine { .native }

    var deviceVersion: Int { deviceVersionOption ?? formerDeviceVersion ?? 1 }
    var option: String { formerDeviceVersion != nil ? "--device-version" : "--sim-device-version" }

    public func validate() throws {
        try NativeRanges.simDeviceVersion.check(deviceVersionOption)
        try NativeRanges.deviceVersion.check(formerDeviceVersion)
        if deviceVersionOption != nil, formerDeviceVersion != nil {
            throw ValidationError("--device-version is the former name of --sim-device-version; give --sim-device-version once")
        }
    }

    public var given: [String] { deviceVersion != 1 ? [option] : [] }

    public func check(_ request: ServeRequest, slotOption: String) throws {
        try NativeDeviceVersionOptions.check(version: deviceVersion, slotSize: request.slotSize, option: option, slotOption: slotOption)
    }

    public func served(_ request: ServeRequest) throws -> ServedDevice {
        let version = request.firmwareVersion.flatMap(FirmwareVersion.init) ?? FirmwareVersion(major: 1, minor: 0, patch: 0)
        var config = OTAPeripheralConfig(name: request.name ?? "otaflash-sim", slotSize: request.slotSize, firmwareVersion: version,
                                         faults: request.faults)
        if deviceVersion == 2 {
            config.version2 = OTATarget.Version2()
            config.runsCLibrary = true
        }
        return ServedDevice(model: config.nativeModel, name: config.name, firmwareVersion: version.description,
                            what: deviceVersion == 2 ? "OTA target (protocol version 2 on NOR flash, the C device library in lockstep)" : "OTA target")
    }
}
