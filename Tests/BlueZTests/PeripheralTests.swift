import BlueZ
import DBus
import Foundation
import GATT
import Native
import OTA
import OTADevice
import OTAFlashCLI
import OTAWire
import Synchronization
import TestSupport
import Testing

/// Peripheral mode against a stand-in bluetoothd on a private dbus-daemon: the stand-in reads the
/// exported application as BlueZ does and then reads, writes and subscribes to its
/// characteristics as BlueZ does on behalf of centrals.
extension ProcessBusSuites {
@Suite(.serialized)
struct PeripheralTests {
    static let centralA = "/org/bluez/hci0/dev_11_22_33_44_55_66"
    static let centralB = "/org/bluez/hci0/dev_AA_BB_CC_DD_EE_01"

    /// A served OTA target: the host, the device, its application and advertisement, registered
    /// with the stand-in.
    struct Served {
        let host: PeripheralHost
        let peripheral: OTAPeripheral
        let application: PeripheralApplication
        let advertisement: PeripheralAdvertisement
        let events: EventLog
    }

    final class EventLog: Sendable {
        private let events = Mutex<[OTAPeripheralEvent]>([])
        private let stream: AsyncStream<OTAPeripheralEvent>
        private let continuation: AsyncStream<OTAPeripheralEvent>.Continuation
        init() { (stream, continuation) = AsyncStream.makeStream(of: OTAPeripheralEvent.self) }
        func append(_ event: OTAPeripheralEvent) {
            events.withLock { $0.append(event) }
            continuation.yield(event)
        }
        var all: [OTAPeripheralEvent] { events.withLock { $0 } }

        /// Waits for an event equal to `expected` (one waiter at a time), at most `timeout`.
        func waitFor(_ expected: OTAPeripheralEvent, timeout: Duration = .seconds(5)) async throws {
            let stream = self.stream
            try await withThrowingTaskGroup(of: Void.self) { group in
                group.addTask { for await event in stream where event == expected { return } }
                group.addTask {
                    try await Task.sleep(for: timeout)
                    throw TimedOut()
                }
                defer { group.cancelAll() }
                try await group.next()
            }
        }
    }

    static func serve(_ bus: PeripheralTestBus, config: OTAPeripheralConfig) async throws -> Served {
        try await serve(bus, model: config.nativeModel, name: config.name, storeDirectory: config.storeDirectory)
    }

    static func serve(_ bus: PeripheralTestBus, model: any PeripheralModel, name: String, storeDirectory: String? = nil) async throws -> Served {
        let host = try await PeripheralHost.open(adapter: nil, busAddress: bus.address)
        let log = EventLog()
        let peripheral = OTAPeripheral(model: model, storeDirectory: storeDirectory, events: { log.append($0) })
        let application = PeripheralApplication(connection: host.connection, root: "/org/otaflash/test", services: peripheral.services)
        try await application.export()
        let advertisement = PeripheralAdvertisement(connection: host.connection, path: "/org/otaflash/test/advertisement0",
                                                    localName: name, serviceUUIDs: model.advertisedServices)
        try await advertisement.export()
        try await peripheral.attach(link: host, application: application)
        try await application.register(on: host.adapterPath)
        try await advertisement.register(on: host.adapterPath)
        return Served(host: host, peripheral: peripheral, application: application, advertisement: advertisement, events: log)
    }

    static func withBus(_ body: (PeripheralTestBus) async throws -> Void) async throws {
        let bus = try PeripheralTestBus.start()
        defer { bus.stop() }
        try await body(bus)
    }

    static func temporaryDirectory() throws -> String {
        var template = Array("/tmp/otaflash-store-XXXXXX".utf8CString)
        guard let made = mkdtemp(&template) else { throw HarnessError("mkdtemp failed") }
        return String(cString: made)
    }

    static func response(_ bytes: [UInt8]?) throws -> ControlResponse {
        guard let bytes, case .response(let r) = try ControlNotification(decoding: bytes) else {
            throw HarnessError("expected a reply, got \(bytes.map { "\($0)" } ?? "nothing")")
        }
        return r
    }

    // MARK: The object tree

