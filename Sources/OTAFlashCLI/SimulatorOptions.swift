import ArgumentParser
import Foundation
import GATT
import OTACommandLine
import OTADevice
import OTAWire
import Simulator

/// The simulated peripheral as every command with `--simulator` sees it: whether to use it, and
/// what it reports (the protocols' own options of it are in their groups).
public struct SimulatedDeviceOptions: ParsableArguments {
    @Flag(name: .customLong("simulator"), help: "Use the built-in simulated peripheral instead of a Bluetooth device (its options: otaflash help simulator).")
    public var enabled = false

    @Option(name: .customLong("sim-slot-size"), parsing: .unconditional, help: Ranges.simSlotSize.help(ProtocolTexts.simSlotSize(ProtocolCommandLine.all), valueName: "bytes"))
    public var slotSize: Int = 1 << 20

    @Option(name: .customLong("sim-firmware-version"), help: ArgumentHelp(ProtocolTexts.simFirmwareVersion(ProtocolCommandLine.all), valueName: "version"))
    var firmwareVersionOption: String?

    public var firmwareVersion: String { firmwareVersionOption ?? "1.0.0" }

    @Flag(name: .customLong("sim-no-ota-service"), help: "The device does not expose the OTA service.")
    public var noOTAService = false

    @Flag(name: .customLong("sim-advertise-no-uuid"), help: "The device advertises no service UUID, as mcumgr's Mynewt smp_svr sample does: `scan --ota-only` cannot tell what it speaks, `scan --probe` connects and looks.")
    public var advertisesNoUUID = false

    public init() {}

    public func validate() throws {
        try Ranges.simSlotSize.check(slotSize)
        guard firmwareVersionOption.map({ FirmwareVersion($0) != nil }) ?? true else { throw ValidationError("--sim-firmware-version must look like 1.2.3, got '\(firmwareVersion)'") }
    }

    /// Each protocol group's checks of its simulated device's options against the slot size.
    func check(_ groups: [any ProtocolOptionGroup]) throws {
        for group in groups { try group.check(simulatedSlotSize: slotSize, slotOption: "--sim-slot-size") }
    }
}

/// The simulated peripheral as `scan`, `info`, `pair` and the device commands see it: the first
/// protocol's device, with its own options (Protocols.swift).
public struct LookedAtDeviceOptions: ParsableArguments {
    @OptionGroup public var device: SimulatedDeviceOptions
    @OptionGroup var protocols: LookedAtProtocolOptions

    public init() {}

    public func validate() throws {
        try device.check(protocols.protocolGroups)
    }

    public var enabled: Bool { device.enabled }

    public func deviceConfig(address: DeviceAddress) -> SimulatedDeviceConfig { device.deviceConfig(address: address) }

    /// The device `scan`, `info` and `pair` simulate, at `config`'s address.
    func lookedAtDevice(_ config: SimulatedDeviceConfig) throws -> SimulatedDevice {
        try device.lookedAtDevice(config, options: protocols.protocolGroups)
    }

    /// A central that reaches the simulated device at `address` on the real clock.
    func central(address: DeviceAddress) throws -> any GATTCentral {
        SimulatedCentral(devices: [try lookedAtDevice(deviceConfig(address: address))], clock: SystemClock())
    }
}

/// What the simulated device requires of the link (`flash`, `pair`, `unpair`; not `scan`/`info`).
public struct SimulatedSecurityOptions: ParsableArguments {
    @Option(name: .customLong("sim-security"), help: ArgumentHelp("What the device requires of the link: none; encrypt (a bond, Just Works will do); authenticate (a passkey bond: --sim-passkey, else a numeric comparison).", valueName: "level"))
    public var security: LinkSecurity = .none

    @Option(name: .customLong("sim-passkey"), parsing: .unconditional, help: Ranges.simPasskey.help("With --sim-security authenticate: the passkey the device expects", valueName: "n"))
    public var passkey: Int?

    public init() {}

    public func validate() throws {
        try Ranges.simPasskey.check(passkey)
        if passkey != nil, security != .authenticate { throw ValidationError("--sim-passkey needs --sim-security authenticate") }
    }

    /// `config` with the device's security.
    func apply(to config: SimulatedDeviceConfig) -> SimulatedDeviceConfig {
        var config = config
        config.security = security
        config.passkey = passkey.map { UInt32($0) }
        return config
    }
}

/// The simulated link of `flash --simulator`: its timing.
public struct SimulatedLinkOptions: ParsableArguments {
    @Option(name: .customLong("sim-mtu"), parsing: .unconditional, help: Ranges.mtu.help("Negotiated ATT MTU", valueName: "bytes"))
    public var mtu: Int = 247

    @Option(name: .customLong("sim-phy"), help: ArgumentHelp("Radio PHY.", valueName: "phy"))
    public var phy: LinkModel.PHY = .le2M

