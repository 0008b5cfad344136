import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import Ledger
import LineServer
@testable import OTAFlashCLI
import Testing
import TestSupport

/// `otaflash dashboard` over real HTTP on a simulated shift's ledger: the page and the JSON say what
/// the ledger says, the station's heartbeat shows it, a token is asked for when set, bad requests
/// and a ledger that goes away are answered, not crashed on.
@Suite("Dashboard")
struct DashboardTests {
    static func get(_ port: Int, _ path: String, token: String? = nil, method: String = "GET") async throws -> (status: Int, body: String) {
        var request = URLRequest(url: URL(string: "http://127.0.0.1:\(port)\(path)")!)
        request.timeoutInterval = 10
        request.httpMethod = method
        if let token { request.setValue("Bearer \(token)", forHTTPHeaderField: "Authorization") }
        let (data, response) = try await URLSession.shared.data(for: request)
        return (try #require(response as? HTTPURLResponse).statusCode, String(decoding: data, as: UTF8.self))
    }

    static func object(_ text: String) throws -> [String: Any] {
        try #require(try JSONSerialization.jsonObject(with: Data(text.utf8)) as? [String: Any], "\(text)")
    }

    /// A dashboard on `ledger`, listening on a free loopback port until `body` returns.
    static func serve<T>(_ ledger: String, token: String? = nil, _ body: (Int) async throws -> T) async throws -> T {
        let dashboard = Dashboard(location: ledger, token: token)
        let address = try ListenAddress("127.0.0.1:\(try freeLoopbackPort())", option: "--listen")
        let listener = try await HTTPListener.start(dashboard.router(), on: address, option: "--listen")
        do {
            let result = try await body(address.port)
            await listener.stop()
            await dashboard.close()
            return result
        } catch {
            await listener.stop()
            await dashboard.close()
            throw error
        }
    }

    @Test func thePageAndTheJSONSayWhatTheLedgerSays() async throws {
        let scratch = try Scratch()
        let (ledger, station) = try await LineCLITests.shift(scratch)
        let summaryRun = await otaflash(["ledger", "--ledger", ledger, "--summary", "--format", "json"])
        let summary = try Self.object(summaryRun.stdout)
        try await Self.serve(ledger) { port in
            let page = try await Self.get(port, "/")
            #expect(page.status == 200 && page.body.hasPrefix("<!DOCTYPE html>"))
            #expect(page.body.contains("id=\"count-devices\" data-value=\"\(summary["devices"] as? Int ?? -1)\""))
            #expect(page.body.components(separatedBy: "<figure class=\"plot\"").count - 1 == 4)
            #expect(!page.body.contains("src=") && !page.body.contains("href="), "every asset served here")

            let view = try await Self.get(port, "/view")
            #expect(view.status == 200 && view.body.contains("id=\"count-done\" data-value=\"\(station["done"] as? Int ?? -1)\""))

            let api = try Self.object(try await Self.get(port, "/api/summary").body)
            let counts = try #require(api["counts"] as? [String: Any])
            #expect(counts["devices"] as? Int == summary["devices"] as? Int && counts["attempts"] as? Int == summary["attempts"] as? Int)
            #expect(counts["first_pass_yield"] as? Double == summary["first_pass_yield"] as? Double)
            #expect(counts["quarantined"] as? Int == station["quarantined"] as? Int)

            // The station's last beat says its shift ended: dead at once.
            let stations = try #require(try JSONSerialization.jsonObject(with: Data(try await Self.get(port, "/api/stations").body.utf8)) as? [[String: Any]])
            #expect(stations.count == 1 && stations[0]["name"] as? String == "st-1" && stations[0]["alive"] as? Bool == false, "\(stations)")
            #expect(stations[0]["adapters"] as? [String] == ["sim"])

            let all = try Self.object(try await Self.get(port, "/api/devices").body)
            #expect(all["total"] as? Int == summary["devices"] as? Int && all["limit"] as? Int == 100)
            let first = try #require((all["devices"] as? [[String: Any]])?.first)
            let address = try #require(first["device"] as? String), serial = try #require(first["serial_number"] as? String)
            let one = try Self.object(try await Self.get(port, "/api/devices?q=\(address.lowercased())&limit=5").body)
            #expect((one["devices"] as? [[String: Any]])?.map { $0["device"] as? String } == [address], "\(one)")
            let bySerial = try Self.object(try await Self.get(port, "/api/devices?q=\(serial)").body)
            #expect(bySerial["total"] as? Int == 1, "\(bySerial)")
            for bad in ["/api/devices?limit=5000", "/api/devices?limit=0", "/api/devices?limit=many", "/api/devices?q=" + String(repeating: "A", count: 65)] {
                let answer = try await Self.get(port, bad)
                let error = try Self.object(answer.body)["error"] as? String
                #expect(answer.status == 400 && error?.isEmpty == false, "\(bad): \(answer)")
            }
            for method in ["POST", "PUT", "DELETE"] {
                let write = try await Self.get(port, "/api/summary", method: method)
                let line = try Self.object(write.body)["error"] as? String
                #expect(write.status == 405 && line?.contains("no write endpoint") == true, "\(method): \(write)")
            }
            let nothing = try await Self.get(port, "/nothing")
            let what = try Self.object(nothing.body)["error"] as? String
            #expect(nothing.status == 404 && what?.contains("/api/summary") == true, "\(nothing)")
        }
    }

    /// The dashboard reads only the records it has not read: one written while it runs shows,
    /// counted once, whatever the number of reads.
    @Test func aRecordWrittenWhileItRunsShowsOnce() async throws {
        let scratch = try Scratch()
        let (ledger, _) = try await LineCLITests.shift(scratch)
        try await Self.serve(ledger) { port in
            func attempts() async throws -> Int? {
                let counts = try Self.object(try await Self.get(port, "/api/summary").body)["counts"] as? [String: Any]
                return counts?["attempts"] as? Int
            }
            let before = try #require(try await attempts())
            let store = try Ledger.open(ledger)
            var record = try #require(try await store.records(LedgerQuery(limit: 1)).first)
            record.id = nil
            record.device = "0E:5D:FF:FF:FF:01"
            record.startedAt = LedgerRecord.timestamp(Date())
            try await store.append(record)
            await store.close()
            let written = ContinuousClock.now
            var seen = before
            // The dashboard reads at most once a second, on a request: it shows within a second and
            // a request (five allowed here, for a loaded machine).
            while seen == before, ContinuousClock.now - written < .seconds(5) {
                try await Task.sleep(for: .milliseconds(100))
                seen = try #require(try await attempts())
            }
            #expect(seen == before + 1, "one record more, counted once")
            try await Task.sleep(for: .seconds(1.1))
            #expect(try await attempts() == before + 1, "read again: still counted once")
            let devices = try Self.object(try await Self.get(port, "/api/devices?q=0E:5D:FF:FF:FF:01").body)
            #expect(devices["total"] as? Int == 1)
        }
    }

    @Test func aTokenIsAskedForAndAWrongOneRefused() async throws {
        let scratch = try Scratch()
        let (ledger, _) = try await LineCLITests.shift(scratch)
        try await Self.serve(ledger, token: "line-3-secret") { port in
            let page = try await Self.get(port, "/")
            #expect(page.status == 200 && page.body.contains("id=\"count-attempts\" data-value=\"0\""), "the page alone holds no data")
            for path in ["/view", "/api/summary", "/api/stations", "/api/devices"] {
                #expect(try await Self.get(port, path).status == 401, "\(path)")
                #expect(try await Self.get(port, path, token: "line-3-secreT").status == 401, "\(path)")
                #expect(try await Self.get(port, path, token: "line-3-secret").status == 200, "\(path)")
            }
        }
    }

    @Test func aLedgerThatGoesAwayIsALineUntilItIsBack() async throws {
        let scratch = try Scratch()
        let (ledger, _) = try await LineCLITests.shift(scratch)
        let aside = scratch.url.appendingPathComponent("aside.sqlite").path
        try await Self.serve(ledger) { port in
            #expect(try await Self.get(port, "/api/summary").status == 200)
            try FileManager.default.moveItem(atPath: ledger, toPath: aside)
            try await Task.sleep(for: .milliseconds(1100))  // past the reading's freshness
            let gone = try await Self.get(port, "/api/summary")
            let error = try Self.object(gone.body)["error"] as? String
            #expect(gone.status == 503 && error?.contains("is gone") == true, "\(gone)")
            #expect(try await Self.get(port, "/view").status == 503)
            #expect(try await Self.get(port, "/").status == 200, "the page still loads, with the line")
            try FileManager.default.moveItem(atPath: aside, toPath: ledger)
            try await Task.sleep(for: .milliseconds(1100))
            #expect(try await Self.get(port, "/api/summary").status == 200)
        }
    }

    @Test func theStationsHeartbeatIsAliveWhileItBeats() async throws {
        let scratch = try Scratch()
        let path = scratch.url.appendingPathComponent("l.sqlite").path
        let store = try SQLiteLedger(path: path)
        #expect(try await store.heartbeats().isEmpty, "no table yet")
        // A long interval: a loaded machine may take seconds between the beat and its reading.
        var beat = StationHeartbeat(station: "st-9", run: "r1", startedAt: LedgerRecord.timestamp(Date()), interval: 60, adapters: ["hci0", "hci1"],
                                    inProgress: 3, claimsHeld: 3)
        let before = Date()
        try await store.beat(beat)
        let read = try #require(try await store.heartbeats().first)
        #expect(read.alive && read.age <= Date().timeIntervalSince(before) + 0.01 && read.adapters == ["hci0", "hci1"] && read.inProgress == 3, "\(read)")
        beat.ended = true
        try await store.beat(beat)
        #expect(try await store.heartbeats().first?.alive == false)
        #expect(StationHeartbeat(station: "s", run: "r", startedAt: "", interval: 2, adapters: [], inProgress: 0, claimsHeld: 0, age: 6.5).alive == false,
                "three intervals without a beat")
    }

