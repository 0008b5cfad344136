import GATT
import Native
import OTA
import OTAWire
import Testing

/// How the engine cuts the image into data packets and paces its checkpoints.
@Suite("Engine: streaming")
struct EngineStreamingTests {
    // MARK: Chunk sizes

    static let mtus = [23, 24, 27, 28, 185, 247, 251, 512, 517]

    /// A data packet carries `min(mtu - 3, 510) - 4` image bytes; the last one carries what is left.
    @Test(arguments: mtus)
    func packetsCarryMTUMinusSevenBytesAndTheLastOneTheRest(mtu: Int) throws {
        let chunk = min(mtu - 3, 510) - 4
        let size = chunk * 37 + chunk / 2 + 1
        let image = testImage(size, seed: UInt64(mtu))
        let t = runCleanTransfer(image, settings: .init(checkpointInterval: 1024), mtu: mtu)
        #expect(t.outcome == .finished)
        let last = try #require(t.packets.last)
        #expect(t.packets.dropLast().allSatisfy { $0.count == chunk })
        #expect(last.count == size % chunk)
        #expect(last.offset + last.count == size)
        // A packet (4-byte offset + payload) always fits one ATT write of `mtu - 3` bytes.
        #expect(t.packets.allSatisfy { $0.count + OTAProtocol.dataHeaderSize <= mtu - OTAProtocol.attWriteOverhead })
        // ... and never exceeds the 510-byte write value BlueZ accepts.
        #expect(t.packets.allSatisfy { $0.count + OTAProtocol.dataHeaderSize <= OTAProtocol.maximumWriteValue })
    }

    @Test(arguments: mtus)
    func engineReportsTheChunkSizeItUses(mtu: Int) {
        var engine = OTAEngine(image: testImage(4096))
        engine.connectAndBegin(mtu: mtu)
        #expect(engine.chunkSize == OTAProtocol.chunkSize(mtu: mtu))
        #expect(engine.nextStreamStep() == .data(offset: 0, count: OTAProtocol.chunkSize(mtu: mtu)))
    }

    @Test(arguments: mtus)
    func cleanTransferSendsEveryByteExactlyOnce(mtu: Int) {
        let image = testImage(20_000, seed: 3)
        let t = runCleanTransfer(image, settings: .init(checkpointInterval: 4096), mtu: mtu)
        #expect(t.outcome == .finished)
        #expect(t.coverage(size: image.size).allSatisfy { $0 == 1 })
        #expect(t.stats?.bytesSent == image.size)
        #expect(t.stats?.bytesResent == 0)
        #expect(t.stats?.packets == t.packets.count)
    }

    /// An image smaller than one packet goes out as a single packet.
    @Test func imageSmallerThanAChunkIsOnePacket() {
        let image = testImage(100)
        let t = runCleanTransfer(image, mtu: 247)
        #expect(t.outcome == .finished)
        #expect(t.packets.map(\.offset) == [0])
        #expect(t.packets.map(\.count) == [100])
    }

    /// The ATT MTU is never below 23 (Core Spec Vol 3, Part F, 3.2.8); a smaller value is refused
    /// before anything is written.
    @Test(arguments: [0, 7, 8, 20, 22])
    func mtuBelowTheATTMinimumFailsBeforeBegin(mtu: Int) throws {
        var engine = OTAEngine(image: testImage(4096))
        let actions = engine.handle(.connected(info: Device.info(), mtu: mtu))
        let failure = try #require(actions.first?.failure, "MTU \(mtu) was accepted: \(actions)")
        #expect(actions.count == 1)
        #expect(failure.code == .incompatibleDevice)
        #expect(failure.message.contains("MTU"))
        #expect(engine.phase == .failed)
    }

    @Test func minimumMTUIsAccepted() {
        var engine = OTAEngine(image: testImage(4096))
        let actions = engine.handle(.connected(info: Device.info(), mtu: 23))
        #expect(actions == [.send(beginRequest(engine.image, restart: false))])
    }

    // MARK: Checkpoints

