import ArgumentParser
import GATT
import OTADevice
import OTAWire
import Simulator

/// Options of the built-in simulated peripheral: its link model and the faults it injects.
public struct SimulatorOptions: ParsableArguments {
    @OptionGroup(title: "Simulated faults")
    public var faultOptions: FaultOptions

    /// Seed of the fault generator (also seeds the reconnect jitter).
    public var seed: UInt64 { faultOptions.seed }

    @Flag(name: .customLong("simulator"), help: "Flash the built-in simulated peripheral instead of a Bluetooth device.")
    public var enabled = false

    @Option(name: .customLong("sim-mtu"), help: "Negotiated ATT MTU (23–517).")
    public var mtu: Int = 247

    @Option(name: .customLong("sim-phy"), help: "Radio PHY: 1M or 2M.")
    public var phy: String = "2M"

    @Option(name: .customLong("sim-interval-ms"), help: "Connection interval in milliseconds (7.5–4000).")
    public var intervalMs: Double = 15

    @Option(name: .customLong("sim-packets-per-event"), help: "Most link-layer packets per connection event (default: as many as fit).")
    public var packetsPerEvent: Int?

    @Option(name: .customLong("sim-time"), help: "real: take the link's real time (a demo); virtual: compute it and finish at once; unlimited: no link timing.")
    public var time: String = "real"

    @Option(name: .customLong("sim-slot-size"), help: "Bytes the device's image slot holds.")
    public var slotSize: Int = 1 << 20

    @Option(name: .customLong("sim-firmware-version"), help: "Firmware version the device reports before the update.")
    public var firmwareVersion: String = "1.0.0"

    @Option(name: .customLong("sim-state"), help: ArgumentHelp("Keep the simulated device's flash and transfer state in this folder between runs, so a second run resumes.", valueName: "dir"))
    public var stateDir: String?

    @Flag(name: .customLong("sim-no-ota-service"), help: "The device does not expose the OTA service.")
    public var noOTAService = false

    @Flag(name: .customLong("sim-data-without-write-without-response"), help: "The data characteristic lacks write-without-response.")
    public var dataWithoutWriteWithoutResponse = false

    public init() {}

    public mutating func validate() throws {
        guard !enabled || (23...517).contains(mtu) else { throw ValidationError("--sim-mtu must be between 23 and 517, got \(mtu)") }
        guard LinkModel.PHY(rawValue: phy.uppercased()) != nil else { throw ValidationError("--sim-phy must be 1M or 2M, got '\(phy)'") }
        guard (7.5...4000).contains(intervalMs) else { throw ValidationError("--sim-interval-ms must be between 7.5 and 4000, got \(intervalMs)") }
        guard ["real", "virtual", "unlimited"].contains(time) else { throw ValidationError("--sim-time must be real, virtual or unlimited, got '\(time)'") }
        guard slotSize > 0 else { throw ValidationError("--sim-slot-size must be positive, got \(slotSize)") }
        guard FirmwareVersion(firmwareVersion) != nil else { throw ValidationError("--sim-firmware-version must look like 1.2.3, got '\(firmwareVersion)'") }
        if let ppe = packetsPerEvent, ppe < 1 { throw ValidationError("--sim-packets-per-event must be at least 1") }
    }

    public var link: LinkModel {
        LinkModel(mtu: mtu, phy: LinkModel.PHY(rawValue: phy.uppercased()) ?? .le2M,
                  connectionInterval: .microseconds(Int64(intervalMs * 1000)), packetsPerEvent: packetsPerEvent,
                  timed: time != "unlimited")
    }

    public var faults: FaultPlan { faultOptions.plan }

    /// The simulated device at `address`.
    public func deviceConfig(address: DeviceAddress) -> SimulatedDeviceConfig {
        SimulatedDeviceConfig(address: address, slotSize: slotSize,
                              firmwareVersion: FirmwareVersion(firmwareVersion) ?? FirmwareVersion(major: 1, minor: 0, patch: 0),
                              link: link, faults: faults, hasOTAService: !noOTAService,
                              dataProperties: dataWithoutWriteWithoutResponse ? [.write] : [.writeWithoutResponse])
    }

