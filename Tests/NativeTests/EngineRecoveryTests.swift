import GATT
import Native
import OTA
import OTAWire
import Testing

/// What the engine does when the device's position disagrees with what was sent: rewind when the
/// device holds a matching prefix, force a rollback when it does not, restart when even that fails.
@Suite("Engine: gaps, rollbacks and resumes")
struct EngineRecoveryTests {
    static let interval = 240 * 4
    let image = testImage(20_000, seed: 4)

    /// Streams until a checkpoint at `interval` is in flight and the next interval has gone out.
    func engineWithCheckpointInFlight() -> OTAEngine {
        var engine = OTAEngine(image: image, settings: .init(checkpointInterval: Self.interval))
        engine.connectAndBegin(mtu: 247)
        _ = engine.streamUntilIdle()
        #expect(engine.commandInFlight == .checkpoint(offset: UInt32(Self.interval), crc: crc(image, upTo: Self.interval)))
        return engine
    }

    // MARK: Checkpoint replies showing a gap

    @Test func gapReplyWithAMatchingCRCRewindsToTheDeviceOffset() {
        var engine = engineWithCheckpointInFlight()
        let actions = engine.handle(Device.checkpoint(.gap, offset: 500, crc: crc(image, upTo: 500)))
        #expect(actions.isEmpty)
        #expect(engine.sent == 500)
        #expect(engine.stats.rewinds == 1)
        #expect(engine.commandInFlight == nil)
        #expect(engine.nextStreamStep() == .data(offset: 500, count: 240))
    }

    @Test func gapReplyWithAMismatchingCRCForcesACheckpointAtTheDeviceOffset() {
        var engine = engineWithCheckpointInFlight()
        let actions = engine.handle(Device.checkpoint(.gap, offset: 500, crc: 0xBAD0_BAD0))
        let forced = ControlRequest.checkpoint(offset: 500, crc: crc(image, upTo: 500))
        #expect(actions == [.send(forced)])
        #expect(engine.commandInFlight == forced)
    }

    /// The device rolls back to its last committed checkpoint; its position there matches, so the
    /// stream continues from it.
    @Test func forcedCheckpointRollbackResumesFromTheDevicesCommittedOffset() {
        var engine = engineWithCheckpointInFlight()
        _ = engine.handle(Device.checkpoint(.gap, offset: 500, crc: 0xBAD0_BAD0))
        let actions = engine.handle(Device.checkpoint(.crcMismatch, offset: 0, crc: 0))
        #expect(actions.isEmpty)
        #expect(engine.stats.rollbacks == 1)
        #expect(engine.sent == 0)
        #expect(engine.nextStreamStep() == .data(offset: 0, count: 240))
    }

    @Test func restartsWhenTheRolledBackPositionAlsoDisagrees() {
        var engine = engineWithCheckpointInFlight()
        _ = engine.handle(Device.checkpoint(.gap, offset: 500, crc: 0xBAD0_BAD0))
        let actions = engine.handle(Device.checkpoint(.crcMismatch, offset: 240, crc: 0x1234_5678))
        #expect(actions == [.send(beginRequest(image, restart: true))])
        #expect(engine.stats.restarts == 1)
        #expect(engine.phase == .beginning)
        #expect(engine.handle(Device.begin(offset: 0, crc: 0)).isEmpty)
        #expect(engine.nextStreamStep() == .data(offset: 0, count: 240))
    }

    /// CRC_MISMATCH: the device saw different data below the checkpoint and fell back to its last
    /// committed one. The engine resends from there.
    @Test func crcMismatchReplyRollsBackToTheDevicesCommittedCheckpoint() {
        var engine = engineWithCheckpointInFlight()
        let c1 = Self.interval
        #expect(engine.handle(Device.checkpoint(.success, offset: c1, crc: crc(image, upTo: c1))).isEmpty)
        #expect(engine.nextStreamStep() == .command(.checkpoint(offset: UInt32(2 * c1), crc: crc(image, upTo: 2 * c1))))
        _ = engine.streamUntilIdle()
        let actions = engine.handle(Device.checkpoint(.crcMismatch, offset: c1, crc: crc(image, upTo: c1)))
        #expect(actions.isEmpty)
        #expect(engine.stats.rollbacks == 1)
        #expect(engine.acked == c1)
        #expect(engine.nextStreamStep() == .data(offset: c1, count: 240))
    }

    @Test func successReplyAtAnotherOffsetIsReconciledLikeAGap() {
        var engine = engineWithCheckpointInFlight()
        let actions = engine.handle(Device.checkpoint(.success, offset: 720, crc: crc(image, upTo: 720)))
        #expect(actions.isEmpty)
        #expect(engine.acked == 0)
        #expect(engine.nextStreamStep() == .data(offset: 720, count: 240))
    }

    // MARK: GAP events

