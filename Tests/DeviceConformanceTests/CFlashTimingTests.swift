import Native
import OTADevice
import OTAWire
import Testing

/// The C library on NOR flash with realistic timing: 85 ms per 4 KiB page erase, 40 µs per word.
/// The figures are the NOR model's busy time (simulated flash time), not wall-clock time.
struct CFlashTimingTests {
    static let image: [UInt8] = (0..<(256 * 1024)).map { UInt8(truncatingIfNeeded: $0 &* 131 &+ $0 >> 9) }

    func begin(_ c: CDeviceLibrary) -> [UInt8] {
        c.control(ControlRequest.begin(.init(protocolVersion: 2, imageSize: UInt32(Self.image.count), imageCRC: CRC32.checksum(Self.image),
                                             version: FirmwareVersion(packed: 0x0200_0000), restart: false)).encoded, from: central(1))
    }

    /// BEGIN erases nothing, so its reply never waits for the slot's erase; each CHECKPOINT's reply
    /// waits at most for the flash work of the data queued before it, well inside the reply
    /// timeout of 5 s (the central adds a window's erases on top).
    @Test func beginWaitsForNoEraseAndEachCheckpointForOneInterval() throws {
        let c = try #require(CDeviceSetup(slotSize: 256 * 1024, eraseUnit: 4096).make())
        let before = c.busyMicroseconds
        #expect(begin(c).prefix(3) == [0x80, 0x01, 0x00])
        #expect(c.busyMicroseconds == before)
        #expect(c.erases == 0)
        let interval = 16 * 1024
        var worst: UInt64 = 0
        for start in stride(from: 0, to: Self.image.count, by: interval) {
            let t0 = c.busyMicroseconds
            for p in stride(from: start, to: start + interval, by: 240) {
                let n = min(240, start + interval - p)
                _ = c.data(DataPacket.encode(offset: UInt32(p), payload: Self.image[p..<(p + n)]), from: central(1))
            }
            let end = start + interval
            let reply = c.control(ControlRequest.checkpoint(offset: UInt32(end), crc: CRC32.checksum(Self.image[0..<end])).encoded, from: central(1))
            #expect(reply.prefix(3) == [0x80, 0x02, 0x00], "checkpoint at \(end)")
            worst = max(worst, c.busyMicroseconds - t0)
        }
        // 4 erases (340 ms) and 4096 words (164 ms) per 16 KiB interval.
        #expect(worst == 4 * 85_000 + 4096 * 40)
        #expect(worst < 5_000_000)
        #expect(c.erases == UInt32(Self.image.count / 4096))
        let verify = c.control(ControlRequest.verify.encoded, from: central(1))
        #expect(verify.prefix(3) == [0x80, 0x04, 0x00])
        #expect(c.control(ControlRequest.activate.encoded, from: central(1)) == [0x80, 0x05, 0x00])
        #expect(c.rebootRequested)
        #expect(Array(c.slot.prefix(Self.image.count)) == Self.image)
        #expect(c.violations == 0)
    }

    /// A program that fails (worn flash) drops what the device held beyond the committed offset;
    /// the next CHECKPOINT says where it stands and the rewrite erases first.
    @Test func failedProgramRollsBackToTheCommittedOffset() throws {
        let c = try #require(CDeviceSetup(slotSize: 256 * 1024, eraseUnit: 4096).make())
        _ = begin(c)
        for p in stride(from: 0, to: 8192, by: 256) {
            _ = c.data(DataPacket.encode(offset: UInt32(p), payload: Self.image[p..<(p + 256)]), from: central(1))
        }
        #expect(c.control(ControlRequest.checkpoint(offset: 8192, crc: CRC32.checksum(Self.image[0..<8192])).encoded, from: central(1)).prefix(3) == [0x80, 0x02, 0x00])
        for p in stride(from: 8192, to: 9216, by: 256) {
            _ = c.data(DataPacket.encode(offset: UInt32(p), payload: Self.image[p..<(p + 256)]), from: central(1))
        }
        c.failFlash(afterOperations: 0)
        _ = c.data(DataPacket.encode(offset: 9216, payload: Self.image[9216..<9472]), from: central(1))
        let status = c.control(ControlRequest.status.encoded, from: central(1))
        let decoded = try ControlResponse(decoding: status)
        guard case .status(let s) = decoded.payload else {
            Issue.record("STATUS reply without its payload: \(status)")
            return
        }
        #expect(s.offset == 8192)
        for p in stride(from: 8192, to: 12_288, by: 256) {
            _ = c.data(DataPacket.encode(offset: UInt32(p), payload: Self.image[p..<(p + 256)]), from: central(1))
        }
        #expect(c.control(ControlRequest.checkpoint(offset: 12_288, crc: CRC32.checksum(Self.image[0..<12_288])).encoded, from: central(1)).prefix(3) == [0x80, 0x02, 0x00])
        #expect(c.violations == 0)
    }
}
