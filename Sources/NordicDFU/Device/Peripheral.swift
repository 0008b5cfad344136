import GATT
import OTADevice

/// A Secure DFU bootloader (`NordicDFUBootloader`) with its GATT table, as the simulator serves
/// it: service 0xFE59 with the control point (write, notify) and the packet characteristic
/// (write without response). Each control point write is answered by a notification at once;
/// after the last EXECUTE the device resets into the new image, away for `resetDuration`.
///
/// Of the fault options it honours `disconnectAt` (firmware offsets: the link drops once when a
/// packet first brings the bank to or past one) and `refuseConnectionsAfter`.
public struct NordicDFUPeripheral: PeripheralModel {
    public private(set) var bootloader: NordicDFUBootloader
    public var faults: FaultPlan
    /// How long the device is away while it resets into a validated image.
    public var resetDuration: Duration
    /// The SoftDevice FWID the bootloader reports once it activated a SoftDevice image (a real
    /// one reads it from the new SoftDevice; the model is told). Nil: unchanged.
    public var softDeviceAfterUpdate: UInt32?
    private var pendingDisconnects: [Int]
    private var awayUntil = Duration.zero

    public init(bootloader: NordicDFUBootloader = NordicDFUBootloader(), faults: FaultPlan = .none,
                resetDuration: Duration = .milliseconds(500), softDeviceAfterUpdate: UInt32? = nil) {
        self.bootloader = bootloader
        self.softDeviceAfterUpdate = softDeviceAfterUpdate
        self.faults = faults
        self.resetDuration = resetDuration
        self.pendingDisconnects = faults.disconnectAt.sorted()
    }

    public var services: [PeripheralService] {
        [PeripheralService(SecureDFUService.serviceUUID, [
            PeripheralCharacteristic(SecureDFUService.controlPointUUID, [.write, .notify]),
            PeripheralCharacteristic(SecureDFUService.packetUUID, [.writeWithoutResponse]),
        ])]
    }

    public var advertisedServices: [BluetoothUUID] { [SecureDFUService.serviceUUID] }
    public var availableAt: Duration { awayUntil }

    public func refusesConnection(after connections: Int) -> Bool {
        faults.refuseConnectionsAfter.map { connections >= $0 } ?? false
    }

    public func read(_ characteristic: BluetoothUUID) -> [UInt8]? { nil }

    public mutating func write(_ bytes: [UInt8], to characteristic: BluetoothUUID, withResponse: Bool,
                               from central: String?, at now: Duration) -> PeripheralWriteResult {
        switch characteristic {
        case SecureDFUService.packetUUID:
            var outputs: [PeripheralTimed] = []
            if let receipt = bootloader.handlePacket(bytes) {
                outputs.append(PeripheralTimed(at: now, .notify(SecureDFUService.controlPointUUID, receipt)))
            }
            if bootloader.currentType == .data, let next = pendingDisconnects.first, bootloader.writeOffset >= next {
                pendingDisconnects.removeAll { $0 <= bootloader.writeOffset }
                outputs.append(PeripheralTimed(at: now, .dropLink(reason: "injected disconnect at offset \(next)")))
            }
            return PeripheralWriteResult(reply: .success(at: now), outputs: outputs, reports: packetReports)
        case SecureDFUService.controlPointUUID where withResponse:
            let before = bootloader
            let response = bootloader.handleControl(bytes)
            var outputs = [PeripheralTimed(at: now, .notify(SecureDFUService.controlPointUUID, response))]
            if bootloader.resetPending {
                bootloader.reset()
                if let type = bootloader.activations.last?.type, type == .softDevice || type == .softDeviceBootloader,
                   let softDevice = softDeviceAfterUpdate {
                    bootloader.config.softDevice = softDevice
                }
                awayUntil = now + resetDuration
                outputs.append(PeripheralTimed(at: now + .milliseconds(5),
                                               .reboot(until: awayUntil, reason: "the bootloader activates the validated image")))
            }
            return PeripheralWriteResult(reply: .success(at: now), outputs: outputs, reports: controlReports(before: before))
        default:
            return PeripheralWriteResult(reply: .failure(.writeNotPermitted, "writing \(characteristic)"), outputs: [])
        }
    }

    public mutating func wake(_ token: UInt64, at now: Duration) -> [PeripheralTimed] { [] }

    public mutating func linkDropped(central: String?) {
        bootloader.linkLost()
    }
}