    @Test func gapEventWithNoCommandInFlightRewindsAtOnce() {
        var engine = OTAEngine(image: image, settings: .init(checkpointInterval: Self.interval))
        engine.connectAndBegin(mtu: 247)
        for _ in 0..<3 { _ = engine.nextStreamStep() }
        #expect(engine.commandInFlight == nil)
        let actions = engine.handle(Device.gap(offset: 240, crc: crc(image, upTo: 240)))
        #expect(actions.isEmpty)
        #expect(engine.stats.rewinds == 1)
        #expect(engine.nextStreamStep() == .data(offset: 240, count: 240))
    }

    @Test func gapEventWithAMismatchingCRCForcesACheckpoint() {
        var engine = OTAEngine(image: image, settings: .init(checkpointInterval: Self.interval))
        engine.connectAndBegin(mtu: 247)
        for _ in 0..<3 { _ = engine.nextStreamStep() }
        let actions = engine.handle(Device.gap(offset: 240, crc: 0xFFFF_0000))
        #expect(actions == [.send(.checkpoint(offset: 240, crc: crc(image, upTo: 240)))])
    }

    /// With a checkpoint in flight, its reply will say where the device stands: hold the stream.
    @Test func gapEventWhileACheckpointIsInFlightHoldsTheStreamUntilTheReply() {
        var engine = OTAEngine(image: image, settings: .init(checkpointInterval: Self.interval))
        engine.connectAndBegin(mtu: 247)
        for _ in 0..<4 { _ = engine.nextStreamStep() }
        #expect(engine.nextStreamStep().command != nil)
        #expect(engine.nextStreamStep().data != nil)
        #expect(engine.handle(Device.gap(offset: 480, crc: crc(image, upTo: 480))).isEmpty)
        #expect(engine.nextStreamStep() == .idle)
        #expect(engine.handle(Device.checkpoint(.gap, offset: 480, crc: crc(image, upTo: 480))).isEmpty)
        #expect(engine.nextStreamStep() == .data(offset: 480, count: 240))
    }

    @Test func gapEventOutsideStreamingIsIgnored() {
        var engine = OTAEngine(image: image)
        _ = engine.handle(.connected(info: Device.info(), mtu: 247))
        #expect(engine.handle(Device.gap(offset: 0, crc: 0)).isEmpty)
        #expect(engine.phase == .beginning)
    }

    // MARK: Resuming at BEGIN

    static let resumePoints: [(name: String, offset: Int)] = [
        ("zero", 0), ("a checkpoint", interval), ("one byte past a checkpoint", interval + 1),
        ("mid-interval", interval * 2 + 37), ("the end", 20_000),
    ]

    /// The device already holds a prefix of this image: the engine continues after it, sends only
    /// the rest, and finishes.
    @Test(arguments: resumePoints)
    func resumesWhereTheDeviceStands(name: String, offset: Int) throws {
        let t = runCleanTransfer(image, settings: .init(checkpointInterval: Self.interval), resumeAt: offset)
        #expect(t.outcome == .finished)
        let stats = try #require(t.stats)
        #expect(stats.resumedFrom == [offset])
        #expect(stats.bytesSent == image.size - offset)
        #expect(t.packets.first?.offset == (offset < image.size ? offset : nil))
        let coverage = t.coverage(size: image.size)
        #expect(coverage[..<offset].allSatisfy { $0 == 0 })
        #expect(coverage[offset...].allSatisfy { $0 == 1 })
        #expect(t.commands.suffix(2) == [.verify, .activate])
    }

    @Test func resumeAtTheEndGoesStraightToTheClosingCheckpoint() {
        var engine = OTAEngine(image: image)
        engine.connectAndBegin(resumeAt: image.size)
        #expect(engine.nextStreamStep() == .command(.checkpoint(offset: UInt32(image.size), crc: image.crc32)))
        #expect(engine.nextStreamStep() == .idle)
        #expect(engine.handle(Device.checkpoint(.success, offset: image.size, crc: image.crc32)) == [.send(.verify)])
    }

    @Test func beginReplyWithAMismatchingCRCForcesARollbackThenContinues() {
        var engine = OTAEngine(image: image, settings: .init(checkpointInterval: Self.interval))
        _ = engine.handle(.connected(info: Device.info(), mtu: 247))
        let at = Self.interval + 1
        let actions = engine.handle(Device.begin(offset: at, crc: 0xDEAD_BEEF))
        #expect(actions == [.send(.checkpoint(offset: UInt32(at), crc: crc(image, upTo: at)))])
        let after = engine.handle(Device.checkpoint(.crcMismatch, offset: Self.interval, crc: crc(image, upTo: Self.interval)))
        #expect(after.isEmpty)
        #expect(engine.stats.rollbacks == 1)
        #expect(engine.sent == Self.interval)
        #expect(engine.streamUntilIdle().first(where: { $0.data != nil }) == .data(offset: Self.interval, count: 240))
    }

