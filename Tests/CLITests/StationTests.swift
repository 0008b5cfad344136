import Foundation
import Ledger
@testable import OTAFlashCLI
import Simulator
import Testing
import TestSupport

/// `otaflash station` on a simulated line (virtual time): every device flashed once, failing ones
/// retried then quarantined, a restart that flashes none again, two stations on one PostgreSQL.
@Suite("Station")
struct StationTests {
    static let image = samplePath("seeded-4k.bin")

    static let faults: [Population.Fault: Double] = [.gone: 0.1, .flaky: 0.15]

    /// The first seed whose line of 24 devices has both a `gone` and a `flaky` device.
    static let seed: UInt64 = (UInt64(1)...).first { seed in
        let kinds = Set(members(seed).compactMap(\.fault))
        return kinds.contains(.gone) && kinds.contains(.flaky)
    } ?? 0

    /// The population the station meets, as `Population` makes it (the test's expectations).
    static func members(_ seed: UInt64) -> [Population.Member] {
        Array(sequence(state: Population(devices: 24, arrivalsPerHour: 3600, dwell: .seconds(600), faults: faults, seed: seed).arrivals()) { $0.next() })
    }

    static var members: [Population.Member] { members(seed) }

    static func station(_ ledger: String, _ extra: [String] = []) -> [String] {
        ["station", "--simulator", "--sim-time", "virtual", "--json", "--ledger", ledger, "--sim-devices", "24", "--sim-arrivals", "3600",
         "--sim-fail", "gone:0.1", "--sim-fail", "flaky:0.15", "--sim-seed", "\(seed)", "--retries", "1", "--retry-backoff", "5",
         "--reconnect-window", "1"] + extra + [image]
    }

    @Test func aShiftFlashesEveryDeviceOnceRetriesAndQuarantinesAndARestartFlashesNoneAgain() async throws {
        let scratch = try Scratch()
        let ledger = scratch.url.appendingPathComponent("l.sqlite").path
        let gone = Set(Self.members.filter { $0.fault == .gone }.map(\.address.description))
        let flaky = Set(Self.members.filter { $0.fault == .flaky }.map(\.address.description))
        #expect(!gone.isEmpty && !flaky.isEmpty, "the seed gives both kinds of failing device")

        let run = await otaflash(Self.station(ledger, ["--station", "st-1"]))
        #expect(run.code == 0, "\(run.stderr)")
        let events = run.stdoutLines.compactMap { line -> [String: LineValue]? in
            let object = try? JSONDecoder().decode([String: LineValue].self, from: Data(line.utf8))
            let name = object?["event"]?.string ?? ""
            _ = expectDocumentedLines([line], section: EventDocs.shared.sections["otaflash station"]?[name] != nil ? "otaflash station" : "otaflash flash")
            return object
        }
        #expect(events.first?["event"] == .string("start") && events.dropFirst().first?["event"] == .string("station"))
        let summary = try #require(events.last)
        #expect(summary["event"] == .string("summary"))
        #expect(summary["done"] == .int(24 - gone.count), "\(run.stderr)")
        #expect(summary["quarantined"] == .int(gone.count))
        #expect(summary["failed"] == .int(2 * gone.count + flaky.count))
        #expect(summary["missed"] == .int(0))
        let quarantined = Set(events.filter { $0["event"] == .string("quarantined") }.compactMap { $0["device"]?.string })
        #expect(quarantined == gone)
        let retried = Set(events.filter { $0["event"] == .string("retry") }.compactMap { $0["device"]?.string })
        #expect(retried == gone.union(flaky))

        let rows = try await SQLiteLedger(path: ledger).records(LedgerQuery())
        let ok = rows.filter { $0.result == .ok }
        #expect(ok.count == 24 - gone.count && Set(ok.map(\.device)).count == ok.count, "each device flashed once")
        #expect(Set(ok.map(\.device)).isDisjoint(with: gone))
        #expect(rows.filter { $0.result == .error }.count == 2 * gone.count + flaky.count)
        #expect(ok.filter { flaky.contains($0.device) }.allSatisfy { $0.attempts == 2 })
        let claims = try await SQLiteLedger(path: ledger).claims()
        #expect(claims.filter { $0.state == .done }.count == ok.count && !claims.contains { $0.state == .held })

        // Started again: the ledger says what is done; nothing is flashed twice, the quarantined stay so.
        let again = await otaflash(Self.station(ledger, ["--station", "st-1"]))
        #expect(again.code == 0, "\(again.stderr)")
        #expect(!again.stdout.contains("\"event\":\"transfer\""), "no device flashed again")
        let last = try #require(again.jsonEvents.last)
        #expect(last["done"] as? Int == 0, "\(last)")
        #expect(last["already_done"] as? Int == 24 - gone.count && last["quarantined"] as? Int == gone.count, "\(last)")
        #expect(last["seen_elsewhere"] as? Int == 24 - gone.count, "\(last)")
        #expect(try await SQLiteLedger(path: ledger).records(LedgerQuery()).count == rows.count)
    }

