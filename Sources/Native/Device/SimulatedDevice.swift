import GATT
import OTADevice
import OTAWire
import Simulator

/// What makes a simulated device a native one, beyond the identity, flash and link every
/// simulated device has (`SimulatedDeviceConfig`).
public struct NativeDeviceOptions: Sendable, Hashable {
    /// False: the device does not expose the OTA service (e.g. it runs a firmware without it).
    public var hasOTAService: Bool
    /// Properties of the data characteristic; remove `.writeWithoutResponse` to model a broken table.
    public var dataProperties: CharacteristicProperties
    /// How long a CHECKPOINT ahead of its data is held for it (`DeviceModel.Timing`). Nil, the
    /// default, answers `gap` at once: the simulated link never reorders writes.
    public var holdEarlyCheckpoint: Duration?
    /// A device that speaks protocol version 2 with this flash (erase unit, reorder capacity, erase
    /// and program times); nil, the default, speaks version 1.
    public var version2: OTATarget.Version2?
    /// With `version2`: the C device library runs in lockstep with the Swift model and must answer
    /// alike (`OTATarget.runCLibraryInLockstep`; the divergence is in `target?.lockstepDivergence`).
    public var runsCLibrary: Bool

    public init(hasOTAService: Bool = true, dataProperties: CharacteristicProperties = [.writeWithoutResponse],
                holdEarlyCheckpoint: Duration? = nil, version2: OTATarget.Version2? = nil, runsCLibrary: Bool = false) {
        self.hasOTAService = hasOTAService
        self.dataProperties = dataProperties
        self.holdEarlyCheckpoint = holdEarlyCheckpoint
        self.version2 = version2
        self.runsCLibrary = runsCLibrary
    }
}

extension SimulatedDevice {
    /// A native OTA device: `OTATarget` behind `config`'s faults, with its timing (it boots a new
    /// image `config.bootDelay` after its ACTIVATE reply) and its Device Information Service.
    public convenience init(_ config: SimulatedDeviceConfig, native: NativeDeviceOptions = NativeDeviceOptions()) {
        var target = OTATarget(slotSize: config.slotSize, firmwareVersion: config.firmwareVersion, version2: native.version2)
        if native.runsCLibrary {
            target.deferEarlyCheckpoints = native.holdEarlyCheckpoint != nil
            _ = target.runCLibraryInLockstep()
        }
        self.init(config, native: native, restoring: target)
    }

    /// A native device that continues from a saved state (see `OTATarget.snapshot`), e.g. across
    /// runs of a tool.
    public convenience init(_ config: SimulatedDeviceConfig, native: NativeDeviceOptions = NativeDeviceOptions(),
                            restoring target: OTATarget) {
        let timing = DeviceModel.Timing(holdEarlyCheckpoint: native.holdEarlyCheckpoint, bootDelay: config.bootDelay)
        let model = DeviceModel(device: FaultyDevice(target: target, faults: config.faults), timing: timing)
        self.init(config, model: NativePeripheral(model: model, manufacturer: config.manufacturer, modelNumber: config.model,
                                                  serialNumber: config.serialNumber, hasOTAService: native.hasOTAService,
                                                  dataProperties: native.dataProperties))
    }

    /// The native OTA state machine, for inspection by tests and tools (nil for another protocol's model).
    public var target: OTATarget? { model(as: NativePeripheral.self)?.model.target }

    /// The image most recently activated by the native model, if any.
    public var activatedImage: [UInt8]? { target?.lastActivation?.image }

    /// The firmware version the native model runs (nil for another protocol's model).
    public var firmwareVersion: FirmwareVersion? { target?.firmwareVersion }
}
