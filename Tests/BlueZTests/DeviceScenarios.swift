import BlueZ
import DBus
import Foundation
import GATT
import Native
import OTA
import OTADevice
import OTAWire
import Simulator
import Synchronization
import TestSupport
import Testing

/// The two transports that carry the one device model: the in-process simulator and peripheral
/// mode (`OTAPeripheral` on a private bus, with a stand-in bluetoothd acting for the central).
enum DeviceTransport: String, CaseIterable, Sendable, CustomTestStringConvertible {
    case simulator
    case peripheral

    var testDescription: String { rawValue }
}

/// What a central sees of a device, in order.
enum Happening: Sendable, Equatable {
    case notification([UInt8])
    case linkDropped
}

/// A device as a central drives it, through either transport; errors are what the central's
/// transport reports (`GATTError`), so a test can check how the central classifies them.
protocol DeviceUnderTest: Sendable {
    /// Connects (again) and enables notifications on the control point, within `timeout`.
    func connect(timeout: Duration) async throws
    /// Writes a control point command with response.
    func command(_ request: ControlRequest) async throws
    /// Writes `payload` at `offset` to the data characteristic without response.
    func data(offset: Int, _ payload: ArraySlice<UInt8>) async throws
    func readInfo() async throws -> DeviceInfo
    /// The central leaves.
    func disconnect() async throws
    /// The next notification or link loss, or nil when nothing happens within `timeout`.
    func next(within timeout: Duration) async -> Happening?
}

/// The simulator on virtual time: waits cost no wall time.
actor SimulatorUnderTest: DeviceUnderTest {
    let device: SimulatedDevice
    let central: SimulatedCentral
    let clock = VirtualClock()
    private var connection: (any GATTConnection)?
    private var controlPoint: GATTCharacteristic?
    private var dataCharacteristic: GATTCharacteristic?
    private var infoCharacteristic: GATTCharacteristic?

    init(faults: FaultPlan, holdEarlyCheckpoint: Duration? = nil) {
        device = SimulatedDevice(SimulatedDeviceConfig(faults: faults), native: NativeDeviceOptions(holdEarlyCheckpoint: holdEarlyCheckpoint))
        central = SimulatedCentral(devices: [device], clock: clock)
    }

    func connect(timeout: Duration) async throws {
        let connection = try await central.connect(to: device.config.address, timeout: timeout)
        let service = try await connection.discoverService(OTAProtocol.serviceUUID, name: "OTA")
        controlPoint = service.characteristics.first { $0.uuid == OTAProtocol.controlPointUUID }
        dataCharacteristic = service.characteristics.first { $0.uuid == OTAProtocol.dataUUID }
        infoCharacteristic = service.characteristics.first { $0.uuid == OTAProtocol.infoUUID }
        try await connection.setNotifications(true, for: controlPoint!)
        self.connection = connection
    }

    private func linked() throws -> any GATTConnection {
        guard let connection else { throw HarnessError("not connected") }
        return connection
    }

    func command(_ request: ControlRequest) async throws {
        try await linked().write(request.encoded, to: controlPoint!, type: .withResponse)
    }

    func data(offset: Int, _ payload: ArraySlice<UInt8>) async throws {
        try await linked().write(DataPacket.encode(offset: UInt32(offset), payload: payload), to: dataCharacteristic!, type: .withoutResponse)
    }

    func readInfo() async throws -> DeviceInfo {
        try DeviceInfo(decoding: try await linked().read(infoCharacteristic!))
    }

    func disconnect() async throws {
        await connection?.disconnect()
        _ = await next(within: .seconds(1))  // the local disconnect's own event
        connection = nil
    }

    func next(within timeout: Duration) async -> Happening? {
        guard let connection else { return nil }
        let deadline = clock.now + timeout
        while clock.now < deadline {
            switch await connection.nextEvent(timeout: deadline - clock.now) {
            case .notification(_, let value)?: return .notification(value)
            case .disconnected?: return .linkDropped
            case .writeCompleted?, .stackPairing?: continue
            case nil: return nil
            }
        }
        return nil
    }
}

