import OTA

/// Deterministic pseudo-random bytes (SplitMix64), independent of the code under test.
package func testBytes(_ count: Int, seed: UInt64 = 1) -> [UInt8] {
    var state = seed
    var out = [UInt8]()
    out.reserveCapacity(count)
    while out.count < count {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        z ^= z >> 31
        for k in 0..<8 where out.count < count { out.append(UInt8(truncatingIfNeeded: z >> (8 * UInt64(k)))) }
    }
    return out
}

package func testImage(_ count: Int, seed: UInt64 = 1) -> FirmwareImage {
    FirmwareImage(bytes: testBytes(count, seed: seed))
}