    @Test func registeredTreeHasTheServicesCharacteristicsAndFlags() async throws {
        try await Self.withBus { bus in
            let fake = try await FakeBlueZPeripheralSide.start(on: bus)
            let served = try await Self.serve(bus, config: OTAPeripheralConfig(name: "tree-test"))
            let tree = fake.state.withLock { $0.tree }
            #expect(fake.state.withLock { $0.applicationRoot } == "/org/otaflash/test")

            // Two primary services below the root.
            let services = tree.filter { $0.value["org.bluez.GattService1"] != nil }
            #expect(Set(services.keys) == ["/org/otaflash/test/service0", "/org/otaflash/test/service1"])
            let serviceUUIDs = Set(services.values.compactMap { $0["org.bluez.GattService1"]?["UUID"]?.string })
            #expect(serviceUUIDs == [OTAProtocol.serviceUUID.description, "0000180a-0000-1000-8000-00805f9b34fb"])
            #expect(services.values.allSatisfy { $0["org.bluez.GattService1"]?["Primary"]?.bool == true })

            // Every characteristic names its service, which is its parent object.
            var flags: [String: [String]] = [:]
            for (path, interfaces) in tree {
                guard let c = interfaces["org.bluez.GattCharacteristic1"] else { continue }
                let service = c["Service"]?.objectPath
                #expect(service != nil && path.hasPrefix(service! + "/"), "\(path) → \(String(describing: service))")
                flags[c["UUID"]?.string ?? "?"] = c["Flags"]?.strings
            }
            #expect(flags == [
                OTAProtocol.controlPointUUID.description: ["write", "notify"],
                OTAProtocol.dataUUID.description: ["write-without-response"],
                OTAProtocol.infoUUID.description: ["read"],
                "00002a29-0000-1000-8000-00805f9b34fb": ["read"],
                "00002a24-0000-1000-8000-00805f9b34fb": ["read"],
                "00002a26-0000-1000-8000-00805f9b34fb": ["read"],
            ])
            // The control point can notify: it has Notifying and Value.
            let cp = tree[fake.characteristicPath(OTAProtocol.controlPointUUID)!]?["org.bluez.GattCharacteristic1"]
            #expect(cp?["Notifying"]?.bool == false)
            #expect(cp?["Value"]?.bytes == [])
            // Only the data characteristic, which takes write commands only, has its writes acquired.
            let acquiring = tree.compactMap { $0.value["org.bluez.GattCharacteristic1"] }.filter { $0["WriteAcquired"] != nil }
            #expect(acquiring.map { $0["UUID"]?.string } == [OTAProtocol.dataUUID.description])

            // The advertisement as bluetoothd read it.
            let ad = fake.state.withLock { $0.advertisement }
            #expect(ad["Type"]?.string == "peripheral")
            #expect(ad["ServiceUUIDs"]?.strings == [OTAProtocol.serviceUUID.description])
            #expect(ad["LocalName"]?.string == "tree-test")
            #expect(ad["Discoverable"]?.bool == true)

            // Reads answer as docs/PROTOCOL.md says.
            let info = try DeviceInfo(decoding: try await fake.read(OTAProtocol.infoUUID, device: Self.centralA))
            #expect(info.protocolVersion == 1 && info.state == .idle && info.maxImageSize == 1 << 20)
            #expect(info.firmwareVersion == FirmwareVersion(major: 1, minor: 0, patch: 0))
            #expect(String(decoding: try await fake.read(DeviceInformationService.firmwareRevisionUUID, device: nil), as: UTF8.self) == "1.0.0")
            #expect(String(decoding: try await fake.read(DeviceInformationService.manufacturerNameUUID, device: nil), as: UTF8.self) == "otaflash")

