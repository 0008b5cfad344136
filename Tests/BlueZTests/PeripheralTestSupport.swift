import BlueZ
import DBus
import Foundation
import GATT
import Synchronization
import TestSupport
import Testing

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// The peripheral tests' private bus (Tests/TestSupport/PrivateBus.swift).
typealias PeripheralTestBus = PrivateBus

extension PeripheralTestBus {
    /// A private bus for a peripheral test: skipped with the reason without dbus-daemon, failed
    /// when the peripheral suite is required (`Prerequisites`).
    static func start() throws -> PeripheralTestBus { try start(for: .peripheral) }
}


/// The next element of `stream`, or `TimedOut` after `timeout`.
func peripheralNext<T: Sendable>(_ stream: AsyncStream<T>, timeout: Duration = .seconds(5)) async throws -> T? {
    try await nextElement(stream, timeout: timeout)
}

/// A stand-in for bluetoothd on the private bus: owns `org.bluez`, lists adapters at `/`, and
/// implements what peripheral mode calls — `GattManager1.RegisterApplication` (which, as BlueZ
/// does, reads the application's objects with `GetManagedObjects` before replying),
/// `LEAdvertisingManager1.RegisterAdvertisement` (reads the advertisement's properties),
/// their Unregister methods, `Device1.Disconnect` and `Adapter1.Powered`.
final class FakeBlueZPeripheralSide: Sendable {
    let connection: DBusConnection
    let adapter: String
    struct State {
        var applicationOwner: String?
        var applicationRoot: String?
        var tree: DBusManagedObjects = [:]
        var advertisement: [String: DBusValue] = [:]
        var calls: [String] = []
    }
    let state = Mutex(State())
    /// Every call the stand-in logs, in order (one consumer at a time, `waitForCall` included).
    let callStream: AsyncStream<String>
    private let callContinuation: AsyncStream<String>.Continuation

    var adapterPath: String { "/org/bluez/\(adapter)" }

    /// - Parameters:
    ///   - registerError: the error RegisterApplication answers with, if any.
    private init(connection: DBusConnection, adapter: String) {
        self.connection = connection
        self.adapter = adapter
        (callStream, callContinuation) = AsyncStream.makeStream(of: String.self)
    }

    static func start(on bus: PeripheralTestBus, adapter: String = "hci0", powered: Bool = true,
                      devices: [String] = [], registerError: DBusError? = nil) async throws -> FakeBlueZPeripheralSide {
        let connection = try await bus.connect()
        let fake = FakeBlueZPeripheralSide(connection: connection, adapter: adapter)
        let adapterPath = fake.adapterPath
        try await connection.addObjectManager(at: "/")
        try await connection.export(path: adapterPath, interfaces: [
            DBusInterface(name: "org.bluez.Adapter1", properties: [
                "Address": .string("00:AA:01:00:00:01"), "Powered": .bool(powered), "Name": .string("fake"),
            ], writableProperties: ["Powered"], propertySetter: { name, value in
                fake.log("Powered=\(value.bool.map { "\($0)" } ?? "?")")
            }),
            DBusInterface(name: "org.bluez.GattManager1", methods: [
                "RegisterApplication": { call in
                    guard let root = call.arguments.first?.objectPath, let sender = call.sender else {
                        throw DBusError(name: "org.bluez.Error.InvalidArguments", message: "expected (o, a{sv})")
                    }
                    fake.log("RegisterApplication \(root)")
                    if let registerError { throw registerError }
                    let tree = try await connection.getManagedObjects(destination: sender, path: root, timeout: .seconds(5))
                    fake.state.withLock {
                        $0.applicationOwner = sender
                        $0.applicationRoot = root
                        $0.tree = tree
                    }
                    return []
                },
                "UnregisterApplication": { call in
                    fake.log("UnregisterApplication \(call.arguments.first?.objectPath ?? "?")")
                    return []
                },
            ]),
            DBusInterface(name: "org.bluez.LEAdvertisingManager1", methods: [
                "RegisterAdvertisement": { call in
                    guard let path = call.arguments.first?.objectPath, let sender = call.sender else {
                        throw DBusError(name: "org.bluez.Error.InvalidArguments", message: "expected (o, a{sv})")
                    }
                    fake.log("RegisterAdvertisement \(path)")
                    let properties = try await connection.getAllProperties(
                        destination: sender, path: path, interface: "org.bluez.LEAdvertisement1", timeout: .seconds(5))
                    fake.state.withLock { $0.advertisement = properties }
                    return []
                },
                "UnregisterAdvertisement": { call in
                    fake.log("UnregisterAdvertisement \(call.arguments.first?.objectPath ?? "?")")
                    return []
                },
            ]),
        ])
        for device in devices {
            try await connection.export(path: device, interfaces: [
                DBusInterface(name: "org.bluez.Device1", methods: [
                    "Disconnect": { call in
                        fake.log("Disconnect \(call.path)")
                        return []
                    },
                ], properties: ["Connected": .bool(true)]),
            ])
        }
        _ = try await connection.requestName("org.bluez")
        return fake
    }

