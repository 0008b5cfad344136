import Native
import OTAWire
import Testing

@Suite("Native messages cut short")
struct TruncatedMessageTests {
    /// Every prefix of a BEGIN or a STATUS reply is refused as an error, never a trap.
    @Test func everyTruncationOfAMessageIsAnError() {
        let begin = ControlRequest.begin(.init(imageSize: 4096, imageCRC: 0x1234_5678, version: FirmwareVersion(packed: 7), restart: true)).encoded
        for n in 0..<begin.count {
            #expect(throws: RequestDecodingError.self) { try ControlRequest(decoding: Array(begin.prefix(n))) }
        }
        let status = ControlResponse(opcode: .status, status: .success, payload: .status(.init(
            state: DeviceState(rawValue: 1), offset: 16, crc: 2, imageSize: 4096, imageCRC: 3))).encoded
        for n in 4..<status.count {
            #expect(throws: WireError.self) { try ControlResponse(decoding: Array(status.prefix(n))) }
        }
    }
}