            try await served.advertisement.unregister()
            try await served.application.unregister()
            #expect(fake.calls.contains("UnregisterApplication /org/otaflash/test"))
            #expect(fake.calls.contains("UnregisterAdvertisement /org/otaflash/test/advertisement0"))
            await served.host.close()
            await fake.connection.close()
        }
    }

    // MARK: A flash end to end

    @Test func fourKiBFlashThroughTheExportedObjectsStoresTheImage() async throws {
        try await Self.withBus { bus in
            let fake = try await FakeBlueZPeripheralSide.start(on: bus, devices: [Self.centralA])
            let store = try Self.temporaryDirectory()
            defer { try? FileManager.default.removeItem(atPath: store) }
            let served = try await Self.serve(bus, config: OTAPeripheralConfig(name: "flash-test", storeDirectory: store,
                                                                              bootDelay: .milliseconds(50)))
            var image = [UInt8](repeating: 0, count: 4096)
            var generator = SeededGenerator(seed: 42)
            for i in image.indices { image[i] = UInt8(truncatingIfNeeded: generator.next()) }
            let crc = CRC32.checksum(image)
            let version = FirmwareVersion(major: 2, minor: 1, patch: 7)

            let notifications = try await fake.startNotify(OTAProtocol.controlPointUUID)
            #expect(await served.application.isNotifying(OTAProtocol.controlPointUUID))

            try await fake.write(OTAProtocol.controlPointUUID, ControlRequest.begin(.init(
                imageSize: UInt32(image.count), imageCRC: crc, version: version, restart: false)).encoded, device: Self.centralA)
            let begin = try Self.response(try await peripheralNext(notifications))
            #expect(begin == ControlResponse(opcode: .begin, status: .success, payload: .position(offset: 0, crc: 0)))

            // MTU 247: 240 image bytes per packet (docs/PROTOCOL.md, "Data characteristic").
            let chunk = OTAProtocol.chunkSize(mtu: 247)
            var offset = 0
            while offset < image.count {
                let end = min(offset + chunk, image.count)
                try await fake.write(OTAProtocol.dataUUID, DataPacket.encode(offset: UInt32(offset), payload: image[offset..<end]),
                                     device: Self.centralA)
                offset = end
            }
            try await fake.write(OTAProtocol.controlPointUUID, ControlRequest.checkpoint(offset: UInt32(image.count), crc: crc).encoded,
                                 device: Self.centralA)
            #expect(try Self.response(try await peripheralNext(notifications))
                    == ControlResponse(opcode: .checkpoint, status: .success, payload: .position(offset: UInt32(image.count), crc: crc)))

            try await fake.write(OTAProtocol.controlPointUUID, ControlRequest.verify.encoded, device: Self.centralA)
            #expect(try Self.response(try await peripheralNext(notifications))
                    == ControlResponse(opcode: .verify, status: .success, payload: .computedCRC(crc)))

            try await fake.write(OTAProtocol.controlPointUUID, ControlRequest.activate.encoded, device: Self.centralA)
            #expect(try Self.response(try await peripheralNext(notifications)) == ControlResponse(opcode: .activate, status: .success))

            // The stored image is the image, byte for byte, under its CRC; no temporary file is left.
            let path = "\(store)/\(hex32(crc)).bin"
            let stored = FileManager.default.contents(atPath: path).map { [UInt8]($0) }
            #expect(stored == image, "\(path)")
            #expect(try FileManager.default.contentsOfDirectory(atPath: store) == [String(path.split(separator: "/").last!)])

            // The device boots the new image: the link to the central is dropped with Device1.Disconnect.
            try await fake.waitForCall("Disconnect \(Self.centralA)")

            // Events for the progress output, in order.
            let events = served.events.all
            #expect(events.first == .connected(central: Self.centralA))
            #expect(events.contains(.begin(central: Self.centralA, size: 4096, crc: crc, offset: 0)))
            #expect(events.contains(.progress(central: Self.centralA, received: 4096, total: 4096)))
            #expect(events.contains(.verified(central: Self.centralA, crc: crc)))
            #expect(events.contains(.activated(central: Self.centralA, size: 4096, crc: crc, version: version.description, stored: path)))

            // While it reboots, commands fail (it keeps advertising: re-registering an advertisement
            // on BlueZ 5.66 left it unseen by later scans); afterwards it runs the new version.
            #expect(!fake.calls.contains("UnregisterAdvertisement /org/otaflash/test/advertisement0"))
            await #expect(throws: DBusError.self) {
                try await fake.write(OTAProtocol.controlPointUUID, ControlRequest.status.encoded, device: Self.centralA)
            }
            await served.peripheral.waitUntilBack()
            #expect(served.events.all.contains { if case .disconnected(Self.centralA, _) = $0 { true } else { false } })
            #expect(String(decoding: try await fake.read(DeviceInformationService.firmwareRevisionUUID, device: nil), as: UTF8.self) == "2.1.7")

            await served.host.close()
            await fake.connection.close()
        }
    }

    // MARK: One transfer at a time

    @Test func aSecondCentralIsToldBusyOnItsOwnWriteOnly() async throws {
        try await Self.withBus { bus in
            let fake = try await FakeBlueZPeripheralSide.start(on: bus, devices: [Self.centralA, Self.centralB])
            let served = try await Self.serve(bus, config: OTAPeripheralConfig(name: "busy-test"))
            let notifications = try await fake.startNotify(OTAProtocol.controlPointUUID)
            let begin = ControlRequest.begin(.init(imageSize: 1000, imageCRC: 0x1234_5678, version: FirmwareVersion(packed: 0),
                                                   restart: false)).encoded
            try await fake.write(OTAProtocol.controlPointUUID, begin, device: Self.centralA)
            #expect(try Self.response(try await peripheralNext(notifications)).status == .success)

            // B's BEGIN fails on B's own write with ATT application error 0x89 (busy)...
            var refusal: DBusError?
            do {
                try await fake.write(OTAProtocol.controlPointUUID, begin, device: Self.centralB)
            } catch let error as DBusError {
                refusal = error
            }
            #expect(refusal == DBusError(name: "org.bluez.Error.Failed", message: "0x89"))
            // ...its data is ignored, and nothing was notified: the next notification is the
            // answer to A's STATUS, which shows only A's transfer.
            try await fake.write(OTAProtocol.dataUUID, DataPacket.encode(offset: 0, payload: [1, 2, 3][...]), device: Self.centralB)
            try await fake.write(OTAProtocol.controlPointUUID, ControlRequest.status.encoded, device: Self.centralA)
            let status = try Self.response(try await peripheralNext(notifications))
            #expect(status.opcode == .status)
            #expect(status.payload == .status(.init(state: .receiving, offset: 0, crc: 0, imageSize: 1000, imageCRC: 0x1234_5678)))
            // STATUS is answered for anyone (docs/PROTOCOL.md); other commands from B are refused.
            try await fake.write(OTAProtocol.controlPointUUID, ControlRequest.status.encoded, device: Self.centralB)
            #expect(try Self.response(try await peripheralNext(notifications)).opcode == .status)
            await #expect(throws: DBusError(name: "org.bluez.Error.Failed", message: "0x89")) {
                try await fake.write(OTAProtocol.controlPointUUID, ControlRequest.abort.encoded, device: Self.centralB)
            }
            #expect(served.events.all.contains(.busy(central: Self.centralB, owner: Self.centralA)))

            // Once A aborts, B may begin.
            try await fake.write(OTAProtocol.controlPointUUID, ControlRequest.abort.encoded, device: Self.centralA)
            #expect(try Self.response(try await peripheralNext(notifications)) == ControlResponse(opcode: .abort, status: .success))
            try await fake.write(OTAProtocol.controlPointUUID, begin, device: Self.centralB)
            #expect(try Self.response(try await peripheralNext(notifications)).status == .success)
            await served.host.close()
            await fake.connection.close()
        }
    }

    // MARK: Faults

    @Test func injectedGATTErrorsAndRebootsReachTheCentral() async throws {
        try await Self.withBus { bus in
            let fake = try await FakeBlueZPeripheralSide.start(on: bus, devices: [Self.centralA])
            let faults = FaultPlan(rebootAt: [480], rebootDuration: .milliseconds(300), gattErrorRate: 0)
            let served = try await Self.serve(bus, config: OTAPeripheralConfig(name: "fault-test", faults: faults))
            let notifications = try await fake.startNotify(OTAProtocol.controlPointUUID)
            let image = [UInt8](repeating: 0x5A, count: 1024)
            try await fake.write(OTAProtocol.controlPointUUID, ControlRequest.begin(.init(
                imageSize: 1024, imageCRC: CRC32.checksum(image), version: FirmwareVersion(packed: 0), restart: false)).encoded,
                device: Self.centralA)
            _ = try await peripheralNext(notifications)
            for offset in stride(from: 0, to: 720, by: 240) {
                try await fake.write(OTAProtocol.dataUUID, DataPacket.encode(offset: UInt32(offset), payload: image[offset..<offset + 240]),
                                     device: Self.centralA)
            }
            // The packet covering 480 rebooted the device: the link is dropped, commands fail while it is away.
            try await fake.waitForCall("Disconnect \(Self.centralA)")
            await #expect(throws: DBusError.self) {
                try await fake.write(OTAProtocol.controlPointUUID, ControlRequest.status.encoded, device: Self.centralA)
            }
            await served.peripheral.waitUntilBack()
            // Back: nothing was committed, so it holds nothing.
            try await fake.write(OTAProtocol.controlPointUUID, ControlRequest.status.encoded, device: Self.centralA)
            let status = try Self.response(try await peripheralNext(notifications))
            #expect(status.payload == .status(.init(state: .receiving, offset: 0, crc: 0, imageSize: 1024, imageCRC: CRC32.checksum(image))))
            await served.host.close()
            await fake.connection.close()
        }
    }

    @Test func anInjectedGATTErrorIsAnApplicationError() async throws {
        try await Self.withBus { bus in
            let fake = try await FakeBlueZPeripheralSide.start(on: bus)
            let served = try await Self.serve(bus, config: OTAPeripheralConfig(faults: FaultPlan(gattErrorRate: 1)))
            await #expect(throws: DBusError(name: "org.bluez.Error.Failed", message: "writing the control point: ATT error 0xe")) {
                try await fake.write(OTAProtocol.controlPointUUID, ControlRequest.status.encoded, device: Self.centralA)
            }
            await served.host.close()
            await fake.connection.close()
        }
    }

    // MARK: Adapters and errors

    @Test func adapterSelectionAndItsErrors() async throws {
        try await Self.withBus { bus in
            // Nothing owns org.bluez yet: bluetoothd is "not running".
            await #expect(throws: PeripheralError.self) { _ = try await PeripheralHost.open(adapter: nil, busAddress: bus.address) }
            do {
                _ = try await PeripheralHost.open(adapter: nil, busAddress: bus.address)
            } catch let error as PeripheralError {
                #expect(error.kind == .bluetoothUnavailable && error.message.contains("bluetoothd is not running"))
            }
            let fake = try await FakeBlueZPeripheralSide.start(on: bus, adapter: "hci1", powered: false)
            do {
                _ = try await PeripheralHost.open(adapter: "hci7", busAddress: bus.address)
                Issue.record("a missing adapter was accepted")
            } catch let error as PeripheralError {
                #expect(error.message == "no adapter hci7; bluetoothd has hci1")
            }
            do {
                _ = try await PeripheralHost.open(adapter: "hci1", busAddress: bus.address)
                Issue.record("a powered-off adapter was accepted")
            } catch let error as PeripheralError {
                #expect(error.kind == .bluetoothUnavailable && error.message.hasPrefix("adapter hci1 is powered off"))
            }
            do {
                _ = try await PeripheralHost.open(adapter: nil, busAddress: bus.address)
                Issue.record("no powered adapter, yet one was chosen")
            } catch let error as PeripheralError {
                #expect(error.message.hasPrefix("no powered Bluetooth adapter"))
            }
            await fake.connection.close()
        }
    }

    @Test func theCommandEndsWithOneLineAndItsExitCode() async throws {
        try await Self.withBus { bus in
            setenv(PeripheralHost.busAddressEnvironment, bus.address, 1)
            defer { unsetenv(PeripheralHost.busAddressEnvironment) }
            let noStack = CapturedOutput()
            #expect(await runOtaflash(["simulate", "--adapter", "hci0"], output: noStack) == ExitCode.bluetoothUnavailable.rawValue)
            #expect(noStack.stderr == "otaflash: error: bluetoothd is not running (org.bluez: ServiceUnknown: The name org.bluez was not provided by any .service files); start it with `systemctl start bluetooth`\n")

            let fake = try await FakeBlueZPeripheralSide.start(
                on: bus, registerError: DBusError(name: "org.bluez.Error.AlreadyExists", message: "Already Exists"))
            let refused = CapturedOutput()
            #expect(await runOtaflash(["simulate", "--json"], output: refused) == ExitCode.bluetoothUnavailable.rawValue)
            #expect(refused.stderr == "otaflash: error: registering the GATT application on hci0 (GattManager1.RegisterApplication) failed: org.bluez.Error.AlreadyExists: Already Exists\n")
            #expect(refused.stdout.hasSuffix(#""error":"bluetooth_unavailable","message":"registering the GATT application on hci0 (GattManager1.RegisterApplication) failed: org.bluez.Error.AlreadyExists: Already Exists"}"# + "\n"))
            #expect(fake.calls.contains("RegisterApplication /org/otaflash/simulate"))
            await fake.connection.close()
        }
    }

    @Test func permissionErrorsMapToTheirCode() {
        let denied = PeripheralError.from(DBusError(name: "org.freedesktop.DBus.Error.AccessDenied", message: "Rejected send message"), "registering the GATT application")
        #expect(denied.kind == .permission)
        #expect(PeripheralError.from(DBusError(name: "org.freedesktop.DBus.Error.ServiceUnknown"), "x").message.contains("bluetoothd is not running"))
    }

    // MARK: Small parts

    @Test func optionsAreReadAsBlueZSendsThem() throws {
        let request = try GATTServerRequest(options: .vardict([
            "device": .objectPath(Self.centralA), "mtu": .uint16(517), "link": .string("LE"), "offset": .uint16(4),
        ]))
        #expect(request == GATTServerRequest(device: Self.centralA, mtu: 517, offset: 4, link: "LE"))
        #expect(try GATTServerRequest(options: .vardict([:])) == GATTServerRequest())
        #expect(OTAPeripheralEvent.address(of: Self.centralA) == "11:22:33:44:55:66")
    }

    @Test func storingIsAtomicAndNamedByCRC() throws {
        let directory = try Self.temporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let path = try OTAPeripheral.store([1, 2, 3], crc: 0xAB, in: directory)
        #expect(path == "\(directory)/000000ab.bin")
        #expect(try FileManager.default.contentsOfDirectory(atPath: directory) == ["000000ab.bin"])
        #expect(throws: OTAPeripheral.StoreError.self) { try OTAPeripheral.store([1], crc: 1, in: "\(directory)/missing") }
    }
}
}

