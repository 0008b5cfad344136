import NordicDFU
import OTA
import Simulator
import Testing

/// The Secure DFU soak strategy's checks: they hold on a clean run and tell an activation the
/// last EXECUTE's lost answer explains from one after any other failure.
@Suite("Secure DFU soak strategy")
struct NordicDFUSoakStrategyTests {
    @Test func checksHoldOnACleanRunAndSortActivationsOnFailure() async throws {
        let strategy = NordicDFUSoak()
        let (trial, result) = try await strategy.cleanRun(seed: 5)
        #expect(trial.check(.success(result)).violation == nil)
        let lostExecute = trial.check(.failure(OTAError(.notConfirmed, "the link was lost during the last EXECUTE")))
        #expect(lostExecute.violation == nil)
        #expect(lostExecute.unconfirmedActivation)
        // A plain link loss does not explain an activation.
        #expect(trial.check(.failure(OTAError(.connection, "the link was lost during the last EXECUTE"))).activatedOnFailure)
        let timedOut = trial.check(.failure(OTAError(.timeout, "no reply")))
        #expect(timedOut.violation == "failed (timeout) after 1 activations")
        #expect(timedOut.activatedOnFailure)
        #expect(strategy.summary([]).count == 1)
    }
}
