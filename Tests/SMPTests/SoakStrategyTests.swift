import GATT
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
        // Marked but never swapped in (here: no reset; in the field: MCUboot refused it at boot),
        // yet ok: a false success the check catches.
        let marked = try strategy.trial(SoakScenario(seed: 9, for: strategy), seed: 9, settings: SoakSettings())
        let image = try MCUbootImage(bytes: marked.image.bytes, source: "soak image")
        let central = SimulatedCentral(devices: [marked.device], clock: VirtualClock())
        let profile = SMPProfile(settings: SMPUploadSettings(fileSHA256: image.sha256, imageHash: image.imageHash, reset: false))
        let noSwap = try await OTASession(central: central, address: marked.device.config.address, image: marked.image, profile: profile).run()
        #expect(marked.check(.success(noSwap)).violation == "reported ok with 1 marks and 0 swaps")
    }
}