extension ProcessBusSuites.PeripheralTests {
    /// bluetoothd sends the writes of a characteristic flagged write-without-response with
    /// NO_REPLY_EXPECTED set (gdbus `g_dbus_send_message`); such calls are handled like any other.
    @Test func dataWritesSentWithoutReplyReachTheDevice() async throws {
        guard FileManager.default.isExecutableFile(atPath: "/usr/bin/busctl") else {
            print("SKIPPED: busctl is not installed")
            return
        }
        try await Self.withBus { bus in
            let fake = try await FakeBlueZPeripheralSide.start(on: bus)
            let served = try await Self.serve(bus, config: OTAPeripheralConfig())
            try await fake.write(OTAProtocol.controlPointUUID, ControlRequest.begin(.init(
                imageSize: 16, imageCRC: 0, version: FirmwareVersion(packed: 0), restart: false)).encoded, device: Self.centralA)
            let process = Process()
            process.executableURL = URL(fileURLWithPath: "/usr/bin/busctl")
            process.arguments = ["--address=\(bus.address)", "call", "--expect-reply=false", fake.applicationOwner!,
                                 fake.characteristicPath(OTAProtocol.dataUUID)!, "org.bluez.GattCharacteristic1", "WriteValue",
                                 "aya{sv}", "8", "0", "0", "0", "0", "1", "2", "3", "4", "1", "device", "o", Self.centralA]
            try process.run()
            process.waitUntilExit()
            #expect(process.terminationStatus == 0)
            try await served.events.waitFor(.progress(central: Self.centralA, received: 4, total: 16))
            #expect(await served.peripheral.device?.target.received == 4)
            await served.host.close()
            await fake.connection.close()
        }
    }
}

