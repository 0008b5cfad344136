import GATT
import OTA
import OTADevice
import Simulator
import Testing
@testable import ESPOTA

/// The soak strategy's checks: they hold on clean runs of each component, and catch an ok without
/// a restart, a second START on one boot, a short sector and a refusal said of a device that waits
/// for bytes.
@Suite("esp-ota soak strategy")
struct ESPOTASoakStrategyTests {
    @Test func checksHoldOnCleanRunsAndCatchFalseSuccessAndASecondStart() async throws {
        let strategy = ESPOTASoak()
        var hosts: Set<String> = []
        for seed: UInt64 in 1...9 {
            let (trial, result) = try await strategy.cleanRun(seed: seed)
            hosts.insert(trial.group ?? "")
            #expect(trial.check(.success(result)).violation == nil)
        }
        #expect(hosts == ["nimble", "bluedroid", "raw"])
        let untouched = try strategy.trial(SoakScenario(seed: 9, for: strategy), seed: 9, settings: SoakSettings())
        let (_, result) = try await strategy.cleanRun(seed: 9)
        #expect(untouched.check(.success(result)).violation == "reported ok with 0 restarts into the new image")
        var twice = ESPOTAPeripheral()
        for _ in 0..<2 {
            _ = twice.write(ESPCommand.start(length: 100).encoded, to: ESPOTAService.commandUUID, withResponse: true, from: nil, at: .zero)
        }
        #expect(ESPOTASoak.verdict(twice, sent: [], result: .failure(OTAError(.timeout, "x"))).violation == "took 1 second START(s) on one boot")
        // A device handed an empty sector waits for bytes: "refused" would be the wrong diagnosis.
        var waiting = ESPOTAPeripheral()
        _ = waiting.write(ESPCommand.start(length: 9000).encoded, to: ESPOTAService.commandUUID, withResponse: true, from: nil, at: .zero)
        _ = waiting.write(ESPSectorPacket(sector: 0, sequence: 0xFF, payload: [1, 2]).encoded, to: ESPOTAService.receiveFirmwareUUID,
                          withResponse: false, from: nil, at: .zero)
        let verdict = ESPOTASoak.verdict(waiting, sent: [], result: .failure(OTAError(.verifyFailed, "… took every byte and refused the image …")))
        #expect(verdict.violation == "handed 1 short sector(s) to its application")
        #expect(waiting.waitingForBytes)
    }

    @Test func aSeededSoakOf24RunsBreaksNoInvariant() async throws {
        let strategy = ESPOTASoak()
        for seed: UInt64 in 100..<124 {
            let trial = try strategy.trial(SoakScenario(seed: seed, for: strategy), seed: seed, settings: SoakSettings())
            let result: Result<OTAResult, OTAError>
            do throws(OTAError) {
                result = .success(try await trial.session(SoakSettings(), seed: seed).session.run())
            } catch {
                result = .failure(error)
            }
            #expect(trial.check(result).violation == nil, "seed \(seed)")
        }
    }
}
