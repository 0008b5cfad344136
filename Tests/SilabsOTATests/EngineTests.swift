import GATT
import OTA
import OTAWire
import Testing
@testable import SilabsOTA

/// The engine without I/O: the host example's sequence, the close for the check, the read-back,
/// and the start-over after a lost link.
@Suite("silabs-ota engine")
struct SilabsEngineTests {
    static let gbl = TestGBL.bytes(version: 0x0200_0000, body: TestGBL.body(1000))
    static let appLoader = SilabsOTALink(mode: .appLoader, versions: SilabsVersions(otaVersion: 3, application: 0x0100_0000))
    static let application = SilabsOTALink(mode: .application, versions: SilabsVersions(application: 0x0100_0000))

    static func engine(version: UInt32? = 0x0200_0000, config: EngineConfig = EngineConfig()) -> SilabsOTAEngine {
        SilabsOTAEngine(image: FirmwareImage(bytes: gbl), config: config, imageVersion: version, settle: .seconds(1))
    }

    /// Streams the whole GBL: every step up to the idle after 0x03.
    static func stream(_ engine: inout SilabsOTAEngine) -> [TransferStep] {
        var steps: [TransferStep] = []
        while true {
            let step = engine.nextStreamStep()
            steps.append(step)
            if step == .idle { return steps }
        }
    }

    @Test(arguments: [(23, 20), (185, 180), (247, 244), (517, 508)])
    func eachDataWriteIsWholeWords(mtu: Int, chunk: Int) {
        #expect(SilabsOTAEngine.chunk(mtu: mtu) == chunk)
    }

    @Test func theSequenceIsZeroDataThreeThenTheClose() {
        var engine = Self.engine()
        #expect(engine.handle(.connected(Self.appLoader, mtu: 247)).isEmpty)
        let steps = Self.stream(&engine)
        #expect(steps.first == .write(TransferWrite([0x00], to: .control, withResponse: false)))
        let data = steps.compactMap { if case .data(let o, let c) = $0 { (o, c) } else { nil } }
        #expect(data.map(\.0) == Array(stride(from: 0, to: Self.gbl.count, by: 244)))
        #expect(data.dropLast().allSatisfy { $0.1 == 244 } && data.map(\.1).reduce(0, +) == Self.gbl.count)
        #expect(steps.dropLast().last == .write(TransferWrite([0x03], to: .control, withResponse: false)))
        #expect(engine.acked == Self.gbl.count)
        #expect(engine.phase == .verifying && engine.isAwaitingReply && engine.currentTimeout == .zero)
        let close = engine.handle(.timeout)
        guard case .failed(let error)? = close.first else { Issue.record("no close after 0x03"); return }
        #expect(error.resumable && error.message.contains("AppLoader checked the GBL"))
        #expect(engine.awaitsNextConnection)
        // The device boots the application: done.
        #expect(engine.handle(.connected(SilabsOTALink(mode: nil, versions: SilabsVersions(application: 0x0200_0000)), mtu: 247)).isEmpty)
        #expect(engine.handle(.timeout) == [.finished])
    }

    @Test func anApplicationOTADFUDeviceIsCheckedByTheVersionItRunsAfterTheClose() {
        var engine = Self.engine(config: EngineConfig(verifyTimeout: .seconds(10)))
        _ = engine.handle(.connected(Self.application, mtu: 23))
        _ = Self.stream(&engine)
        _ = engine.handle(.timeout)
        // Still the old version while it checks: wait.
        engine.observe(time: .seconds(3))
        _ = engine.handle(.connected(Self.application, mtu: 23))
        guard case .failed(let waiting)? = engine.handle(.timeout).first else { Issue.record("no wait"); return }
        #expect(waiting.resumable && waiting.code == .connection)
        // Still the old one after --verify-timeout: refused.
        engine.observe(time: .seconds(11))
        _ = engine.handle(.connected(Self.application, mtu: 23))
        guard case .failed(let refused)? = engine.handle(.timeout).first else { Issue.record("no refusal"); return }
        #expect(refused.code == .verifyFailed && refused.message.contains("0x01000000"))
    }

    @Test func theNewVersionIsTheSuccessAndNoVersionIsNotConfirmed() {
        var ok = Self.engine()
        _ = ok.handle(.connected(Self.application, mtu: 185))
        _ = Self.stream(&ok)
        _ = ok.handle(.timeout)
        _ = ok.handle(.connected(SilabsOTALink(mode: .application, versions: SilabsVersions(application: 0x0200_0000)), mtu: 185))
        #expect(ok.handle(.timeout) == [.finished])

        var unknown = Self.engine()
        _ = unknown.handle(.connected(SilabsOTALink(mode: .application), mtu: 185))
        _ = Self.stream(&unknown)
        _ = unknown.handle(.timeout)
        _ = unknown.handle(.connected(SilabsOTALink(mode: .application), mtu: 185))
        guard case .failed(let error)? = unknown.handle(.timeout).first else { Issue.record("no end"); return }
        #expect(error.code == .notConfirmed)

        // The version the device ran already cannot tell.
        var same = Self.engine(version: 0x0100_0000)
        _ = same.handle(.connected(Self.application, mtu: 185))
        _ = Self.stream(&same)
        _ = same.handle(.timeout)
        _ = same.handle(.connected(Self.application, mtu: 185))
        guard case .failed(let sameError)? = same.handle(.timeout).first else { Issue.record("no end"); return }
        #expect(sameError.code == .notConfirmed)
    }

    @Test func aLinkLostMidTransferStartsTheGBLOverAfterTheSettleTime() {
        var engine = Self.engine()
        _ = engine.handle(.connected(Self.application, mtu: 247))
        _ = engine.nextStreamStep()
        _ = engine.nextStreamStep()
        _ = engine.nextStreamStep()
        guard case .failed(let lost)? = engine.handle(.disconnected(.linkLost("gone"))).first else { Issue.record("no failure"); return }
        #expect(lost.resumable && lost.code == .connection && lost.message.contains("cannot resume"))
        #expect(engine.acked == 0)
        #expect(engine.handle(.connected(Self.application, mtu: 247)).isEmpty)
        #expect(engine.nextStreamStep() == .idle)
        #expect(engine.isAwaitingReply && engine.currentTimeout == .seconds(1))
        #expect(engine.handle(.timeout).isEmpty)
        #expect(engine.nextStreamStep() == .write(TransferWrite([0x00], to: .control, withResponse: false)))
        #expect(engine.nextStreamStep() == .data(offset: 0, count: 244))
        #expect(engine.notes.contains { $0.contains("whole GBL goes again") })
    }

    @Test func anApplicationWithInPlaceOTADFUAloneIsNotTransferredTo() {
        var engine = Self.engine()
        guard case .failed(let error)? = engine.handle(.connected(SilabsOTALink(mode: nil), mtu: 247)).first else { Issue.record("taken"); return }
        #expect(error.code == .incompatibleDevice)
    }

    @Test func writeCommandsAreNotCountedAsTakenUntilTheCheck() {
        var engine = Self.engine()
        _ = engine.handle(.connected(SilabsOTALink(mode: .application, versions: SilabsVersions(application: 1), writeCommands: true), mtu: 247))
        _ = Self.stream(&engine)
        #expect(engine.acked == 0)
    }
}
