// otaflash-soak: flashes the simulator under random, seeded faults and checks the invariants.
//
//   swift run -c release otaflash-soak --runs 1000 --seed 1 [--protocol native|nordic-dfu|smp] [--device-version 1|2]
//                                      [--json FILE] [--verbose]
//
// --device-version 2 runs a version 2 device on NOR flash, with the C device library
// (Sources/COTADevice) in lockstep beside the Swift model: a run fails if they ever answer differently.
//
// Each run draws an image size, a link and a set of faults from the seed, then runs a whole
// session (with the reconnect supervisor) on virtual time. It fails (exit 1) if any run
// activated an image other than the one sent, hung past its timeouts, or re-sent more than one
// checkpoint window (Secure DFU: one data object; SMP: buf_count requests) after a resume.
// Each protocol's strategy (`SoakStrategy`, listed in Strategies.swift) makes its device, its
// plan and its own checks; docs/RELIABILITY.md records a full run of each protocol.

import Foundation
import GATT
import OTA
import Simulator

struct Options {
    var runs = 100
    var seed: UInt64 = 1
    var json: String?
    var verbose = false
    /// Replay one run only, printing its session events.
    var only: Int?
    var strategy: any SoakStrategy = soakStrategies[0]
    /// The simulated device's protocol version (native: 2 runs a device on NOR flash, 4 KiB erase
    /// units, 85 ms per erase, 40 µs per word, 32 KiB reorder capacity, with the C library in lockstep).
    var deviceVersion = 1

    init(_ args: [String]) {
        var i = 0
        func value() -> String {
            i += 1
            guard i < args.count else { fail("\(args[i - 1]) needs a value") }
            return args[i]
        }
        let names = soakStrategies.map(\.name)
        while i < args.count {
            switch args[i] {
            case "--runs": runs = Int(value()) ?? { fail("--runs takes a whole number") }()
            case "--seed": seed = UInt64(value()) ?? { fail("--seed takes a whole number") }()
            case "--json": json = value()
            case "--verbose", "-v": verbose = true
            case "--only": only = Int(value()) ?? { fail("--only takes a run number") }()
            case "--protocol":
                let name = value()
                guard let strategy = soakStrategies.first(where: { $0.name == name }) else {
                    fail("--protocol must be \(names.dropLast().joined(separator: ", ")) or \(names.last ?? "")")
                }
                self.strategy = strategy
            case "--device-version": deviceVersion = Int(value()) ?? 0
            case "--help", "-h":
                print("usage: otaflash-soak [--runs N] [--seed S] [--protocol \(names.joined(separator: "|"))] [--device-version 1|2] [--json FILE] [--verbose] [--only RUN]")
                exit(0)
            default: fail("unknown argument \(args[i])")
            }
            i += 1
        }
        guard runs > 0 else { fail("--runs must be positive") }
        let versions = strategy.deviceVersions
        guard versions.contains(deviceVersion) else {
            fail("--device-version must be \(versions.map(String.init).joined(separator: " or ")) for \(strategy.name)")
        }
    }
}

func fail(_ message: String) -> Never {
    FileHandle.standardError.write(Data("otaflash-soak: \(message)\n".utf8))
    exit(2)
}

/// A session's run on virtual time: its result and what its events showed.
struct SessionRun {
    var result: Result<OTAResult, OTAError>
    var reconnects: Int
    var virtualSeconds: Double
    var wallSeconds: Double
    var afterProgress: Double
    var hung: Bool
}

/// Runs `session` to its end with a wall-clock watchdog: every wait is virtual, so a run that
/// takes `hangLimit` of real time is stuck.
func runSession(_ session: OTASession, clock: VirtualClock, trace: Bool) async -> SessionRun {
    let reconnects = Counter()
    let lastProgress = Counter()
    let t0 = ContinuousClock.now
    let work = Task { () async -> Result<OTAResult, OTAError> in
        do throws(OTAError) {
            return .success(try await session.run { event in
                if case .reconnecting = event { reconnects.increment() }
                if case .progress(let p) = event, p.confirmed > lastProgress.mark {
                    lastProgress.mark = p.confirmed
                    lastProgress.at = clock.now
                }
                if trace {
                    switch event {
                    case .progress: break
                    default: print("  \(clock.now.seconds): \(event)")
                    }
                }
            })
        } catch {
            return .failure(error)
        }
    }
    let watchdog = Task {
        try await Task.sleep(for: hangLimit)
        work.cancel()
    }
    let result = await work.value
    watchdog.cancel()
    let wall = (ContinuousClock.now - t0).seconds
    var hung = false
    if case .failure(let e) = result, e.code == .interrupted, wall >= hangLimit.seconds { hung = true }
    return SessionRun(result: result, reconnects: reconnects.value, virtualSeconds: clock.now.seconds, wallSeconds: wall,
                      afterProgress: (clock.now - lastProgress.at).seconds, hung: hung)
}

