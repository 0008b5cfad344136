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
// SMP runs also fail if the server marked for test or confirmed, or MCUboot swapped in, any
// bytes but the image sent. docs/RELIABILITY.md records a full run of each protocol.

import Foundation
import GATT
import Native
import NordicDFU
import OTA
import OTADevice
import OTAWire
import Simulator
import SMP

struct Options {
    var runs = 100
    var seed: UInt64 = 1
    var json: String?
    var verbose = false
    /// Replay one run only, printing its session events.
    var only: Int?
    var protocolName = "native"
    /// The native device's protocol version: 2 runs a device on NOR flash (4 KiB erase units,
    /// 85 ms per erase, 40 µs per word, 32 KiB reorder capacity), with the C library in lockstep.
    var deviceVersion = 1

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
            case "--protocol":
                protocolName = value()
                guard ["native", NordicDFUProfile.name, SMPProfile.name].contains(protocolName) else {
                    fail("--protocol must be native, \(NordicDFUProfile.name) or \(SMPProfile.name)")
                }
            case "--device-version":
                deviceVersion = Int(value()) ?? 0
                guard (1...2).contains(deviceVersion) else { fail("--device-version must be 1 or 2") }
            case "--help", "-h":
                print("usage: otaflash-soak [--runs N] [--seed S] [--protocol native|\(NordicDFUProfile.name)|\(SMPProfile.name)] [--device-version 1|2] [--json FILE] [--verbose] [--only RUN]")
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

/// What one run drew from the seed: an image size, a link and the faults the simulated device
/// injects. A Secure DFU run (`nordic`) draws sizes around its 4096-byte objects (a short one,
/// whole objects only, a short last object, up to 256 KiB) and a tenth of the drop and corruption
/// rates: a lost or corrupted packet spoils its whole object, as Secure DFU packets carry no offset.
struct Scenario: CustomStringConvertible {
    var size: Int
    var link: LinkModel
    var faults: FaultPlan
    var bitFlip: Bool
    /// A device that never confirms: it drops or corrupts every packet, or stops answering.
    var neverConfirms: String?