/// Writes through the socket bluetoothd acquires (`AcquireWrite`), as bluetoothd sends them.
extension ProcessBusSuites.PeripheralTests {
    static func send(_ fd: Int32, _ datagram: [UInt8]) throws {
        let sent = datagram.withUnsafeBytes { Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
        guard sent == datagram.count else { throw HarnessError("send on the acquired socket: \(String(cString: strerror(errno)))") }
    }

    /// Streams `image[from..<to]` as data packets into the socket.
    static func sendPackets(_ fd: Int32, _ image: [UInt8], from: Int, to: Int, mtu: Int = 247) throws {
        let chunk = OTAProtocol.chunkSize(mtu: mtu)
        var offset = from
        while offset < to {
            let end = min(offset + chunk, to)
            try send(fd, DataPacket.encode(offset: UInt32(offset), payload: image[offset..<end]))
            offset = end
        }
    }

    /// A served native device with a transfer of `image` begun by `centralA`, and its control
    /// point's notifications.
    static func begun(_ bus: PeripheralTestBus, _ image: [UInt8]) async throws
        -> (fake: FakeBlueZPeripheralSide, served: Served, notifications: AsyncStream<[UInt8]>) {
        let fake = try await FakeBlueZPeripheralSide.start(on: bus, devices: [Self.centralA])
        let served = try await Self.serve(bus, config: OTAPeripheralConfig())
        let notifications = try await fake.startNotify(OTAProtocol.controlPointUUID)
        try await fake.write(OTAProtocol.controlPointUUID, ControlRequest.begin(.init(
            imageSize: UInt32(image.count), imageCRC: CRC32.checksum(image), version: FirmwareVersion(packed: 0), restart: false)).encoded,
            device: Self.centralA)
        _ = try Self.response(try await peripheralNext(notifications))
        return (fake, served, notifications)
    }

    /// bluetoothd handles each ATT PDU in order: the data it put into the socket before it called
    /// WriteValue for a CHECKPOINT reaches the device before the CHECKPOINT, although the socket
    /// is read by another path than the call.
    @Test func dataThroughTheAcquiredSocketComesBeforeALaterCheckpoint() async throws {
        try await Self.withBus { bus in
            let image = Self.testImage(8192)
            let (fake, served, notifications) = try await Self.begun(bus, image)
            let (fd, mtu) = try await fake.acquireWrite(OTAProtocol.dataUUID, device: Self.centralA, mtu: 247)
            defer { close(fd) }
            #expect(mtu == 247)
            // Three windows, each followed at once by its CHECKPOINT: every one is answered at its
            // own offset. (An early CHECKPOINT would be held until its data came; the order itself
            // is what the next test checks.)
            var sent = 0
            for end in [2048, 6000, 8192] {
                try Self.sendPackets(fd, image, from: sent, to: end)
                sent = end
                let part = CRC32.checksum(image[0..<end])
                try await fake.write(OTAProtocol.controlPointUUID, ControlRequest.checkpoint(offset: UInt32(end), crc: part).encoded,
                                     device: Self.centralA)
                #expect(try Self.response(try await peripheralNext(notifications))
                        == ControlResponse(opcode: .checkpoint, status: .success, payload: .position(offset: UInt32(end), crc: part)))
            }
            #expect(await served.peripheral.device?.target.received == 8192)
            await served.host.close()
            await fake.connection.close()
        }
    }

