import ArgumentParser
import GATT
import OTACommandLine
import Simulator

/// How `--sim-buttonless` starts the simulated Secure DFU device: in its application, with the
/// buttonless service, and what it does when asked to enter its bootloader.
public enum SimulatedButtonless: String, CaseIterable, ExpressibleByArgument, Sendable {
    /// 8EC90003: it reboots into its bootloader at the address + 1.
    case unbonded
    /// 8EC90004: it enters its bootloader only for a bonded central.
    case bonded
    /// It answers Enter Bootloader with "operation failed".
    case refusing
    /// It accepts Enter Bootloader, resets, and its bootloader never comes up.
    case lost

    public static let help = "Start the simulated Secure DFU device in its application with the buttonless service: " + kinds

    public static let kinds = "unbonded (8EC90003: it reboots into its bootloader at the address + 1), bonded (8EC90004: only for a bonded central), "
        + "refusing (it answers Enter Bootloader with 'operation failed') or lost (its bootloader never comes up)."

    /// What the simulated device is, for the lines that refuse other protocols' options with it.
    static let device = "buttonless device"
}

/// `flash --simulator`'s start of the simulated Secure DFU device in its application.
public struct SimulatedButtonlessOptions: ParsableArguments, Sendable {
    @Option(name: .customLong("sim-buttonless"), help: ArgumentHelp(SimulatedButtonless.help, valueName: "kind"))
    var buttonless: SimulatedButtonless?

    public init() {}
}

extension SimulatedButtonless {
    /// The device in its application, `bootloader` behind it.
    func device(address: DeviceAddress, bootloader: NordicDFUPeripheral) -> NordicButtonlessDevice {
        NordicButtonlessDevice(address: address, requiresBond: self == .bonded, bootloader: bootloader,
                               enterRefusal: self == .refusing ? .operationFailed : nil, bootloaderNeverAppears: self == .lost)
    }
}

/// The SoftDevice a simulated bootloader runs once it installed `plan`'s: what the package's last
/// image requires, when an image before it is a SoftDevice; nil: unchanged.
func softDeviceInstalled(by plan: FlashPlan?) -> UInt32? {
    let commands = (plan?.parts ?? []).map { part in
        (part.profile as? NordicDFUProfile).flatMap { try? DFUInitPacket(decoding: $0.initPacket).command }
    }
    let installsSoftDevice = commands.dropLast().contains { $0?.type == .softDevice || $0?.type == .softDeviceBootloader }
    return installsSoftDevice ? commands.last??.softDeviceRequirements.first : nil
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
