import GATT
import OTADevice
import OTAWire

/// The native OTA device (`DeviceModel`) with its GATT table: the OTA service and the Device
/// Information Service.
public struct NativePeripheral: PeripheralModel {
    public private(set) var model: DeviceModel
    public var manufacturer: String
    public var modelNumber: String
    /// The Device Information Service's serial number, when the device has one.
    public var serialNumber: String?
    /// False: the device does not expose the OTA service (e.g. it runs a firmware without it).
    public var hasOTAService: Bool
    /// Properties of the data characteristic; remove `.writeWithoutResponse` to model a broken table.
    public var dataProperties: CharacteristicProperties
    /// Each data packet carries its offset (docs/PROTOCOL.md, "Data characteristic").
    public var writesCarryTheirPlace: Bool { true }
    public var runsLockstep: Bool { model.target.runsCLibrary }
    public var lockstepDivergence: String? { model.target.lockstepDivergence }
    public var busyError: ATTError { ATTError(rawValue: 0x80 | OTAStatus.busy.rawValue) }

    public init(model: DeviceModel, manufacturer: String, modelNumber: String, serialNumber: String? = nil, hasOTAService: Bool = true,
                dataProperties: CharacteristicProperties = [.writeWithoutResponse]) {
        self.model = model
        self.manufacturer = manufacturer
        self.modelNumber = modelNumber
        self.serialNumber = serialNumber
        self.hasOTAService = hasOTAService
        self.dataProperties = dataProperties
    }

    public var services: [PeripheralService] {
        var out: [PeripheralService] = []
        if hasOTAService {
            out.append(PeripheralService(OTAProtocol.serviceUUID, [
                PeripheralCharacteristic(OTAProtocol.controlPointUUID, [.write, .notify]),
                PeripheralCharacteristic(OTAProtocol.dataUUID, dataProperties),
                PeripheralCharacteristic(OTAProtocol.infoUUID, [.read]),
            ]))
        }
        out.append(PeripheralService(DeviceInformationService.serviceUUID, [
            PeripheralCharacteristic(DeviceInformationService.manufacturerNameUUID, [.read]),
            PeripheralCharacteristic(DeviceInformationService.modelNumberUUID, [.read]),
            PeripheralCharacteristic(DeviceInformationService.firmwareRevisionUUID, [.read]),
        ] + (serialNumber == nil ? [] : [PeripheralCharacteristic(DeviceInformationService.serialNumberUUID, [.read])])))
        return out
    }

    public var advertisedServices: [BluetoothUUID] { hasOTAService ? [OTAProtocol.serviceUUID] : [] }
    public var availableAt: Duration { model.availableAt }

    public func refusesConnection(after connections: Int) -> Bool {
        model.device.refusesConnection(after: connections)
    }

    public func read(_ characteristic: BluetoothUUID) -> [UInt8]? {
        switch characteristic {
        case OTAProtocol.infoUUID where hasOTAService: model.target.info.encoded
        case DeviceInformationService.manufacturerNameUUID: Array(manufacturer.utf8)
        case DeviceInformationService.modelNumberUUID: Array(modelNumber.utf8)
        case DeviceInformationService.firmwareRevisionUUID: Array(model.target.firmwareVersion.description.utf8)
        case DeviceInformationService.serialNumberUUID: serialNumber.map { Array($0.utf8) }
        default: nil
        }
    }

    public mutating func write(_ bytes: [UInt8], to characteristic: BluetoothUUID, withResponse: Bool,
                               from central: String?, at now: Duration) -> PeripheralWriteResult {
        if characteristic == OTAProtocol.dataUUID, hasOTAService {
            guard withResponse else {
                let outputs = model.receiveData(bytes, from: central, at: now)
                return PeripheralWriteResult(reply: .success(at: now), outputs: outputs, reports: progress)
            }
            let (acknowledged, outputs) = model.receiveAcknowledgedData(bytes, at: now)
            return PeripheralWriteResult(reply: .success(at: acknowledged), outputs: outputs, reports: progress)
        }
        guard withResponse else { return PeripheralWriteResult(reply: .success(at: now), outputs: []) }
        guard characteristic == OTAProtocol.controlPointUUID, hasOTAService else {
            return PeripheralWriteResult(reply: .failure(.writeNotPermitted, "writing \(characteristic)"), outputs: [])
        }
        let result = model.receiveCommand(bytes, from: central, at: now)
        let reply: PeripheralReply
        var reports: [PeripheralReport] = []
        switch result.reply {
        case .success(let at):
            reply = .success(at: at)
            reports = commandReports(bytes.first.flatMap(OTAOpcode.init(rawValue:)), result)
        case .injectedError:
            reply = .failure(.unlikelyError, "writing the control point")
            reports = [.note("injected fault: control point write answered with an ATT error")]
        case .busy(let owner):
            reply = .failure(busyError, "writing the control point")
            reports = [.busy(owner: owner)]
        case .away:
            reply = .away
        }
        return PeripheralWriteResult(reply: reply, outputs: result.outputs, reports: reports)
    }

    /// The transfer's progress after a data write.
    private var progress: [PeripheralReport] {
        guard let pending = model.target.pending else { return [] }
        return [.progress(received: model.target.received, total: Int(pending.imageSize))]
    }

    /// What a handled command did: a transfer began, the image verified, an image activated.
    private func commandReports(_ opcode: OTAOpcode?, _ result: DeviceModel.CommandResult) -> [PeripheralReport] {
        var reports: [PeripheralReport] = []
        let target = model.target
        let status = result.response.count >= 3 ? OTAStatus(rawValue: result.response[2]) : nil
        if status == .success {
            switch opcode {
            case .begin?:
                if let pending = target.pending {
                    reports.append(.begin(size: Int(pending.imageSize), crc: pending.imageCRC, offset: target.received))
                }
            case .verify?:
                reports.append(.verified(crc: target.pending?.imageCRC))
            default:
                break
            }
        }
        if result.activated, let activation = target.lastActivation {
            reports.append(.activated(image: activation.image, version: activation.version.description))
        }
        if result.notificationLost {
            reports.append(.note("injected fault: the reply to \(opcode.map { "\($0)" } ?? "a command") is not notified"))
        }
        return reports
    }

    public func isAway(at now: Duration) -> Bool { model.isAway(at: now) }

    public func describe(_ bytes: [UInt8], to characteristic: BluetoothUUID) -> String {
        guard characteristic == OTAProtocol.dataUUID else { return "\(bytes.count) B" }
        let packet = DataPacket.decode(bytes).map { "offset \($0.offset) +\($0.payload.count)" } ?? "\(bytes.count) B, malformed"
        return "\(packet), received \(model.target.received)"
    }

    public mutating func wake(_ token: UInt64, at now: Duration) -> [PeripheralTimed] {
        model.wake(token, at: now)
    }

    public mutating func linkDropped(central: String?) {
        model.linkDropped(central: central)
    }
}
