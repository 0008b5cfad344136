import Native
import OTAWire
import Testing

/// Control point commands: the bytes a central writes, and how a device decodes them.
@Suite("Control point requests")
struct RequestCodecTests {
    /// BEGIN is 15 bytes: opcode, protocol version, image size, image CRC, packed firmware version, flags.
    @Test func beginEncodesToFifteenLittleEndianBytes() throws {
        let begin = ControlRequest.begin(.init(protocolVersion: 1, imageSize: 0x0001_2345, imageCRC: 0xCBF4_3926,
                                               version: FirmwareVersion(major: 1, minor: 2, patch: 3), restart: true))
        let expected: [UInt8] = [
            0x01,                    // opcode BEGIN
            0x01,                    // protocol version
            0x45, 0x23, 0x01, 0x00,  // image size 0x00012345
            0x26, 0x39, 0xF4, 0xCB,  // image CRC 0xCBF43926
            0x03, 0x00, 0x02, 0x01,  // version 1.2.3 = 0x01020003
            0x01,                    // flags: restart
        ]
        #expect(begin.encoded == expected)
        #expect(begin.encoded.count == 15)
        #expect(try ControlRequest(decoding: expected) == begin)
    }

    @Test func beginWithoutRestartHasAZeroFlagsByte() throws {
        let bytes: [UInt8] = [0x01, 0x01, 0x00, 0x10, 0x00, 0x00, 0x78, 0x56, 0x34, 0x12, 0x00, 0x00, 0x00, 0x00, 0x00]
        let decoded = try ControlRequest(decoding: bytes)
        #expect(decoded == .begin(.init(protocolVersion: 1, imageSize: 4096, imageCRC: 0x1234_5678,
                                        version: FirmwareVersion(packed: 0), restart: false)))
        #expect(decoded.encoded == bytes)
    }

    @Test func checkpointEncodesToNineBytes() throws {
        let checkpoint = ControlRequest.checkpoint(offset: 0x0000_4000, crc: 0xDEAD_BEEF)
        let expected: [UInt8] = [0x02, 0x00, 0x40, 0x00, 0x00, 0xEF, 0xBE, 0xAD, 0xDE]
        #expect(checkpoint.encoded == expected)
        #expect(try ControlRequest(decoding: expected) == checkpoint)
    }

    static let bareCommands: [(ControlRequest, [UInt8])] = [(.status, [0x03]), (.verify, [0x04]), (.activate, [0x05]), (.abort, [0x06])]

    @Test(arguments: bareCommands)
    func commandsWithoutParametersAreOneOpcodeByte(request: ControlRequest, bytes: [UInt8]) throws {
        #expect(request.encoded == bytes)
        #expect(try ControlRequest(decoding: bytes) == request)
        #expect(request.opcode.rawValue == bytes[0])
    }

    static let malformedLengths: [(bytes: [UInt8], opcode: UInt8?)] = [
        ([], nil),
        ([0x01, 0x01, 0x00, 0x10, 0x00, 0x00, 0x78, 0x56, 0x34, 0x12, 0x00, 0x00, 0x00, 0x00], 0x01),              // BEGIN, 14 bytes
        ([0x01, 0x01, 0x00, 0x10, 0x00, 0x00, 0x78, 0x56, 0x34, 0x12, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00], 0x01),  // BEGIN, 16 bytes
        ([0x01], 0x01),
        ([0x02, 0x00, 0x40, 0x00, 0x00, 0xEF, 0xBE, 0xAD], 0x02),              // CHECKPOINT, 8 bytes
        ([0x02, 0x00, 0x40, 0x00, 0x00, 0xEF, 0xBE, 0xAD, 0xDE, 0x00], 0x02),  // CHECKPOINT, 10 bytes
        ([0x03, 0x00], 0x03),
        ([0x04, 0x00, 0x00, 0x00, 0x00], 0x04),
        ([0x05, 0x01], 0x05),
        ([0x06, 0xFF], 0x06),
    ]

    @Test(arguments: malformedLengths)
    func malformedLengthsDecodeToInvalidLength(bytes: [UInt8], opcode: UInt8?) throws {
        let error = try #require(decodingError(bytes))
        #expect(error.status == .invalidLength)
        #expect(error.opcode == opcode.map(OTAOpcode.init(rawValue:)))
    }

    @Test(arguments: [[UInt8]([0x00]), [0x07], [0x7F, 0x01, 0x02], [0x80], [0xFF]])
    func unknownOpcodesDecodeToUnknownOpcode(bytes: [UInt8]) throws {
        let error = try #require(decodingError(bytes))
        #expect(error.status == .unknownOpcode)
        #expect(error.opcode == OTAOpcode(rawValue: bytes[0]))
    }

    private func decodingError(_ bytes: [UInt8]) -> RequestDecodingError? {
        do {
            _ = try ControlRequest(decoding: bytes)
            return nil
        } catch {
            return error
        }
    }

    @Test func opcodesPrintTheirNamesAndUnknownOnesTheirValue() {
        #expect(OTAOpcode.begin.description == "BEGIN")
        #expect(OTAOpcode.checkpoint.description == "CHECKPOINT")
        #expect(OTAOpcode.verify.description == "VERIFY")
        #expect(OTAOpcode(rawValue: 0x2A).description == "opcode 0x2a")
    }
}

/// Data packets on the data characteristic: a 32-bit little-endian offset, then image bytes.
@Suite("Data packets")
struct DataPacketTests {
    @Test func dataPacketIsTheOffsetThenThePayload() throws {
        let image: [UInt8] = [0x00, 0x11, 0xAA, 0xBB, 0xCC]
        let packet = DataPacket.encode(offset: 0x0102_0304, payload: image[2...])
        #expect(packet == [0x04, 0x03, 0x02, 0x01, 0xAA, 0xBB, 0xCC])
        let decoded = try #require(DataPacket.decode(packet))
        #expect(decoded.offset == 0x0102_0304)
        #expect(Array(decoded.payload) == [0xAA, 0xBB, 0xCC])
    }

    @Test(arguments: [[UInt8](), [0x00], [0x00, 0x00, 0x00, 0x00]])
    func packetWithoutAPayloadByteDoesNotDecode(bytes: [UInt8]) {
        #expect(DataPacket.decode(bytes) == nil)
    }

    /// A data packet carries `min(mtu - 3, 510) - 4` image bytes: 3 for the ATT header, 4 for the
    /// offset, and BlueZ drops write values over 510 bytes.
    static let chunkSizes: [(mtu: Int, chunk: Int)] = [
        (23, 16), (24, 17), (27, 20), (28, 21), (185, 178), (247, 240), (251, 244), (512, 505), (513, 506), (517, 506), (7, 0), (0, 0),
    ]

    @Test(arguments: chunkSizes)
    func chunkSizeIsTheMTUMinusSevenBytesUpToBlueZsLimit(mtu: Int, chunk: Int) {
        #expect(OTAProtocol.chunkSize(mtu: mtu) == chunk)
    }
}
