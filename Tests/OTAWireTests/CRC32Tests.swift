import OTAWire
import Testing

/// CRC-32/ISO-HDLC, the zlib and Nordic DFU checksum.
@Suite("CRC32")
struct CRC32Tests {
    @Test(arguments: [
        ("", 0x0000_0000 as UInt32),
        ("123456789", 0xCBF4_3926),
        ("a", 0xE8B7_BE43),
        ("abc", 0x3524_41C2),
        ("The quick brown fox jumps over the lazy dog", 0x414F_A339),
    ])
    func matchesKnownCheckValues(text: String, crc: UInt32) {
        #expect(CRC32.checksum(Array(text.utf8)) == crc)
    }

    @Test func matchesKnownValuesForBinaryInput() {
        #expect(CRC32.checksum([0x00]) == 0xD202_EF8D)
        #expect(CRC32.checksum([0xFF, 0xFF, 0xFF, 0xFF]) == 0xFFFF_FFFF)
        #expect(CRC32.checksum([UInt8](repeating: 0, count: 32)) == 0x190A_55AD)
    }

    @Test(arguments: [0, 1, 4, 5, 8, 9])
    func updatingInPiecesEqualsTheWhole(split: Int) {
        let bytes = Array("123456789".utf8)
        var crc = CRC32()
        crc.update(bytes[..<split])
        crc.update(bytes[split...])
        #expect(crc.value == 0xCBF4_3926)
    }

    @Test func updatingOneByteAtATimeEqualsTheWhole() {
        var rng = SeededBytes(seed: 42)
        let bytes = rng.bytes(10_000)
        var crc = CRC32()
        for b in bytes { crc.update([b]) }
        #expect(crc.value == CRC32.checksum(bytes))
    }

    /// A CRC carried over the wire (e.g. a checkpoint's) resumes the computation.
    @Test func continuesFromASavedValue() {
        let bytes = Array("123456789".utf8)
        var resumed = CRC32(value: CRC32.checksum(bytes[..<4]))
        resumed.update(bytes[4...])
        #expect(resumed.value == 0xCBF4_3926)
    }

    @Test func sliceAndArrayGiveTheSameChecksum() {
        let bytes: [UInt8] = [9, 8, 7, 1, 2, 3, 4, 5, 6, 7, 8, 9]
        #expect(CRC32.checksum(bytes[3...]) == CRC32.checksum(Array(bytes[3...])))
    }

    @Test(arguments: [(0xCBF4_3926 as UInt32, "cbf43926"), (0, "00000000"), (0xABCD, "0000abcd"), (0xFFFF_FFFF, "ffffffff")])
    func printsAsEightLowercaseHexDigits(value: UInt32, text: String) {
        #expect(hex32(value) == text)
    }
}

/// Deterministic test bytes (SplitMix64).
struct SeededBytes {
    var state: UInt64
    init(seed: UInt64) { state = seed }
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
    mutating func bytes(_ n: Int) -> [UInt8] { (0..<n).map { _ in UInt8(truncatingIfNeeded: next()) } }
}