/// What the stand-in bluetoothd saw, in arrival order, with a wait that ends on a change or a
/// deadline (no polling).
final class Timeline: Sendable {
    enum Entry: Sendable, Equatable {
        case happening(Happening)
        case advertising(Bool)
    }

    private let state = Mutex<(entries: [Entry], waiter: CheckedContinuation<Void, Never>?)>(([], nil))

    var entries: [Entry] { state.withLock { $0.entries } }

    func append(_ entry: Entry) {
        state.withLock { s in
            s.entries.append(entry)
            return s.waiter.take()
        }?.resume()
    }

    private func kick() {
        state.withLock { $0.waiter.take() }?.resume()
    }

    /// Waits until `ready(entries)` holds or `timeout` passes; returns whether it holds.
    func wait(timeout: Duration, until ready: @escaping @Sendable ([Entry]) -> Bool) async -> Bool {
        let deadline = ContinuousClock.now + timeout
        let timer = Task { [weak self] in
            try? await Task.sleep(until: deadline, clock: .continuous)
            self?.kick()
        }
        defer { timer.cancel() }
        while true {
            var outcome: Bool?
            await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                state.withLock { s in
                    if ready(s.entries) {
                        outcome = true
                    } else if ContinuousClock.now >= deadline {
                        outcome = false
                    } else {
                        s.waiter = continuation
                        return
                    }
                    continuation.resume()
                }
            }
            if let outcome { return outcome }
        }
    }
}

