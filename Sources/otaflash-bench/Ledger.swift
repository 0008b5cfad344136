import Foundation
import Ledger
import Simulator

/// The ledger's cost per record: `count` records appended one transaction each (WAL, synchronous
/// FULL: each is on disk when `append` returns), then one summary query over all of them.
func ledgerFigures(count: Int) async throws -> (microsecondsPerRecord: Double, queryMilliseconds: Double, fileBytes: Int) {
    let folder = NSTemporaryDirectory() + "otaflash-bench-ledger-\(getpid())"
    try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
    defer { try? FileManager.default.removeItem(atPath: folder) }
    let ledger = try SQLiteLedger(path: folder + "/ledger.sqlite")
    let sha = String(repeating: "5e", count: 32)
    let started = ContinuousClock.now
    for i in 0..<count {
        let device = String(format: "C0:FF:EE:%02X:%02X:%02X", (i >> 16) & 0xFF, (i >> 8) & 0xFF, i & 0xFF)
        let now = LedgerRecord.timestamp(Date())
        try await ledger.append(LedgerRecord(runID: "bench", startedAt: now, endedAt: now, station: "bench", adapter: "hci0", device: device,
                                             manufacturer: "otaflash", model: "bench", serialNumber: "SN\(i)", firmwareBefore: "1.0.0",
                                             protocolName: "native", imageName: "app.bin", imageSize: 262_144, imageSHA256: sha,
                                             firmwareAfter: "2.0.0", bytesSent: 262_144, seconds: 2.1, rate: 124_000,
                                             result: i % 50 == 0 ? "error" : "ok", exitCode: i % 50 == 0 ? 10 : 0,
                                             errorCode: i % 50 == 0 ? "timeout" : nil, otaflashVersion: "bench", otaflashCommit: "bench"))
    }
    let appended = (ContinuousClock.now - started).seconds
    let q0 = ContinuousClock.now
    let summary = LedgerSummary(try await ledger.records(LedgerQuery()))
    let query = (ContinuousClock.now - q0).seconds
    guard summary.attempts == count else { throw BenchFailure("the ledger holds \(summary.attempts) records, expected \(count)") }
    await ledger.close()
    let bytes = ((try? FileManager.default.contentsOfDirectory(atPath: folder)) ?? []).reduce(0) { total, name in
        total + (((try? FileManager.default.attributesOfItem(atPath: folder + "/" + name))?[.size] as? Int) ?? 0)
    }
    return (appended / Double(count) * 1e6, query * 1e3, bytes)
}
