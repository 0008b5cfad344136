import ArgumentParser
import GATT
import Native
import NordicDFU
import Simulator

/// How `--sim-buttonless` starts the simulated Secure DFU device: in its application, with the
/// buttonless service, and what it does when asked to enter its bootloader.
enum SimulatedButtonless: String, CaseIterable, ExpressibleByArgument {
    /// 8EC90003: it reboots into its bootloader at the address + 1.
    case unbonded
    /// 8EC90004: it enters its bootloader only for a bonded central.
    case bonded
    /// It answers Enter Bootloader with "operation failed".
    case refusing
    /// It accepts Enter Bootloader, resets, and its bootloader never comes up.
    case lost

    static let help = "Start the simulated Secure DFU device in its application with the buttonless service: " + kinds

    static let kinds = "unbonded (8EC90003: it reboots into its bootloader at the address + 1), bonded (8EC90004: only for a bonded central), "
        + "refusing (it answers Enter Bootloader with 'operation failed') or lost (its bootloader never comes up)."

    /// The device in its application, `bootloader` behind it.
    func device(address: DeviceAddress, bootloader: NordicDFUPeripheral) -> NordicButtonlessDevice {
        NordicButtonlessDevice(address: address, requiresBond: self == .bonded, bootloader: bootloader,
                               enterRefusal: self == .refusing ? .operationFailed : nil, bootloaderNeverAppears: self == .lost)
    }
}

extension SimulatorOptions {
    /// A Secure DFU device with `config`'s address, faults and boot delay, its bank the size of
    /// `config`'s slot.
    func nordicDevice(config: SimulatedDeviceConfig, softDeviceAfterUpdate: UInt32?) throws -> SimulatedDevice {
        let address = config.address
        let settings = try secureDFU.bootloaderConfig(bankSize: config.slotSize)
        let bootloader = NordicDFUPeripheral(bootloader: NordicDFUBootloader(config: settings), faults: config.faults,
                                             resetDelay: config.bootDelay, softDeviceAfterUpdate: softDeviceAfterUpdate)
        guard let kind = buttonless else {
            return SimulatedDevice(config, model: bootloader)
        }
        return SimulatedDevice(config, model: kind.device(address: address, bootloader: bootloader))
    }
}
