import BlueZ
import DBus
import Foundation
import GATT
import Synchronization
import Testing

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// A private `dbus-daemon` for one peripheral test: spawned with an empty signal mask and default
/// dispositions, its address read from `--print-address` within a timeout, killed with SIGKILL by
/// PID at the end.
final class PeripheralTestBus: Sendable {
    let pid: pid_t
    let address: String
    let directory: String
    private let stdoutFD: Int32
    private let stopped = Mutex(false)

    private init(pid: pid_t, address: String, directory: String, stdoutFD: Int32) {
        self.pid = pid
        self.address = address
        self.directory = directory
        self.stdoutFD = stdoutFD
    }

    struct Failure: Error, CustomStringConvertible { var description: String }

    static func daemon() -> String? {
        for candidate in ["/usr/bin/dbus-daemon", "/bin/dbus-daemon", "/usr/local/bin/dbus-daemon"]
        where access(candidate, X_OK) == 0 {
            return candidate
        }
        return nil
    }

    static func start(timeoutMilliseconds: Int32 = 5000) throws -> PeripheralTestBus? {
        guard let daemon = daemon() else {
            print("SKIPPED: dbus-daemon is not installed; peripheral D-Bus test not run")
            return nil
        }
        var template = Array("/tmp/otaflash-periph-XXXXXX".utf8CString)
        guard let made = mkdtemp(&template) else { throw Failure(description: "mkdtemp failed") }
        let directory = String(cString: made)
        let config = """
            <!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
             "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
            <busconfig>
              <type>session</type>
              <listen>unix:path=\(directory)/bus</listen>
              <auth>EXTERNAL</auth>
              <policy context="default">
                <allow send_destination="*" eavesdrop="true"/>
                <allow eavesdrop="true"/>
                <allow own="*"/>
              </policy>
            </busconfig>
            """
        try config.write(toFile: "\(directory)/bus.conf", atomically: true, encoding: .utf8)

        var fds: [Int32] = [0, 0]
        guard pipe(&fds) == 0 else { throw Failure(description: "pipe failed") }
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_adddup2(&actions, fds[1], 1)
        posix_spawn_file_actions_addclose(&actions, fds[0])
        posix_spawn_file_actions_addclose(&actions, fds[1])
        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        var empty = sigset_t()
        sigemptyset(&empty)
        posix_spawnattr_setsigmask(&attributes, &empty)
        var all = sigset_t()
        sigfillset(&all)
        posix_spawnattr_setsigdefault(&attributes, &all)
        posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF))
        let arguments = [daemon, "--config-file=\(directory)/bus.conf", "--print-address=1", "--nofork", "--nopidfile"]
        var argv: [UnsafeMutablePointer<CChar>?] = arguments.map { strdup($0) } + [nil]
        defer { for p in argv { free(p) } }
        var pid: pid_t = 0
        let status = posix_spawn(&pid, daemon, &actions, &attributes, &argv, environ)
        close(fds[1])
        guard status == 0 else {
            close(fds[0])
            throw Failure(description: "posix_spawn(dbus-daemon) failed: \(status)")
        }
        var line: [UInt8] = []
        var remaining = timeoutMilliseconds
        while !line.contains(UInt8(ascii: "\n")) {
            var p = pollfd(fd: fds[0], events: Int16(POLLIN), revents: 0)
            let started = peripheralMilliseconds()
            let ready = poll(&p, 1, remaining)
            remaining -= Int32(peripheralMilliseconds() - started)
            var buffer = [UInt8](repeating: 0, count: 512)
            let n = ready > 0 ? read(fds[0], &buffer, buffer.count) : 0
            if n <= 0 || remaining <= 0 {
                kill(pid, SIGKILL)
                waitpid(pid, nil, 0)
                close(fds[0])
                throw Failure(description: "dbus-daemon did not print its address in time")
            }
            line += buffer[0..<n]
        }
        let address = String(decoding: line.prefix { $0 != UInt8(ascii: "\n") }, as: UTF8.self)
        return PeripheralTestBus(pid: pid, address: address, directory: directory, stdoutFD: fds[0])
    }

    func stop() {
        guard stopped.withLock({ done -> Bool in defer { done = true }; return !done }) else { return }
        kill(pid, SIGKILL)
        waitpid(pid, nil, 0)
        close(stdoutFD)
        try? FileManager.default.removeItem(atPath: directory)
    }

    func connect() async throws -> DBusConnection {
        try await DBusConnection.connect(address: address)
    }
}

func peripheralMilliseconds() -> Int64 {
    var now = timespec()
    clock_gettime(CLOCK_MONOTONIC, &now)
    return Int64(now.tv_sec) * 1000 + Int64(now.tv_nsec) / 1_000_000
}

struct PeripheralTimedOut: Error {}

/// The next element of `stream`, or `PeripheralTimedOut` after `timeout`.
func peripheralNext<T: Sendable>(_ stream: AsyncStream<T>, timeout: Duration = .seconds(5)) async throws -> T? {
    try await withThrowingTaskGroup(of: T?.self) { group in
        group.addTask {
            var iterator = stream.makeAsyncIterator()
            return await iterator.next()
        }
        group.addTask {
            try await Task.sleep(for: timeout)
            throw PeripheralTimedOut()
        }
        defer { group.cancelAll() }
        return try await group.next()!
    }
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
    private let callStream: AsyncStream<String>
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
        let stream = callStream
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask {
                for await call in stream where call == line { return }
            }
            group.addTask {
                try await Task.sleep(for: timeout)
                throw PeripheralTimedOut()
            }
            defer { group.cancelAll() }
            try await group.next()
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
        guard let owner = applicationOwner, let path = characteristicPath(uuid) else { throw PeripheralTestBus.Failure(description: "no application") }
        _ = try await connection.call(
            destination: owner, path: path, interface: "org.bluez.GattCharacteristic1", member: "WriteValue",
            arguments: [.bytes(value), GATTServerRequest(device: device, mtu: mtu, link: "LE").options], timeout: .seconds(5))
    }

    /// `ReadValue(options)` on the application's characteristic.
    func read(_ uuid: BluetoothUUID, device: String?) async throws -> [UInt8] {
        guard let owner = applicationOwner, let path = characteristicPath(uuid) else { throw PeripheralTestBus.Failure(description: "no application") }
        let reply = try await connection.call(
            destination: owner, path: path, interface: "org.bluez.GattCharacteristic1", member: "ReadValue",
            arguments: [GATTServerRequest(device: device, mtu: 247, link: "LE").options], timeout: .seconds(5))
        return reply.first?.bytes ?? []
    }

    /// `StartNotify` on the characteristic, and a stream of the values it notifies
    /// (`PropertiesChanged` on `Value`).
    func startNotify(_ uuid: BluetoothUUID) async throws -> AsyncStream<[UInt8]> {
        guard let owner = applicationOwner, let path = characteristicPath(uuid) else { throw PeripheralTestBus.Failure(description: "no application") }
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