    /// With an interval that is a whole number of packets, checkpoints fall exactly every
    /// `checkpointInterval` bytes, and a last one closes the image.
    @Test func checkpointsFallEveryIntervalBytesAndOneClosesTheImage() {
        let interval = 240 * 16
        let image = testImage(50_000)
        let t = runCleanTransfer(image, settings: .init(checkpointInterval: interval), mtu: 247)
        #expect(t.outcome == .finished)
        let expected = Array(stride(from: interval, to: image.size, by: interval)) + [image.size]
        #expect(t.checkpointOffsets == expected)
        #expect(t.stats?.checkpoints == expected.count)
    }

    @Test(arguments: [(1024, 23), (3840, 247), (4096, 247), (16384, 247), (16384, 517), (300, 185)])
    func neverMoreThanOneCommandInFlight(interval: Int, mtu: Int) {
        let image = testImage(70_000, seed: 5)
        let t = runCleanTransfer(image, settings: .init(checkpointInterval: interval), mtu: mtu)
        #expect(t.outcome == .finished)
        #expect(t.overlappingCommands == 0)
    }

    /// One checkpoint may be unanswered while the next interval streams; when the next one is due
    /// the stream waits.
    @Test func streamStopsWhenTheNextCheckpointIsDueAndThePreviousIsUnanswered() throws {
        let interval = 240 * 4
        var engine = OTAEngine(image: testImage(10_000), settings: .init(checkpointInterval: interval))
        engine.connectAndBegin(mtu: 247)
        let steps = engine.streamUntilIdle()
        #expect(steps.compactMap(\.command) == [.checkpoint(offset: UInt32(interval), crc: crc(engine.image, upTo: interval))])
        #expect(engine.sent == 2 * interval)
        #expect(engine.commandInFlight == .checkpoint(offset: UInt32(interval), crc: crc(engine.image, upTo: interval)))
        for _ in 0..<3 { #expect(engine.nextStreamStep() == .idle) }

        let actions = engine.handle(Device.checkpoint(.success, offset: interval, crc: crc(engine.image, upTo: interval)))
        #expect(actions.isEmpty)
        #expect(engine.acked == interval)
        #expect(engine.nextStreamStep() == .command(.checkpoint(offset: UInt32(2 * interval), crc: crc(engine.image, upTo: 2 * interval))))
        #expect(engine.nextStreamStep() == .data(offset: 2 * interval, count: 240))
    }

    /// At most two intervals are ever unacknowledged: `settings.window` bytes beyond the last
    /// confirmed checkpoint, whether or not the interval is a whole number of packets.
    @Test(arguments: [(3840, 247), (4096, 247), (16384, 247), (1000, 23), (5000, 185), (16384, 517)])
    func unacknowledgedBytesNeverExceedTheWindow(interval: Int, mtu: Int) {
        let image = testImage(120_000, seed: 11)
        let settings = OTAEngine.Settings(checkpointInterval: interval)
        let t = runCleanTransfer(image, settings: settings, mtu: mtu)
        #expect(t.outcome == .finished)
        #expect(t.maxUnacknowledged <= settings.window,
                "\(t.maxUnacknowledged) bytes unacknowledged with a window of \(settings.window)")
    }

    /// Whenever the stream stalls on an unanswered checkpoint, a full interval has gone out since
    /// that checkpoint (or the image is all sent).
    @Test func streamOnlyStallsWhenAnIntervalHasGoneOutSinceTheLastCheckpoint() {
        let image = testImage(60_000, seed: 2)
        let settings = OTAEngine.Settings(checkpointInterval: 2400)
        let t = runCleanTransfer(image, settings: settings, mtu: 247)
        #expect(!t.stallPoints.isEmpty)
        for stall in t.stallPoints {
            #expect(stall.sent - stall.lastCheckpoint >= settings.checkpointInterval || stall.sent == image.size)
        }
    }

    @Test func checkpointCRCIsTheCRCOfThePrefix() {
        let image = testImage(30_000, seed: 9)
        let t = runCleanTransfer(image, settings: .init(checkpointInterval: 4000), mtu: 100)
        for case .checkpoint(let offset, let c) in t.commands {
            #expect(c == crc(image, upTo: Int(offset)))
        }
        #expect(t.checkpointOffsets.last == image.size)
    }

    @Test func restartConfigAsksTheDeviceToDiscardAPartialTransfer() {
        var engine = OTAEngine(image: testImage(4096), config: EngineConfig(restart: true))
        let actions = engine.handle(.connected(info: Device.info(), mtu: 247))
        #expect(actions == [.send(beginRequest(engine.image, restart: true))])
    }
}
