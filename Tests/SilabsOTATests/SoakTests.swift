import GATT
import OTA
import OTADevice
import Simulator
import Testing
@testable import SilabsOTA

/// The soak strategy's checks hold on clean runs of each kind and catch a false success and a
/// false refusal; a test-sized seeded soak breaks no invariant.
@Suite("silabs-ota soak strategy")
struct SilabsSoakTests {
    @Test func checksHoldOnCleanRunsAndCatchAFalseSuccessAndAFalseRefusal() async throws {
        let strategy = SilabsOTASoak()
        var kinds: Set<String> = []
        for seed: UInt64 in 1...8 {
            let (trial, result) = try await strategy.cleanRun(seed: seed)
            kinds.insert(trial.group ?? "")
            #expect(trial.check(.success(result)).violation == nil, "seed \(seed)")
        }
        #expect(kinds == ["app", "apploader"])
        let untouched = try strategy.trial(SoakScenario(seed: 3, for: strategy), seed: 3, settings: SoakSettings())
        let (_, result) = try await strategy.cleanRun(seed: 3)
        #expect(untouched.check(.success(result)).violation == "reported ok with 0 boots of the GBL")
        let refusedNothing = SilabsOTASoak.verdict(SilabsOTAPeripheral(), sent: [], result: .failure(OTAError(.verifyFailed, "refused")))
        #expect(refusedNothing.violation?.hasPrefix("said the device refused the GBL, but it refused nothing") == true)
    }

    @Test func aSeededSoakOf200RunsBreaksNoInvariant() async throws {
        let strategy = SilabsOTASoak()
        var ok = 0
        for seed: UInt64 in 1000..<1200 {
            var scenario = SoakScenario(seed: seed, for: strategy)
            scenario.size = min(scenario.size, 6_000)
            let trial = try strategy.trial(scenario, seed: seed, settings: SoakSettings())
            let result: Result<OTAResult, OTAError>
            do throws(OTAError) {
                result = .success(try await trial.session(SoakSettings(), seed: seed).session.run())
            } catch {
                result = .failure(error)
            }
            if case .success = result { ok += 1 }
            #expect(trial.check(result).violation == nil, "seed \(seed): \(trial.detail ?? "")")
        }
        // The faults are many and neither device resumes: what counts is that no run breaks an
        // invariant; enough succeed to show the success path is soaked too.
        #expect(ok >= 40, "\(ok) of 200 ok")
    }
}
