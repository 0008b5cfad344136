import Native
import OTAWire
import Testing

/// What a device notifies on the control point: replies `80 op status payload` and events `81 code payload`.
@Suite("Control point notifications")
struct NotificationCodecTests {
    @Test func beginReplyCarriesTheDevicePosition() throws {
        let reply = ControlResponse(opcode: .begin, status: .success, payload: .position(offset: 0x100, crc: 0x1122_3344))
        let bytes: [UInt8] = [0x80, 0x01, 0x00, 0x00, 0x01, 0x00, 0x00, 0x44, 0x33, 0x22, 0x11]
        #expect(reply.encoded == bytes)
        #expect(try ControlResponse(decoding: bytes) == reply)
        #expect(try ControlNotification(decoding: bytes) == .response(reply))
    }

    @Test func checkpointGapReplyCarriesTheDevicePosition() throws {
        let reply = ControlResponse(opcode: .checkpoint, status: .gap, payload: .position(offset: 0x0001_0000, crc: 0xCAFE_F00D))
        let bytes: [UInt8] = [0x80, 0x02, 0x05, 0x00, 0x00, 0x01, 0x00, 0x0D, 0xF0, 0xFE, 0xCA]
        #expect(reply.encoded == bytes)
        #expect(try ControlResponse(decoding: bytes) == reply)
    }

    @Test func statusReplyCarriesStateOffsetCRCSizeAndImageCRC() throws {
        let status = ControlResponse.Status(state: .receiving, offset: 0x2000, crc: 0x0A0B_0C0D, imageSize: 0x0004_0000, imageCRC: 0xCF1F_C040)
        let reply = ControlResponse(opcode: .status, status: .success, payload: .status(status))
        let bytes: [UInt8] = [
            0x80, 0x03, 0x00,
            0x01,                    // state: receiving
            0x00, 0x20, 0x00, 0x00,  // offset
            0x0D, 0x0C, 0x0B, 0x0A,  // CRC of what the device holds
            0x00, 0x00, 0x04, 0x00,  // image size
            0x40, 0xC0, 0x1F, 0xCF,  // image CRC
        ]
        #expect(reply.encoded == bytes)
        #expect(try ControlResponse(decoding: bytes) == reply)
    }

    @Test func verifyReplyCarriesTheComputedCRC() throws {
        let reply = ControlResponse(opcode: .verify, status: .crcMismatch, payload: .computedCRC(0x5A96_1D8E))
        let bytes: [UInt8] = [0x80, 0x04, 0x06, 0x8E, 0x1D, 0x96, 0x5A]
        #expect(reply.encoded == bytes)
        #expect(try ControlResponse(decoding: bytes) == reply)
    }

    @Test(arguments: [
        (ControlResponse(opcode: .activate, status: .success), [UInt8]([0x80, 0x05, 0x00])),
        (ControlResponse(opcode: .activate, status: .notVerified), [0x80, 0x05, 0x07]),
        (ControlResponse(opcode: .abort, status: .success), [0x80, 0x06, 0x00]),
        (ControlResponse(opcode: .checkpoint, status: .invalidState), [0x80, 0x02, 0x03]),
        (ControlResponse(opcode: OTAOpcode(rawValue: 0x33), status: .unknownOpcode), [0x80, 0x33, 0x01]),
    ])
    func repliesWithoutPayloadAreThreeBytes(reply: ControlResponse, bytes: [UInt8]) throws {
        #expect(reply.encoded == bytes)
        #expect(try ControlResponse(decoding: bytes) == reply)
    }

    @Test func gapEventCarriesTheExpectedOffsetAndCRC() throws {
        let event = DeviceEvent.gap(expectedOffset: 0x0000_3C00, crc: 0x8765_4321)
        let bytes: [UInt8] = [0x81, 0x01, 0x00, 0x3C, 0x00, 0x00, 0x21, 0x43, 0x65, 0x87]
        #expect(event.encoded == bytes)
        #expect(try DeviceEvent(decoding: bytes) == event)
        #expect(try ControlNotification(decoding: bytes) == .event(event))
        #expect(ControlNotification.event(event).encoded == bytes)
    }

