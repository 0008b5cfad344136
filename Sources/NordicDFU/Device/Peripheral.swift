import GATT
import OTADevice

/// A Secure DFU bootloader (`NordicDFUBootloader`) with its GATT table, as the simulator serves
/// it: service 0xFE59 with the control point (write, notify) and the packet characteristic
/// (write without response). Each control point write is acknowledged at once and answered by a
/// notification once the flash is idle; after the last EXECUTE the device resets into the new
/// image, away for `resetDuration`.
///
/// It honours the fault options through the same `FaultInjector` the native device draws from,
/// with offsets in firmware bytes (a data packet sits where the bank's write offset stands; the
/// init packet's packets take the rate faults only): dropped and corrupted packets (the bootloader
/// appends what arrives, so only the next receipt's or checksum's CRC shows it), link losses,
/// reboots (the object in progress is lost, the device is away for `FaultPlan.rebootDuration`),
/// a hang (packets ignored, requests acknowledged but never answered), ATT errors on control point
/// writes, lost notifications, slow flash (answers wait for the flash, the last EXECUTE also
/// reads the whole image back), a bank byte that rots before the post-validation, and refused
/// connections.
public struct NordicDFUPeripheral: PeripheralModel {
    public private(set) var bootloader: NordicDFUBootloader
    /// How long the device is away while it resets into a validated image.
    public var resetDuration: Duration
    /// From the last EXECUTE's answer to the reset: time for the answer to go out on the link
    /// (the simulator's `SimulatedDeviceConfig.bootDelay`), as the SDK waits for it.
    public var resetDelay: Duration
    /// The SoftDevice FWID the bootloader reports once it activated a SoftDevice image (a real
    /// one reads it from the new SoftDevice; the model is told). Nil: unchanged.
    public var softDeviceAfterUpdate: UInt32?
    private var injector: FaultInjector
    private var awayUntil = Duration.zero
    /// The flash is busy until then: an answer waits for it.
    private var busyUntil = Duration.zero

    public init(bootloader: NordicDFUBootloader = NordicDFUBootloader(), faults: FaultPlan = .none,
                resetDuration: Duration = .milliseconds(500), resetDelay: Duration = .milliseconds(100),
                softDeviceAfterUpdate: UInt32? = nil) {
        var bootloader = bootloader
        bootloader.flashBitFlipAt = faults.flashBitFlipAt ?? bootloader.flashBitFlipAt
        self.bootloader = bootloader
        self.softDeviceAfterUpdate = softDeviceAfterUpdate
        self.injector = FaultInjector(faults)
        self.resetDuration = resetDuration
        self.resetDelay = resetDelay
    }

    /// The faults still to come (offset faults that fired are gone).
    public var faults: FaultPlan { injector.plan }
    /// The device hung (`FaultPlan.stopAnsweringAt`).
    public var silent: Bool { injector.silent }

    public var services: [PeripheralService] {
        [PeripheralService(SecureDFUService.serviceUUID, [
            PeripheralCharacteristic(SecureDFUService.controlPointUUID, [.write, .notify]),
            PeripheralCharacteristic(SecureDFUService.packetUUID, [.writeWithoutResponse]),
        ])]
    }

    public var advertisedServices: [BluetoothUUID] { [SecureDFUService.serviceUUID] }
    public var availableAt: Duration { awayUntil }

    public func refusesConnection(after connections: Int) -> Bool {
        injector.refusesConnection(after: connections)
    }

    public func read(_ characteristic: BluetoothUUID) -> [UInt8]? { nil }

