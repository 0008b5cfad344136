import OTAWire
import Testing
@testable import ESPOTA

@Suite struct CodecTests {
    @Test func crc16IsTheXmodemVariant() {
        #expect(CRC16.checksum(Array("123456789".utf8)) == 0x31C3)
        #expect(CRC16.checksum([]) == 0)
    }

    @Test func startCarriesItsLengthAndTheCRCOfBytes0To17() throws {
        let bytes = ESPCommand.start(length: 0x0012_3456).encoded
        #expect(bytes.count == 20)
        #expect(Array(bytes[0..<6]) == [0x01, 0x00, 0x56, 0x34, 0x12, 0x00])
        #expect(bytes[6..<18].allSatisfy { $0 == 0 })
        let crc = CRC16.checksum(bytes[0..<18])
        #expect(bytes[18] == UInt8(crc & 0xFF) && bytes[19] == UInt8(crc >> 8))
        #expect(try ESPCommand(decoding: bytes) == .start(length: 0x0012_3456))
        #expect(Array(ESPCommand.stop.encoded[0..<2]) == [0x02, 0x00])
    }

    @Test func commandAckReadsAsEitherHostWritesIt() throws {
        // NimBLE's START answer: 03 00 | 01 00 | 00 00 … CRC.
        var nimble: [UInt8] = [0x03, 0x00, 0x01, 0x00, 0x00, 0x00] + [UInt8](repeating: 0, count: 12)
        nimble.appendLE(CRC16.checksum(nimble))
        #expect(try ESPCommandAck(decoding: nimble) == ESPCommandAck(command: 1, status: 0))
        // Bluedroid's rejection of a second START; a short one and a bad CRC are read too.
        #expect(try ESPCommandAck(decoding: [0x03, 0x00, 0x01, 0x00, 0x01, 0x00]).accepted == false)
        #expect(try ESPCommandAck(decoding: [0x03, 0x00, 0x02, 0x00, 0x00, 0x00] + [UInt8](repeating: 0xAB, count: 20)).command == 2)
        #expect(throws: WireError.self) { try ESPCommandAck(decoding: [0x03, 0x00, 0x01]) }
        #expect(throws: WireError.self) { try ESPCommandAck(decoding: [0x04, 0x00, 0x01, 0x00, 0x00, 0x00]) }
    }

    @Test func sectorPacketLayout() throws {
        let packet = ESPSectorPacket(sector: 0x0102, sequence: 0xFF, payload: [0xAA, 0xBB, 0x34, 0x12])
        #expect(packet.encoded == [0x02, 0x01, 0xFF, 0xAA, 0xBB, 0x34, 0x12])
        #expect(try ESPSectorPacket(decoding: packet.encoded) == packet)
        #expect(throws: ByteReader.ShortRead.self) { try ESPSectorPacket(decoding: [0x01, 0x00]) }
    }

    @Test(arguments: [
        // NimBLE success: status byte, a zero, no expected sector.
        ([0x05, 0x00, 0x00, 0x00, 0x00, 0x00], ESPSectorAck(sector: 5, status: .success, expected: nil)),
        // NimBLE wrong-sector NACK: the sector it wants at 4–5.
        ([0x07, 0x00, 0x02, 0x00, 0x05, 0x00], ESPSectorAck(sector: 7, status: .sectorIndexError, expected: 5)),
        // Bluedroid success: the next sector at 4–5.
        ([0x05, 0x00, 0x00, 0x00, 0x06, 0x00], ESPSectorAck(sector: 5, status: .success, expected: 6)),
        // Four bytes only; extra bytes past the CRC.
        ([0x05, 0x00, 0x01, 0x00], ESPSectorAck(sector: 5, status: .crcError, expected: nil)),
        ([0x05, 0x00, 0x01, 0x00, 0x05, 0x00] + [UInt8](repeating: 0x11, count: 30), ESPSectorAck(sector: 5, status: .crcError, expected: 5)),
    ] as [([UInt8], ESPSectorAck)])
    func sectorAckIsReadLiberally(bytes: [UInt8], ack: ESPSectorAck) throws {
        #expect(try ESPSectorAck(decoding: bytes) == ack)
    }

    @Test func sectorAckShorterThanFourBytesIsRefused() {
        #expect(throws: ByteReader.ShortRead.self) { try ESPSectorAck(decoding: [0x05, 0x00, 0x00]) }
    }
}