    /// A status a newer device might send still decodes, so the central can print it; this
    /// version defines no payload for it, so its bytes are ignored, whatever their length.
    @Test func unknownStatusCodeStillDecodesAndPrints() throws {
        let reply = try ControlResponse(decoding: [0x80, 0x01, 0x42])
        #expect(reply.status.rawValue == 0x42)
        #expect(reply.status.description == "unknown status (0x42)")
        for extra in [[UInt8](), [0x01], [0x01, 0x00, 0x00, 0x00], [0x01, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00]] {
            let withBytes = try ControlResponse(decoding: [0x80, 0x04, 0xE0] + extra)
            #expect(withBytes == ControlResponse(opcode: .verify, status: OTAStatus(rawValue: 0xE0)))
        }
    }

    /// docs/PROTOCOL.md, "Byte order and versions": a later minor revision may append fields, also
    /// to a reply whose status carries no payload today (BEGIN refused, ACTIVATE, ABORT, an
    /// unknown opcode's reply). Before, 1 to 7 such bytes made a BEGIN or CHECKPOINT refusal
    /// undecodable, so the central dropped it and waited for its reply timeout.
    @Test(arguments: [
        ([0x80, 0x01, 0x04, 0x00, 0x00, 0x04, 0x00] as [UInt8], ControlResponse(opcode: .begin, status: .imageTooLarge)),
        ([0x80, 0x01, 0x09, 0xAA], ControlResponse(opcode: .begin, status: .busy)),
        ([0x80, 0x01, 0x0B, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00], ControlResponse(opcode: .begin, status: .unsupportedProtocol)),
        ([0x80, 0x02, 0x03, 0x01, 0x02], ControlResponse(opcode: .checkpoint, status: .invalidState)),
        ([0x80, 0x04, 0x03, 0x01], ControlResponse(opcode: .verify, status: .invalidState)),
        ([0x80, 0x05, 0x07, 0x01, 0x02, 0x03], ControlResponse(opcode: .activate, status: .notVerified)),
        ([0x80, 0x06, 0x00, 0xFF], ControlResponse(opcode: .abort, status: .success)),
        ([0x80, 0x33, 0x01, 0x00, 0x01], ControlResponse(opcode: OTAOpcode(rawValue: 0x33), status: .unknownOpcode)),
    ])
    func bytesAfterAStatusWithoutPayloadAreIgnored(bytes: [UInt8], reply: ControlResponse) throws {
        #expect(try ControlResponse(decoding: bytes) == reply)
        #expect(try ControlNotification(decoding: bytes) == .response(reply))
    }

    /// An event is a notification like a reply: a later minor revision may append fields to it.
    @Test func longerGapEventDecodesAndIgnoresTheExtraBytes() throws {
        let bytes: [UInt8] = [0x81, 0x01, 0x00, 0x3C, 0x00, 0x00, 0x21, 0x43, 0x65, 0x87, 0x01, 0x00]
        #expect(try ControlNotification(decoding: bytes) == .event(.gap(expectedOffset: 0x3C00, crc: 0x8765_4321)))
    }

    @Test(arguments: [
        (OTAStatus.success, "success", "0x00"),
        (.unknownOpcode, "unknown opcode", "0x01"),
        (.invalidLength, "invalid length", "0x02"),
        (.invalidState, "invalid state", "0x03"),
        (.imageTooLarge, "too large", "0x04"),
        (.gap, "gap", "0x05"),
        (.crcMismatch, "CRC mismatch", "0x06"),
        (.notVerified, "not verified", "0x07"),
        (.flashError, "flash", "0x08"),
        (.busy, "busy", "0x09"),
        (.incomplete, "incomplete", "0x0a"),
        (.unsupportedProtocol, "unsupported protocol", "0x0b"),
        (.invalidImage, "invalid image", "0x0c"),
    ])
    func knownStatusCodesPrintWordsAndTheirCode(status: OTAStatus, words: String, code: String) {
        #expect(status.description.contains(words))
        #expect(status.description.contains("(\(code))"))
        #expect(!status.description.contains("unknown status"))
    }