    /// The simulated device (restored from `--sim-state` when given) and a central that reaches it.
    public func makeCentral(address: DeviceAddress) throws -> (SimulatedCentral, SimulatedDevice) {
        let config = deviceConfig(address: address)
        let device = try stateDir.map { try SimulatorState.load(from: $0, config: config) } ?? SimulatedDevice(config)
        return (SimulatedCentral(devices: [device], clock: clock), device)
    }

    /// Saves the device's state when `--sim-state` asks for it.
    public func save(_ device: SimulatedDevice) throws {
        guard let stateDir else { return }
        do {
            try SimulatorState.save(device, to: stateDir)
        } catch {
            throw CLIFailure(.internalError, "cannot save simulator state to \(stateDir): \(error.localizedDescription)")
        }
    }

    public var clock: any MonotonicClock {
        time == "real" ? SystemClock() : VirtualClock()
    }

    public static let defaultAddress = DeviceAddress("C0:FF:EE:00:00:01")!
}

/// Faults a simulated device injects, in process (`--simulator`) or served through BlueZ
/// (`otaflash simulate`): one set of names, so a fault means the same thing on either.
public struct FaultOptions: ParsableArguments {
    public init() {}

    @Option(name: .customLong("sim-seed"), help: "Seed of the fault generator; the same seed replays the same faults.")
    var seed: UInt64 = 1

    @Option(name: .customLong("sim-drop-rate"), help: "Fraction (0–1) of data packets the device drops.")
    var dropRate: Double = 0

    @Option(name: .customLong("sim-disconnect-at"), help: "Drop the link when the device receives this image offset (repeatable).")
    var disconnectAt: [Int] = []

    @Option(name: .customLong("sim-reboot-at"), help: "Power-cycle the device when it receives this offset (repeatable).")
    var rebootAt: [Int] = []

    @Option(name: .customLong("sim-corrupt-at"), help: "Flip the byte at this offset as it arrives (repeatable).")
    var corruptAt: [Int] = []

    @Option(name: .customLong("sim-corrupt-rate"), help: "Fraction (0–1) of data packets corrupted as they arrive.")
    var corruptRate: Double = 0

    @Option(name: .customLong("sim-gatt-error-rate"), help: "Fraction (0–1) of control point writes answered with an ATT error.")
    var gattErrorRate: Double = 0

    @Option(name: .customLong("sim-lost-notification-rate"), help: "Fraction (0–1) of replies not notified.")
    var lostNotificationRate: Double = 0

    @Option(name: .customLong("sim-slow-flash-ms"), help: "Extra flash time per KiB, in milliseconds.")
    var slowFlashMs: Double = 0

    @Option(name: .customLong("sim-flash-bitflip-at"), help: "Rot this flash byte after it is written (verify must reject the image).")
    var flashBitflipAt: Int?

    public func validate() throws {
        for (name, rate) in [("--sim-drop-rate", dropRate), ("--sim-corrupt-rate", corruptRate),
                             ("--sim-gatt-error-rate", gattErrorRate), ("--sim-lost-notification-rate", lostNotificationRate)] {
            guard (0...1).contains(rate) else { throw ValidationError("\(name) must be a fraction between 0 and 1, got \(rate)") }
        }
        guard slowFlashMs >= 0 else { throw ValidationError("--sim-slow-flash-ms must not be negative") }
        for offset in disconnectAt + rebootAt + corruptAt + (flashBitflipAt.map { [$0] } ?? []) where offset < 0 {
            throw ValidationError("fault offsets must not be negative, got \(offset)")
        }
    }

    public var plan: FaultPlan {
        FaultPlan(seed: seed, dropRate: dropRate, disconnectAt: disconnectAt, rebootAt: rebootAt,
                  corruptRate: corruptRate, corruptAt: corruptAt, gattErrorRate: gattErrorRate,
                  lostNotificationRate: lostNotificationRate,
                  slowFlashPerKiB: .microseconds(Int64(slowFlashMs * 1000)), flashBitFlipAt: flashBitflipAt)
    }
}