    @Test func beginReplyWithAMismatchingCRCRestartsWhenTheRollbackDisagreesToo() {
        var engine = OTAEngine(image: image, settings: .init(checkpointInterval: Self.interval))
        _ = engine.handle(.connected(info: Device.info(), mtu: 247))
        _ = engine.handle(Device.begin(offset: 5000, crc: 0xDEAD_BEEF))
        let actions = engine.handle(Device.checkpoint(.crcMismatch, offset: Self.interval, crc: 0xDEAD_BEEF))
        #expect(actions == [.send(beginRequest(image, restart: true))])
        #expect(engine.stats.restarts == 1)
    }

    @Test func beginReplyAtZeroWithANonzeroCRCRestarts() {
        var engine = OTAEngine(image: image)
        _ = engine.handle(.connected(info: Device.info(), mtu: 247))
        #expect(engine.handle(Device.begin(offset: 0, crc: 1)) == [.send(beginRequest(image, restart: true))])
    }

    @Test func beginReplyBeyondTheImageRestarts() {
        var engine = OTAEngine(image: image)
        _ = engine.handle(.connected(info: Device.info(), mtu: 247))
        #expect(engine.handle(Device.begin(offset: image.size + 1, crc: 0)) == [.send(beginRequest(image, restart: true))])
    }

    @Test func statusReplyForAnotherImageRestarts() {
        var engine = engineWithCheckpointInFlight()
        #expect(engine.handle(.timeout) == [.send(.status)])
        let other = testImage(999, seed: 77)
        let actions = engine.handle(Device.status(offset: 0, crc: 0, image: other))
        #expect(actions == [.send(beginRequest(image, restart: true))])
    }

    /// Recoveries are bounded: a device that never agrees ends the transfer.
    @Test func givesUpAfterMaxRecoveries() throws {
        var engine = OTAEngine(image: image, config: EngineConfig(maxRecoveries: 3))
        _ = engine.handle(.connected(info: Device.info(), mtu: 247))
        var last: [Action] = []
        for _ in 0..<10 {
            last = engine.handle(Device.begin(offset: 0, crc: 1))
            if engine.isFinished { break }
        }
        let failure = try #require(last.first?.failure)
        #expect(failure.code == .protocolError)
        #expect(engine.stats.restarts == 3)
    }

    // MARK: Another central's transfer

    /// ATT application error 0x89 on a command write: the device serves another central
    /// (docs/PROTOCOL.md, "One transfer at a time"). Sending again cannot help: one resumable
    /// protocol error, at once.
    @Test func attBusyOnACommandWriteEndsWithOneResumableProtocolError() throws {
        var engine = OTAEngine(image: image)
        #expect(engine.handle(.connected(info: Device.info(), mtu: 247)) == [.send(beginRequest(image, restart: false))])
        let actions = engine.handle(.commandFailed(.att(ATTError(rawValue: 0x89), "writing the control point")))
        #expect(actions.count == 1)
        let failure = try #require(actions.first?.failure)
        #expect(failure.code == .protocolError)
        #expect(failure.resumable)
        #expect(failure.description == "the device is busy with another central's transfer; wait for it to finish, then run the same command again")
        #expect(engine.phase == .failed)
        #expect(engine.commandInFlight == nil)
        #expect(engine.stats.commandRetries == 0)
    }

    /// The same refusal as a reply notification (a device that can notify one central).
    @Test func busyReplyEndsWithOneResumableProtocolError() throws {
        var engine = OTAEngine(image: image)
        _ = engine.handle(.connected(info: Device.info(), mtu: 247))
        let failure = try #require(engine.handle(Device.beginRefused(.busy)).first?.failure)
        #expect(failure.code == .protocolError)
        #expect(failure.resumable)
        #expect(failure.message.contains("another central is updating this device"), "\(failure)")
    }

    /// Any other ATT error on a command write is sent again.
    @Test func anotherATTErrorOnACommandWriteIsRetried() {
        var engine = OTAEngine(image: image)
        _ = engine.handle(.connected(info: Device.info(), mtu: 247))
        #expect(engine.handle(.commandFailed(.att(ATTError(rawValue: 0x80), "writing the control point")))
                == [.send(beginRequest(image, restart: false))])
        #expect(engine.stats.commandRetries == 1)
        #expect(engine.phase == .beginning)
    }

    @Test func staleReplyToAnotherCommandIsIgnored() {
        var engine = engineWithCheckpointInFlight()
        let inFlight = engine.commandInFlight
        #expect(engine.handle(Device.verify(.success, crc: image.crc32)).isEmpty)
        #expect(engine.handle(Device.begin(offset: 0, crc: 0)).isEmpty)
        #expect(engine.commandInFlight == inFlight)
    }

    @Test func undecodableNotificationIsIgnored() {
        var engine = engineWithCheckpointInFlight()
        #expect(engine.handle(.notification([0x80])).isEmpty)
        #expect(engine.handle(.notification([0x55, 0x01, 0x02])).isEmpty)
        #expect(engine.commandInFlight != nil)
    }
}