    /// bluetoothd holds the writes that arrive while it acquires, and sends them into the socket
    /// once it has the reply, while a command it handled meanwhile may already be waiting as a
    /// call (a STATUS here, which a device answers at once with what it holds): the held writes
    /// still come first.
    @Test func writesHeldWhileAcquiringComeBeforeTheCallMadeMeanwhile() async throws {
        try await Self.withBus { bus in
            let image = Self.testImage(4096)
            let crc = CRC32.checksum(image)
            let (fake, served, notifications) = try await Self.begun(bus, image)
            let (fd, _) = try await fake.acquireWrite(OTAProtocol.dataUUID, device: Self.centralA)
            defer { close(fd) }
            // The STATUS call goes first (a device answers it at once, with what it holds); the
            // held data follows 200 ms later.
            let late = Task {
                try await Task.sleep(for: .milliseconds(200))
                try Self.sendPackets(fd, image, from: 0, to: image.count)
            }
            try await fake.write(OTAProtocol.controlPointUUID, ControlRequest.status.encoded, device: Self.centralA)
            try await late.value
            let status = try Self.response(try await peripheralNext(notifications))
            #expect(status.payload == .status(.init(state: .receiving, offset: UInt32(image.count), crc: crc,
                                                    imageSize: UInt32(image.count), imageCRC: crc)))
            await served.host.close()
            await fake.connection.close()
        }
    }

    /// Writes that come on their own, with no call after them, reach the device too; when
    /// bluetoothd hangs up, the next write acquires a new socket and goes on from there.
    @Test func aHungUpSocketIsAcquiredAgain() async throws {
        try await Self.withBus { bus in
            let image = Self.testImage(4096)
            let (fake, served, _) = try await Self.begun(bus, image)
            let first = try await fake.acquireWrite(OTAProtocol.dataUUID, device: Self.centralA)
            // Progress is reported every 5 % (204 bytes): 1920 is the end of a 240-byte packet.
            try Self.sendPackets(first.fd, image, from: 0, to: 1920)
            try await served.events.waitFor(.progress(central: Self.centralA, received: 1920, total: 4096))
            close(first.fd)
            let second = try await fake.acquireWrite(OTAProtocol.dataUUID, device: Self.centralA)
            defer { close(second.fd) }
            try Self.sendPackets(second.fd, image, from: 1920, to: 4096)
            try await served.events.waitFor(.progress(central: Self.centralA, received: 4096, total: 4096))
            #expect(await served.peripheral.device?.target.received == 4096)
            await served.host.close()
            await fake.connection.close()
        }
    }

    /// bluetoothd 5.66 keeps one socket per characteristic for every central: when another
    /// central calls, the socket acquired for the first is handed back (it hangs up), so the
    /// writes that follow are acquired again under the central that made them.
    @Test func anotherCentralsCallHandsTheSocketBack() async throws {
        try await Self.withBus { bus in
            let image = Self.testImage(4096)
            let (fake, served, _) = try await Self.begun(bus, image)
            let first = try await fake.acquireWrite(OTAProtocol.dataUUID, device: Self.centralA)
            defer { close(first.fd) }
            try Self.sendPackets(first.fd, image, from: 0, to: 960)
            try await fake.write(OTAProtocol.controlPointUUID, ControlRequest.status.encoded, device: Self.centralA)
            var pfd = pollfd(fd: first.fd, events: Int16(POLLIN), revents: 0)
            #expect(poll(&pfd, 1, 0) == 0, "the socket was handed back on its own central's call")
            #expect(await served.peripheral.device?.target.received == 960)

            try await fake.write(OTAProtocol.controlPointUUID, ControlRequest.status.encoded, device: Self.centralB)
            pfd.revents = 0
            #expect(poll(&pfd, 1, 2000) == 1 && pfd.revents & Int16(POLLHUP) != 0, "revents \(pfd.revents)")
            var byte: UInt8 = 0
            #expect(recv(first.fd, &byte, 1, Int32(MSG_DONTWAIT)) == 0, "end of file: the application closed its end")
            await served.host.close()
            await fake.connection.close()
        }
    }
}