extension SoakRecord {
    init(_ run: SessionRun, neverConfirms: Bool) {
        self.init(outcome: .ok, reconnects: run.reconnects, virtualSeconds: run.virtualSeconds, wallSeconds: run.wallSeconds,
                  afterProgress: run.afterProgress, neverConfirms: neverConfirms)
        switch run.result {
        case .success(let r):
            resumeResends = r.stats.resumeResends
            bytesSent = r.stats.bytesSent
        case .failure(let e):
            outcome = run.hung ? .hang : .failed(e.code)
            if run.hung { violation = "no end within \(hangLimit.seconds) s of wall time" }
        }
    }

    /// The checks every protocol's run shares: a device that never confirms does not succeed, the
    /// run ends within the bound after its last progress, and no resume re-sends more than
    /// `resendLimit` bytes (`limitName`).
    mutating func checkShared(bound: Duration, resendLimit: Int, limitName: String) {
        if neverConfirms, outcome == .ok {
            violation = violation ?? "a device that never confirms reported success"
        }
        if afterProgress > bound.seconds {
            violation = violation ?? "ran \(afterProgress) s after its last progress, past the \(bound.seconds) s bound"
        }
        if let worst = resumeResends.max(), worst > resendLimit {
            overResendLimit = true
            violation = violation ?? "re-sent \(worst) bytes after a resume, more than the \(resendLimit)-byte \(limitName)"
        }
    }
}

/// One run of `strategy`: its trial's device and plan through `OTASession` on virtual time, then
/// its checks and the shared ones.
func soak(_ strategy: any SoakStrategy, _ scenario: SoakScenario, seed: UInt64, trace: Bool, verbose: Bool) async -> (SoakRecord, detail: String?) {
    let trial: SoakTrial
    do {
        trial = try strategy.trial(scenario, seed: seed, settings: settings)
    } catch {
        var record = SoakRecord(outcome: .failed(error.code))
        record.violation = error.message
        return (record, nil)
    }
    let (session, clock) = trial.session(settings, seed: seed)
    let run = await runSession(session, clock: clock, trace: trace)
    switch run.result {
    case .success(let r): if trace { print("  stats: \(r.stats)") }
    case .failure(let e): if verbose { print("  \(e)") }
    }
    var record = SoakRecord(run, neverConfirms: scenario.neverConfirms != nil)
    let verdict = trial.check(run.result)
    record.verdict = verdict
    record.group = trial.group
    if let violation = verdict.violation { record.violation = record.violation ?? violation }
    record.checkShared(bound: runBound, resendLimit: trial.resendLimit, limitName: trial.resendLimitName)
    return (record, trial.detail)
}

final class Counter: @unchecked Sendable {
    // Touched only from the session's own task, one run at a time.
    private(set) var value = 0
    var mark = 0
    var at: Duration = .zero
    func increment() { value += 1 }
}

