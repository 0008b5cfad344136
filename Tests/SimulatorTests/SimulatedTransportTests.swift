import GATT
import Native
import OTADevice
import OTAWire
import Simulator
import Testing

/// The simulated peripheral seen through the `GATTCentral`/`GATTConnection` protocols, on virtual time.
@Suite("Simulated transport")
struct SimulatedTransportTests {
    static let address = DeviceAddress("C0:FF:EE:00:00:01")!

    func connect(_ config: SimulatedDeviceConfig = SimulatedDeviceConfig()) async throws -> (SimulatedDevice, any GATTConnection, VirtualClock) {
        let device = SimulatedDevice(config)
        let clock = VirtualClock()
        let central = SimulatedCentral(devices: [device], clock: clock)
        let connection = try await central.connect(to: config.address, timeout: .seconds(5))
        return (device, connection, clock)
    }

    /// Waits for the next event that is not the completion of a write.
    func nextNotification(_ connection: any GATTConnection) async -> GATTEvent? {
        while let event = await connection.nextEvent(timeout: .seconds(10)) {
            if case .writeCompleted(_, nil) = event { continue }
            return event
        }
        return nil
    }

    @Test func scanReportsDevicesStrongestFirstAndFiltersOnTheOTAService() async throws {
        let near = SimulatedDevice(SimulatedDeviceConfig(address: DeviceAddress("00:00:00:00:00:01")!, rssi: -40))
        let far = SimulatedDevice(SimulatedDeviceConfig(address: DeviceAddress("00:00:00:00:00:02")!, rssi: -80))
        let plain = SimulatedDevice(SimulatedDeviceConfig(address: DeviceAddress("00:00:00:00:00:03")!, rssi: -30), native: NativeDeviceOptions(hasOTAService: false))
        let central = SimulatedCentral(devices: [far, plain, near], clock: VirtualClock())
        let all = try await central.scan(filter: ScanFilter(), timeout: .seconds(1))
        #expect(all.map(\.address.description) == ["00:00:00:00:00:03", "00:00:00:00:00:01", "00:00:00:00:00:02"])
        let ota = try await central.scan(filter: ScanFilter(serviceUUIDs: [OTAProtocol.serviceUUID]), timeout: .seconds(1))
        #expect(ota.map(\.address.description) == ["00:00:00:00:00:01", "00:00:00:00:00:02"])
    }

    @Test func unknownAddressIsNotFoundAfterTheTimeout() async {
        let clock = VirtualClock()
        let central = SimulatedCentral(devices: [SimulatedDevice(SimulatedDeviceConfig())], clock: clock)
        do {
            _ = try await central.connect(to: DeviceAddress("11:22:33:44:55:66")!, timeout: .seconds(7))
            Issue.record("connected to a device that does not exist")
        } catch {
            #expect(error.code == .deviceNotFound)
            #expect(clock.now >= .seconds(7))
        }
    }

    @Test func gattTableHasTheOTACharacteristicsWithTheirProperties() async throws {
        let (_, connection, _) = try await connect()
        let service = try await connection.discoverService(OTAProtocol.serviceUUID, name: "OTA")
        #expect(service.characteristic(OTAProtocol.controlPointUUID)?.properties == [.write, .notify])
        #expect(service.characteristic(OTAProtocol.dataUUID)?.properties == [.writeWithoutResponse])
        #expect(service.characteristic(OTAProtocol.infoUUID)?.properties == [.read])
        #expect(try await connection.mtu() == 247)
    }

