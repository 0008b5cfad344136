import GATT
import OTAWire
import Testing

@Suite("Byte reader")
struct ByteReaderTests {
    @Test func readsLittleEndianFieldsInOrder() throws {
        var r = ByteReader([0x01, 0x34, 0x12, 0x78, 0x56, 0x34, 0x12, 0xAA])
        #expect(try r.u8() == 0x01)
        #expect(try r.u16() == 0x1234)
        #expect(try r.u32() == 0x1234_5678)
        #expect(r.consumed == 7)
        #expect(Array(r.rest()) == [0xAA])
        #expect(r.remaining == 0)
    }

    /// A field past the end throws and says where, and the reader stays where it was.
    @Test func aShortReadThrowsWhereTheFieldStarts() throws {
        var r = ByteReader([0x01, 0x02, 0x03])
        _ = try r.u8()
        #expect(throws: ByteReader.ShortRead(offset: 1, size: 4, available: 2)) { try r.u32() }
        #expect(r.remaining == 2)
        #expect(try r.u16() == 0x0302)
        #expect(throws: ByteReader.ShortRead(offset: 3, size: 1, available: 0)) { try r.u8() }
        #expect("\(ByteReader.ShortRead(offset: 3, size: 1, available: 0))" == "a 1-byte field at offset 3 runs past the end (0 bytes left)")
    }

    /// Offsets count from the reader's first byte, also on a slice that does not start at 0.
    @Test func offsetsCountFromTheSlicesStart() {
        let bytes: [UInt8] = [0x60, 0x06, 0x01, 0x10, 0x00]
        var r = ByteReader(bytes[3...])
        #expect(throws: ByteReader.ShortRead(offset: 0, size: 4, available: 2)) { try r.u32() }
    }
}

@Suite("Device address")
struct DeviceAddressTests {
    @Test func parsesEitherSeparatorAndCase() {
        #expect(DeviceAddress("c0-ff-ee-00-00-01")?.description == "C0:FF:EE:00:00:01")
        #expect(DeviceAddress("C0:FF:EE:00:00:01")?.bytes == [0xC0, 0xFF, 0xEE, 0x00, 0x00, 0x01])
        #expect(DeviceAddress(0xC0, 0xFF, 0xEE, 0x00, 0x0A, 0x01) == DeviceAddress("C0:FF:EE:00:0A:01"))
    }

    /// `Character.isHexDigit` takes fullwidth digits too, which no radix-16 parse reads: such an
    /// address is refused like any other malformed one.
    @Test(arguments: ["ＡＡ:BB:CC:DD:EE:FF", "+1:BB:CC:DD:EE:FF", "AA:BB:CC:DD:EE", "AA:BB:CC:DD:EE:FF:00", "AA:BB:CC:DD:EE:F"])
    func refusesWhatIsNotSixASCIIHexPairs(text: String) {
        #expect(DeviceAddress(text) == nil)
    }
}