// swift-argument-parser's generate-manual plugin (scripts/package) asks every executable of the
// package that links ArgumentParser, as this one does through the protocol modules, for its help
// as JSON; this program parses its own arguments, so it answers with its name and purpose.
if CommandLine.arguments.dropFirst().first == "--experimental-dump-help" {
    print(#"{"serializationVersion":0,"command":{"commandName":"otaflash-soak","abstract":"Flashes the simulator under random, seeded faults and checks the invariants (docs/RELIABILITY.md).","shouldDisplay":true}}"#)
    exit(0)
}
let options = Options(Array(CommandLine.arguments.dropFirst()))
let strategy = options.strategy
let settings = SoakSettings(deviceVersion: options.deviceVersion)
/// Wall-clock limit of one run: every wait is virtual, so a run that takes this long is stuck.
let hangLimit: Duration = .seconds(20)
/// The documented bound after the last progress (docs/PRODUCTION.md, "Time limits"), and what the protocol adds to it.
let runBound = strategy.bound(settings)
let (resendLimit, resendLimitName) = strategy.resendLimit(settings)
var records: [SoakRecord] = []
let soakStart = ContinuousClock.now

for run in 0..<options.runs where options.only.map({ $0 == run }) ?? true {
    let scenarioSeed = options.seed &* 0x9E37_79B9 &+ UInt64(run)
    let scenario = SoakScenario(seed: scenarioSeed, for: strategy)
    let (record, detail) = await soak(strategy, scenario, seed: scenarioSeed, trace: options.only != nil, verbose: options.verbose)
    if options.verbose || record.violation != nil {
        let described = "\(scenario)" + (detail.map { ", \($0)" } ?? "")
        print("run \(run) (seed \(scenarioSeed)): \(record.outcome)\(record.violation.map { " VIOLATION: \($0)" } ?? ""); reconnects \(record.reconnects), resume re-sends \(record.resumeResends); \(described)")
    }
    records.append(record)
}

// MARK: Summary

let total = (ContinuousClock.now - soakStart).seconds
var outcomes: [String: Int] = [:]
for r in records { outcomes[r.outcome.description, default: 0] += 1 }
let violations = records.filter { $0.violation != nil }
let resumes = records.flatMap(\.resumeResends)
let maxResend = resumes.max() ?? 0
let reconnectTotal = records.map(\.reconnects).reduce(0, +)
let wall = records.map(\.wallSeconds).sorted()
let virtual = records.map(\.virtualSeconds).sorted()
func pctile(_ xs: [Double], _ p: Double) -> Double { xs.isEmpty ? 0 : xs[min(xs.count - 1, Int(Double(xs.count) * p))] }

print("otaflash-soak: \(options.runs) runs\(strategy.title(settings).map { " of \($0)" } ?? ""), seed \(options.seed), \(String(format: "%.1f", total)) s")
print("outcomes: " + outcomes.sorted { $0.key < $1.key }.map { "\($0.key) \($0.value)" }.joined(separator: ", "))
print("reconnects: \(reconnectTotal) in all; resumes measured: \(resumes.count); max bytes re-sent per resume: \(maxResend) (\(resendLimitName) \(resendLimit))")
print(String(format: "virtual time per run: median %.2f s, p95 %.2f s, max %.2f s; wall time per run: median %.1f ms, max %.1f ms",
             pctile(virtual, 0.5), pctile(virtual, 0.95), virtual.last ?? 0, pctile(wall, 0.5) * 1000, (wall.last ?? 0) * 1000))
let mismatched = records.filter(\.verdict.mismatchedActivation).count
let hangs = records.filter { $0.outcome == .hang }.count
let overWindow = records.filter(\.overResendLimit).count
let never = records.filter(\.neverConfirms)
let neverOutcomes = Dictionary(grouping: never, by: \.outcome.description).mapValues(\.count)
let pastBound = records.filter { $0.afterProgress > runBound.seconds }.count
print("never-confirming devices: \(never.count) runs (" + neverOutcomes.sorted { $0.key < $1.key }.map { "\($0.key) \($0.value)" }.joined(separator: ", ")
      + String(format: "), longest after the last progress %.1f s; bound %.0f s, runs past it: %d", never.map(\.afterProgress).max() ?? 0, runBound.seconds, pastBound))
for line in strategy.summary(records) { print(line) }
print("violations: \(violations.count) (mismatched activations \(mismatched), hangs \(hangs), resumes over one \(resendLimitName) \(overWindow))")
print("\(options.runs - violations.count) passed, \(violations.count) failed")

if let path = options.json {
    let object: [String: Any] = [
        "runs": options.runs, "seed": options.seed, "seconds": total, "outcomes": outcomes,
        "protocol": strategy.name, "reconnects": reconnectTotal, "resumes": resumes.count, "max_resend_per_resume": maxResend, "resend_limit": resendLimit,
        "mismatched_activations": mismatched, "hangs": hangs, "never_confirming_runs": never.count, "past_bound": pastBound, "resumes_over_window": overWindow, "violations": violations.count,
    ]
    if let data = try? JSONSerialization.data(withJSONObject: object, options: [.prettyPrinted, .sortedKeys]) {
        if !FileManager.default.createFile(atPath: path, contents: data) { fail("cannot write \(path)") }
    }
}
exit(violations.isEmpty ? 0 : 1)
