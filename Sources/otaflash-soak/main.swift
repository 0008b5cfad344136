// otaflash-soak: flashes the simulator under random, seeded faults and checks the invariants.
//
//   swift run -c release otaflash-soak --runs 1000 --seed 1 [--json FILE] [--verbose]
//
// Each run draws an image size, a link and a set of faults from the seed, then runs a whole
// session (with the reconnect supervisor) on virtual time. It fails (exit 1) if any run
// activated an image other than the one sent, hung past its timeouts, or re-sent more than one
// checkpoint window after a resume. docs/RELIABILITY.md records a full run.

import Foundation
import GATT
import OTA
import OTADevice
import OTAWire
import Simulator

struct Options {
    var runs = 100
    var seed: UInt64 = 1
    var json: String?
    var verbose = false
    /// Replay one run only, printing its session events.
    var only: Int?

    init(_ args: [String]) {
        var i = 0
        func value() -> String {
            i += 1
            guard i < args.count else { fail("\(args[i - 1]) needs a value") }
            return args[i]
        }
        while i < args.count {
            switch args[i] {
            case "--runs": runs = Int(value()) ?? { fail("--runs takes a whole number") }()
            case "--seed": seed = UInt64(value()) ?? { fail("--seed takes a whole number") }()
            case "--json": json = value()
            case "--verbose", "-v": verbose = true
            case "--only": only = Int(value()) ?? { fail("--only takes a run number") }()
            case "--help", "-h":
                print("usage: otaflash-soak [--runs N] [--seed S] [--json FILE] [--verbose] [--only RUN]")
                exit(0)
            default: fail("unknown argument \(args[i])")
            }
            i += 1
        }
        guard runs > 0 else { fail("--runs must be positive") }
    }
}

func fail(_ message: String) -> Never {
    FileHandle.standardError.write(Data("otaflash-soak: \(message)\n".utf8))
    exit(2)
}

/// What one run drew from the seed.
struct Scenario: CustomStringConvertible {
    var size: Int
    var link: LinkModel
    var faults: FaultPlan
    var bitFlip: Bool
    /// A device that never confirms: it drops or corrupts every packet, or stops answering.
    var neverConfirms: String?

    init(seed: UInt64) {
        var rng = SeededGenerator(seed: seed)
        let size = [4096, 32 * 1024, 100_000, 256 * 1024][Int(rng.next() % 4)] + Int(rng.next() % 512)
        self.size = size
        let mtu = [23, 185, 247, 517][Int(rng.next() % 4)]
        let phy: LinkModel.PHY = rng.next() % 2 == 0 ? .le1M : .le2M
        let ci = [7500, 15000, 30000, 50000][Int(rng.next() % 4)]
        link = LinkModel(mtu: mtu, phy: phy, connectionInterval: .microseconds(Int64(ci)))
        func rate(_ max: Double) -> Double { rng.next() % 3 == 0 ? 0 : Double(rng.next() % 1000) / 1000 * max }
        func offsets(_ maxCount: UInt64) -> [Int] { (0..<Int(rng.next() % (maxCount + 1))).map { _ in Int(rng.next() % UInt64(size)) } }
        let bitFlip = rng.next() % 20 == 0
        self.bitFlip = bitFlip
        faults = FaultPlan(
            seed: rng.next(),
            dropRate: rate(0.03),
            disconnectAt: offsets(3),
            rebootAt: offsets(2),
            corruptRate: rate(0.005),
            gattErrorRate: rate(0.1),
            lostNotificationRate: rate(0.1),
            slowFlashPerKiB: .microseconds(Int64(rng.next() % 3000)),
            flashBitFlipAt: bitFlip ? Int(rng.next() % UInt64(size)) : nil)
        // One run in ten: a device that never confirms, which must still end within the bound.
        if rng.next() % 10 == 0 {
            switch rng.next() % 3 {
            case 0: faults.dropRate = 1; neverConfirms = "drops every packet"
            case 1: faults.corruptRate = 1; neverConfirms = "corrupts every packet"
            default:
                faults.stopAnsweringAt = Int(rng.next() % UInt64(size))
                neverConfirms = "stops answering at \(faults.stopAnsweringAt!)"
            }
        }
    }

