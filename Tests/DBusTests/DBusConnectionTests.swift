@testable import DBus
import Synchronization
import TestSupport
import Testing

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

private let serviceName = "com.example.OtaflashTest"
private let testInterface = "com.example.Test1"

/// Exports `/com/example/test` with a few methods used by several tests.
private func exportTestObject(_ server: DBusConnection, extraMethods: [String: DBusMethodHandler] = [:]) async throws {
    var methods: [String: DBusMethodHandler] = [
        "Echo": { call in call.arguments },
        "Fail": { _ in throw DBusError(name: "org.bluez.Error.NotPermitted", message: "Write acquired") },
        "FailBadName": { _ in throw DBusError(name: "not an error name", message: "oops") },
        "FailPlain": { _ in throw TimedOut() },
    ]
    methods.merge(extraMethods) { $1 }
    try await server.export(
        path: "/com/example/test",
        interfaces: [DBusInterface(name: testInterface, methods: methods)],
        ordering: .concurrent)
    #expect(try await server.requestName(serviceName) == .primaryOwner)
}

/// A method that answers only when the test releases it (or after 10 s, so nothing outlives the
/// test for long), and tells the test when a call has arrived. One call at a time.
private final class HeldMethod: Sendable {
    let arrived: AsyncStream<Void>
    private let arrivedContinuation: AsyncStream<Void>.Continuation
    private let released: AsyncStream<Void>
    private let releasedContinuation: AsyncStream<Void>.Continuation

    init() {
        (arrived, arrivedContinuation) = AsyncStream.makeStream(of: Void.self)
        (released, releasedContinuation) = AsyncStream.makeStream(of: Void.self)
    }

    var handler: DBusMethodHandler {
        { [arrivedContinuation, released] _ in
            arrivedContinuation.yield()
            _ = try? await nextElement(released, timeout: .seconds(10))
            return []
        }
    }

    func release() { releasedContinuation.finish() }
}

