import GATT
import Native
import OTAWire
import Testing

@Suite("Bluetooth UUIDs")
struct BluetoothUUIDTests {
    /// 16- and 32-bit UUIDs expand onto the Bluetooth base UUID 0000xxxx-0000-1000-8000-00805F9B34FB.
    @Test(arguments: ["180A", "180a", "0000180A", "0000180a-0000-1000-8000-00805f9b34fb", "0000180A-0000-1000-8000-00805F9B34FB"])
    func shortAndLongFormsOfTheSameUUIDAreEqual(text: String) throws {
        let uuid = try #require(BluetoothUUID(text))
        #expect(uuid == BluetoothUUID(uint16: 0x180A))
        #expect(uuid.description == "0000180a-0000-1000-8000-00805f9b34fb")
        #expect(uuid.shortValue == 0x180A)
        #expect(uuid.bytes == [0x00, 0x00, 0x18, 0x0A, 0x00, 0x00, 0x10, 0x00, 0x80, 0x00, 0x00, 0x80, 0x5F, 0x9B, 0x34, 0xFB])
    }

    @Test func thirtyTwoBitUUIDKeepsItsUpperHalf() throws {
        let text = "12345678"  // a String value, so the failable parser runs (not the literal initializer)
        let uuid = try #require(BluetoothUUID(text))
        #expect(uuid.description == "12345678-0000-1000-8000-00805f9b34fb")
        #expect(uuid.shortValue == nil)
        #expect(uuid == BluetoothUUID(uint32: 0x1234_5678))
    }

    @Test func customUUIDHasNoShortForm() throws {
        let text = "B0E60001-2F6E-4B2A-9C1F-6F7461666C61"
        let uuid = try #require(BluetoothUUID(text))
        #expect(uuid == OTAProtocol.serviceUUID)
        #expect(uuid.description == "b0e60001-2f6e-4b2a-9c1f-6f7461666c61")
        #expect(uuid.shortValue == nil)
    }

    @Test(arguments: [
        "", "180", "18000", "180G", "0x180A", "{0000180a-0000-1000-8000-00805f9b34fb}",
        "0000180a00001000800000805f9b34fb",          // 32 digits without dashes
        "0000180a-00001000-8000-00805f9b34fb",        // dashes in the wrong places
        "0000180a-0000-1000-8000-00805f9b34f",        // one digit short
        "0000180a-0000-1000-8000-00805f9b34fbb",      // one digit long
        "0000180a-0000-1000-8000-00805f9b34fg",
    ])
    func malformedTextIsRejected(text: String) {
        #expect(BluetoothUUID(text) == nil)
    }

    @Test func theOTACharacteristicsAreDistinctFromTheService() {
        let all = [OTAProtocol.serviceUUID, OTAProtocol.controlPointUUID, OTAProtocol.dataUUID, OTAProtocol.infoUUID]
        #expect(Set(all).count == 4)
        #expect(DeviceInformationService.serviceUUID.shortValue == 0x180A)
        #expect(DeviceInformationService.firmwareRevisionUUID.shortValue == 0x2A26)
    }
}
