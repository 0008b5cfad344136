/// SplitMix64: small, fast, and the same sequence on every platform for a seed.
public struct SeededGenerator: RandomNumberGenerator, Sendable {
    private var state: UInt64

    public init(seed: UInt64) { state = seed }

    public mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }

    /// True with probability `p`; draws nothing when `p` is 0, so a plan without a fault does not
    /// shift the sequence of the others.
    public mutating func chance(_ p: Double) -> Bool {
        guard p > 0 else { return false }
        return Double(next() >> 11) / Double(1 << 53) < p
    }
}
