import BlueZ
import DBus
import Foundation
import GATT
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
        let host = try await PeripheralHost.open(adapter: nil, busAddress: bus.address)
        let log = EventLog()
        let peripheral = OTAPeripheral(config: config) { log.append($0) }
        let application = PeripheralApplication(connection: host.connection, root: "/org/otaflash/test", services: peripheral.services)
        await peripheral.attach(link: host, application: application)
        try await application.export()
        let advertisement = PeripheralAdvertisement(connection: host.connection, path: "/org/otaflash/test/advertisement0",
                                                    localName: config.name, serviceUUIDs: [OTAProtocol.serviceUUID])
        try await advertisement.export()
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

            // The advertisement as bluetoothd read it.
            let ad = fake.state.withLock { $0.advertisement }
            #expect(ad["Type"]?.string == "peripheral")
            #expect(ad["ServiceUUIDs"]?.strings == [OTAProtocol.serviceUUID.description])
            #expect(ad["LocalName"]?.string == "tree-test")

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
            #expect(events.contains(.activated(central: Self.centralA, size: 4096, crc: crc, version: version, stored: path)))

            // While it reboots, commands fail; afterwards it runs the new version.
            await #expect(throws: DBusError.self) {
                try await fake.write(OTAProtocol.controlPointUUID, ControlRequest.status.encoded, device: Self.centralA)
            }
            try await Task.sleep(for: .milliseconds(600))
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
            try await Task.sleep(for: .milliseconds(400))
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
            await #expect(throws: DBusError(name: "org.bluez.Error.Failed", message: "injected GATT error")) {
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
            #expect(noStack.stderr == "otaflash: error: bluetoothd is not running (nothing owns org.bluez on the D-Bus system bus): start it with `systemctl start bluetooth`\n")

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

    @Test func optionsAreReadAsBlueZSendsThem() {
        let request = GATTServerRequest(options: .vardict([
            "device": .objectPath(Self.centralA), "mtu": .uint16(517), "link": .string("LE"), "offset": .uint16(4),
        ]))
        #expect(request == GATTServerRequest(device: Self.centralA, mtu: 517, offset: 4, link: "LE"))
        #expect(GATTServerRequest(options: .vardict([:])) == GATTServerRequest())
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
            #expect(await served.peripheral.device.target.received == 4)
            await served.host.close()
            await fake.connection.close()
        }
    }
}