/// One device model, one behaviour: each scenario runs through the simulator and through peripheral
/// mode and must end the same way.
extension ProcessBusSuites.PeripheralTests {
    static let scenarioImage = testImage(4096)
    static let scenarioVersion = FirmwareVersion(major: 3, minor: 0, patch: 1)

    static func testImage(_ count: Int) -> [UInt8] {
        var generator = SeededGenerator(seed: 7)
        return (0..<count).map { _ in UInt8(truncatingIfNeeded: generator.next()) }
    }

    static func reply(_ happening: Happening?) throws -> ControlResponse {
        guard case .notification(let bytes)? = happening else {
            throw HarnessError("expected a reply notification, got \(happening.map { "\($0)" } ?? "nothing")")
        }
        return try response(bytes)
    }

    static func position(_ offset: Int) -> ControlResponse.Payload {
        .position(offset: UInt32(offset), crc: CRC32.checksum(scenarioImage[0..<offset]))
    }

    /// BEGIN, then `image[0..<end]` in 240-byte packets.
    static func beginAndSend(_ device: any DeviceUnderTest, upTo end: Int) async throws {
        let image = scenarioImage
        try await device.command(.begin(.init(imageSize: UInt32(image.count), imageCRC: CRC32.checksum(image),
                                              version: scenarioVersion, restart: false)))
        #expect(try reply(await device.next(within: .seconds(5))).status == .success)
        for offset in stride(from: 0, to: end, by: 240) {
            try await device.data(offset: offset, image[offset..<min(offset + 240, end)])
        }
    }

    /// Whether a central gives up on `error` or resumes (OTAError's classification).
    static func isResumableConnectionError(_ error: any Error) -> Bool {
        guard let error = error as? GATTError else { return false }
        let mapped = OTAError.from(error, device: "the device")
        return mapped.code == .connection && mapped.resumable
    }

    /// Slow flash makes VERIFY and ACTIVATE take 400 ms each. The ACTIVATE reply still goes out
    /// before the link drops for the reboot; while the device reboots a connection attempt and a
    /// read fail as lost connections (which a central resumes from), and afterwards the device
    /// runs the new image.
    @Test(arguments: DeviceTransport.allCases)
    func activateReplyComesBeforeTheRebootAndTheRebootRefusesConnections(_ transport: DeviceTransport) async throws {
        let faults = FaultPlan(rebootDuration: .milliseconds(1500), slowFlashPerKiB: .milliseconds(100))
        try await Self.withDevice(transport, faults: faults, bootDelay: .milliseconds(500)) { device in
            let image = Self.scenarioImage
            let crc = CRC32.checksum(image)
            try await device.connect(timeout: .seconds(2))
            try await Self.beginAndSend(device, upTo: image.count)
            try await device.command(.checkpoint(offset: UInt32(image.count), crc: crc))
            #expect(try Self.reply(await device.next(within: .seconds(5))).status == .success)
            try await device.command(.verify)
            #expect(try Self.reply(await device.next(within: .seconds(5))) == ControlResponse(opcode: .verify, status: .success, payload: .computedCRC(crc)))

            try await device.command(.activate)
            #expect(try Self.reply(await device.next(within: .seconds(5))) == ControlResponse(opcode: .activate, status: .success))
            #expect(await device.next(within: .seconds(5)) == .linkDropped)

            // Rebooting: a read on the old link fails as a lost link, not as a protocol error...
            do {
                _ = try await device.readInfo()
                Issue.record("a read during the reboot succeeded")
            } catch {
                #expect(Self.isResumableConnectionError(error), "\(error)")
            }
            if let peripheral = device as? PeripheralUnderTest {
                // Peripheral mode keeps advertising (re-registering an advertisement on BlueZ 5.66
                // left it unseen by later scans): a central that connects has its requests
                // refused until the device is back; its link is left to it.
                try await peripheral.announceConnection()
                do {
                    _ = try await device.readInfo()
                    Issue.record("a read from a central connected during the reboot succeeded")
                } catch {}
                await peripheral.waitUntilBack()
            } else {
                // ...and the simulator refuses a connection attempt as a connection error.
                do {
                    try await device.connect(timeout: .milliseconds(300))
                    Issue.record("a connection during the reboot was accepted")
                } catch {
                    #expect(Self.isResumableConnectionError(error), "\(error)")
                }
            }

            try await device.connect(timeout: .seconds(5))
            let info = try await device.readInfo()
            #expect(info.firmwareVersion == Self.scenarioVersion)
            #expect(info.activeImageCRC == crc)
        }
    }