    @Test(arguments: [
        [UInt8](),
        [0x42, 0x01, 0x00],                         // neither reply nor event
        [0x80],                                     // reply without opcode and status
        [0x80, 0x01],                               // reply without status
        [0x80, 0x01, 0x00, 0x00, 0x01, 0x00, 0x00, 0x44, 0x33, 0x22],        // BEGIN position, 7 bytes
        [0x80, 0x03, 0x00, 0x01, 0x00, 0x20, 0x00, 0x00],                    // STATUS payload cut short
        [0x80, 0x04, 0x00, 0x8E, 0x1D, 0x96],       // VERIFY CRC, 3 bytes
        [0x81],                                     // event without code
        [0x81, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00],  // unknown event code
        [0x81, 0x01, 0x00, 0x3C, 0x00, 0x00, 0x21, 0x43, 0x65],        // GAP, 7 payload bytes
    ])
    func malformedNotificationsAreRejected(bytes: [UInt8]) {
        #expect(throws: WireError.self) { try ControlNotification(decoding: bytes) }
    }

    static let longerReplies: [(bytes: [UInt8], reply: ControlResponse)] = [
        ([0x80, 0x01, 0x00, 0x00, 0x01, 0x00, 0x00, 0x44, 0x33, 0x22, 0x11, 0xEE, 0xFF],
         ControlResponse(opcode: .begin, status: .success, payload: .position(offset: 0x100, crc: 0x1122_3344))),
        ([0x80, 0x02, 0x06, 0x00, 0x10, 0x00, 0x00, 0x04, 0x03, 0x02, 0x01, 0x00],
         ControlResponse(opcode: .checkpoint, status: .crcMismatch, payload: .position(offset: 0x1000, crc: 0x0102_0304))),
        ([0x80, 0x03, 0x00, 0x02, 0x10, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x10, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x99, 0x99],
         ControlResponse(opcode: .status, status: .success, payload: .status(.init(state: .verified, offset: 16, crc: 1, imageSize: 16, imageCRC: 2)))),
        ([0x80, 0x04, 0x00, 0x8E, 0x1D, 0x96, 0x5A, 0x01, 0x02, 0x03],
         ControlResponse(opcode: .verify, status: .success, payload: .computedCRC(0x5A96_1D8E))),
        ([0x80, 0x05, 0x00, 0x00, 0x00], ControlResponse(opcode: .activate, status: .success)),
    ]

    /// docs/PROTOCOL.md, "Byte order and versions": a later minor revision may append fields to
    /// replies; a central accepts longer values and ignores the extra bytes.
    @Test(arguments: longerReplies)
    func longerRepliesDecodeAndIgnoreTheExtraBytes(bytes: [UInt8], reply: ControlResponse) throws {
        #expect(try ControlResponse(decoding: bytes) == reply)
    }

    @Test func wireErrorsShowTheOffendingBytes() {
        #expect {
            try ControlNotification(decoding: [0x42, 0xAB])
        } throws: { error in
            "\(error)".contains("42 ab")
        }
    }
}

/// The info characteristic: 24 bytes; the first 20 are the original layout.
@Suite("Device info")
struct DeviceInfoCodecTests {
    @Test func infoEncodesToTwentyFourBytes() throws {
        let info = DeviceInfo(protocolVersion: 1, state: .receiving, maxImageSize: 0x0010_0000,
                              firmwareVersion: FirmwareVersion(major: 2, minor: 5, patch: 0x0102),
                              received: 0x0000_4000, pendingImageSize: 0x0004_0000, activeImageCRC: 0xCAFE_F00D)
        let bytes: [UInt8] = [
            0x01, 0x01, 0x00, 0x00,  // protocol version, state, reserved
            0x00, 0x00, 0x10, 0x00,  // slot size 1 MiB
            0x02, 0x01, 0x05, 0x02,  // firmware 2.5.258 = 0x02050102
            0x00, 0x40, 0x00, 0x00,  // received
            0x00, 0x00, 0x04, 0x00,  // pending image size
            0x0D, 0xF0, 0xFE, 0xCA,  // CRC32 of the running image
        ]
        #expect(info.encoded == bytes)
        #expect(DeviceInfo.encodedSize == 24)
        #expect(try DeviceInfo(decoding: bytes) == info)
    }