    @Test func theHumanScreenEndsWithTheCounts() async throws {
        let scratch = try Scratch()
        let run = await otaflash(Self.station(scratch.url.appendingPathComponent("l.sqlite").path).filter { $0 != "--json" })
        #expect(run.code == 0, "\(run.stderr)")
        #expect(run.stdout.contains("quarantined") && run.stdout.contains("devices per hour (virtual clock"), "\(run.stdout)")
        #expect(run.stderr.contains("quarantined after 2 failed attempts"), "\(run.stderr)")
    }

    @Test(arguments: [
        (["--simulator", "--ledger", "/nonexistent/l.sqlite", "--device", "AA:BB:CC:DD:EE:01"], "--device lists a batch's devices"),
        (["--no-ledger"], "--no-ledger: a station keeps its books"),
        (["--simulator", "--ledger", "/nonexistent/l.sqlite", "--sim-fail", "gone:0.7", "--sim-fail", "flaky:0.7"], "add up to 1.4"),
        (["--simulator", "--ledger", "/nonexistent/l.sqlite", "--retry-backoff", "-1"], "--retry-backoff must be between 0 and 3600"),
        (["--sim-devices", "5"], "--sim-devices describes a simulated line"),
    ])
    func badOptionsAreRefusedWithOneLine(extra: [String], says: String) async {
        let run = await otaflash(["station"] + extra + [Self.image])
        expectOneUsageLine(run, saying: [says])
    }

    @Test func aSimulatedLineNeedsALedger() async {
        expectOneUsageLine(await otaflash(["station", "--simulator", Self.image]), saying: ["add --ledger PATH"])
    }

    /// Two stations, one PostgreSQL ledger, the same 60 devices in range of both: each device
    /// flashed exactly once, by one or the other, and the claims say by whom.
    @Test(.needs(.postgres)) func twoStationsOnOnePostgreSQLFlashEachDeviceOnce() async throws {
        let url = try Prerequisites.require(PostgresServer.shared, for: .postgres).database("stations")
        let line = ["station", "--simulator", "--sim-time", "virtual", "--json", "--ledger", url, "--sim-devices", "60",
                    "--sim-arrivals", "7200", "--sim-seed", "3", "--per-adapter", "4", "--claim-lease", "5", Self.image]
        async let a = otaflash(line + ["--station", "st-a"])
        async let b = otaflash(line + ["--station", "st-b"])
        let (ra, rb) = await (a, b)
        #expect(ra.code == 0 && rb.code == 0, "\(ra.stderr)\n\(rb.stderr)")
        let store = try PostgresLedger(url: url)
        let rows = try await store.records(LedgerQuery())
        let ok = rows.filter { $0.result == .ok }
        #expect(ok.count == 60 && Set(ok.map(\.device)).count == 60, "every device flashed exactly once")
        let claims = try await store.claims()
        #expect(claims.count == 60 && claims.allSatisfy { $0.state == .done })
        for claim in claims { #expect(ok.first { $0.device.uppercased() == claim.device }?.station == claim.station) }
        await store.close()
        // The books count attempts: a device found held or done by the other station is no row,
        // and each station's ok rows are the devices it flashed (its summary's `done`).
        #expect(rows.count == ok.count, "\(rows.filter { $0.result != .ok }.map { "\($0.station) \($0.result) \($0.errorCode ?? "-")" })")
        for (name, run) in [("st-a", ra), ("st-b", rb)] {
            let summary = try #require(run.jsonEvents.last)
            #expect(ok.filter { $0.station == name }.count == summary["done"] as? Int, "\(name): \(summary)")
        }
        let check = await otaflash(["ledger", "--ledger", url, "--check"])
        #expect(check.code == 0, "\(check.stdout)\(check.stderr)")
    }
}