    @Option(name: .customLong("sim-interval-ms"), parsing: .unconditional, help: Ranges.interval.help("Connection interval in milliseconds", valueName: "ms"))
    public var intervalMs: Double = 15

    @Option(name: .customLong("sim-packets-per-event"), parsing: .unconditional, help: Ranges.packetsPerEvent.help("Most link-layer packets per connection event (default: as many as fit)", valueName: "n"))
    public var packetsPerEvent: Int?

    @Option(name: .customLong("sim-time"), help: ArgumentHelp("real: take the link's real time (a demo); virtual: compute it and finish at once; unlimited: no link timing.", valueName: "time"))
    var time: SimulatedTime = .real

    public init() {}

    public func validate() throws {
        try Ranges.mtu.check(mtu)
        try Ranges.interval.check(intervalMs)
        try Ranges.packetsPerEvent.check(packetsPerEvent)
    }

    public var model: LinkModel {
        LinkModel(mtu: mtu, phy: phy, connectionInterval: Ranges.interval.duration(intervalMs), packetsPerEvent: packetsPerEvent,
                  timed: time != .unlimited)
    }
}

/// Options of the built-in simulated peripheral: the device, its link model and the faults it injects.
public struct SimulatorOptions: ParsableArguments {
    @OptionGroup public var device: SimulatedDeviceOptions

    @OptionGroup public var security: SimulatedSecurityOptions

    @OptionGroup public var linkOptions: SimulatedLinkOptions

    @OptionGroup(title: "Simulated faults")
    public var faultOptions: FaultOptions

    /// Seed of the fault generator (also seeds the reconnect jitter).
    public var seed: UInt64 { faultOptions.seed }
    public var enabled: Bool { device.enabled }
    public var slotSize: Int { device.slotSize }

    public init() {}

    public var link: LinkModel { linkOptions.model }

    public var faults: FaultPlan { faultOptions.plan }

    /// The simulated device at `address`.
    public func deviceConfig(address: DeviceAddress) -> SimulatedDeviceConfig {
        var config = security.apply(to: device.deviceConfig(address: address))
        config.link = link
        config.faults = faults
        return config
    }

    /// What the simulated device is besides its protocol's own options.
    public var settings: SimulatedDeviceSettings { device.settings }

    /// The simulated device restored from the folder `kept` names (by the protocol whose device
    /// keeps its state, with the command's protocol `options`) and a central that reaches it.
    func makeCentral(address: DeviceAddress, kept: KeptState, options: [any ProtocolOptionGroup]) throws -> (SimulatedCentral, SimulatedDevice) {
        let request = SimulatedDeviceRequest(plan: nil, config: deviceConfig(address: address), settings: settings, options: options)
        let device = try kept.keeper.load(kept.directory, request)
        return (SimulatedCentral(devices: [device], clock: clock), device)
    }

    /// Saves the device's state into the folder `kept` names.
    func save(_ device: SimulatedDevice, _ kept: KeptState) throws {
        do {
            try kept.keeper.save(device, kept.directory)
        } catch {
            throw CLIFailure(.internalError, "cannot save simulator state to \(kept.directory): \(error.localizedDescription)")
        }
    }

    public var clock: any MonotonicClock {
        linkOptions.time == .real ? SystemClock() : VirtualClock()
    }

    public static let defaultAddress = DeviceAddress(0xC0, 0xFF, 0xEE, 0x00, 0x00, 0x01)
}

extension SimulatedDeviceOptions {
    /// The simulated device at `address`, with the default link and no faults.
    public func deviceConfig(address: DeviceAddress) -> SimulatedDeviceConfig {
        var config = SimulatedDeviceConfig(address: address, slotSize: slotSize,
                                           firmwareVersion: FirmwareVersion(firmwareVersion) ?? FirmwareVersion(major: 1, minor: 0, patch: 0))
        config.advertisesServices = !advertisesNoUUID
        return config
    }

    /// What the simulated device is besides its protocol's own options.
    var settings: SimulatedDeviceSettings {
        SimulatedDeviceSettings(hasOTAService: !noOTAService)
    }

    /// The device `scan`, `info` and `pair` simulate: the first protocol's, at `config`'s address,
    /// as the command's protocol `options` describe it.
    func lookedAtDevice(_ config: SimulatedDeviceConfig, settings: SimulatedDeviceSettings? = nil,
                        options: [any ProtocolOptionGroup]) throws -> SimulatedDevice {
        guard let first = ProtocolCommandLine.all.first else {
            throw CLIFailure(.internalError, "no protocol is registered; please report this")
        }
        return try first.simulatedDevice(SimulatedDeviceRequest(plan: nil, config: config, settings: settings ?? self.settings, options: options))
    }
}

/// The folder a protocol's simulated device keeps its state in between runs, and how it keeps it.
struct KeptState {
    var directory: String
    var keeper: SimulatorStateKeeper