    public mutating func write(_ bytes: [UInt8], to characteristic: BluetoothUUID, withResponse: Bool,
                               from central: String?, at now: Duration) -> PeripheralWriteResult {
        switch characteristic {
        case SecureDFUService.packetUUID:
            let outputs = packet(bytes, at: now)
            return PeripheralWriteResult(reply: .success(at: now), outputs: outputs, reports: packetReports)
        case SecureDFUService.controlPointUUID where withResponse:
            guard now >= awayUntil else { return PeripheralWriteResult(reply: .away, outputs: []) }
            if injector.silent { return PeripheralWriteResult(reply: .success(at: now), outputs: []) }
            if injector.refusesCommand() {
                return PeripheralWriteResult(reply: .failure(.unlikelyError, "writing the DFU control point"), outputs: [],
                                             reports: [.note("injected fault: control point write answered with an ATT error")])
            }
            let before = bootloader
            let (outputs, notified) = request(bytes, at: now)
            var reports = controlReports(before: before)
            if !notified {
                reports.append(.note("injected fault: the answer to \(DFUOpcode(rawValue: bytes.first ?? 0)) is not notified"))
            }
            return PeripheralWriteResult(reply: .success(at: now), outputs: outputs, reports: reports)
        default:
            return PeripheralWriteResult(reply: .failure(.writeNotPermitted, "writing \(characteristic)"), outputs: [])
        }
    }

    /// A packet write: the faults decide what arrives; a receipt goes out once the flash took it.
    private mutating func packet(_ bytes: [UInt8], at now: Duration) -> [PeripheralTimed] {
        guard now >= awayUntil else { return [] }
        let offset = bootloader.currentType == .data && bootloader.dataObjectSize > 0 ? bootloader.writeOffset : nil
        var bytes = bytes
        switch injector.packet(at: offset, count: bytes.count) {
        case .dropped: return []
        case .disconnect(let reason): return [PeripheralTimed(at: now, .dropLink(reason: reason))]
        case .corrupt(let index, let mask): bytes[index] ^= mask
        case .deliver: break
        }
        busyUntil = max(busyUntil, now) + injector.flashTime(bytes: bytes.count)
        var outputs: [PeripheralTimed] = []
        if let receipt = bootloader.handlePacket(bytes), !injector.losesNotification() {
            outputs.append(PeripheralTimed(at: busyUntil, .notify(SecureDFUService.controlPointUUID, receipt)))
        }
        if injector.rebootsAfterPacket(at: offset, count: bytes.count) {
            bootloader.reset()
            awayUntil = now + injector.plan.rebootDuration
            outputs.append(PeripheralTimed(at: now, .reboot(until: awayUntil, reason: "device rebooted at offset \(offset ?? 0)")))
        }
        return outputs
    }

    /// A control point request: answered once the flash is idle (the last EXECUTE also reads the
    /// whole image back for its hash); a validated image is activated and the device resets.
    private mutating func request(_ bytes: [UInt8], at now: Duration) -> (outputs: [PeripheralTimed], notified: Bool) {
        var ready = max(busyUntil, now)
        if bytes.first == DFUOpcode.execute.rawValue, bootloader.currentType == .data {
            ready += injector.flashTime(bytes: bootloader.writeOffset)
        }
        busyUntil = ready
        let response = bootloader.handleControl(bytes)
        var outputs: [PeripheralTimed] = []
        // `--sim-lose-final-answer`: the bootloader's disconnect as it resets overtakes the last
        // EXECUTE's answer (nRF5 SDK 15.3 `nrf_dfu_req_handler.c` answers, then resets).
        let lostFinal = injector.plan.loseFinalAnswer && bootloader.resetPending
        let notified = !injector.losesNotification() && !lostFinal
        if notified {
            outputs.append(PeripheralTimed(at: ready, .notify(SecureDFUService.controlPointUUID, response)))
        }
        if bootloader.resetPending {
            bootloader.reset()
            if let type = bootloader.activations.last?.type, type == .softDevice || type == .softDeviceBootloader,
               let softDevice = softDeviceAfterUpdate {
                bootloader.config.softDevice = softDevice
            }
            let resetAt = ready + resetDelay
            awayUntil = resetAt + resetDuration
            outputs.append(PeripheralTimed(at: resetAt, .reboot(until: awayUntil, reason: "the bootloader activates the validated image", injected: false)))
        }
        return (outputs, notified)
    }

    public mutating func wake(_ token: UInt64, at now: Duration) -> [PeripheralTimed] { [] }

    public mutating func linkDropped(central: String?) {
        bootloader.linkLost()
    }
}
