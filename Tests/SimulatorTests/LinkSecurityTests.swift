import GATT
import Native
import OTAWire
@testable import Simulator
import Testing

/// The simulated device's link security, as embedded stacks check it (NimBLE
/// `ble_att_svr_check_perms`, Zephyr `bt_gatt_check_perm`): a read, a CCCD write or a write
/// request on a link weaker than the device requires is refused with ATT 0x05 without a bond and
/// 0x0F with one (the central then encrypts with its bond); a write command is dropped unanswered.
@Suite("Simulated link security")
struct LinkSecurityTests {
    static let address = DeviceAddress("C0:FF:EE:00:00:01")!

    func connect(_ security: LinkSecurity, bond: LinkSecurity = .none, passkey: UInt32? = nil)
        async throws -> (SimulatedDevice, SimulatedConnection, GATTService) {
        var config = SimulatedDeviceConfig()
        config.security = security
        config.passkey = passkey
        let device = SimulatedDevice(config)
        device.state.withLock { $0.bond = bond }
        let central = SimulatedCentral(devices: [device], clock: VirtualClock())
        let connection = try await central.connect(to: Self.address, timeout: .seconds(5))
        let service = try await connection.discoverService(OTAProtocol.serviceUUID, name: "OTA")
        return (device, try #require(connection as? SimulatedConnection), service)
    }

    @Test(arguments: [LinkSecurity.encrypt, .authenticate])
    func withoutABondReadsSubscriptionsAndWriteRequestsAreRefusedWithInsufficientAuthentication(security: LinkSecurity) async throws {
        let (_, connection, service) = try await connect(security)
        let cp = try #require(service.characteristic(OTAProtocol.controlPointUUID))
        let info = try #require(service.characteristic(OTAProtocol.infoUUID))
        await #expect(throws: GATTError.self) { try await connection.setNotifications(true, for: cp) }
        do {
            _ = try await connection.read(info)
            Issue.record("an unpaired central read a protected characteristic")
        } catch {
            #expect(error.attError == .insufficientAuthentication)
            #expect(error.wantsPairing)
        }
        #expect(throws: GATTError.self) { _ = try connection.submitWrite([0x01], to: cp) }
        #expect(connection.attRefusals == [.insufficientAuthentication, .insufficientAuthentication, .insufficientAuthentication])
    }

    @Test func theStacksOwnPairingIsAbandonedAndQueuedOnceSayingWhatTheDeviceAsked() async throws {
        let (_, connection, service) = try await connect(.authenticate, passkey: 123456)
        let cp = try #require(service.characteristic(OTAProtocol.controlPointUUID))
        await #expect(throws: GATTError.self) { try await connection.setNotifications(true, for: cp) }
        await #expect(throws: GATTError.self) { try await connection.setNotifications(true, for: cp) }
        #expect(connection.stackPairing == StackPairing(bonded: false, asked: .passkey))
        guard case .stackPairing(let attempt)? = await connection.nextEvent(timeout: .seconds(1)) else {
            Issue.record("no stackPairing event")
            return
        }
        #expect(attempt.wantsAuthentication)
        let more = await connection.nextEvent(timeout: .seconds(1))
        #expect(more == nil)
    }

    @Test func aBondedCentralIsAnsweredInsufficientEncryptionOnceThenEncryptsWithItsBond() async throws {
        let (_, connection, service) = try await connect(.encrypt, bond: .encrypt)
        let cp = try #require(service.characteristic(OTAProtocol.controlPointUUID))
        let info = try #require(service.characteristic(OTAProtocol.infoUUID))
        try await connection.setNotifications(true, for: cp)
        _ = try await connection.read(info)
        #expect(connection.attRefusals == [.insufficientEncryption])
        #expect(connection.stackPairing == nil)
    }

    @Test func aBondTooWeakIsAnsweredInsufficientEncryptionThenAuthentication() async throws {
        let (_, connection, service) = try await connect(.authenticate, bond: .encrypt, passkey: 1)
        let info = try #require(service.characteristic(OTAProtocol.infoUUID))
        await #expect(throws: GATTError.self) { _ = try await connection.read(info) }
        #expect(connection.attRefusals == [.insufficientEncryption, .insufficientAuthentication])
    }

    @Test func writeCommandsOnAWeakLinkAreDroppedWithoutAnAnswer() async throws {
        let (_, connection, service) = try await connect(.encrypt)
        let data = try #require(service.characteristic(OTAProtocol.dataUUID))
        try await connection.write([0, 0, 0, 0, 1, 2, 3], to: data, type: .withoutResponse)
        #expect(try connection.tryWriteWithoutResponse([0, 0, 0, 0, 1, 2, 3], to: data))
        #expect(connection.droppedCommands == 2)
        #expect(connection.attRefusals.isEmpty)
        let event = await connection.nextEvent(timeout: .seconds(2))
        #expect(event == nil)
    }
}