    /// On PostgreSQL the beat is stamped and aged by the server's clock.
    @Test(.needs(.postgres)) func heartbeatsOnPostgreSQL() async throws {
        let url = try Prerequisites.require(PostgresServer.shared, for: .postgres).database("heartbeats")
        let a = try PostgresLedger(url: url), b = try PostgresLedger(url: url)
        try await a.prepare(station: "st-a")
        #expect(try await b.heartbeats().isEmpty, "no table yet")
        let beat = StationHeartbeat(station: "st-a", run: "r1", startedAt: LedgerRecord.timestamp(Date()), interval: 2, adapters: ["hci0"],
                                    inProgress: 1, claimsHeld: 1)
        try await a.beat(beat)
        try await a.beat(beat)
        var older = beat
        older.run = "r0"
        try await b.beat(older)
        try await a.beat(beat)
        let read = try await b.heartbeats()
        #expect(read.count == 1 && read[0].run == "r1" && read[0].age < 60, "the newest beat of each station: \(read)")
        await a.close()
        await b.close()
    }

    @Test(arguments: [
        (["--listen", "0.0.0.0:8080"], 2, "--listen 0.0.0.0:8080 is reachable from other machines: give --token or --token-file"),
        (["--listen", "127.0.0.1:99999"], 2, "--listen 127.0.0.1:99999: the port must be 1 to 65535"),
        (["--token", "short"], 2, "the token's length must be between 8 and 256 characters"),
        (["--token", "with space inside"], 2, "the token must be printable ASCII without spaces"),
        (["--token-file", "/nonexistent/token"], 2, "--token-file /nonexistent/token: cannot be read"),
    ])
    func badOptionsAreOneLineAndExit2(_ arguments: [String], _ code: Int32, _ line: String) async {
        let run = await otaflash(["dashboard", "--ledger", "/nonexistent.sqlite"] + arguments)
        #expect(run.code == code, "\(run.stderr)")
        #expect(run.stderr.contains(line), "\(run.stderr)")
    }

    @Test func aMissingLedgerIsExit18AndAPortInUseExit2() async throws {
        let missing = await otaflash(["dashboard", "--ledger", "/nonexistent-folder/l.sqlite"])
        #expect(missing.code == 18 && missing.errorLines.count == 1 && missing.stderr.contains("no ledger at /nonexistent-folder/l.sqlite"), "\(missing.stderr)")
        let scratch = try Scratch()
        let (ledger, _) = try await LineCLITests.shift(scratch)
        let busy = try SilentListener()
        let run = await otaflash(["dashboard", "--ledger", ledger, "--listen", "127.0.0.1:\(busy.port)"])
        #expect(run.code == 2 && run.errorLines.count == 1 && run.stderr.contains("the port \(busy.port) is in use"), "\(run.stderr)")
        let down = await otaflash(["dashboard", "--ledger", "postgres://u:p@127.0.0.1:\(try freeLoopbackPort())/db"])
        #expect(down.code == 18 && down.errorLines.count == 1, "\(down.stderr)")
    }
}
