import GATT
import OTACommandLine
import Simulator

extension SimulatedButtonless {
    /// The device in its application, `bootloader` behind it.
    func device(address: DeviceAddress, bootloader: NordicDFUPeripheral) -> NordicButtonlessDevice {
        NordicButtonlessDevice(address: address, requiresBond: self == .bonded, bootloader: bootloader,
                               enterRefusal: self == .refusing ? .operationFailed : nil, bootloaderNeverAppears: self == .lost)
    }
}

/// A Secure DFU device with `config`'s address, faults and boot delay, its bank the size of
/// `config`'s slot, the bootloader `options` describe (default: nrfutil's defaults), in front of
/// its application with the buttonless service when `buttonless` says so.
func simulatedSecureDFUDevice(config: SimulatedDeviceConfig, options: SecureDFUSimulatorOptions?, buttonless: SimulatedButtonless?,
                              softDeviceAfterUpdate: UInt32?) throws -> SimulatedDevice {
    var settings = NordicDFUBootloader.Config()
    settings.bankSize = config.slotSize
    if let options { settings = try options.bootloaderConfig(bankSize: config.slotSize) }
    let bootloader = NordicDFUPeripheral(bootloader: NordicDFUBootloader(config: settings), faults: config.faults,
                                         resetDelay: config.bootDelay, softDeviceAfterUpdate: softDeviceAfterUpdate)
    guard let kind = buttonless else {
        return SimulatedDevice(config, model: bootloader)
    }
    return SimulatedDevice(config, model: kind.device(address: config.address, bootloader: bootloader))
}
