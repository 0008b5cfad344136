import GATT
import OTADevice
import OTAWire

/// How `otaflash simulate` presents itself.
public struct OTAPeripheralConfig: Sendable {
    public var name: String
    public var slotSize: Int
    public var firmwareVersion: FirmwareVersion
    public var faults: FaultPlan
    /// Device Information Service strings (0x2A29, 0x2A24).
    public var manufacturer: String
    public var model: String
    /// Where verified-and-activated images are written as `<crc32>.bin`; nil keeps none.
    public var storeDirectory: String?
    /// How long after its ACTIVATE reply the device drops the link to boot the new image.
    public var bootDelay: Duration
    /// How long a CHECKPOINT that overtook its data is held for it before it is answered `gap`.
    public var holdEarlyCheckpoint: Duration
    /// Called with one line per read and write and what became of it (debugging).
    public var trace: (@Sendable (String) -> Void)?
    /// A device that speaks protocol version 2 with this flash; nil, the default, speaks version 1.
    public var version2: OTATarget.Version2?
    /// With `version2`: the C device library runs in lockstep with the Swift model
    /// (`OTATarget.runCLibraryInLockstep`); `OTAPeripheral.lockstepDivergence` has the first difference.
    public var runsCLibrary = false

    public init(name: String = "otaflash-sim", slotSize: Int = 1 << 20,
                firmwareVersion: FirmwareVersion = FirmwareVersion(major: 1, minor: 0, patch: 0),
                faults: FaultPlan = .none, manufacturer: String = "otaflash", model: String = "otaflash simulate",
                storeDirectory: String? = nil, bootDelay: Duration = .milliseconds(300),
                holdEarlyCheckpoint: Duration = .milliseconds(300), trace: (@Sendable (String) -> Void)? = nil) {
        self.name = name
        self.slotSize = slotSize
        self.firmwareVersion = firmwareVersion
        self.faults = faults
        self.manufacturer = manufacturer
        self.model = model
        self.storeDirectory = storeDirectory
        self.bootDelay = bootDelay
        self.holdEarlyCheckpoint = holdEarlyCheckpoint
        self.trace = trace
    }
}

extension OTAPeripheralConfig {
    /// The native OTA device this configuration describes: an `OTATarget` behind a `FaultPlan`,
    /// with its timing, and its Device Information Service strings.
    public var nativeModel: NativePeripheral {
        var target = OTATarget(slotSize: slotSize, firmwareVersion: firmwareVersion, version2: version2)
        if runsCLibrary {
            // The C library holds an early CHECKPOINT as the model does (300 ms).
            target.deferEarlyCheckpoints = true
            _ = target.runCLibraryInLockstep()
        }
        // Through BlueZ a CHECKPOINT can overtake its data (EATT bearers, a central's write socket
        // beside D-Bus): hold it for the data rather than answer `gap` at once.
        let timing = DeviceModel.Timing(holdEarlyCheckpoint: holdEarlyCheckpoint, bootDelay: bootDelay)
        return NativePeripheral(model: DeviceModel(device: FaultyDevice(target: target, faults: faults), timing: timing),
                                manufacturer: manufacturer, modelNumber: model)
    }
}