    @Test func version2InfoEncodesToFortyBytes() throws {
        let info = DeviceInfo(protocolVersion: 2, state: .receiving, maxImageSize: 0x0004_0000,
                              firmwareVersion: FirmwareVersion(major: 1, minor: 0, patch: 0),
                              received: 0x0000_2100, pendingImageSize: 0x0001_0000, activeImageCRC: nil,
                              flash: .init(eraseUnit: 4096, reorderCapacity: 0x8000, reorderRanges: 16, eraseTimeMs: 85,
                                           erasesAhead: true, committed: 0x2000))
        let bytes: [UInt8] = [
            0x02, 0x01, 0x01, 0x10,  // protocol version 2, receiving, erases ahead, 16 ranges
            0x00, 0x00, 0x04, 0x00,  // slot size 256 KiB
            0x00, 0x00, 0x00, 0x01,  // firmware 1.0.0
            0x00, 0x21, 0x00, 0x00,  // received
            0x00, 0x00, 0x01, 0x00,  // pending image size
            0x00, 0x00, 0x00, 0x00,  // no running image CRC
            0x00, 0x10, 0x00, 0x00,  // erase unit 4096
            0x00, 0x80, 0x00, 0x00,  // reorder capacity 32 KiB
            0x55, 0x00, 0x00, 0x00,  // erase time 85 ms, reserved
            0x00, 0x20, 0x00, 0x00,  // committed offset
        ]
        #expect(info.encoded == bytes)
        #expect(bytes.count == DeviceInfo.version2Size)
        #expect(try DeviceInfo(decoding: bytes) == info)
    }

    @Test func version2InfoWithoutItsFlashFieldsIsRejected() {
        let v1 = DeviceInfo(state: .idle, maxImageSize: 4096, firmwareVersion: FirmwareVersion(major: 1, minor: 0, patch: 0),
                            received: 0, pendingImageSize: 0)
        var bytes = v1.encoded
        bytes[0] = 2
        #expect(throws: WireError.self) { try DeviceInfo(decoding: bytes) }
        #expect(throws: WireError.self) { try DeviceInfo(decoding: bytes + [UInt8](repeating: 0, count: 15)) }
    }

    @Test(arguments: [UInt32(0), 3, 4095, 0x8000_0001])
    func eraseUnitThatIsNotAPowerOfTwoIsRejected(unit: UInt32) {
        let info = DeviceInfo(protocolVersion: 2, state: .idle, maxImageSize: 4096, firmwareVersion: FirmwareVersion(packed: 0),
                              received: 0, pendingImageSize: 0,
                              flash: .init(eraseUnit: unit, reorderCapacity: 0, reorderRanges: 0, eraseTimeMs: 0))
        #expect(throws: WireError.self) { try DeviceInfo(decoding: info.encoded) }
    }

    @Test func twentyByteInfoFromAnOlderDeviceHasNoRunningImageCRC() throws {
        let bytes: [UInt8] = [0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x10, 0x00, 0x00, 0x00, 0x01, 0x01,
                              0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00]
        let info = try DeviceInfo(decoding: bytes)
        #expect(info.activeImageCRC == nil)
        #expect(info.maxImageSize == 0x0010_0000)
    }

    @Test func shortInfoIsRejected() {
        let bytes = [UInt8](repeating: 0, count: 19)
        #expect(throws: WireError.self) { try DeviceInfo(decoding: bytes) }
    }

    /// A later minor version may append fields: the first 20 bytes still decode.
    @Test func longerInfoDecodesItsFirstTwentyBytes() throws {
        let info = DeviceInfo(state: .idle, maxImageSize: 4096, firmwareVersion: FirmwareVersion(major: 1, minor: 0, patch: 0),
                              received: 0, pendingImageSize: 0)
        #expect(try DeviceInfo(decoding: info.encoded + [0xAA, 0xBB, 0xCC, 0xDD]) == info)
    }

    @Test(arguments: [(DeviceState.idle, "idle"), (.receiving, "receiving"), (.verified, "verified"), (DeviceState(rawValue: 9), "unknown(9)")])
    func deviceStatesPrintTheirNames(state: DeviceState, text: String) {
        #expect(state.description == text)
    }
}
