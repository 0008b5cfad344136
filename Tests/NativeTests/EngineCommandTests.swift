import GATT
import Native
import OTA
import OTAWire
import Testing

/// Lost replies, failed writes, VERIFY and ACTIVATE, and what is refused before BEGIN.
@Suite("Engine: commands, verify and activate")
struct EngineCommandTests {
    let image = testImage(5_000, seed: 8)

    /// Streams the whole image and confirms every checkpoint: VERIFY is in flight afterwards.
    func engineAtVerify(_ config: EngineConfig = EngineConfig(), settings: OTAEngine.Settings = .init()) -> OTAEngine {
        var engine = OTAEngine(image: image, config: config, settings: settings)
        engine.connectAndBegin(mtu: 247)
        var actions: [Action] = []
        while actions.isEmpty {
            _ = engine.streamUntilIdle()
            guard case .checkpoint(let o, let c)? = engine.commandInFlight else { break }
            actions = engine.handle(Device.checkpoint(.success, offset: Int(o), crc: c))
        }
        #expect(actions == [.send(.verify)])
        #expect(engine.phase == .verifying)
        return engine
    }

    // MARK: Timeouts and failed writes

    @Test func timedOutCheckpointIsReplacedWithStatus() {
        var engine = OTAEngine(image: image, settings: .init(checkpointInterval: 960))
        engine.connectAndBegin()
        _ = engine.streamUntilIdle()
        #expect(engine.handle(.timeout) == [.send(.status)])
        #expect(engine.commandInFlight == .status)
        #expect(engine.stats.commandRetries == 1)
        // STATUS says where the device is; the stream continues from there.
        let actions = engine.handle(Device.status(offset: 960, crc: crc(image, upTo: 960), image: image))
        #expect(actions.isEmpty)
        #expect(engine.nextStreamStep() == .command(.checkpoint(offset: 960, crc: crc(image, upTo: 960))))
    }

    @Test(arguments: [0, 1, 3])
    func unansweredCommandFailsWithATimeoutAfterCommandRetries(retries: Int) throws {
        var engine = OTAEngine(image: image, config: EngineConfig(commandRetries: retries))
        let first = engine.handle(.connected(info: Device.info(), mtu: 247))
        var sends = first.compactMap(\.request)
        var last: [Action] = []
        for _ in 0..<(retries + 1) {
            last = engine.handle(.timeout)
            sends += last.compactMap(\.request)
        }
        #expect(sends == Array(repeating: beginRequest(image, restart: false), count: retries + 1))
        let failure = try #require(last.first?.failure)
        #expect(failure.code == .timeout)
        #expect(failure.resumable)
        #expect(engine.phase == .failed)
    }

    @Test func verifyWaitsForItsOwnLongerTimeoutThenAsksForStatusInsteadOfStartingOver() throws {
        var engine = engineAtVerify(EngineConfig(replyTimeout: .seconds(2), verifyTimeout: .seconds(40)))
        #expect(engine.currentTimeout == .seconds(40))
        // Sending VERIFY again would make a slow device start reading its flash over.
        #expect(engine.handle(.timeout) == [.send(.status)])
        #expect(engine.currentTimeout == .seconds(2))
        // Still not verified: the phase ends, saying nothing was activated.
        let actions = engine.handle(Device.status(offset: image.size, crc: image.crc32, image: image))
        let failure = try #require(actions.first?.failure)
        #expect(failure.code == .timeout)
        #expect(failure.resumable)
        #expect(failure.message.contains("did not finish verifying the image within 40.0 s; nothing was activated"))
        #expect(engine.failedIn == .verifying)
    }

    @Test func aLostVerifyReplyIsRecoveredByStatus() {
        var engine = engineAtVerify()
        #expect(engine.handle(.timeout) == [.send(.status)])
        // The device verified the image; only its reply was lost.
        #expect(engine.handle(Device.status(state: .verified, offset: image.size, crc: image.crc32, image: image)) == [.send(.activate)])
        #expect(engine.phase == .activating)
    }

