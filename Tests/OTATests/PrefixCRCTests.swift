import OTA
import OTAWire
import Testing

@Suite("PrefixCRC")
struct PrefixCRCTests {
    let bytes = testBytes(10_000, seed: 21)

    @Test(arguments: [0, 1, 2, 239, 240, 241, 4095, 4096, 4097, 9_999, 10_000])
    func crcAtAnyOffsetEqualsTheCRCOfThePrefix(offset: Int) {
        var prefix = PrefixCRC(image: bytes)
        #expect(prefix.crc(upTo: offset) == CRC32.checksum(bytes[0..<offset]))
        prefix.record(offset: 4096, crc: CRC32.checksum(bytes[0..<4096]))
        prefix.record(offset: 240, crc: CRC32.checksum(bytes[0..<240]))
        #expect(prefix.crc(upTo: offset) == CRC32.checksum(bytes[0..<offset]))
    }

    @Test func everyOffsetMatchesWithManyRecordedPoints() {
        var prefix = PrefixCRC(image: bytes)
        for point in stride(from: 1000, to: bytes.count, by: 1000).reversed() {
            prefix.record(offset: point, crc: CRC32.checksum(bytes[0..<point]))
        }
        for offset in stride(from: 0, through: bytes.count, by: 7) {
            #expect(prefix.crc(upTo: offset) == CRC32.checksum(bytes[0..<offset]))
        }
    }

    @Test(arguments: [-1, 10_001, Int.max])
    func offsetOutsideTheImageHasNoCRC(offset: Int) {
        #expect(PrefixCRC(image: bytes).crc(upTo: offset) == nil)
    }

    @Test func emptyImageHasTheCRCOfNothing() {
        #expect(PrefixCRC(image: []).crc(upTo: 0) == 0)
        #expect(PrefixCRC(image: []).crc(upTo: 1) == nil)
    }
}
