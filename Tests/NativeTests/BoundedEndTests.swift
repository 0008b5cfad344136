import GATT
import Native
import OTA
import OTADevice
import OTAWire
import Simulator
import Testing

// A device that answers but never confirms, or stops answering, must still end: every run ends
// with a clear error within a bound computed from the options (docs/PRODUCTION.md, "Time limits").

@Suite("Every run ends within its bound")
struct BoundedEndTests {
    static let image = testImage(96 * 1024, seed: 77)

    struct Outcome {
        var error: OTAError?
        var virtualSeconds: Double
        var reconnects: Int
        var device: SimulatedDevice
    }

    func run(_ faults: FaultPlan, config: EngineConfig = EngineConfig(replyTimeout: .seconds(1)), settings: OTAEngine.Settings = .init(),
             timeouts: SessionTimeouts = SessionTimeouts(stall: .seconds(5)),
             reconnect: ReconnectPolicy = ReconnectPolicy(window: .seconds(10))) async -> Outcome {
        let device = simulatedDevice(faults: faults)
        let clock = VirtualClock()
        let central = SimulatedCentral(devices: [device], clock: clock)
        let session = OTASession(central: central, address: device.config.address, image: Self.image, config: config,
                                 profile: NativeProfile(settings: settings),
                                 timeouts: timeouts, reconnect: reconnect)
        let reconnects = Counter()
        do {
            _ = try await session.run { if case .reconnecting = $0 { reconnects.increment() } }
            return Outcome(error: nil, virtualSeconds: clock.now.seconds, reconnects: reconnects.value, device: device)
        } catch {
            return Outcome(error: error, virtualSeconds: clock.now.seconds, reconnects: reconnects.value, device: device)
        }
    }

    func bound(_ config: EngineConfig, _ timeouts: SessionTimeouts, _ reconnect: ReconnectPolicy) -> Double {
        OTASession.bound(config: config, timeouts: timeouts, reconnect: reconnect).seconds
    }

    /// Dropped packets cost a window each before the checkpoint says so, and the stall budget runs
    /// out first; corrupted ones are rolled back at once, and the recoveries run out first.
    @Test(arguments: [(FaultPlan(dropRate: 1), OTAError.Code.timeout), (FaultPlan(corruptRate: 1), .protocolError)])
    func aDeviceThatLosesEveryPacketEndsWithAnError(faults: FaultPlan, code: OTAError.Code) async throws {
        let outcome = await run(faults)
        let error = try #require(outcome.error)
        #expect(error.code == code)
        #expect(error.message.contains("no new data"))
        #expect((outcome.device.target?.activationCount == 0))
        #expect(outcome.virtualSeconds <= bound(EngineConfig(replyTimeout: .seconds(1)), SessionTimeouts(stall: .seconds(5)), ReconnectPolicy(window: .seconds(10))))
    }

    @Test func aDeviceThatStopsAnsweringMidTransferTimesOutWithinTheBound() async throws {
        let config = EngineConfig(replyTimeout: .seconds(1))
        let timeouts = SessionTimeouts(stall: .seconds(5))
        let reconnect = ReconnectPolicy(window: .seconds(10))
        let outcome = await run(FaultPlan(stopAnsweringAt: 40_000), config: config, timeouts: timeouts, reconnect: reconnect)
        let error = try #require(outcome.error)
        #expect(error.code == .timeout)
        #expect(error.resumable)
        #expect((outcome.device.target?.activationCount == 0))
        #expect(outcome.virtualSeconds <= bound(config, timeouts, reconnect))
    }

    @Test func theStallBudgetCountsConnectedTimeOnly() async throws {
        // A device that keeps dropping the link but answers: each connection confirms nothing new,
        // yet the time spent reconnecting is the reconnect window's, not the stall budget's.
        let config = EngineConfig(maxRecoveries: 10_000, replyTimeout: .seconds(1))
        let outcome = await run(FaultPlan(dropRate: 1), config: config, timeouts: SessionTimeouts(stall: .seconds(3)),
                                reconnect: ReconnectPolicy(window: .seconds(30)))
        let error = try #require(outcome.error)
        #expect(error.code == .timeout)
        #expect(error.message.contains("no new data in 3.0 s of connected time"))
        // The stall is final: reconnecting cannot make the device confirm what it keeps losing.
        #expect(outcome.reconnects == 0)
    }

