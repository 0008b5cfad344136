import OTADevice
import SMP
import Simulator

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
