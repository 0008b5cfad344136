import BlueZ
import Foundation
import GATT
import NordicDFU
import OTADevice
import OTAWire
import Testing

/// Peripheral mode serves any device model: a Secure DFU bootloader (`NordicDFUPeripheral`)
/// through the same exported objects as the native target.
extension ProcessBusSuites.PeripheralTests {
    static func nordicSample(_ name: String) -> String {
        URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("firmware-samples/nordic/\(name)").path
    }

    @Test func aSecureDFUBootloaderIsServedAndStoresTheValidatedImage() async throws {
        let package = try DFUPackage.load(path: Self.nordicSample("blinky-app.zip"))
        let image = try #require(package.images.first)
        try await Self.withBus { bus in
            let fake = try await FakeBlueZPeripheralSide.start(on: bus, devices: [Self.centralA])
            let store = try Self.temporaryDirectory()
            defer { try? FileManager.default.removeItem(atPath: store) }
            var config = NordicDFUBootloader.Config()
            config.signatureCheck = try #require(.verify(pem: String(contentsOfFile: Self.nordicSample("test-key-public.pem"), encoding: .utf8)))
            let served = try await Self.serve(bus, model: NordicDFUPeripheral(bootloader: NordicDFUBootloader(config: config),
                                                                              resetDuration: .milliseconds(50)),
                                              name: "DfuTarg", storeDirectory: store)
            // The table: 0xFE59 with its control point (write, notify) and packet (write without response).
            let control = try #require(fake.characteristicPath(SecureDFUService.controlPointUUID))
            let packet = try #require(fake.characteristicPath(SecureDFUService.packetUUID))
            #expect(control.hasPrefix("/org/otaflash/test/") && packet.hasPrefix("/org/otaflash/test/"))
            // Its packets carry no offset: they come through WriteValue, not an acquired socket,
            // whose first writes BlueZ may send as copies of a later one.
            #expect(fake.state.withLock { $0.tree[packet]?["org.bluez.GattCharacteristic1"]?["WriteAcquired"] } == nil)

            let notifications = try await fake.startNotify(SecureDFUService.controlPointUUID)
            func request(_ r: DFURequest) async throws -> DFUResponse {
                try await fake.write(SecureDFUService.controlPointUUID, r.encoded, device: Self.centralA)
                return try DFUResponse(decoding: try #require(try await peripheralNext(notifications)))
            }
            func send(_ type: DFUObjectType, _ bytes: [UInt8]) async throws {
                #expect(try await request(.create(type, size: UInt32(bytes.count))).result == .success)
                for start in stride(from: 0, to: bytes.count, by: 244) {
                    try await fake.write(SecureDFUService.packetUUID, Array(bytes[start..<min(start + 244, bytes.count)]), device: Self.centralA)
                }
                #expect(try await request(.calculateChecksum) == .checksum(offset: UInt32(bytes.count), crc: CRC32.checksum(bytes)))
                #expect(try await request(.execute).result == .success)
            }

            let select = try await request(.select(.command))
            #expect(select.result == .success)
            try await send(.command, image.initPacket.bytes)
            try await send(.data, image.firmware.bytes)

            let crc = CRC32.checksum(image.firmware.bytes)
            let path = "\(store)/\(hex32(crc)).bin"
            try await served.events.waitFor(.activated(central: Self.centralA, size: image.firmware.size, crc: crc,
                                                       version: image.initPacket.command.firmwareVersion.map { "\($0)" }, stored: path))
            #expect(FileManager.default.contents(atPath: path).map { [UInt8]($0) } == image.firmware.bytes)
            let events = served.events.all
            #expect(events.contains(.begin(central: Self.centralA, size: image.firmware.size, crc: nil, offset: 0)))
            #expect(events.contains(.progress(central: Self.centralA, received: image.firmware.size, total: image.firmware.size)))
            #expect(events.contains(.verified(central: Self.centralA, crc: nil)))
            #expect(await served.peripheral.activations == 1)
            await served.host.close()
            await fake.connection.close()
        }
    }

    @Test func aSecureDFUBootloaderRefusesAPackageSignedWithAnotherKey() async throws {
        let package = try DFUPackage.load(path: Self.nordicSample("blinky-app.zip"))
        let image = try #require(package.images.first)
        try await Self.withBus { bus in
            let fake = try await FakeBlueZPeripheralSide.start(on: bus, devices: [Self.centralA])
            var config = NordicDFUBootloader.Config()
            config.signatureCheck = .reject
            let served = try await Self.serve(bus, model: NordicDFUPeripheral(bootloader: NordicDFUBootloader(config: config)), name: "DfuTarg")
            let notifications = try await fake.startNotify(SecureDFUService.controlPointUUID)
            func request(_ r: DFURequest) async throws -> DFUResponse {
                try await fake.write(SecureDFUService.controlPointUUID, r.encoded, device: Self.centralA)
                return try DFUResponse(decoding: try #require(try await peripheralNext(notifications)))
            }
            let bytes = image.initPacket.bytes
            #expect(try await request(.create(.command, size: UInt32(bytes.count))).result == .success)
            try await fake.write(SecureDFUService.packetUUID, bytes, device: Self.centralA)
            // A signature that does not verify: ext 0x0C, and nothing begins.
            #expect(try await request(.execute) == .extended(.execute, .verificationFailed))
            #expect(!served.events.all.contains { if case .begin = $0 { true } else { false } })
            #expect(await served.peripheral.activations == 0)
            await served.host.close()
            await fake.connection.close()
        }
    }

    /// A device whose address changes (a buttonless application resetting into its bootloader at
    /// the address + 1) says so once it reset: the host that serves each address on its own
    /// adapter moves its advertising on that event. Until then it answers at the old address.
    @Test func aButtonlessApplicationThatEntersItsBootloaderReportsItsNewAddress() async throws {
        try await Self.withBus { bus in
            let fake = try await FakeBlueZPeripheralSide.start(on: bus, devices: [Self.centralA])
            let application = try #require(DeviceAddress("C0:11:22:33:44:10"))
            let model = NordicButtonlessDevice(address: application, resetDuration: .milliseconds(50))
            let served = try await Self.serve(bus, model: model, name: "otaflash-app")
            // The bootloader's table, for its own application on another adapter, is wired to the same device.
            let bootloaderTable = served.peripheral.services(for: model.bootloader.services)
            #expect(bootloaderTable.flatMap { $0.characteristics.map(\.uuid) }.contains(SecureDFUService.controlPointUUID))
            #expect(!served.peripheral.services.flatMap { $0.characteristics.map(\.uuid) }.contains(SecureDFUService.controlPointUUID))

            let indications = try await fake.startNotify(SecureDFUService.buttonlessUUID)
            try await fake.write(SecureDFUService.buttonlessUUID, ButtonlessRequest.enterBootloader.encoded, device: Self.centralA)
            #expect(try await peripheralNext(indications) == [0x20, 0x01, 0x01])
            try await fake.waitForCall("Disconnect \(Self.centralA)")
            try await served.events.waitFor(.moved(address: DeviceAddress("C0:11:22:33:44:11")))
            #expect(await served.peripheral.model.currentAddress == DeviceAddress("C0:11:22:33:44:11"))
            #expect(served.events.all.filter { if case .moved = $0 { true } else { false } }.count == 1)
            await served.host.close()
            await fake.connection.close()
        }
    }
}
