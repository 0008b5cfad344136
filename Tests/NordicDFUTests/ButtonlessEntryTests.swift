import GATT
import OTA
import OTADevice
import Simulator
import Testing
@testable import NordicDFU

// Buttonless entry end to end on the simulator: `NordicButtonlessDevice` runs its application
// until `NordicDFUProfile.enterUpdateMode` asks it into its bootloader, which answers at the
// address + 1; a session there flashes the application, and the device runs it at the original
// address again.

@Suite struct ButtonlessEntryTests {
    let app = DeviceAddress("C0:FF:EE:00:00:FF")!
    let limits = UpdateModeLimits(reply: .seconds(5), disconnect: .seconds(5))

    func device(requiresBond: Bool = false, refusal: ButtonlessResult? = nil) -> SimulatedDevice {
        SimulatedDevice(SimulatedDeviceConfig(address: app),
                        model: NordicButtonlessDevice(address: app, requiresBond: requiresBond, enterRefusal: refusal))
    }

    func enter(_ device: SimulatedDevice, central: SimulatedCentral) async throws -> UpdateModeEntry? {
        let connection = try await central.connect(to: app, timeout: .seconds(5))
        let services = try await connection.discoverServices()
        return try await NordicDFUProfile().enterUpdateMode(on: connection, services: services, device: app, limits: limits)
    }

    @Test func theApplicationRebootsIntoItsBootloaderAtTheAddressPlusOneAndBackAfterTheUpdate() async throws {
        let package = try DFUPackage.load(path: nordicSample("blinky-app.zip"))
        let image = try #require(package.images.first)
        let device = device()
        let central = SimulatedCentral(devices: [device], clock: VirtualClock())

        let entry = try #require(try await enter(device, central: central))
        // The least significant octet wraps without carrying into the next one.
        #expect(entry.address == DeviceAddress("C0:FF:EE:00:00:00"))
        #expect(entry.name == "DFU-C0FFEE0000FF")
        #expect(device.model(as: NordicButtonlessDevice.self)?.mode == .bootloader)
        #expect(device.address == entry.address)
        // Nothing answers at the application's address while the bootloader runs.
        await #expect(throws: GATTError.self) { try await central.connect(to: app, timeout: .seconds(1)) }

        let session = OTASession(device: entry.address.description, image: image.firmware,
                                 profile: NordicDFUProfile(image: image), reconnect: .never, clock: central.clock) {
            () async throws(GATTError) in try await central.connect(to: entry, timeout: .seconds(5))
        }
        let result = try await session.run()
        #expect(result.activated)
        let model = try #require(device.model(as: NordicButtonlessDevice.self))
        #expect(model.mode == .application)
        #expect(model.application == image.firmware.bytes)
        #expect(device.address == app)
        let services = try await central.connect(to: app, timeout: .seconds(5)).discoverServices()
        #expect(services.flatMap(\.characteristics).map(\.uuid) == [SecureDFUService.buttonlessUUID])
    }

    @Test func theBootloaderIsFoundByTheNameItWasGivenWhenTheAddressDoesNotAnswer() async throws {
        let device = device()
        let central = SimulatedCentral(devices: [device], clock: VirtualClock())
        var entry = try #require(try await enter(device, central: central))
        entry.address = DeviceAddress("C0:FF:EE:00:00:42")!  // as if the bootloader had moved elsewhere
        let connection = try await central.connect(to: entry, timeout: .seconds(2))
        #expect(connection.peer == "C0:FF:EE:00:00:00")
        let services = try await connection.discoverServices()
        #expect(services.first?.characteristic(SecureDFUService.controlPointUUID) != nil)
    }

    /// Each result but success is one line saying what it means; not bonded is a pairing matter.
    @Test(arguments: [ButtonlessResult.opcodeNotSupported, .operationFailed, .invalidAdvertisingName, .busy,
                      ButtonlessResult(rawValue: 0x99)])
    func aRefusedEnterBootloaderSaysWhy(result: ButtonlessResult) async throws {
        let device = device(refusal: result)
        let central = SimulatedCentral(devices: [device], clock: VirtualClock())
        await #expect {
            try await enter(device, central: central)
        } throws: { error in
            guard let error = error as? OTAError else { return false }
            return error.code == .protocolError && error.message == "C0:FF:EE:00:00:FF refused Enter Bootloader: \(result)"
                && !error.message.contains("\n")
        }
        #expect(device.model(as: NordicButtonlessDevice.self)?.mode == .application)
    }

    @Test func notBondedIsAPairingMatter() async throws {
        let device = device(refusal: .notBonded)
        let central = SimulatedCentral(devices: [device], clock: VirtualClock())
        await #expect {
            try await enter(device, central: central)
        } throws: { error in
            (error as? OTAError)?.code == .permission
        }
    }

    @Test func theBondedVariantNeedsPairing() async throws {
        let device = device(requiresBond: true)
        let central = SimulatedCentral(devices: [device], clock: VirtualClock())
        await #expect {
            try await enter(device, central: central)
        } throws: { error in
            guard let error = error as? OTAError else { return false }
            return error.code == .permission && error.message.contains("only for a bonded central")
        }
    }

    @Test func aBootloaderIsReadyAsItIs() async throws {
        let device = SimulatedDevice(SimulatedDeviceConfig(address: app), model: NordicDFUPeripheral())
        let central = SimulatedCentral(devices: [device], clock: VirtualClock())
        #expect(try await enter(device, central: central) == nil)
    }
}