    func log(_ line: String) {
        state.withLock { $0.calls.append(line) }
        callContinuation.yield(line)
    }

    /// Waits until the stand-in has logged `line` (one consumer at a time), at most `timeout`.
    func waitForCall(_ line: String, timeout: Duration = .seconds(5)) async throws {
        guard try await firstElement(of: callStream, timeout: timeout, where: { $0 == line }) != nil else {
            throw HarnessError("the stand-in's call log ended before \(line)")
        }
    }
    var calls: [String] { state.withLock { $0.calls } }

    /// The registered application's characteristic path for `uuid`.
    func characteristicPath(_ uuid: BluetoothUUID) -> String? {
        state.withLock { s in
            s.tree.first { $0.value["org.bluez.GattCharacteristic1"]?["UUID"]?.string == uuid.description }?.key
        }
    }

    var applicationOwner: String? { state.withLock { $0.applicationOwner } }

    /// `WriteValue(value, options)` on the application's characteristic, as bluetoothd calls it.
    func write(_ uuid: BluetoothUUID, _ value: [UInt8], device: String?, mtu: Int = 247) async throws {
        guard let owner = applicationOwner, let path = characteristicPath(uuid) else { throw HarnessError("no application") }
        _ = try await connection.call(
            destination: owner, path: path, interface: "org.bluez.GattCharacteristic1", member: "WriteValue",
            arguments: [.bytes(value), GATTServerRequest(device: device, mtu: mtu, link: "LE").options], timeout: .seconds(5))
    }

    /// `AcquireWrite(options)` on the application's characteristic, as bluetoothd calls it on the
    /// first write: the socket it then sends each write's value to, and the MTU the server gave.
    func acquireWrite(_ uuid: BluetoothUUID, device: String?, mtu: Int = 247) async throws -> (fd: Int32, mtu: Int) {
        guard let owner = applicationOwner, let path = characteristicPath(uuid) else { throw HarnessError("no application") }
        let reply = try await connection.call(
            destination: owner, path: path, interface: "org.bluez.GattCharacteristic1", member: "AcquireWrite",
            arguments: [GATTServerRequest(device: device, mtu: mtu, link: "LE").options], timeout: .seconds(5))
        guard reply.count == 2, let fd = reply[0].unixFD, let given = reply[1].integer else {
            throw HarnessError("AcquireWrite replied \(reply)")
        }
        return (fd, given)
    }

    /// `ReadValue(options)` on the application's characteristic.
    func read(_ uuid: BluetoothUUID, device: String?) async throws -> [UInt8] {
        guard let owner = applicationOwner, let path = characteristicPath(uuid) else { throw HarnessError("no application") }
        let reply = try await connection.call(
            destination: owner, path: path, interface: "org.bluez.GattCharacteristic1", member: "ReadValue",
            arguments: [GATTServerRequest(device: device, mtu: 247, link: "LE").options], timeout: .seconds(5))
        return reply.first?.bytes ?? []
    }

    /// `StartNotify` on the characteristic, and a stream of the values it notifies
    /// (`PropertiesChanged` on `Value`).
    func startNotify(_ uuid: BluetoothUUID) async throws -> AsyncStream<[UInt8]> {
        guard let owner = applicationOwner, let path = characteristicPath(uuid) else { throw HarnessError("no application") }
        let subscription = try await connection.subscribe(.propertiesChanged(sender: owner, path: path, interface: "org.bluez.GattCharacteristic1"))
        _ = try await connection.call(destination: owner, path: path, interface: "org.bluez.GattCharacteristic1",
                                      member: "StartNotify", timeout: .seconds(5))
        let (stream, continuation) = AsyncStream.makeStream(of: [UInt8].self)
        let task = Task {
            for await signal in subscription.signals {
                if signal.arguments.count >= 2, let value = signal.arguments[1].vardict?["Value"]?.bytes {
                    continuation.yield(value)
                }
            }
            continuation.finish()
        }
        continuation.onTermination = { _ in task.cancel() }
        return stream
    }
}
