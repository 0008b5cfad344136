import Native
import OTA
import OTAWire
import Testing

/// The checkpoint interval adapts to corruption (docs/PROTOCOL.md, "Choosing the checkpoint
/// interval"): each CRC rollback halves it, down to 1 KiB, so the next corruption is caught
/// sooner and costs less; each clean checkpoint doubles it back, never above the configured one.
@Suite("Engine: adaptive checkpoint interval")
struct EngineAdaptiveIntervalTests {
    static let configured = 8192
    /// 240-byte chunks at MTU 247: checkpoints fall on chunk boundaries.
    static let chunk = OTAProtocol.chunkSize(mtu: 247)
    let image = testImage(200_000, seed: 12)

    /// The offset of the checkpoint `interval` bytes after `from`, on a chunk boundary.
    static func checkpoint(after from: Int, interval: Int) -> Int {
        from + max(interval / chunk, 1) * chunk
    }

    /// Streams until idle and returns the offset of the checkpoint in flight.
    func streamToTheNextCheckpoint(_ engine: inout OTAEngine) throws -> Int {
        _ = engine.streamUntilIdle()
        guard case .checkpoint(let offset, let c)? = engine.commandInFlight else {
            throw HarnessIssue("no checkpoint in flight after streaming (phase \(engine.phase))")
        }
        #expect(c == crc(image, upTo: Int(offset)))
        return Int(offset)
    }

    /// The device found corrupted data below the checkpoint and fell back to `committed`.
    func rollBack(_ engine: inout OTAEngine, to committed: Int) {
        let actions = engine.handle(Device.checkpoint(.crcMismatch, offset: committed, crc: crc(image, upTo: committed)))
        #expect(actions.isEmpty, "a rollback to a matching position streams on, got \(actions)")
    }

    @Test func startsAtTheConfiguredInterval() throws {
        var engine = OTAEngine(image: image, settings: .init(checkpointInterval: Self.configured))
        engine.connectAndBegin()
        #expect(engine.currentInterval == Self.configured)
        #expect(try streamToTheNextCheckpoint(&engine) == Self.checkpoint(after: 0, interval: Self.configured))
    }

    /// 8192 → 4096 → 2048 → 1024, then it stays at 1024; each time the next checkpoint follows the
    /// rollback point by the new interval.
    @Test func eachRollbackHalvesTheIntervalDownToOneKiB() throws {
        var engine = OTAEngine(image: image, settings: .init(checkpointInterval: Self.configured))
        engine.connectAndBegin()
        _ = try streamToTheNextCheckpoint(&engine)
        for expected in [4096, 2048, 1024, 1024, 1024] {
            rollBack(&engine, to: 0)
            #expect(engine.currentInterval == expected)
            #expect(engine.sent == 0)
            #expect(try streamToTheNextCheckpoint(&engine) == Self.checkpoint(after: 0, interval: expected))
        }
        #expect(engine.stats.rollbacks == 5)
    }

    /// After shrinking to 1 KiB, clean checkpoints double it back: 2048, 4096, 8192, and no further.
    @Test func cleanCheckpointsDoubleItBackToTheConfiguredIntervalAndNoFurther() throws {
        var engine = OTAEngine(image: image, settings: .init(checkpointInterval: Self.configured))
        engine.connectAndBegin()
        _ = try streamToTheNextCheckpoint(&engine)
        for _ in 0..<3 {
            rollBack(&engine, to: 0)
            _ = try streamToTheNextCheckpoint(&engine)
        }
        #expect(engine.currentInterval == 1024)
        var seen: [Int] = []
        for _ in 0..<5 {
            guard case .checkpoint(let offset, let c)? = engine.commandInFlight else {
                Issue.record("no checkpoint in flight")
                return
            }
            #expect(engine.handle(Device.checkpoint(.success, offset: Int(offset), crc: c)).isEmpty)
            seen.append(engine.currentInterval)
            _ = try streamToTheNextCheckpoint(&engine)
        }
        #expect(seen == [2048, 4096, 8192, 8192, 8192])
    }

    /// A checkpoint interval configured below 1 KiB (the CLI allows 256 and up) is never raised
    /// by a rollback.
    @Test(arguments: [480, 960, 1024])
    func aRollbackNeverRaisesTheIntervalAboveTheConfiguredOne(configured: Int) throws {
        var engine = OTAEngine(image: image, settings: .init(checkpointInterval: configured))
        engine.connectAndBegin()
        _ = try streamToTheNextCheckpoint(&engine)
        for _ in 0..<3 {
            rollBack(&engine, to: 0)
            #expect(engine.currentInterval <= configured)
            let next = try streamToTheNextCheckpoint(&engine)
            #expect(next <= configured)
        }
    }

    /// A whole transfer with one corruption: the interval shrinks once, the transfer still ends
    /// with every byte confirmed, and the checkpoints after the rollback come closer together
    /// before they widen back to the configured spacing.
    @Test func aCorruptedIntervalIsResentWithShorterCheckpointsThatWidenAgain() throws {
        var engine = OTAEngine(image: image, settings: .init(checkpointInterval: Self.configured))
        engine.connectAndBegin()
        var checkpoints: [Int] = []
        var rolledBack = false
        while engine.phase == .streaming {
            let offset = try streamToTheNextCheckpoint(&engine)
            checkpoints.append(offset)
            if !rolledBack, offset >= 3 * Self.configured {
                // The device saw a corrupted packet in this interval: back to the previous checkpoint.
                rolledBack = true
                let committed = checkpoints[checkpoints.count - 2]
                rollBack(&engine, to: committed)
                continue
            }
            _ = engine.handle(Device.checkpoint(.success, offset: offset, crc: crc(image, upTo: offset)))
        }
        #expect(engine.commandInFlight == .verify)
        #expect(engine.stats.rollbacks == 1)
        #expect(engine.currentInterval == Self.configured)
        let gaps = zip(checkpoints.dropFirst(), checkpoints).map { $0 - $1 }
        let full = Self.checkpoint(after: 0, interval: Self.configured)
        #expect(gaps.filter { $0 < full && $0 > 0 }.count >= 1, "no shorter interval after the rollback: \(gaps)")
        #expect(gaps.dropLast().suffix(3).allSatisfy { $0 == full }, "the interval did not widen back: \(gaps)")
    }
}

/// A precondition of a test that did not hold (the engine is not where the test expected).
struct HarnessIssue: Error, CustomStringConvertible {
    var description: String
    init(_ description: String) { self.description = description }
}