    var description: String {
        "size \(size), \(link), drop \(faults.dropRate), disconnects \(faults.disconnectAt), reboots \(faults.rebootAt), "
            + "corrupt \(faults.corruptRate), gatt errors \(faults.gattErrorRate), lost notifications \(faults.lostNotificationRate), "
            + "slow flash \(faults.slowFlashPerKiB), bit flip \(faults.flashBitFlipAt.map(String.init) ?? "none")"
            + (neverConfirms.map { ", never confirms: \($0)" } ?? "")
    }
}

struct RunRecord {
    var outcome: String
    var violation: String?
    var reconnects: Int
    var resumeResends: [Int]
    var bytesSent: Int
    var virtualSeconds: Double
    var wallSeconds: Double
    /// Virtual seconds from the last newly confirmed data (or the start) to the end.
    var afterProgress: Double
    var neverConfirms: Bool
}

let options = Options(Array(CommandLine.arguments.dropFirst()))
let config = EngineConfig()
let timeouts = SessionTimeouts()
let reconnectWindow: Duration = .seconds(60)
/// The documented bound after the last progress (README, "Time limits").
let bound = OTASession.bound(config: config, timeouts: timeouts, reconnect: ReconnectPolicy(window: reconnectWindow))
/// Wall-clock limit of one run: every wait is virtual, so a run that takes this long is stuck.
let hangLimit: Duration = .seconds(20)
var records: [RunRecord] = []
let soakStart = ContinuousClock.now