    @Test func infoAndDeviceInformationAreReadable() async throws {
        let (_, connection, _) = try await connect(SimulatedDeviceConfig(slotSize: 200_000, firmwareVersion: FirmwareVersion(major: 3, minor: 1, patch: 4)))
        let services = try await connection.discoverServices()
        let ota = try #require(services.first { $0.uuid == OTAProtocol.serviceUUID })
        let info = try DeviceInfo(decoding: try await connection.read(try #require(ota.characteristic(OTAProtocol.infoUUID))))
        #expect(info == DeviceInfo(state: .idle, maxImageSize: 200_000, firmwareVersion: FirmwareVersion(major: 3, minor: 1, patch: 4),
                                   received: 0, pendingImageSize: 0))
        let dis = try #require(services.first { $0.uuid == DeviceInformationService.serviceUUID })
        let revision = try await connection.read(try #require(dis.characteristic(DeviceInformationService.firmwareRevisionUUID)))
        #expect(String(decoding: revision, as: UTF8.self) == "3.1.4")
    }

    @Test func commandIsAnsweredWithANotificationAfterLinkTime() async throws {
        let (_, connection, clock) = try await connect()
        let service = try await connection.discoverService(OTAProtocol.serviceUUID, name: "OTA")
        let cp = try #require(service.characteristic(OTAProtocol.controlPointUUID))
        try await connection.setNotifications(true, for: cp)
        let before = clock.now
        let begin = ControlRequest.begin(.init(imageSize: 1000, imageCRC: 0, version: FirmwareVersion(packed: 0), restart: false))
        _ = try connection.submitWrite(begin.encoded, to: cp)
        let event = await nextNotification(connection)
        guard case .notification(let id, let value)? = event else {
            Issue.record("expected a notification, got \(String(describing: event))")
            return
        }
        #expect(id == cp.id)
        #expect(value == [0x80, 0x01, 0x00, 0, 0, 0, 0, 0, 0, 0, 0])
        #expect(clock.now > before)
    }

    @Test func writingWithoutResponseToTheControlPointIsNotPermitted() async throws {
        let (_, connection, _) = try await connect()
        let service = try await connection.discoverService(OTAProtocol.serviceUUID, name: "OTA")
        let cp = try #require(service.characteristic(OTAProtocol.controlPointUUID))
        #expect(throws: GATTError.self) { _ = try connection.tryWriteWithoutResponse([0x03], to: cp) }
    }

    @Test func disconnectFaultDropsTheLinkAndTheCentralHearsAfterTheSupervisionTimeout() async throws {
        var config = SimulatedDeviceConfig()
        config.faults = FaultPlan(disconnectAt: [100])
        let (device, connection, _) = try await connect(config)
        let service = try await connection.discoverService(OTAProtocol.serviceUUID, name: "OTA")
        let cp = try #require(service.characteristic(OTAProtocol.controlPointUUID))
        let data = try #require(service.characteristic(OTAProtocol.dataUUID))
        try await connection.setNotifications(true, for: cp)
        let begin = ControlRequest.begin(.init(imageSize: 1000, imageCRC: 0, version: FirmwareVersion(packed: 0), restart: false))
        _ = try connection.submitWrite(begin.encoded, to: cp)
        _ = await nextNotification(connection)
        try await connection.write(DataPacket.encode(offset: 0, payload: testBytes(200)[...]), to: data, type: .withoutResponse)
        let event = await nextNotification(connection)
        guard case .disconnected(.linkLost(let why))? = event else {
            Issue.record("expected a link loss, got \(String(describing: event))")
            return
        }
        #expect(why.contains("disconnect"))
        #expect(device.target?.received == 0)
        #expect(throws: GATTError.self) { _ = try connection.tryWriteWithoutResponse([0, 0, 0, 0, 1], to: data) }
    }

    @Test func rebootedDeviceIsUnreachableForTheRebootDuration() async throws {
        var config = SimulatedDeviceConfig()
        config.faults = FaultPlan(rebootAt: [0], rebootDuration: .seconds(3))
        let device = SimulatedDevice(config)
        let clock = VirtualClock()
        let central = SimulatedCentral(devices: [device], clock: clock)
        let connection = try await central.connect(to: config.address, timeout: .seconds(5))
        let service = try await connection.discoverService(OTAProtocol.serviceUUID, name: "OTA")
        let cp = try #require(service.characteristic(OTAProtocol.controlPointUUID))
        let data = try #require(service.characteristic(OTAProtocol.dataUUID))
        let begin = ControlRequest.begin(.init(imageSize: 1000, imageCRC: 0, version: FirmwareVersion(packed: 0), restart: false))
        _ = try connection.submitWrite(begin.encoded, to: cp)
        try await connection.write(DataPacket.encode(offset: 0, payload: testBytes(100)[...]), to: data, type: .withoutResponse)
        while let event = await connection.nextEvent(timeout: .seconds(10)) {
            if case .disconnected = event { break }
        }
        let rebootedBy = clock.now
        // Too short a timeout to see it come back.
        await #expect(throws: GATTError.self) { _ = try await central.connect(to: config.address, timeout: .milliseconds(100)) }
        _ = try await central.connect(to: config.address, timeout: .seconds(10))
        #expect(clock.now >= rebootedBy - .milliseconds(420) + .seconds(3))
        #expect(device.connectionCount == 2)
    }
}