/// Peripheral mode on a private bus. The stand-in bluetoothd acts for one central: it writes and
/// reads as bluetoothd does on the central's behalf, announces the central's connection through
/// `Device1.Connected`, and connects only while the device advertises (an LE peripheral accepts a
/// connection only in answer to its connectable advertising).
actor PeripheralUnderTest: DeviceUnderTest {
    let fake: FakeBlueZPeripheralSide
    let served: ProcessBusSuites.PeripheralTests.Served
    let central: String
    let timeline = Timeline()
    private var cursor = 0
    /// Links the stand-in had dropped when the central last connected: one dropped since means
    /// the central's link is down.
    private var dropsAtConnect = 0
    private var consumers: [Task<Void, Never>] = []

    init(fake: FakeBlueZPeripheralSide, served: ProcessBusSuites.PeripheralTests.Served, central: String) async throws {
        self.fake = fake
        self.served = served
        self.central = central
        let notifications = try await fake.startNotify(OTAProtocol.controlPointUUID)
        let timeline = self.timeline
        let drops = DropCounter(fake: fake, central: central, timeline: timeline)
        consumers = [
            Task {
                for await value in notifications {
                    // A drop the stand-in handled before this notification came is ordered first.
                    drops.sync()
                    timeline.append(.happening(.notification(value)))
                }
            },
            Task {
                for await call in fake.callStream {
                    if call.hasPrefix("Disconnect ") { drops.sync() }
                    if call.hasPrefix("RegisterAdvertisement ") { timeline.append(.advertising(true)) }
                    if call.hasPrefix("UnregisterAdvertisement ") { timeline.append(.advertising(false)) }
                }
            },
        ]
    }

    /// Turns the stand-in's log of `Device1.Disconnect` calls into `linkDropped` entries, once each.
    final class DropCounter: Sendable {
        let fake: FakeBlueZPeripheralSide
        let central: String
        let timeline: Timeline
        private let recorded = Mutex(0)

        init(fake: FakeBlueZPeripheralSide, central: String, timeline: Timeline) {
            self.fake = fake
            self.central = central
            self.timeline = timeline
        }

        var logged: Int { fake.calls.filter { $0 == "Disconnect \(central)" }.count }

        func sync() {
            recorded.withLock { count in
                while count < logged {
                    count += 1
                    timeline.append(.happening(.linkDropped))
                }
            }
        }
    }

    func close() {
        for task in consumers { task.cancel() }
    }

    func connect(timeout: Duration) async throws {
        let advertises = await timeline.wait(timeout: timeout) { entries in
            entries.reversed().lazy.compactMap { if case .advertising(let on) = $0 { on } else { nil } }.first ?? false
        }
        guard advertises else {
            throw GATTError(.connectFailed, "connecting to the served device failed: it did not advertise within \(timeout)")
        }
        try await announceConnection()
    }

    /// bluetoothd reports the central connected (`Device1.Connected` = true), advertising or not.
    /// Waits until the served device is back from its reboot.
    func waitUntilBack() async { await served.peripheral.waitUntilBack() }

    func announceConnection() async throws {
        dropsAtConnect = drops
        try await fake.connection.updateProperty(path: central, interface: "org.bluez.Device1", name: "Connected", value: .bool(true))
    }

    func disconnect() async throws {
        try await fake.connection.updateProperty(path: central, interface: "org.bluez.Device1", name: "Connected", value: .bool(false))
        try await served.events.waitFor(.disconnected(central: central, reason: "the central disconnected"))
    }

    private var drops: Int { fake.calls.filter { $0 == "Disconnect \(central)" }.count }

    /// Runs one call on the central's behalf and maps a failure as the central does
    /// (CentralConnection.gattCall): a call that fails once the link is down is `notConnected`.
    private func asCentral<T: Sendable>(_ operation: String, _ body: () async throws -> T) async throws -> T {
        do {
            return try await body()
        } catch {
            if drops > dropsAtConnect {
                throw GATTError(.notConnected, "\(operation): the device is not connected")
            }
            throw GATTError(.failed, "\(operation) failed: \(error)")
        }
    }

    func command(_ request: ControlRequest) async throws {
        try await asCentral("writing the control point") {
            try await fake.write(OTAProtocol.controlPointUUID, request.encoded, device: central)
        }
    }

    func data(offset: Int, _ payload: ArraySlice<UInt8>) async throws {
        try await asCentral("writing data") {
            try await fake.write(OTAProtocol.dataUUID, DataPacket.encode(offset: UInt32(offset), payload: payload), device: central)
        }
    }

    func readInfo() async throws -> DeviceInfo {
        let bytes = try await asCentral("reading the info characteristic") { try await fake.read(OTAProtocol.infoUUID, device: central) }
        return try DeviceInfo(decoding: bytes)
    }

    func next(within timeout: Duration) async -> Happening? {
        let from = cursor
        let found = await timeline.wait(timeout: timeout) { entries in
            entries.dropFirst(from).contains { if case .happening = $0 { true } else { false } }
        }
        guard found else {
            cursor = max(cursor, timeline.entries.count)
            return nil
        }
        let entries = timeline.entries
        for i in from..<entries.count {
            if case .happening(let happening) = entries[i] {
                cursor = i + 1
                return happening
            }
        }
        return nil
    }
}

extension ProcessBusSuites.PeripheralTests {
    /// Runs `body` against a fresh device on `transport`. `bootDelay` is peripheral mode's (the
    /// simulator boots two connection intervals after its reply).
    static func withDevice(_ transport: DeviceTransport, faults: FaultPlan, holdEarlyCheckpoint: Duration? = nil,
                           bootDelay: Duration = .milliseconds(200),
                           _ body: (any DeviceUnderTest) async throws -> Void) async throws {
        switch transport {
        case .simulator:
            try await body(SimulatorUnderTest(faults: faults, holdEarlyCheckpoint: holdEarlyCheckpoint))
        case .peripheral:
            try await withBus { bus in
                let fake = try await FakeBlueZPeripheralSide.start(on: bus, devices: [centralA])
                var config = OTAPeripheralConfig(name: "scenario", faults: faults, bootDelay: bootDelay)
                if let holdEarlyCheckpoint { config.holdEarlyCheckpoint = holdEarlyCheckpoint }
                let served = try await serve(bus, config: config)
                let device = try await PeripheralUnderTest(fake: fake, served: served, central: centralA)
                do {
                    try await body(device)
                } catch {
                    await device.close()
                    await served.peripheral.stop()
                    await served.host.close()
                    await fake.connection.close()
                    throw error
                }
                await device.close()
                await served.peripheral.stop()
                await served.host.close()
                await fake.connection.close()
            }
        }
    }
}