    @Test func failedVerifyWriteIsStillSentAgain() {
        var engine = engineAtVerify(EngineConfig())
        #expect(engine.handle(.commandFailed(.att(.unlikelyError, "writing the control point"))) == [.send(.verify)])
    }

    @Test func failedControlPointWriteIsRetried() {
        var engine = OTAEngine(image: image)
        _ = engine.handle(.connected(info: Device.info(), mtu: 247))
        let actions = engine.handle(.commandFailed(.att(.unlikelyError, "writing the control point")))
        #expect(actions == [.send(beginRequest(image, restart: false))])
        #expect(engine.stats.commandRetries == 1)
    }

    /// The caller says which code a spent retry fails with: a failed write is a connection
    /// failure carrying the write's error as its cause, whatever that error's text says.
    @Test func controlPointWritesThatKeepFailingFailAsAConnectionErrorWithTheirCause() throws {
        var engine = OTAEngine(image: image, config: EngineConfig(commandRetries: 1))
        _ = engine.handle(.connected(info: Device.info(), mtu: 247))
        let writeError = GATTError.att(.unlikelyError, "no reply from the controller's queue")
        #expect(engine.handle(.commandFailed(writeError)) == [.send(beginRequest(image, restart: false))])
        let failure = try #require(engine.handle(.commandFailed(writeError)).first?.failure)
        #expect(failure.code == .connection)
        #expect(failure.cause as? GATTError == writeError)
        #expect(failure.resumable)
    }

    @Test func anUnansweredCommandFailsAsATimeoutWithoutACause() throws {
        var engine = OTAEngine(image: image, config: EngineConfig(commandRetries: 0))
        _ = engine.handle(.connected(info: Device.info(), mtu: 247))
        let failure = try #require(engine.handle(.timeout).first?.failure)
        #expect(failure.code == .timeout)
        #expect(failure.cause == nil)
    }

    @Test func writeFailingBecauseTheLinkIsGoneWaitsForTheDisconnect() {
        var engine = OTAEngine(image: image)
        _ = engine.handle(.connected(info: Device.info(), mtu: 247))
        #expect(engine.handle(.commandFailed(GATTError(.notConnected, "not connected"))).isEmpty)
        let actions = engine.handle(.disconnected(.linkLost("supervision timeout")))
        #expect(actions.first?.failure?.code == .connection)
        #expect(actions.first?.failure?.resumable == true)
    }

    @Test func disconnectWhileStreamingFailsResumably() throws {
        var engine = OTAEngine(image: image, settings: .init(checkpointInterval: 960))
        engine.connectAndBegin()
        _ = engine.streamUntilIdle()
        _ = engine.handle(Device.checkpoint(.success, offset: 960, crc: crc(image, upTo: 960)))
        let failure = try #require(engine.handle(.disconnected(.linkLost("peer reset"))).first?.failure)
        #expect(failure.code == .connection)
        #expect(failure.resumable)
        #expect(failure.message.contains("960"))
    }

    @Test func timeoutWithNothingInFlightDoesNothing() {
        var engine = OTAEngine(image: image)
        engine.connectAndBegin()
        #expect(engine.handle(.timeout).isEmpty)
    }

    // MARK: VERIFY and ACTIVATE

    @Test func activateIsSentOnlyAfterVerifyReportsTheImageCRC() {
        var engine = engineAtVerify()
        #expect(engine.handle(Device.verify(.success, crc: image.crc32)) == [.send(.activate)])
        #expect(engine.phase == .activating)
        #expect(engine.currentTimeout == EngineConfig().activateTimeout)
        #expect(engine.handle(Device.activate()) == [.finished])
        #expect(engine.phase == .done)
    }

    @Test(arguments: [OTAStatus.crcMismatch, .success])
    func verifyReportingAnotherCRCFailsAndNeverActivates(status: OTAStatus) throws {
        var engine = engineAtVerify()
        let actions = engine.handle(Device.verify(status, crc: image.crc32 ^ 1))
        #expect(!actions.contains(.send(.activate)))
        let failure = try #require(actions.first?.failure)
        #expect(actions.count == 1)
        #expect(failure.code == .verifyFailed)
        #expect(failure.message.contains(hex32(image.crc32)))
        #expect(engine.phase == .failed)
        // Nothing afterwards brings ACTIVATE back.
        #expect(engine.handle(Device.activate()).isEmpty)
        #expect(engine.handle(.timeout).isEmpty)
    }

