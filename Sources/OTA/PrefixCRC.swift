import OTAWire

/// CRC32 of any prefix `image[0..<offset]`, computed from the nearest known point below it.
///
/// Known points are added as checkpoints are confirmed, so checking a device's resume position
/// costs at most one checkpoint interval of hashing, never a re-hash from zero.
public struct PrefixCRC: Sendable {
    public let image: [UInt8]
    /// Offsets with their CRCs, ascending; always starts with (0, 0).
    private var points: [(offset: Int, crc: UInt32)] = [(0, 0)]

    public init(image: [UInt8]) { self.image = image }

    /// Remembers the CRC at `offset` (already computed elsewhere).
    public mutating func record(offset: Int, crc: UInt32) {
        guard offset > 0, offset <= image.count else { return }
        let i = insertionIndex(offset)
        if i < points.count, points[i].offset == offset { return }
        points.insert((offset, crc), at: i)
    }

    /// CRC of `image[0..<offset]`; nil when `offset` is past the image.
    public func crc(upTo offset: Int) -> UInt32? {
        guard offset >= 0, offset <= image.count else { return nil }
        let base = points[insertionIndex(offset + 1) - 1]
        var crc = CRC32(value: base.crc)
        crc.update(image[base.offset..<offset])
        return crc.value
    }

    /// The first index whose offset is >= `offset`.
    private func insertionIndex(_ offset: Int) -> Int {
        var lo = 0, hi = points.count
        while lo < hi {
            let mid = (lo + hi) / 2
            if points[mid].offset < offset { lo = mid + 1 } else { hi = mid }
        }
        return lo
    }
}