    @Test func aVerifyThatNeverAnswersEndsAfterTheVerifyTimeoutWithoutReconnecting() async throws {
        let config = EngineConfig(replyTimeout: .seconds(1), verifyTimeout: .seconds(3))
        let outcome = await run(FaultPlan(slowFlashPerKiB: .milliseconds(100)), config: config, settings: .init(checkpointInterval: 4096),
                                timeouts: SessionTimeouts(stall: .seconds(3000)), reconnect: ReconnectPolicy(window: .seconds(60)))
        let error = try #require(outcome.error)
        #expect(error.code == .timeout)
        #expect(error.message.contains("did not finish verifying"))
        #expect(outcome.reconnects == 0)
        #expect((outcome.device.target?.activationCount == 0))
    }

    @Test func lossesWithProgressBetweenThemNeverExhaustTheRecoveries() async throws {
        // 2 % of packets lost: every rewind lands further on, so the transfer completes.
        let config = EngineConfig(maxRecoveries: 2)
        let outcome = await run(FaultPlan(seed: 5, dropRate: 0.02), config: config, settings: .init(checkpointInterval: 4096))
        #expect(outcome.error == nil)
        #expect(outcome.device.activatedImage == Self.image.bytes)
    }
}

@Suite("Engine: rewinds that confirm nothing")
struct EngineRewindBoundTests {
    let image = testImage(20_000, seed: 9)

    @Test func rewindsToTheSameOffsetCountAsRecoveriesAndEndTheTransfer() throws {
        var engine = OTAEngine(image: image, config: EngineConfig(maxRecoveries: 5), settings: .init(checkpointInterval: 960))
        engine.connectAndBegin(mtu: 247)
        var last: [TransferAction] = []
        var rounds = 0
        while engine.phase == .streaming, rounds < 100 {
            rounds += 1
            _ = engine.streamUntilIdle()
            // The device lost everything after 480: it answers every checkpoint with that gap.
            last = engine.handle(Device.checkpoint(.gap, offset: 480, crc: crc(image, upTo: 480)))
        }
        let failure = try #require(last.first?.failure)
        #expect(failure.code == .protocolError)
        #expect(failure.message.contains("no new data in 5 recoveries"))
        // The first gap at 480 is progress (the device holds more than before); 5 more are allowed.
        #expect(rounds == 7)
    }

    @Test func aRewindFurtherOnForgivesEarlierOnes() {
        var engine = OTAEngine(image: image, config: EngineConfig(maxRecoveries: 2), settings: .init(checkpointInterval: 960))
        engine.connectAndBegin(mtu: 247)
        for offset in [240, 240, 480, 480, 720, 720, 960, 960] {
            _ = engine.streamUntilIdle()
            let actions = engine.handle(Device.checkpoint(.gap, offset: offset, crc: crc(image, upTo: offset)))
            #expect(actions.isEmpty)
            #expect(engine.phase == .streaming)
        }
    }
}

/// A device that is gone: no attempt connects. The reconnect window counts from the first
/// attempt's start and bounds the attempts themselves, so the run ends within it, not a connect
/// timeout (or three, with a fallback scan) later.
@Suite("The reconnect window bounds the attempts")
struct ReconnectWindowTests {
    final class Limits: @unchecked Sendable {
        // Touched only from the session's own task.
        var values: [Duration] = []
    }

    @Test(arguments: [(20.0, 60.0), (20.0, 30.0), (5.0, 60.0)])
    func aGoneDeviceEndsWithinTheWindowOfItsLastSignOfLife(connect: Double, window: Double) async throws {
        let clock = VirtualClock()
        let limits = Limits()
        let session = OTASession(device: "gone", image: BoundedEndTests.image, profile: NativeProfile(),
                                 timeouts: SessionTimeouts(connect: .seconds(connect)), reconnect: ReconnectPolicy(window: .seconds(window)),
                                 clock: clock) { (limit: Duration) async throws(GATTError) -> any GATTConnection in
            limits.values.append(limit)
            try? await clock.sleep(for: limit)
            throw GATTError(.connectFailed, "no answer within \(limit.seconds) s")
        }
        do {
            _ = try await session.run()
            Issue.record("connected to a device that is gone")
        } catch {
            #expect(error.code == .connection)
            #expect(error.message.contains("gave up reconnecting"), "\(error.message)")
        }
        #expect(clock.now <= .seconds(window), "\(clock.now)")
        // It gives up when the next attempt would start past the window: at most one backoff early.
        #expect(clock.now >= .seconds(window) - ReconnectPolicy().maxDelay, "\(clock.now)")
        #expect(limits.values.first == .seconds(connect))
        #expect(limits.values.count > 1)
        #expect(limits.values.allSatisfy { $0 <= .seconds(connect) && $0 > .zero })
    }
}

final class Counter: @unchecked Sendable {
    // Touched only from the session's own task.
    private(set) var value = 0
    func increment() { value += 1 }
}
