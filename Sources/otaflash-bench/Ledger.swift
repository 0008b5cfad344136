import Foundation
import Ledger
import Simulator

/// The ledger's cost per record: `count` records appended one transaction each (each is
/// committed when `append` returns: SQLite in WAL with synchronous FULL, or PostgreSQL), then
/// one summary query over all of them. With `claims`, each record is preceded by its device's
/// claim, as a station sharing the ledger does.
func ledgerFigures(count: Int, url: String? = nil, claims: Bool = false) async throws
    -> (microsecondsPerRecord: Double, queryMilliseconds: Double, fileBytes: Int) {
    let folder = NSTemporaryDirectory() + "otaflash-bench-ledger-\(getpid())"
    try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
    defer { try? FileManager.default.removeItem(atPath: folder) }
    let ledger: any LedgerStore = try url.map { try PostgresLedger(url: $0) } ?? SQLiteLedger(path: folder + "/ledger.sqlite")
    try await ledger.prepare(station: "bench")
    let before = try await ledger.records(LedgerQuery()).count
    let sha = String(repeating: "5e", count: 32)
    let run = UUID().uuidString
    let holder = ClaimHolder(station: "bench", run: run)
    let started = ContinuousClock.now
    for i in 0..<count {
        let device = String(format: "C0:FF:EE:%02X:%02X:%02X", (i >> 16) & 0xFF, (i >> 8) & 0xFF, i & 0xFF)
        if claims {
            guard case .granted = try await ledger.claim(device, image: run, by: holder, lease: .seconds(60)) else {
                throw BenchFailure("\(device) was not granted")
            }
        }
        let now = LedgerRecord.timestamp(Date())
        try await ledger.append(LedgerRecord(runID: run, startedAt: now, endedAt: now, station: "bench", adapter: "hci0", device: device,
                                             manufacturer: "otaflash", model: "bench", serialNumber: "SN\(i)", firmwareBefore: "1.0.0",
                                             protocolName: "native", imageName: "app.bin", imageSize: 262_144, imageSHA256: claims ? run : sha,
                                             firmwareAfter: "2.0.0", bytesSent: 262_144, seconds: 2.1, rate: 124_000,
                                             result: i % 50 == 0 ? .error : .ok, exitCode: i % 50 == 0 ? 10 : 0,
                                             errorCode: i % 50 == 0 ? "timeout" : nil, otaflashVersion: "bench", otaflashCommit: "bench"))
    }
    let appended = (ContinuousClock.now - started).seconds
    let q0 = ContinuousClock.now
    let summary = LedgerSummary(try await ledger.records(LedgerQuery()))
    let query = (ContinuousClock.now - q0).seconds
    guard summary.attempts == before + count else { throw BenchFailure("the ledger holds \(summary.attempts) records, expected \(before + count)") }
    await ledger.close()
    let bytes = ((try? FileManager.default.contentsOfDirectory(atPath: folder)) ?? []).reduce(0) { total, name in
        total + (((try? FileManager.default.attributesOfItem(atPath: folder + "/" + name))?[.size] as? Int) ?? 0)
    }
    return (appended / Double(count) * 1e6, query * 1e3, bytes)
}

/// A bench record of device `i` in run `run`.
func benchRecord(_ i: Int, run: String) -> LedgerRecord {
    let now = LedgerRecord.timestamp(Date())
    let device = String(format: "C0:FF:EE:%02X:%02X:%02X", (i >> 16) & 0xFF, (i >> 8) & 0xFF, i & 0xFF)
    return LedgerRecord(runID: run, startedAt: now, endedAt: now, station: "bench", adapter: "hci0", device: device,
                        manufacturer: "otaflash", model: "bench", serialNumber: "SN\(i)", firmwareBefore: "1.0.0",
                        protocolName: "native", imageName: "app.bin", imageSize: 262_144, imageSHA256: String(repeating: "5e", count: 32),
                        firmwareAfter: "2.0.0", bytesSent: 262_144, seconds: 2.1, rate: 124_000, result: .ok, exitCode: 0,
                        otaflashVersion: "bench", otaflashCommit: "bench")
}

/// The outbox's cost (docs/LEDGER.md, "When the server goes away"), in µs per record, `count`
/// records each: appended plainly to the PostgreSQL ledger at `url`; appended through a station's
/// outbox while the server answers (the idempotent write); kept in the outbox (SQLite, WAL,
/// synchronous FULL: what a record costs while the server is away); sent from it when the server
/// answers again (the replay).
func outboxFigures(count: Int, url: String) async throws -> (plain: Double, through: Double, kept: Double, replayed: Double) {
    let folder = NSTemporaryDirectory() + "otaflash-bench-outbox-\(getpid())"
    try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
    defer { try? FileManager.default.removeItem(atPath: folder) }
    func perRecord(_ body: (Int) async throws -> Void) async throws -> Double {
        let started = ContinuousClock.now
        for i in 0..<count { try await body(i) }
        return (ContinuousClock.now - started).seconds / Double(count) * 1e6
    }
    let shared = try PostgresLedger(url: url)
    try await shared.prepare(station: "bench")
    let plainRun = UUID().uuidString
    let plain = try await perRecord { try await shared.append(benchRecord($0, run: plainRun)) }
    let station = try SpoolingLedger(shared: shared, outbox: try Outbox(path: folder + "/outbox-up.sqlite"))
    let throughRun = UUID().uuidString
    let through = try await perRecord { try await station.append(benchRecord($0, run: throughRun)) }
    let outbox = try Outbox(path: folder + "/outbox.sqlite")
    let keptRun = UUID().uuidString
    let kept = try await perRecord { try await outbox.keep(.record(benchRecord($0, run: keptRun))) }
    let replaying = try SpoolingLedger(shared: shared, outbox: outbox)
    let started = ContinuousClock.now
    let sent = try await replaying.replay()
    let replayed = (ContinuousClock.now - started).seconds / Double(count) * 1e6
    guard sent == count else { throw BenchFailure("the outbox sent \(sent) records, expected \(count)") }
    await shared.close()
    await outbox.close()
    return (plain, through, kept, replayed)
}