    init(seed: UInt64, nordic: Bool = false) {
        var rng = SeededGenerator(seed: seed)
        let size = nordic ? Self.objectSize(&rng) : [4096, 32 * 1024, 100_000, 256 * 1024][Int(rng.next() % 4)] + Int(rng.next() % 512)
        self.size = size
        let scale = nordic ? 0.1 : 1
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
            dropRate: rate(0.03 * scale),
            disconnectAt: offsets(3),
            rebootAt: offsets(2),
            corruptRate: rate(0.005 * scale),
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

    private static func objectSize(_ rng: inout SeededGenerator) -> Int {
        let objects = 1 + Int(rng.next() % 32)
        return switch rng.next() % 4 {
        case 0: 1 + Int(rng.next() % 4096)
        case 1: objects * 4096
        case 2: (objects - 1) * 4096 + 1 + Int(rng.next() % 4095)
        default: 100_000 + Int(rng.next() % 160_000)
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
    /// The link was lost during the last command and the device activated the image anyway:
    /// the run failed with a connection error, the image is the one sent (Secure DFU's last EXECUTE).
    var unconfirmedActivation = false
    /// The run failed, yet the device activated something (other than `unconfirmedActivation`).
    var activatedOnFailure = false
    /// The device activated an image other than the one sent (or one whose hash did not match).
    var mismatchedActivation = false
    /// A resume re-sent more than `resendLimit` allows.
    var overResendLimit = false
    /// The SMP server's buffers, count × size, and how it encoded its answers.
    var smpBuffers: String?
    var smpEncoding: SMPReplyEncoding?
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

extension RunRecord {
    init(_ run: SessionRun, neverConfirms: Bool) {
        self.init(outcome: "", violation: nil, reconnects: run.reconnects, resumeResends: [], bytesSent: 0,
                  virtualSeconds: run.virtualSeconds, wallSeconds: run.wallSeconds, afterProgress: run.afterProgress,
                  neverConfirms: neverConfirms)
        switch run.result {
        case .success(let r):
            outcome = "ok"
            resumeResends = r.stats.resumeResends
            bytesSent = r.stats.bytesSent
        case .failure(let e):
            outcome = run.hung ? "hang" : e.code.description
            if run.hung { violation = "no end within \(hangLimit.seconds) s of wall time" }
        }
    }

    /// The checks every protocol's run shares: a device that never confirms does not succeed, the
    /// run ends within the bound after its last progress, and no resume re-sends more than
    /// `resendLimit` bytes (`limitName`).
    mutating func checkShared(bound: Duration, resendLimit: Int, limitName: String) {
        if neverConfirms, outcome == "ok" {
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

let options = Options(Array(CommandLine.arguments.dropFirst()))
let config = EngineConfig()
let timeouts = SessionTimeouts()
let reconnectWindow: Duration = .seconds(60)
/// The documented bound after the last progress (README, "Time limits").
let bound = OTASession.bound(config: config, timeouts: timeouts, reconnect: ReconnectPolicy(window: reconnectWindow))
/// Wall-clock limit of one run: every wait is virtual, so a run that takes this long is stuck.
let hangLimit: Duration = .seconds(20)
let nordic = options.protocolName == NordicDFUProfile.name
let smp = options.protocolName == SMPProfile.name
/// The SMP bound: the session's, with the first upload request's longer wait (a server erases
/// its slot before answering it) in place of the reply timeout on each try.
let smpBound = bound + (SMPEngine.firstRequestTimeout - config.replyTimeout) * (config.commandRetries + 1)
/// The most a resume may send again: one checkpoint window, or one Secure DFU data object (SMP:
/// buf_count requests, checked per run against its server's buffers; the largest is printed).
let resendLimit = nordic ? NordicDFUBootloader.Config().dataMaxSize
    : smp ? smpBufferConfigs.map { $0.count * smpRequestData(bufferSize: $0.size) }.max() ?? 0
    : config.window + (options.deviceVersion == 2 ? OTATarget.Version2().eraseUnit : 0)
let resendLimitName = nordic ? "data object" : smp ? "window of buf_count requests" : "window"
/// A version 2 device: its flash, and what it adds to the bound (a CHECKPOINT or STATUS waits a
/// window's erases longer on each try) and to a resume (a commit rounds down to an erase unit).
let version2 = options.deviceVersion == 2 ? OTATarget.Version2() : nil
let nativeBound = bound + (version2.map { .milliseconds(Int($0.eraseTimeMs)) * (config.window / $0.eraseUnit + 1) } ?? .zero)
    * (config.commandRetries + 1)
var records: [RunRecord] = []
let soakStart = ContinuousClock.now

for run in 0..<options.runs where options.only.map({ $0 == run }) ?? true {
    let scenarioSeed = options.seed &* 0x9E37_79B9 &+ UInt64(run)
    let record: RunRecord
    let described: String
    if nordic {
        let scenario = Scenario(seed: scenarioSeed, nordic: true)
        record = await runNordic(scenario, seed: scenarioSeed, trace: options.only != nil, verbose: options.verbose)
        described = "\(scenario)"
    } else if smp {
        let scenario = Scenario(seed: scenarioSeed)
        record = await runSMP(scenario, seed: scenarioSeed, trace: options.only != nil, verbose: options.verbose)
        described = "\(scenario), buffers \(record.smpBuffers ?? "?"), \(record.smpEncoding.map { "\($0)" } ?? "?") answers"
    } else {
        let scenario = Scenario(seed: scenarioSeed)
        record = await runNative(scenario, seed: scenarioSeed, trace: options.only != nil, verbose: options.verbose)
        described = "\(scenario)"
    }
    if options.verbose || record.violation != nil {
        print("run \(run) (seed \(scenarioSeed)): \(record.outcome)\(record.violation.map { " VIOLATION: \($0)" } ?? ""); reconnects \(record.reconnects), resume re-sends \(record.resumeResends); \(described)")
    }
    records.append(record)
}

/// One run of the native protocol against `NativePeripheral`.
func runNative(_ scenario: Scenario, seed scenarioSeed: UInt64, trace: Bool, verbose: Bool) async -> RunRecord {
    var rng = SeededGenerator(seed: scenarioSeed ^ 0xABCDEF)
    let image = FirmwareImage(bytes: (0..<scenario.size).map { _ in UInt8(truncatingIfNeeded: rng.next()) })
    let device = SimulatedDevice(SimulatedDeviceConfig(slotSize: 1 << 20, link: scenario.link, faults: scenario.faults), native: NativeDeviceOptions(version2: version2, runsCLibrary: version2 != nil))
    let clock = VirtualClock()
    let central = SimulatedCentral(devices: [device], clock: clock)
    let session = OTASession(central: central, address: device.config.address, image: image, config: config,
                             profile: NativeProfile(), timeouts: timeouts, reconnect: ReconnectPolicy(window: reconnectWindow, seed: scenarioSeed))
    let run = await runSession(session, clock: clock, trace: trace)
    var record = RunRecord(run, neverConfirms: scenario.neverConfirms != nil)
    let activation = device.target?.lastActivation
    if let activation, activation.image != image.bytes || activation.crc != image.crc32 {
        record.violation = "activated an image that differs from the one sent"
    }
    switch run.result {
    case .success(let r):
        if trace { print("  stats: \(r.stats)") }
        if activation?.image != image.bytes { record.violation = record.violation ?? "reported ok but the device did not activate the image" }
    case .failure(let e):
        if verbose { print("  \(e)") }
        if activation != nil && e.code != .connection { record.violation = record.violation ?? "failed (\(e.code)) after activating" }
    }
    if device.target?.protocolVersion != UInt8(options.deviceVersion) {
        record.violation = record.violation ?? "the device spoke version \(device.target?.protocolVersion ?? 0)"
    }
    if version2 != nil, device.target?.runsCLibrary != true {
        record.violation = record.violation ?? "the C device library did not run"
    }
    if let divergence = device.target?.lockstepDivergence {
        record.violation = record.violation ?? "the C device library and the Swift model differ: \(divergence)"
    }
    record.checkShared(bound: nativeBound, resendLimit: resendLimit, limitName: "window")
    return record
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

print("otaflash-soak: \(options.runs) runs\(nordic || smp ? " of \(options.protocolName)" : version2 != nil ? " of native v2 (NOR flash: 4 KiB units, 85 ms erase, 40 µs/word)" : ""), seed \(options.seed), \(String(format: "%.1f", total)) s")
print("outcomes: " + outcomes.sorted { $0.key < $1.key }.map { "\($0.key) \($0.value)" }.joined(separator: ", "))
print("reconnects: \(reconnectTotal) in all; resumes measured: \(resumes.count); max bytes re-sent per resume: \(maxResend) (\(resendLimitName) \(resendLimit))")
print(String(format: "virtual time per run: median %.2f s, p95 %.2f s, max %.2f s; wall time per run: median %.1f ms, max %.1f ms",
             pctile(virtual, 0.5), pctile(virtual, 0.95), virtual.last ?? 0, pctile(wall, 0.5) * 1000, (wall.last ?? 0) * 1000))
let mismatched = records.filter { $0.mismatchedActivation || $0.violation?.contains("activated an image") == true }.count
let hangs = records.filter { $0.outcome == "hang" }.count
let overWindow = records.filter(\.overResendLimit).count
let runBound = smp ? smpBound : bound
let never = records.filter(\.neverConfirms)
let neverOutcomes = Dictionary(grouping: never, by: \.outcome).mapValues(\.count)
let pastBound = records.filter { $0.afterProgress > runBound.seconds }.count
print("never-confirming devices: \(never.count) runs (" + neverOutcomes.sorted { $0.key < $1.key }.map { "\($0.key) \($0.value)" }.joined(separator: ", ")
      + String(format: "), longest after the last progress %.1f s; bound %.0f s, runs past it: %d", never.map(\.afterProgress).max() ?? 0, runBound.seconds, pastBound))
if nordic {
    let unconfirmed = records.filter(\.unconfirmedActivation).count
    let onFailure = records.filter(\.activatedOnFailure).count
    let okOnce = records.filter { $0.outcome == "ok" && $0.violation == nil }.count
    print("activations: \(okOnce) runs ok with the image sent activated once, byte-identical, its hash matched; \(unconfirmed) failed runs activated it while the link was lost during the last EXECUTE (a connection error that says so); other failed runs that activated anything: \(onFailure)")
}
if smp {
    let okOnce = records.filter { $0.outcome == "ok" && $0.violation == nil }.count
    let onFailure = records.filter(\.activatedOnFailure).count
    print(smpEncodingSummary(records))
    print("marks and swaps: \(okOnce) runs ok with the image sent marked as asked and swapped in once, byte-identical; failed runs in which MCUboot swapped the image sent in (after its hash matched and it was marked): \(onFailure); marks or swaps of other bytes: \(mismatched)")
}
print("violations: \(violations.count) (mismatched activations \(mismatched), hangs \(hangs), resumes over one \(resendLimitName) \(overWindow))")
print("\(options.runs - violations.count) passed, \(violations.count) failed")

if let path = options.json {
    let object: [String: Any] = [
        "runs": options.runs, "seed": options.seed, "seconds": total, "outcomes": outcomes,
        "protocol": options.protocolName, "reconnects": reconnectTotal, "resumes": resumes.count, "max_resend_per_resume": maxResend, "resend_limit": resendLimit,
        "mismatched_activations": mismatched, "hangs": hangs, "never_confirming_runs": never.count, "past_bound": pastBound, "resumes_over_window": overWindow, "violations": violations.count,
    ]
    if let data = try? JSONSerialization.data(withJSONObject: object, options: [.prettyPrinted, .sortedKeys]) {
        if !FileManager.default.createFile(atPath: path, contents: data) { fail("cannot write \(path)") }
    }
}
exit(violations.isEmpty ? 0 : 1)