for run in 0..<options.runs where options.only.map({ $0 == run }) ?? true {
    let scenarioSeed = options.seed &* 0x9E37_79B9 &+ UInt64(run)
    let scenario = Scenario(seed: scenarioSeed)
    var rng = SeededGenerator(seed: scenarioSeed ^ 0xABCDEF)
    let image = FirmwareImage(bytes: (0..<scenario.size).map { _ in UInt8(truncatingIfNeeded: rng.next()) })
    let device = SimulatedDevice(SimulatedDeviceConfig(slotSize: 1 << 20, link: scenario.link, faults: scenario.faults))
    let clock = VirtualClock()
    let central = SimulatedCentral(devices: [device], clock: clock)
    let session = OTASession(central: central, address: device.config.address, image: image, config: config,
                             timeouts: timeouts, reconnect: ReconnectPolicy(window: reconnectWindow, seed: scenarioSeed))
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
                if options.only != nil {
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
    // Watchdog: a run that does not finish in wall time is a hang.
    let watchdog = Task {
        try await Task.sleep(for: hangLimit)
        work.cancel()
    }
    let result = await work.value
    watchdog.cancel()
    let wall = (ContinuousClock.now - t0).seconds

    var record = RunRecord(outcome: "", violation: nil, reconnects: reconnects.value, resumeResends: [],
                           bytesSent: 0, virtualSeconds: clock.now.seconds, wallSeconds: wall,
                           afterProgress: (clock.now - lastProgress.at).seconds, neverConfirms: scenario.neverConfirms != nil)
    let activation = device.target?.lastActivation
    if let activation, activation.image != image.bytes || activation.crc != image.crc32 {
        record.violation = "activated an image that differs from the one sent"
    }
    switch result {
    case .success(let r):
        if options.only != nil { print("  stats: \(r.stats)") }
        record.outcome = "ok"
        record.resumeResends = r.stats.resumeResends
        record.bytesSent = r.stats.bytesSent
        if activation?.image != image.bytes { record.violation = record.violation ?? "reported ok but the device did not activate the image" }
    case .failure(let e):
        record.outcome = e.code == .interrupted && wall >= hangLimit.seconds ? "hang" : e.code.description
        if options.verbose { print("run \(run): \(e)") }
        if record.outcome == "hang" { record.violation = "no end within \(hangLimit.seconds) s of wall time" }
        if activation != nil && e.code != .connection { record.violation = record.violation ?? "failed (\(e.code)) after activating" }
    }
    if scenario.neverConfirms != nil, record.outcome == "ok" {
        record.violation = record.violation ?? "a device that never confirms reported success"
    }
    if record.afterProgress > bound.seconds {
        record.violation = record.violation ?? "ran \(record.afterProgress) s after its last progress, past the \(bound.seconds) s bound"
    }
    if let worst = record.resumeResends.max(), worst > config.window {
        record.violation = record.violation ?? "re-sent \(worst) bytes after a resume, more than the \(config.window)-byte window"
    }
    if options.verbose || record.violation != nil {
        let line = "run \(run) (seed \(scenarioSeed)): \(record.outcome)\(record.violation.map { " VIOLATION: \($0)" } ?? ""); reconnects \(record.reconnects), resume re-sends \(record.resumeResends); \(scenario)"
        print(line)
    }
    records.append(record)
}

final class Counter: @unchecked Sendable {
    // Touched only from the session's own task, one run at a time.
    private(set) var value = 0
    var mark = 0
    var at: Duration = .zero
    func increment() { value += 1 }
}

// MARK: Summary

let total = (ContinuousClock.now - soakStart).seconds
var outcomes: [String: Int] = [:]
for r in records { outcomes[r.outcome, default: 0] += 1 }
let violations = records.filter { $0.violation != nil }
let resumes = records.flatMap(\.resumeResends)
let maxResend = resumes.max() ?? 0
let reconnectTotal = records.map(\.reconnects).reduce(0, +)
let wall = records.map(\.wallSeconds).sorted()
let virtual = records.map(\.virtualSeconds).sorted()
func pctile(_ xs: [Double], _ p: Double) -> Double { xs.isEmpty ? 0 : xs[min(xs.count - 1, Int(Double(xs.count) * p))] }

print("otaflash-soak: \(options.runs) runs, seed \(options.seed), \(String(format: "%.1f", total)) s")
print("outcomes: " + outcomes.sorted { $0.key < $1.key }.map { "\($0.key) \($0.value)" }.joined(separator: ", "))
print("reconnects: \(reconnectTotal) in all; resumes measured: \(resumes.count); max bytes re-sent per resume: \(maxResend) (window \(config.window))")
print(String(format: "virtual time per run: median %.2f s, p95 %.2f s, max %.2f s; wall time per run: median %.1f ms, max %.1f ms",
             pctile(virtual, 0.5), pctile(virtual, 0.95), virtual.last ?? 0, pctile(wall, 0.5) * 1000, (wall.last ?? 0) * 1000))
let mismatched = violations.filter { $0.violation?.contains("activated an image") == true }.count
let hangs = records.filter { $0.outcome == "hang" }.count
let overWindow = records.filter { ($0.resumeResends.max() ?? 0) > config.window }.count
let never = records.filter(\.neverConfirms)
let neverOutcomes = Dictionary(grouping: never, by: \.outcome).mapValues(\.count)
let pastBound = records.filter { $0.afterProgress > bound.seconds }.count
print("never-confirming devices: \(never.count) runs (" + neverOutcomes.sorted { $0.key < $1.key }.map { "\($0.key) \($0.value)" }.joined(separator: ", ")
      + String(format: "), longest after the last progress %.1f s; bound %.0f s, runs past it: %d", never.map(\.afterProgress).max() ?? 0, bound.seconds, pastBound))
print("violations: \(violations.count) (mismatched activations \(mismatched), hangs \(hangs), resumes over one window \(overWindow))")
print("\(options.runs - violations.count) passed, \(violations.count) failed")

if let path = options.json {
    let object: [String: Any] = [
        "runs": options.runs, "seed": options.seed, "seconds": total, "outcomes": outcomes,
        "reconnects": reconnectTotal, "resumes": resumes.count, "max_resend_per_resume": maxResend, "window": config.window,
        "mismatched_activations": mismatched, "hangs": hangs, "never_confirming_runs": never.count, "past_bound": pastBound, "resumes_over_window": overWindow, "violations": violations.count,
    ]
    if let data = try? JSONSerialization.data(withJSONObject: object, options: [.prettyPrinted, .sortedKeys]) {
        if !FileManager.default.createFile(atPath: path, contents: data) { fail("cannot write \(path)") }
    }
}
exit(violations.isEmpty ? 0 : 1)