@Suite("DBusConnection against a private dbus-daemon", .needs(.dbus))
struct DBusConnectionTests {
    @Test func connectsAndGetsUniqueName() async throws {
        try await withTestBus { bus in
            let connection = try await bus.connect()
            let name = try #require(await connection.uniqueName)
            #expect(name.hasPrefix(":"))
            #expect(await connection.isConnected)
            await connection.close()
            #expect(await !connection.isConnected)
            await #expect(throws: DBusError.self) {
                _ = try await connection.call(
                    destination: "org.freedesktop.DBus", path: "/org/freedesktop/DBus",
                    interface: "org.freedesktop.DBus", member: "ListNames")
            }
        }
    }

    /// Regression: a reused socket descriptor once left the new connection's watch unarmed.
    @Test func reconnectingManyTimesNeverStalls() async throws {
        try await withTestBus { bus in
            var failures: [String] = []
            for attempt in 0..<300 {
                do {
                    let connection = try await DBusConnection.connect(address: bus.address, timeout: .seconds(2))
                    await connection.close()
                } catch {
                    failures.append("attempt \(attempt): \(error)")
                }
            }
            #expect(failures.isEmpty, "\(failures)")
        }
    }

    @Test func roundTripOfEveryType() async throws {
        try await withTestBus { bus in
            let server = try await bus.connect()
            let client = try await bus.connect()
            try await exportTestObject(server)

            let values: [DBusValue] = [
                .byte(0xFE), .bool(true), .bool(false), .int16(-2), .uint16(65535), .int32(-70000),
                .uint32(4_000_000_000), .int64(-1 << 40), .uint64(1 << 63), .double(2.5),
                .string("héllo ✓"), .string(""), .objectPath("/org/bluez/hci0/dev_00_11"), .signature("a{sv}"),
                .bytes([0, 1, 2, 255]), .bytes([]), .strings(["a", "b"]),
                .array(elementSignature: "(yq)", [.struct([.byte(1), .uint16(2)])]),
                .array(elementSignature: "ay", [.bytes([1]), .bytes([])]),
                .vardict(["Transport": .string("le"), "UUIDs": .strings(["1234"]), "RSSI": .int16(-60)]),
                .dictionary(keySignature: "o", valueSignature: "a{sa{sv}}", [
                    .objectPath("/a"): .dictionary(keySignature: "s", valueSignature: "a{sv}", [
                        .string("org.bluez.Device1"): .vardict(["Connected": .bool(true)]),
                    ]),
                ]),
                .dictionary(keySignature: "q", valueSignature: "ay", [.uint16(0x004C): .bytes([2, 0x15])]),
                .struct([.string("x"), .variant(.variant(.int32(7)))]),
                .variant(.array(elementSignature: "s", [])),
            ]
            let reply = try await client.call(
                destination: serviceName, path: "/com/example/test", interface: testInterface,
                member: "Echo", arguments: values)
            #expect(reply == values)

            // Also by unique name and without an interface (the spec allows omitting it).
            let serverName = try #require(await server.uniqueName)
            let reply2 = try await client.call(
                destination: serverName, path: "/com/example/test", interface: nil,
                member: "Echo", arguments: [.string("no interface")])
            #expect(reply2 == [.string("no interface")])

            // A large byte array (fixed-array fast path both ways).
            let big = DBusValue.bytes((0..<100_000).map { UInt8(truncatingIfNeeded: $0) })
            let reply3 = try await client.call(
                destination: serviceName, path: "/com/example/test", interface: testInterface,
                member: "Echo", arguments: [big])
            #expect(reply3.first?.bytes?.count == 100_000)
            #expect(reply3 == [big])

            await client.close()
            await server.close()
        }
    }

    @Test func errorRepliesCarryNames() async throws {
        try await withTestBus { bus in
            let server = try await bus.connect()
            let client = try await bus.connect()
            try await exportTestObject(server)

            func callError(_ member: String, path: String = "/com/example/test", interface: String? = testInterface)
                async -> DBusError?
            {
                do {
                    _ = try await client.call(destination: serviceName, path: path, interface: interface, member: member)
                    return nil
                } catch {
                    return error as? DBusError
                }
            }

            let notPermitted = await callError("Fail")
            #expect(notPermitted?.name == "org.bluez.Error.NotPermitted")
            #expect(notPermitted?.message == "Write acquired")

            #expect(await callError("FailBadName")?.name == DBusError.Name.failed)
            #expect(await callError("FailPlain")?.name == DBusError.Name.failed)
            #expect(await callError("NoSuchMethod")?.name == DBusError.Name.unknownMethod)
            #expect(await callError("Echo", interface: "com.example.Nope")?.name == DBusError.Name.unknownInterface)
            // Unexported paths fall through to libdbus's default reply.
            #expect(await callError("Echo", path: "/nowhere")?.name == DBusError.Name.unknownMethod)
            // A name nobody owns: the bus answers.
            do {
                _ = try await client.call(destination: "com.example.Nobody", path: "/", interface: nil, member: "X")
                Issue.record("expected ServiceUnknown")
            } catch let error as DBusError {
                #expect(error.name == DBusError.Name.serviceUnknown)
            }
        }
    }

    @Test func callTimesOut() async throws {
        try await withTestBus { bus in
            let server = try await bus.connect()
            let client = try await bus.connect()
            let held = HeldMethod()
            defer { held.release() }
            try await exportTestObject(server, extraMethods: ["Block": held.handler])
            let started = ContinuousClock.now
            do {
                _ = try await client.call(
                    destination: serviceName, path: "/com/example/test", interface: testInterface,
                    member: "Block", timeout: .milliseconds(200))
                Issue.record("expected a timeout")
            } catch let error as DBusError {
                #expect(error.isTimeout, "\(error)")
            }
            let elapsed = ContinuousClock.now - started
            // The server did get the call: the client gave up on a reply, not on sending.
            _ = try await next(held.arrived)
            held.release()
            // Under the 25 s that libdbus waits by default: the call's own 200 ms ended it (a loaded
            // host's thread queue may add seconds, so no tighter bound).
            #expect(elapsed >= .milliseconds(150) && elapsed < .seconds(20), "\(elapsed)")
            // The connection still works afterwards.
            let echo = try await client.call(
                destination: serviceName, path: "/com/example/test", interface: testInterface,
                member: "Echo", arguments: [.uint32(1)])
            #expect(echo == [.uint32(1)])
        }
    }

    @Test func cancellationCancelsThePendingCall() async throws {
        try await withTestBus { bus in
            let server = try await bus.connect()
            let client = try await bus.connect()
            let held = HeldMethod()
            defer { held.release() }
            try await exportTestObject(server, extraMethods: ["Block": held.handler])
            let task = Task {
                try await client.call(
                    destination: serviceName, path: "/com/example/test", interface: testInterface,
                    member: "Block", timeout: .seconds(20))
            }
            _ = try await next(held.arrived)
            let cancelledAt = ContinuousClock.now
            task.cancel()
            let result = await task.result
            // Well before the call's own 20 s timeout (a loaded machine took 2.5 s once).
            #expect(ContinuousClock.now - cancelledAt < .seconds(10))
            #expect(throws: CancellationError.self) { try result.get() }

            // A task cancelled before the call starts never sends it.
            let early = Task {
                withUnsafeCurrentTask { $0?.cancel() }
                return try await client.call(
                    destination: serviceName, path: "/com/example/test", interface: testInterface, member: "Echo")
            }
            await #expect(throws: CancellationError.self) { try await early.value }

            let echo = try await client.call(
                destination: serviceName, path: "/com/example/test", interface: testInterface,
                member: "Echo", arguments: [.string("still alive")])
            #expect(echo == [.string("still alive")])
        }
    }

    @Test func closingFailsPendingCalls() async throws {
        try await withTestBus { bus in
            let server = try await bus.connect()
            let client = try await bus.connect()
            let held = HeldMethod()
            defer { held.release() }
            try await exportTestObject(server, extraMethods: ["Block": held.handler])
            let task = Task {
                try await client.call(
                    destination: serviceName, path: "/com/example/test", interface: testInterface, member: "Block")
            }
            _ = try await next(held.arrived)
            await client.close()
            do {
                _ = try await task.value
                Issue.record("expected Disconnected")
            } catch let error as DBusError {
                #expect(error.isDisconnected)
            }
        }
    }

    @Test func busGoingAwayFailsCallsAndEndsStreams() async throws {
        try await withTestBus { bus in
            let server = try await bus.connect()
            let client = try await bus.connect()
            let held = HeldMethod()
            defer { held.release() }
            try await exportTestObject(server, extraMethods: ["Block": held.handler])
            let subscription = try await client.subscribe(DBusMatchRule(member: "Never"))
            let task = Task {
                try await client.call(
                    destination: serviceName, path: "/com/example/test", interface: testInterface, member: "Block")
            }
            _ = try await next(held.arrived)
            bus.stop()
            do {
                _ = try await task.value
                Issue.record("expected an error")
            } catch let error as DBusError {
                #expect(error.isDisconnected, "\(error)")
            }
            // The stream finishes (nil) rather than hanging.
            #expect(try await next(subscription.signals) == nil)
            #expect(await !client.isConnected)
        }
    }

    @Test func droppingAConnectionClosesIt() async throws {
        try await withTestBus { bus in
            let observer = try await bus.connect()
            var connection: DBusConnection? = try await bus.connect()
            let name = try #require(await connection?.uniqueName)
            let stream = try #require(try await connection?.subscribe(DBusMatchRule(member: "Never")))
            let gone = try await observer.subscribe(DBusMatchRule(
                sender: "org.freedesktop.DBus", interface: "org.freedesktop.DBus", member: "NameOwnerChanged", arg0: name))
            connection = nil
            // The stream ends, and the bus sees the connection go away.
            #expect(try await next(stream.signals) == nil)
            let change = try #require(try await next(gone.signals))
            #expect(change.arguments == [.string(name), .string(name), .string("")])
        }
    }

    @Test func signalsFollowMatchRules() async throws {
        try await withTestBus { bus in
            let emitter = try await bus.connect()
            let listener = try await bus.connect()
            #expect(try await emitter.requestName("com.example.Emitter") == .primaryOwner)

            let ticks = try await listener.subscribe(DBusMatchRule(
                sender: "com.example.Emitter", pathNamespace: "/dev", interface: "com.example.Signals", member: "Tick"))
            let counted = Mutex(0)
            let counter = try await listener.subscribe(
                DBusMatchRule(interface: "com.example.Signals", member: "Counted")
            ) { _ in counted.withLock { $0 += 1 } }
            let sentinel = try await listener.subscribe(DBusMatchRule(interface: "com.example.Signals", member: "Sentinel"))

            // Filtered out locally and by the bus: wrong member, wrong path namespace.
            try await emitter.emitSignal(path: "/dev", interface: "com.example.Signals", member: "Tock")
            try await emitter.emitSignal(path: "/device", interface: "com.example.Signals", member: "Tick")
            try await emitter.emitSignal(
                path: "/dev/hci0", interface: "com.example.Signals", member: "Tick", arguments: [.uint32(1), .bytes([7])])
            let tick = try #require(try await next(ticks.signals))
            #expect(tick.path == "/dev/hci0")
            #expect(tick.member == "Tick")
            #expect(tick.arguments == [.uint32(1), .bytes([7])])
            #expect(tick.sender == (await emitter.uniqueName))

            // Handler subscription, then unsubscribe: a later signal is not delivered. Signals
            // arrive in order, so once the sentinel is seen the earlier one would have been too.
            try await emitter.emitSignal(path: "/x", interface: "com.example.Signals", member: "Counted")
            try await emitter.emitSignal(path: "/x", interface: "com.example.Signals", member: "Sentinel")
            _ = try await next(sentinel.signals)
            #expect(counted.withLock { $0 } == 1)
            await listener.unsubscribe(counter)
            try await emitter.emitSignal(path: "/x", interface: "com.example.Signals", member: "Counted")
            try await emitter.emitSignal(path: "/x", interface: "com.example.Signals", member: "Sentinel")
            _ = try await next(sentinel.signals)
            #expect(counted.withLock { $0 } == 1)

            // A stream ends on unsubscribe.
            await listener.unsubscribe(ticks)
            var iterator = ticks.signals.makeAsyncIterator()
            #expect(await iterator.next() == nil)

            // Signals from another sender do not match a rule naming com.example.Emitter.
            let other = try await bus.connect()
            let fromEmitter = try await listener.subscribe(DBusMatchRule(sender: "com.example.Emitter", member: "Who"))
            try await other.emitSignal(path: "/w", interface: "com.example.Signals", member: "Who", arguments: [.string("other")])
            try await emitter.emitSignal(path: "/w", interface: "com.example.Signals", member: "Who", arguments: [.string("emitter")])
            #expect(try await next(fromEmitter.signals)?.arguments == [.string("emitter")])
        }
    }

    @Test func propertiesGetGetAllSetAndChanged() async throws {
        try await withTestBus { bus in
            let server = try await bus.connect()
            let client = try await bus.connect()
            let path = "/org/example/app/service0/char0"
            let characteristic = "org.bluez.GattCharacteristic1"
            let rejected = DBusError(name: "org.bluez.Error.InvalidArguments", message: "too long")
            try await server.export(path: path, interfaces: [
                DBusInterface(
                    name: characteristic,
                    properties: [
                        "UUID": .string("0000fe59-0000-1000-8000-00805f9b34fb"),
                        "Flags": .strings(["write-without-response", "notify"]),
                        "Value": .bytes([]),
                        "Notifying": .bool(false),
                    ],
                    writableProperties: ["Notifying", "Value"],
                    propertySetter: { name, value in
                        if name == "Value", (value.bytes?.count ?? 0) > 4 { throw rejected }
                    }),
            ])
            _ = try await server.requestName(serviceName)

            #expect(try await client.getProperty(destination: serviceName, path: path, interface: characteristic, name: "Flags")
                == .strings(["write-without-response", "notify"]))
            let all = try await client.getAllProperties(destination: serviceName, path: path, interface: characteristic)
            #expect(all.count == 4)
            #expect(all["UUID"]?.string == "0000fe59-0000-1000-8000-00805f9b34fb")

            let changes = try await client.subscribe(.propertiesChanged(sender: serviceName, path: path, interface: characteristic))

            try await client.setProperty(destination: serviceName, path: path, interface: characteristic, name: "Notifying", value: .bool(true))
            #expect(await server.exportedProperty(path: path, interface: characteristic, name: "Notifying") == .bool(true))
            let first = try #require(try await next(changes.signals))
            #expect(first.arguments.first == .string(characteristic))
            #expect(first.arguments[1]["Notifying"] == .bool(true))

            // A notification as a GATT server sends it.
            try await server.updateProperty(path: path, interface: characteristic, name: "Value", value: .bytes([1, 2, 3]))
            let second = try #require(try await next(changes.signals))
            #expect(second.arguments[1]["Value"]?.bytes == [1, 2, 3])

            func setError(_ name: String, _ value: DBusValue) async -> String? {
                do {
                    try await client.setProperty(destination: serviceName, path: path, interface: characteristic, name: name, value: value)
                    return nil
                } catch {
                    return (error as? DBusError)?.name
                }
            }
            #expect(await setError("UUID", .string("x")) == DBusError.Name.propertyReadOnly)
            #expect(await setError("Nope", .string("x")) == DBusError.Name.unknownProperty)
            #expect(await setError("Value", .bytes([1, 2, 3, 4, 5])) == rejected.name)
            do {
                _ = try await client.getProperty(destination: serviceName, path: path, interface: "org.example.Nope", name: "X")
                Issue.record("expected UnknownInterface")
            } catch let error as DBusError {
                #expect(error.name == DBusError.Name.unknownInterface)
            }
        }
    }

    @Test func objectManagerListsExportedObjects() async throws {
        try await withTestBus { bus in
            let server = try await bus.connect()
            let client = try await bus.connect()
            _ = try await server.requestName(serviceName)
            try await server.addObjectManager(at: "/app")
            try await server.export(path: "/app/service0", interfaces: [
                DBusInterface(name: "org.bluez.GattService1", properties: [
                    "UUID": .string("fe59"), "Primary": .bool(true),
                ]),
            ])
            try await server.export(path: "/app/service0/char0", interfaces: [
                DBusInterface(
                    name: "org.bluez.GattCharacteristic1",
                    methods: ["WriteValue": { _ in [] }],
                    properties: ["UUID": .string("c0"), "Service": .objectPath("/app/service0")]),
            ])
            try await server.export(path: "/elsewhere", interfaces: [DBusInterface(name: "org.example.Other")])

            let objects = try await client.getManagedObjects(destination: serviceName, path: "/app")
            #expect(Set(objects.keys) == ["/app/service0", "/app/service0/char0"])
            #expect(objects["/app/service0"]?["org.bluez.GattService1"]?["Primary"] == .bool(true))
            #expect(objects["/app/service0/char0"]?["org.bluez.GattCharacteristic1"]?["Service"] == .objectPath("/app/service0"))

            // InterfacesAdded / InterfacesRemoved follow exports below the manager.
            let events = try await client.subscribe(.objectManager(sender: serviceName, path: "/app"))
            try await server.export(path: "/app/service1", interfaces: [
                DBusInterface(name: "org.bluez.GattService1", properties: ["UUID": .string("180a")]),
            ])
            let added = try #require(try await next(events.signals))
            #expect(added.member == "InterfacesAdded")
            #expect(added.arguments.first == .objectPath("/app/service1"))
            #expect(added.arguments[1]["org.bluez.GattService1"]?["UUID"] == .string("180a"))
            await server.unexport(path: "/app/service1")
            let removed = try #require(try await next(events.signals))
            #expect(removed.member == "InterfacesRemoved")
            #expect(removed.arguments == [.objectPath("/app/service1"), .strings(["org.bluez.GattService1"])])

            // Minimal introspection, including intermediate nodes.
            let rootXML = try await client.call(
                destination: serviceName, path: "/", interface: "org.freedesktop.DBus.Introspectable", member: "Introspect")
            #expect(rootXML.first?.string?.contains("<node name=\"app\"/>") == true)
            let charXML = try await client.call(
                destination: serviceName, path: "/app/service0/char0",
                interface: "org.freedesktop.DBus.Introspectable", member: "Introspect")
            #expect(charXML.first?.string?.contains("<method name=\"WriteValue\"/>") == true)

            // Unexported objects stop answering.
            await server.unexport(path: "/app/service0/char0")
            await #expect(throws: DBusError.self) {
                _ = try await client.call(
                    destination: serviceName, path: "/app/service0/char0",
                    interface: "org.bluez.GattCharacteristic1", member: "WriteValue")
            }
        }
    }

    @Test func fallbackObjectsHandleSubtrees() async throws {
        try await withTestBus { bus in
            let server = try await bus.connect()
            let client = try await bus.connect()
            try await server.export(
                path: "/tree",
                interfaces: [DBusInterface(name: testInterface, methods: ["Where": { call in [.objectPath(call.path)] }])],
                fallback: true)
            let name = try #require(await server.uniqueName)
            let reply = try await client.call(destination: name, path: "/tree/a/b", interface: testInterface, member: "Where")
            #expect(reply == [.objectPath("/tree/a/b")])

            // One object per path; after unexport the path is free again.
            do {
                try await server.export(path: "/tree", interfaces: [])
                Issue.record("expected ObjectPathInUse")
            } catch let error as DBusError {
                #expect(error.name == "org.freedesktop.DBus.Error.ObjectPathInUse")
            }
            await server.unexport(path: "/tree")
            try await server.export(path: "/tree", interfaces: [DBusInterface(name: testInterface)])
        }
    }

    @Test func serialObjectsRunCallsInArrivalOrder() async throws {
        try await withTestBus { bus in
            let server = try await bus.connect()
            let client = try await bus.connect()
            let log = Mutex<[String]>([])
            try await server.export(path: "/serial", interfaces: [
                DBusInterface(name: testInterface, methods: [
                    "Write": { call in
                        let n = call.arguments.first?.uint32 ?? 0
                        log.withLock { $0.append("start \(n)") }
                        // Gives another handler the chance to start if calls were not serialized.
                        for _ in 0..<3 { await Task.yield() }
                        log.withLock { $0.append("end \(n)") }
                        return []
                    },
                ]),
            ])
            let name = try #require(await server.uniqueName)
            try await withThrowingTaskGroup(of: Void.self) { group in
                for n in 0..<200 {
                    group.addTask {
                        // The last of 200 calls waits for the 199 before it, each a few hops of
                        // a cooperative pool other suites keep busy: not libdbus's default 25 s.
                        _ = try await client.call(
                            destination: name, path: "/serial", interface: testInterface,
                            member: "Write", arguments: [.uint32(UInt32(n))], timeout: .seconds(300))
                    }
                }
                try await group.waitForAll()
            }
            let entries = log.withLock { $0 }
            #expect(entries.count == 400)
            // Handlers never overlap: every start is immediately followed by its own end.
            var overlapping = 0
            for index in stride(from: 0, to: entries.count - 1, by: 2) {
                let start = entries[index]
                if !start.hasPrefix("start ") || entries[index + 1] != "end " + start.dropFirst(6) { overlapping += 1 }
            }
            #expect(overlapping == 0)
        }
    }

    @Test func unixFileDescriptorsInRepliesAndArguments() async throws {
        try await withTestBus { bus in
            let server = try await bus.connect()
            let client = try await bus.connect()
            let serverEnd = Mutex<Int32>(-1)
            let handed = Mutex<Int32>(-1)
            try await exportTestObject(server, extraMethods: [
                // Like BlueZ AcquireWrite: returns (h fd, q mtu).
                "AcquireWrite": { _ in
                    var pair: [Int32] = [-1, -1]
                    guard socketpair(AF_UNIX, Int32(SOCK_SEQPACKET.rawValue), 0, &pair) == 0 else {
                        throw DBusError(name: "org.bluez.Error.Failed", message: "socketpair")
                    }
                    serverEnd.withLock { $0 = pair[0] }
                    handed.withLock { $0 = pair[1] }
                    return [.unixFD(pair[1]), .uint16(247)]
                },
                // Receives an fd (owned by the handler) and writes through it.
                "WriteTo": { call in
                    guard let fd = call.arguments.first?.unixFD else { throw DBusError.invalidArgument("no fd") }
                    defer { close(fd) }
                    let bytes: [UInt8] = Array("from server".utf8)
                    _ = bytes.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
                    return []
                },
            ])

            let reply = try await client.call(
                destination: serviceName, path: "/com/example/test", interface: testInterface, member: "AcquireWrite")
            // libdbus duplicated the descriptor into the reply; the sender may close its copy now.
            close(handed.withLock { $0 })
            guard reply.count == 2, let fd = reply[0].unixFD, reply[1].uint16 == 247 else {
                Issue.record("unexpected reply \(reply)")
                return
            }
            let payload: [UInt8] = [0x01, 0x02, 0x03, 0xFF]
            let written = payload.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
            #expect(written == payload.count)
            close(fd)

            let readFD = serverEnd.withLock { $0 }
            var pollFD = pollfd(fd: readFD, events: Int16(POLLIN), revents: 0)
            #expect(poll(&pollFD, 1, 5000) == 1)
            var buffer = [UInt8](repeating: 0, count: 64)
            let count = read(readFD, &buffer, buffer.count)
            #expect(Array(buffer.prefix(max(count, 0))) == payload)
            close(readFD)

            // And the other way: an fd as a method argument.
            var pipeFDs: [Int32] = [-1, -1]
            #expect(pipe(&pipeFDs) == 0)
            _ = try await client.call(
                destination: serviceName, path: "/com/example/test", interface: testInterface,
                member: "WriteTo", arguments: [.unixFD(pipeFDs[1])])
            close(pipeFDs[1])
            var received = [UInt8](repeating: 0, count: 64)
            var pipePoll = pollfd(fd: pipeFDs[0], events: Int16(POLLIN), revents: 0)
            #expect(poll(&pipePoll, 1, 5000) == 1)
            let n = read(pipeFDs[0], &received, received.count)
            #expect(String(decoding: received.prefix(max(n, 0)), as: UTF8.self) == "from server")
            close(pipeFDs[0])
        }
    }

    @Test func invalidInputThrowsInsteadOfAborting() async throws {
        try await withTestBus { bus in
            let connection = try await bus.connect()
            let dest = "org.freedesktop.DBus"
            let path = "/org/freedesktop/DBus"
            let iface = "org.freedesktop.DBus"

            func expectInvalid(_ what: String, _ body: () async throws -> Void) async {
                do {
                    try await body()
                    Issue.record("\(what): no error")
                } catch let error as DBusError {
                    #expect(error.isInvalidArgument, "\(what): \(error)")
                } catch {
                    Issue.record("\(what): unexpected \(error)")
                }
            }
            let invalidValues: [(String, DBusValue)] = [
                ("string with NUL", .string("a\0b")),
                ("object path value", .objectPath("/a//b")),
                ("signature value", .signature("a{")),
                ("array element signature", .array(elementSignature: "ss", [])),
                ("array of mixed elements", .array(elementSignature: "s", [.int32(1)])),
                ("dictionary with container key", .dictionary(keySignature: "ay", valueSignature: "s", [:])),
                ("dictionary value type", .dictionary(keySignature: "s", valueSignature: "s", [.string("k"): .int32(1)])),
                ("empty struct", .struct([])),
                ("negative fd", .unixFD(-1)),
                ("too deep", (0..<40).reduce(DBusValue.byte(0)) { inner, _ in .struct([inner]) }),
            ]
            for (what, value) in invalidValues {
                await expectInvalid(what) {
                    _ = try await connection.call(destination: dest, path: path, interface: iface, member: "Ping", arguments: [value])
                }
            }
            await expectInvalid("path") {
                _ = try await connection.call(destination: dest, path: "no/slash", interface: iface, member: "Ping")
            }
            await expectInvalid("interface") {
                _ = try await connection.call(destination: dest, path: path, interface: "nodots", member: "Ping")
            }
            await expectInvalid("member") {
                _ = try await connection.call(destination: dest, path: path, interface: iface, member: "Has.Dot")
            }
            await expectInvalid("bus name") {
                _ = try await connection.call(destination: "-bad..name", path: path, interface: iface, member: "Ping")
            }
            await expectInvalid("signal path") {
                try await connection.emitSignal(path: "/trailing/", interface: "a.b", member: "S")
            }
            await expectInvalid("signal member") {
                try await connection.emitSignal(path: "/", interface: "a.b", member: "9S")
            }
            await expectInvalid("match rule") {
                _ = try await connection.subscribe(DBusMatchRule(path: "bad"))
            }
            await expectInvalid("export path") {
                try await connection.export(path: "//", interfaces: [])
            }
            await expectInvalid("export interface") {
                try await connection.export(path: "/ok", interfaces: [DBusInterface(name: "x")])
            }
            await expectInvalid("request name") {
                _ = try await connection.requestName("nodots")
            }
            await expectInvalid("error name") { try DBusValidation.errorName("org..bad") }
            // Still connected and usable: nothing reached libdbus.
            #expect(await connection.isConnected)
            let names = try await connection.call(destination: dest, path: path, interface: iface, member: "ListNames")
            #expect(names.first?.strings?.contains("org.freedesktop.DBus") == true)
        }
    }

    /// Calls whose bytes do not fit the socket at once make libdbus enable its write watch again
    /// and again; the watch's sources are made once and suspended in between, never made and
    /// cancelled per enable (a cancel racing a hang-up is a libdispatch use-after-free). The
    /// replies all arrive, so a suspended source is resumed when it must be.
    @Test func aWatchEnabledAgainAndAgainMakesItsSourcesOnce() async throws {
        try await withTestBus { bus in
            let server = try await bus.connect()
            let client = try await bus.connect()
            try await exportTestObject(server)
            let payload = DBusValue.bytes([UInt8](repeating: 0x5A, count: 256 << 10))
            for _ in 0..<3 {
                let replies = try await withThrowingTaskGroup(of: Int.self) { group in
                    for i in 0..<40 {
                        group.addTask {
                            let reply = try await client.call(destination: serviceName, path: "/com/example/test", interface: testInterface,
                                                              member: "Echo", arguments: [.uint32(UInt32(i)), payload])
                            return reply.first == .uint32(UInt32(i)) ? 1 : 0
                        }
                    }
                    return try await group.reduce(0, +)
                }
                #expect(replies == 40)
            }
            let counts = client.loop.watchCounts.state.withLock { $0 }
            // A read watch and a write watch: two sources, however often the write one came on.
            #expect(counts.enables > 4, "the write watch never came on again: \(counts)")
            #expect(counts.sources == 2, "\(counts)")
            await client.close()
            await server.close()
        }
    }

    @Test func manyConcurrentCalls() async throws {
        try await withTestBus { bus in
            let server = try await bus.connect()
            let client = try await bus.connect()
            try await exportTestObject(server)
            let payload = DBusValue.bytes([UInt8](repeating: 0xAB, count: 244))

            // Sequential round trips: per-call latency.
            let sequentialCount = 200
            let sequentialStart = ContinuousClock.now
            for _ in 0..<sequentialCount {
                _ = try await client.call(
                    destination: serviceName, path: "/com/example/test", interface: testInterface,
                    member: "Echo", arguments: [payload])
            }
            let sequential = ContinuousClock.now - sequentialStart

            // 1000 calls in flight at once.
            let concurrentCount = 1000
            let concurrentStart = ContinuousClock.now
            let replies = try await withThrowingTaskGroup(of: Bool.self) { group in
                for i in 0..<concurrentCount {
                    group.addTask {
                        let reply = try await client.call(
                            destination: serviceName, path: "/com/example/test", interface: testInterface,
                            member: "Echo", arguments: [.uint32(UInt32(i)), payload])
                        return reply.first == .uint32(UInt32(i))
                    }
                }
                var ok = 0
                for try await matched in group where matched { ok += 1 }
                return ok
            }
            let concurrent = ContinuousClock.now - concurrentStart
            #expect(replies == concurrentCount)

            func ms(_ d: Duration) -> Double {
                Double(d.components.seconds) * 1000 + Double(d.components.attoseconds) / 1e15
            }
            func fixed(_ value: Double) -> String {
                let thousandths = Int((value * 1000).rounded())
                let fraction = String(thousandths % 1000)
                return "\(thousandths / 1000)." + String(repeating: "0", count: 3 - fraction.count) + fraction
            }
            print("D-Bus latency: sequential \(fixed(ms(sequential) / Double(sequentialCount))) ms/call "
                + "(\(sequentialCount) calls, 244-byte ay); \(concurrentCount) concurrent calls in "
                + "\(fixed(ms(concurrent))) ms (\(fixed(ms(concurrent) / Double(concurrentCount))) ms/call)")
        }
    }
}