    /// Two CHECKPOINTs ahead of their data, the second sent while the first is held: the first's
    /// deadline passes without a word, the second is answered `gap` at its own deadline, and
    /// nothing else follows. A CHECKPOINT held when the central disconnects is never answered.
    @Test(arguments: DeviceTransport.allCases)
    func anOldHeldCheckpointNeverAnswersANewerOne(_ transport: DeviceTransport) async throws {
        // Margins: the second CHECKPOINT may come up to 1 s late before the first one's deadline
        // would answer it; quiet windows end before the second's deadline can fall in them.
        try await Self.withDevice(transport, faults: .none, holdEarlyCheckpoint: .milliseconds(1500)) { device in
            try await device.connect(timeout: .seconds(2))
            try await Self.beginAndSend(device, upTo: 240)
            try await device.command(.checkpoint(offset: 720, crc: CRC32.checksum(Self.scenarioImage[0..<720])))
            #expect(await device.next(within: .milliseconds(500)) == nil)
            try await device.command(.checkpoint(offset: 960, crc: CRC32.checksum(Self.scenarioImage[0..<960])))
            // The first CHECKPOINT's deadline falls in here.
            #expect(await device.next(within: .milliseconds(1200)) == nil)
            #expect(try Self.reply(await device.next(within: .seconds(3)))
                    == ControlResponse(opcode: .checkpoint, status: .gap, payload: Self.position(240)))
            #expect(await device.next(within: .milliseconds(1500)) == nil)

            try await device.command(.checkpoint(offset: 1200, crc: CRC32.checksum(Self.scenarioImage[0..<1200])))
            try await device.disconnect()
            try await device.connect(timeout: .seconds(2))
            #expect(await device.next(within: .seconds(2)) == nil)
            try await device.command(.status)
            let status = try Self.reply(await device.next(within: .seconds(5)))
            #expect(status.opcode == .status)
            #expect(status.payload == .status(.init(state: .receiving, offset: 240, crc: CRC32.checksum(Self.scenarioImage[0..<240]),
                                                    imageSize: 4096, imageCRC: CRC32.checksum(Self.scenarioImage))))
        }
    }

    // MARK: Malformed requests from bluetoothd

    /// An `offset` option that is negative, beyond 16 bits, past the value, or on a write is
    /// answered with org.bluez.Error.InvalidOffset (ATT 0x07), and the device keeps serving.
    @Test(arguments: [
        ("ReadValue", DBusValue.int32(-1)),
        ("ReadValue", .int64(Int64.min)),
        ("ReadValue", .uint64(UInt64.max)),
        ("ReadValue", .uint32(70_000)),
        ("ReadValue", .uint16(25)),
        ("ReadValue", .string("4")),
        ("WriteValue", .uint16(4)),
        ("WriteValue", .int16(-4)),
    ])
    func badOffsetsAreRefusedWithInvalidOffset(method: String, offset: DBusValue) async throws {
        try await Self.withBus { bus in
            let fake = try await FakeBlueZPeripheralSide.start(on: bus)
            let served = try await Self.serve(bus, config: OTAPeripheralConfig())
            let uuid = method == "ReadValue" ? OTAProtocol.infoUUID : OTAProtocol.controlPointUUID
            let options = DBusValue.vardict(["device": .objectPath(Self.centralA), "offset": .variant(offset)])
            let arguments = method == "ReadValue" ? [options] : [DBusValue.bytes(ControlRequest.status.encoded), options]
            var refusal: DBusError?
            do {
                _ = try await fake.connection.call(destination: fake.applicationOwner!, path: fake.characteristicPath(uuid)!,
                                                   interface: "org.bluez.GattCharacteristic1", member: method,
                                                   arguments: arguments, timeout: .seconds(5))
            } catch let error as DBusError {
                refusal = error
            }
            #expect(refusal?.name == "org.bluez.Error.InvalidOffset", "\(String(describing: refusal))")
            // Still serving: the info value reads whole.
            #expect(try DeviceInfo(decoding: try await fake.read(OTAProtocol.infoUUID, device: Self.centralA)).state == .idle)
            await served.host.close()
            await fake.connection.close()
        }
    }
}

extension OTAPeripheral {
    /// The served native device (its OTA state machine and faults), when that is what is served.
    var device: FaultyDevice? { (model as? NativePeripheral)?.model.device }
}