    /// The folder the first of `groups` that gives one names, with its protocol's keeper.
    init?(_ groups: [any ProtocolOptionGroup]) {
        for group in groups {
            if let directory = group.stateDirectory, let keeper = type(of: group).commandLine.state {
                self.init(directory: directory, keeper: keeper)
                return
            }
        }
        return nil
    }

    init(directory: String, keeper: SimulatorStateKeeper) {
        self.directory = directory
        self.keeper = keeper
    }
}

/// Faults a simulated device injects, in process (`--simulator`) or served through BlueZ
/// (`otaflash simulate`): one set of names, so a fault means the same thing on either.
public struct FaultOptions: ParsableArguments {
    public init() {}

    @Option(name: .customLong("sim-seed"), parsing: .unconditional, help: Ranges.seed.help("Seed of the fault generator; the same seed replays the same faults", valueName: "n"))
    var seed: UInt64 = 1

    @Option(name: .customLong("sim-drop-rate"), parsing: .unconditional, help: Ranges.dropRate.help("Fraction of data packets the device drops", valueName: "fraction"))
    var dropRate: Double = 0

    @Option(name: .customLong("sim-disconnect-at"), parsing: .unconditionalSingleValue, help: Ranges.disconnectAt.help("Drop the link when the device receives this image offset; repeatable", valueName: "offset"))
    var disconnectAt: [Int] = []

    @Option(name: .customLong("sim-reboot-at"), parsing: .unconditionalSingleValue, help: Ranges.rebootAt.help("Power-cycle the device when it receives this offset; repeatable", valueName: "offset"))
    var rebootAt: [Int] = []

    @Option(name: .customLong("sim-corrupt-at"), parsing: .unconditionalSingleValue, help: Ranges.corruptAt.help("Flip the byte at this offset as it arrives; repeatable", valueName: "offset"))
    var corruptAt: [Int] = []

    @Option(name: .customLong("sim-corrupt-rate"), parsing: .unconditional, help: Ranges.corruptRate.help("Fraction of data packets corrupted as they arrive", valueName: "fraction"))
    var corruptRate: Double = 0

    @Option(name: .customLong("sim-gatt-error-rate"), parsing: .unconditional, help: Ranges.gattErrorRate.help("Fraction of control point writes answered with an ATT error", valueName: "fraction"))
    var gattErrorRate: Double = 0

    @Option(name: .customLong("sim-lost-notification-rate"), parsing: .unconditional, help: Ranges.lostNotificationRate.help("Fraction of replies not notified", valueName: "fraction"))
    var lostNotificationRate: Double = 0

    @Option(name: .customLong("sim-slow-flash-ms"), parsing: .unconditional, help: Ranges.slowFlash.help("Extra flash time per KiB, in milliseconds", valueName: "ms"))
    var slowFlashMs: Double = 0

    @Option(name: .customLong("sim-flash-bitflip-at"), parsing: .unconditional, help: Ranges.flashBitflipAt.help("Rot this flash byte after it is written (verify must reject the image)", valueName: "offset"))
    var flashBitflipAt: Int?

    @Option(name: .customLong("sim-stop-answering-at"), parsing: .unconditional, help: Ranges.stopAnsweringAt.help("The device hangs when it receives this offset: it ignores data and answers no command", valueName: "offset"))
    var stopAnsweringAt: Int?

    @Flag(name: .customLong("sim-lose-final-answer"), help: "The answer to the command that activates the image is lost: the device activates and resets, its answer never arrives")
    var loseFinalAnswer = false

    public func validate() throws {
        for (bounds, rate) in [(Ranges.dropRate, dropRate), (Ranges.corruptRate, corruptRate),
                               (Ranges.gattErrorRate, gattErrorRate), (Ranges.lostNotificationRate, lostNotificationRate)] {
            try bounds.check(rate)
        }
        try Ranges.slowFlash.check(slowFlashMs)
        try Ranges.disconnectAt.check(disconnectAt)
        try Ranges.rebootAt.check(rebootAt)
        try Ranges.corruptAt.check(corruptAt)
        try Ranges.flashBitflipAt.check(flashBitflipAt)
        try Ranges.stopAnsweringAt.check(stopAnsweringAt)
    }

    public var plan: FaultPlan {
        FaultPlan(seed: seed, dropRate: dropRate, disconnectAt: disconnectAt, rebootAt: rebootAt,
                  corruptRate: corruptRate, corruptAt: corruptAt, gattErrorRate: gattErrorRate,
                  lostNotificationRate: lostNotificationRate,
                  slowFlashPerKiB: Ranges.slowFlash.duration(slowFlashMs), flashBitFlipAt: flashBitflipAt, stopAnsweringAt: stopAnsweringAt,
                  loseFinalAnswer: loseFinalAnswer)
    }
}