    @Test func withoutActivationTheTransferFinishesAtVerify() {
        var engine = engineAtVerify(EngineConfig(activate: false))
        #expect(engine.handle(Device.verify(.success, crc: image.crc32)) == [.finished])
    }

    @Test func incompleteAtVerifyAsksForStatusAndResendsTheMissingPart() {
        var engine = engineAtVerify(settings: .init(checkpointInterval: 960))
        #expect(engine.handle(Device.verify(.incomplete, crc: crc(image, upTo: 1920))) == [.send(.status)])
        #expect(engine.handle(Device.status(offset: 1920, crc: crc(image, upTo: 1920), image: image)).isEmpty)
        #expect(engine.phase == .streaming)
        #expect(engine.nextStreamStep() == .data(offset: 1920, count: 240))
    }

    @Test func refusedActivationFails() throws {
        var engine = engineAtVerify()
        _ = engine.handle(Device.verify(.success, crc: image.crc32))
        let failure = try #require(engine.handle(Device.activate(.notVerified)).first?.failure)
        #expect(failure.code == .protocolError)
    }

    @Test func linkLossWhileActivatingSaysTheImageWasVerified() throws {
        var engine = engineAtVerify()
        _ = engine.handle(Device.verify(.success, crc: image.crc32))
        let failure = try #require(engine.handle(.disconnected(.linkLost("device rebooted"))).first?.failure)
        #expect(failure.code == .connection)
        #expect(failure.message.contains("verified"))
    }

    @Test func cleanTransferSendsVerifyThenActivateOnceEach() {
        let t = runCleanTransfer(image)
        #expect(t.outcome == .finished)
        #expect(t.commands.filter { $0 == .verify }.count == 1)
        #expect(t.commands.filter { $0 == .activate }.count == 1)
        #expect(t.commands.suffix(2) == [.verify, .activate])
    }

    // MARK: Refused before BEGIN

    @Test func imageLargerThanTheSlotFailsBeforeBegin() throws {
        var engine = OTAEngine(image: image)
        let actions = engine.handle(.connected(info: Device.info(slot: image.size - 1), mtu: 247))
        let failure = try #require(actions.first?.failure)
        #expect(actions.count == 1)
        #expect(failure.code == .imageTooLarge)
        #expect(failure.message.contains("\(image.size)"))
    }

    @Test func imageExactlyTheSlotSizeBegins() {
        var engine = OTAEngine(image: image)
        let actions = engine.handle(.connected(info: Device.info(slot: image.size), mtu: 247))
        #expect(actions == [.send(beginRequest(image, restart: false))])
    }

    @Test(arguments: [UInt8(0), 3, 255])
    func otherProtocolVersionFailsBeforeBegin(version: UInt8) throws {
        var engine = OTAEngine(image: image)
        let actions = engine.handle(.connected(info: Device.info(protocolVersion: version), mtu: 247))
        let failure = try #require(actions.first?.failure)
        #expect(actions.count == 1)
        #expect(failure.code == .incompatibleDevice)
    }

    static let refusals: [(OTAStatus, OTAError.Code)] = [
        (.busy, .protocolError), (.imageTooLarge, .imageTooLarge), (.unsupportedProtocol, .incompatibleDevice),
        (.invalidImage, .protocolError), (OTAStatus(rawValue: 0x77), .protocolError),
    ]

    @Test(arguments: refusals)
    func refusedBeginFailsWithTheMatchingCode(status: OTAStatus, code: OTAError.Code) throws {
        var engine = OTAEngine(image: image)
        _ = engine.handle(.connected(info: Device.info(), mtu: 247))
        let failure = try #require(engine.handle(Device.beginRefused(status)).first?.failure)
        #expect(failure.code == code)
        #expect(failure.message.contains(status.description))
    }
}
