import GATT
import OTADevice

/// A Secure DFU device as a whole: it runs its application, which exposes the buttonless
/// characteristic (`NordicButtonlessApp`), until a central writes Enter Bootloader; then it
/// resets and comes up as the bootloader (`NordicDFUPeripheral`) at the address whose least
/// significant octet is one higher (the same address for the bonded variant). Once the
/// bootloader activates an application it resets again and runs it at the original address.
///
/// The device answers at one address at a time (`currentAddress`), which is how the simulator
/// serves a device whose address changes.
public struct NordicButtonlessDevice: PeripheralModel {
    public enum Mode: String, Sendable, Hashable {
        case application, bootloader
    }

    /// The application's address.
    public let address: DeviceAddress
    public private(set) var mode = Mode.application
    public private(set) var app: NordicButtonlessApp
    public private(set) var bootloader: NordicDFUPeripheral
    /// How long the device is away while it resets into its bootloader.
    public var resetDuration: Duration
    /// True: the bootloader never comes up after Enter Bootloader (a device stuck in its reset).
    public var bootloaderNeverAppears: Bool
    private var awayUntil = Duration.zero
    /// The central's link is encrypted with a bond (what the bonded variant requires).
    private var encrypted = false

    /// Where a device that never comes back is available: far past any deadline.
    static let never = Duration.seconds(365 * 86_400)

    public init(address: DeviceAddress, requiresBond: Bool = false, bootloader: NordicDFUPeripheral = NordicDFUPeripheral(),
                enterRefusal: ButtonlessResult? = nil, bootloaderNeverAppears: Bool = false,
                resetDuration: Duration = .milliseconds(500)) {
        self.address = address
        var app = NordicButtonlessApp(address: address.description, requiresBond: requiresBond)
        app.refusal = enterRefusal
        self.app = app
        self.bootloader = bootloader
        self.bootloaderNeverAppears = bootloaderNeverAppears
        self.resetDuration = resetDuration
    }

    public mutating func linkEncrypted(_ encrypted: Bool) { self.encrypted = encrypted }

    /// The address the bootloader answers at.
    public var bootloaderAddress: DeviceAddress {
        app.bootloaderAddress.flatMap(DeviceAddress.init) ?? address
    }

    /// The application image the bootloader most recently activated (nil: the device still runs
    /// the one it came with).
    public var application: [UInt8]? {
        bootloader.bootloader.activations.last { $0.type == .application }?.image
    }

    public var services: [PeripheralService] {
        switch mode {
        case .application:
            [PeripheralService(SecureDFUService.serviceUUID, [PeripheralCharacteristic(app.characteristicUUID, [.write, .indicate])])]
        case .bootloader:
            bootloader.services
        }
    }

    public var advertisedServices: [BluetoothUUID] { [SecureDFUService.serviceUUID] }
    public var availableAt: Duration { max(awayUntil, bootloader.availableAt) }
    public var currentAddress: DeviceAddress? { mode == .application ? address : bootloaderAddress }
    /// The bootloader advertises the name set with opcode 0x02, if any.
    public var advertisedName: String? { mode == .bootloader ? app.advertisingName : nil }

    public func refusesConnection(after connections: Int) -> Bool {
        mode == .bootloader && bootloader.refusesConnection(after: connections)
    }

    public func read(_ characteristic: BluetoothUUID) -> [UInt8]? {
        mode == .bootloader ? bootloader.read(characteristic) : nil
    }

    public mutating func notificationsChanged(_ enabled: Bool, for characteristic: BluetoothUUID) {
        if mode == .application, characteristic == app.characteristicUUID { app.setIndications(enabled) }
    }

    public mutating func write(_ bytes: [UInt8], to characteristic: BluetoothUUID, withResponse: Bool,
                               from central: String?, at now: Duration) -> PeripheralWriteResult {
        guard mode == .application else {
            let result = bootloader.write(bytes, to: characteristic, withResponse: withResponse, from: central, at: now)
            let resets = result.outputs.contains { if case .reboot = $0.output { true } else { false } }
            if resets, bootloader.bootloader.activations.last?.type == .application {
                // The new application runs at the original address, its buttonless service fresh.
                var fresh = NordicButtonlessApp(address: address.description, requiresBond: app.requiresBond)
                fresh.refusal = app.refusal
                app = fresh
                mode = .application
            }
            return result
        }
        guard characteristic == app.characteristicUUID, withResponse else {
            return PeripheralWriteResult(reply: .failure(.writeNotPermitted, "writing \(characteristic)"), outputs: [])
        }
        switch app.handleWrite(bytes, encrypted: encrypted) {
        case .refuse(let error):
            return PeripheralWriteResult(reply: .failure(error, "writing the buttonless characteristic"), outputs: [])
        case .indicate(let indication):
            var outputs = [PeripheralTimed(at: now, .notify(characteristic, indication))]
            if app.enteringBootloader {
                mode = .bootloader
                awayUntil = bootloaderNeverAppears ? Self.never : now + resetDuration
                outputs.append(PeripheralTimed(at: now + .milliseconds(5),
                                               .reboot(until: awayUntil, reason: "the application resets into its bootloader", injected: false)))
            }
            return PeripheralWriteResult(reply: .success(at: now), outputs: outputs)
        }
    }

    public mutating func wake(_ token: UInt64, at now: Duration) -> [PeripheralTimed] {
        mode == .bootloader ? bootloader.wake(token, at: now) : []
    }

    public mutating func linkDropped(central: String?) {
        switch mode {
        case .application: app.setIndications(false)
        case .bootloader: bootloader.linkDropped(central: central)
        }
    }
}
