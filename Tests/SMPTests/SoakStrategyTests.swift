import OTA
import Simulator
import SMP
import Testing

/// The SMP soak strategy's checks: they hold on a clean run; a run that says ok without a mark
/// and a swap breaks them.
@Suite("SMP soak strategy")
struct SMPSoakStrategyTests {
    @Test func checksHoldOnACleanRunAndCatchAnOkWithoutASwap() async throws {
        let strategy = SMPSoak()
        let (trial, result) = try await strategy.cleanRun(seed: 9)
        #expect(trial.detail?.hasPrefix("buffers 4×") == true)
        #expect(trial.check(.success(result)).violation == nil)
        // MCUboot swapped the image sent in: a failure after that is counted, not a violation.
        let failed = trial.check(.failure(OTAError(.timeout, "no reply")))
        #expect(failed.violation == nil)
        #expect(failed.activatedOnFailure)
        let untouched = try strategy.trial(SoakScenario(seed: 9, for: strategy), seed: 9, settings: SoakSettings())
        #expect(untouched.check(.success(result)).violation == "reported ok with 0 marks and 0 swaps")
    }
}
