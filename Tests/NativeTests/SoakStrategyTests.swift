import Native
import OTA
import Simulator
import Testing

/// The native soak strategy's checks: they hold on a clean run and catch what they guard.
@Suite("Native soak strategy")
struct NativeSoakStrategyTests {
    @Test func checksHoldOnACleanRunAndCatchAFailureAfterActivating() async throws {
        let strategy = NativeSoak()
        let (trial, result) = try await strategy.cleanRun(seed: 3)
        #expect(trial.check(.success(result)).violation == nil)
        // The device activated the image: a run that failed other than on the link broke a promise.
        #expect(trial.check(.failure(OTAError(.timeout, "no reply"))).violation == "failed (timeout) after activating")
        #expect(trial.check(.failure(OTAError(.connection, "the link was lost"))).violation == nil)
        // A device that activated nothing while the run says ok.
        let untouched = try strategy.trial(SoakScenario(seed: 3, for: strategy), seed: 3, settings: SoakSettings())
        #expect(untouched.check(.success(result)).violation == "reported ok but the device did not activate the image")
    }

    @Test func aVersion2DeviceAddsItsErasesToTheBoundAndAUnitToTheResendLimit() {
        let v1 = SoakSettings(deviceVersion: 1)
        let v2 = SoakSettings(deviceVersion: 2)
        #expect(NativeSoak().bound(v1) == v1.sessionBound)
        #expect(NativeSoak().bound(v2) > v2.sessionBound)
        #expect(NativeSoak().resendLimit(v2).bytes == NativeSoak().resendLimit(v1).bytes + 4096)
    }
}
