import ArgumentParser
import GATT
import OTA
import OTADevice
import OTAWire
import Simulator
import SMP

/// The simulated SMP device (`SMPPeripheral`): a Zephyr SMP server with MCUboot's two slots.
enum SimulatedSMP {
    /// A device with `config`'s address, link, faults and boot delay, two slots of `config`'s slot
    /// size, slot 0 running `config`'s firmware version, and `bufferCount` SMP buffers of
    /// `bufferSize` bytes (Zephyr's default 4 × 384).
    static func device(config: SimulatedDeviceConfig, bufferSize: Int = 384, bufferCount: Int = 4) -> SimulatedDevice {
        SimulatedDevice(config, model: SMPPeripheral(bufferSize: bufferSize, bufferCount: bufferCount, slotSize: config.slotSize,
                                                     firmwareVersion: config.firmwareVersion, faults: config.faults,
                                                     resetDelay: config.bootDelay))
    }
}

/// The simulated SMP device's buffers (`--simulator` with an MCUboot image).
public struct SimulatedSMPOptions: ParsableArguments {
    @Option(name: .customLong("sim-smp-buf-size"), parsing: .unconditional, help: Ranges.smpBufferSize.help("The simulated SMP server's buffer size (MCUmgr buf_size)", valueName: "bytes"))
    var bufferSize = 384

    @Option(name: .customLong("sim-smp-buf-count"), parsing: .unconditional, help: Ranges.smpBufferCount.help("The simulated SMP server's buffer count (MCUmgr buf_count)", valueName: "n"))
    var bufferCount = 4

    public init() {}

    public func validate() throws {
        try Ranges.smpBufferSize.check(bufferSize)
        try Ranges.smpBufferCount.check(bufferCount)
    }
}

extension SimulatedDeviceOptions {
    /// A simulated Zephyr device with an SMP server at `address`, running a confirmed image of
    /// `--sim-firmware-version` (for `image`, `reset` and `echo` with `--simulator`).
    func smpCentral(address: DeviceAddress) -> any GATTCentral {
        SimulatedCentral(devices: [SimulatedSMP.device(config: deviceConfig(address: address))], clock: SystemClock())
    }
}

extension SimulatorOptions {
    /// The simulated device `plan` goes to, with `config`'s address, link and faults: an SMP
    /// server for an MCUboot image, a Secure DFU bootloader (or buttonless application) for a
    /// Nordic package, otherwise a native device.
    func device(for plan: FlashPlan, config: SimulatedDeviceConfig) throws -> SimulatedDevice {
        guard config.hasOTAService else { return SimulatedDevice(config) }
        switch plan.profile {
        case is SMPProfile:
            return SimulatedSMP.device(config: config, bufferSize: smp.bufferSize, bufferCount: smp.bufferCount)
        case is NativeProfile where buttonless == nil:
            return SimulatedDevice(config)
        default:
            return try nordicDevice(config: config, softDeviceAfterUpdate: plan.softDeviceAfterUpdate)
        }
    }
}
