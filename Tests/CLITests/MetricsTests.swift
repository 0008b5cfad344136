import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import Ledger
import LineServer
@testable import OTAFlashCLI
import Testing
import TestSupport

/// `otaflash station --metrics`: Prometheus' text format, checked by Prometheus' own `promtool
/// check metrics` (0 problems), served while the shift runs; a port in use stops the station
/// before any device.
@Suite("Station metrics")
struct MetricsTests {
    /// `promtool check metrics` on `text`: its exit code and what it printed.
    static func promtool(_ text: String) throws -> (code: Int32, output: String) {
        guard let promtool = findExecutable("promtool") else {
            try Prerequisites.unavailable(.promtool, "promtool is not installed (apt-get install prometheus, or run scripts/deps.sh)")
        }
        let process = Process()
        process.executableURL = URL(fileURLWithPath: promtool)
        process.arguments = ["check", "metrics"]
        let input = Pipe(), output = Pipe()
        process.standardInput = input
        process.standardOutput = output
        process.standardError = output
        try process.run()
        input.fileHandleForWriting.write(Data(text.utf8))
        try input.fileHandleForWriting.close()
        let printed = output.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        return (process.terminationStatus, String(decoding: printed, as: UTF8.self))
    }

    static func scrape(_ port: Int) async throws -> (status: Int, type: String?, body: String) {
        var request = URLRequest(url: URL(string: "http://127.0.0.1:\(port)/metrics")!)
        request.timeoutInterval = 5
        let (data, response) = try await URLSession.shared.data(for: request)
        let http = try #require(response as? HTTPURLResponse)
        return (http.statusCode, http.value(forHTTPHeaderField: "Content-Type"), String(decoding: data, as: UTF8.self))
    }

    @Test(.needs(.promtool)) func theExpositionPassesPromtoolWithEveryMetric() async throws {
        let registry = StationMetrics { .init(inProgress: 2, claimsHeld: 2, adaptersUp: 1, outboxDepth: 3) }
        registry.attemptEnded(result: "ok", error: nil, seconds: 12.5, bytes: 200_000)
        registry.attemptEnded(result: "error", error: "connection", seconds: 3, bytes: 1000)
        registry.attemptEnded(result: "error", error: "weird \"label\"\\\n", seconds: 0, bytes: 0)
        let text = await registry.exposition()
        let check = try Self.promtool(text)
        #expect(check.code == 0 && check.output.isEmpty, "promtool: \(check.output)\n\(text)")
        #expect(text.contains("otaflash_attempts_total{result=\"ok\",error=\"none\"} 1\n"))
        #expect(text.contains("otaflash_attempts_total{result=\"error\",error=\"connection\"} 1\n"))
        #expect(text.contains("otaflash_attempts_total{result=\"error\",error=\"weird \\\"label\\\"\\\\\\n\"} 1\n"))
        #expect(text.contains("otaflash_device_duration_seconds_bucket{le=\"10\"} 0\n"))
        #expect(text.contains("otaflash_device_duration_seconds_bucket{le=\"20\"} 1\n"))
        #expect(text.contains("otaflash_device_duration_seconds_bucket{le=\"+Inf\"} 1\n"))
        #expect(text.contains("otaflash_device_duration_seconds_sum 12.5\n") && text.contains("otaflash_device_duration_seconds_count 1\n"))
        #expect(text.contains("otaflash_transfer_rate_bytes_per_second_count 2\n"), "attempts that sent bytes")
        for gauge in ["otaflash_devices_in_progress 2", "otaflash_claims_held 2", "otaflash_adapters_up 1", "otaflash_outbox_depth 3"] {
            #expect(text.contains(gauge + "\n"), "\(gauge)")
        }
        // A station without an outbox has no outbox gauge.
        #expect(await !StationMetrics { .init(inProgress: 0, claimsHeld: 0, adaptersUp: 1, outboxDepth: nil) }.exposition().contains("outbox"))
    }

    /// promtool is not a rubber stamp: a counter without `_total` is a problem it reports.
    @Test(.needs(.promtool)) func promtoolReportsAProblem() throws {
        let check = try Self.promtool("# HELP otaflash_attempts Attempts.\n# TYPE otaflash_attempts counter\notaflash_attempts 1\n")
        #expect(check.code != 0 && check.output.contains("_total"), "\(check.output)")
    }

    @Test(.needs(.promtool)) func aStationServesItsMetricsWhileTheShiftRuns() async throws {
        let scratch = try Scratch()
        let ledger = scratch.url.appendingPathComponent("l.sqlite").path
        let port = try freeLoopbackPort()
        // Real time: six devices, one every 6 s on average, each flashed in about a second: a shift of
        // half a minute or more, time for a loaded machine to scrape it while it runs.
        let station = Task {
            await otaflash(["station", "--simulator", "--json", "--ledger", ledger, "--sim-devices", "6", "--sim-arrivals", "600",
                            "--sim-seed", "3", "--metrics", "127.0.0.1:\(port)", samplePath("seeded-4k.bin")])
        }
        var last = ""
        var counted = 0
        let giveUp = ContinuousClock.now + .seconds(120)
        // Scraped as Prometheus would, every 200 ms, until three devices are counted (at most 120 s).
        while counted < 3, ContinuousClock.now < giveUp {
            if let scraped = try? await Self.scrape(port) {
                #expect(scraped.status == 200 && scraped.type?.hasPrefix("text/plain; version=0.0.4") == true)
                last = scraped.body
                counted = last.firstMatch(of: /otaflash_attempts_total\{result="ok",error="none"\} ([0-9]+)\n/).flatMap { Int($0.output.1) } ?? 0
            }
            if counted < 3 { try await Task.sleep(for: .milliseconds(200)) }
        }
        #expect(counted >= 3, "\(last)")
        let check = try Self.promtool(last)
        #expect(check.code == 0 && check.output.isEmpty, "promtool: \(check.output)")
        #expect(last.contains("otaflash_device_duration_seconds_count \(counted)\n") && last.contains("otaflash_adapters_up 1\n"), "\(last)")
        let run = await station.value
        #expect(run.code == 0, "\(run.stderr)")
        let ok = try await SQLiteLedger(path: ledger).records(LedgerQuery(result: .ok)).count
        #expect(ok >= counted && ok == 6, "the ledger's ok records, \(ok), against the \(counted) counted mid-shift")
        #expect((try? await Self.scrape(port)) == nil, "the listener stops with the shift")
    }

    @Test func aPortInUseStopsTheStationBeforeAnyDevice() async throws {
        let scratch = try Scratch()
        let ledger = scratch.url.appendingPathComponent("l.sqlite").path
        let busy = try SilentListener()
        let run = await otaflash(["station", "--simulator", "--sim-time", "virtual", "--ledger", ledger, "--sim-devices", "3",
                                  "--metrics", "127.0.0.1:\(busy.port)", samplePath("seeded-4k.bin")])
        #expect(run.code == 2, "\(run.stderr)")
        #expect(run.errorLines.count == 1 && run.errorLines[0].contains("--metrics 127.0.0.1:\(busy.port): the port \(busy.port) is in use"), "\(run.stderr)")
        #expect(try await SQLiteLedger(path: ledger).records(LedgerQuery()).isEmpty)
    }

    /// The Grafana dashboard in packaging/ asks only for series a station serves.
    @Test func theGrafanaDashboardUsesTheStationsMetrics() async throws {
        let path = repositoryRoot.appendingPathComponent("packaging/grafana/otaflash-line.json").path
        let board = try #require(try JSONSerialization.jsonObject(with: Data(contentsOf: URL(fileURLWithPath: path))) as? [String: Any])
        let panels = try #require(board["panels"] as? [[String: Any]])
        let expressions = panels.flatMap { ($0["targets"] as? [[String: Any]] ?? []).compactMap { $0["expr"] as? String } }
        #expect(expressions.count >= 10)
        let exposition = await StationMetrics { .init(inProgress: 0, claimsHeld: 0, adaptersUp: 1, outboxDepth: 0) }.exposition()
        let served = Set(exposition.split(separator: "\n").filter { !$0.hasPrefix("#") }.map { String($0.prefix { $0 != "{" && $0 != " " }) })
        for expression in expressions {
            for name in expression.matches(of: /otaflash_[a-z_]+/).map({ String($0.output) }) {
                #expect(served.contains(name), "\(name) in \(expression)")
            }
        }
    }

    @Test(arguments: ["127.0.0.1", "127.0.0.1:0", "127.0.0.1:65536", "example.com:80", "[::1:80", "1.2.3:80"])
    func aMetricsAddressThatIsNotOneIsRefusedWithExit2(_ address: String) async {
        let run = await otaflash(["station", "--simulator", "--ledger", "/tmp/x.sqlite", "--metrics", address, samplePath("seeded-4k.bin")])
        #expect(run.code == 2, "\(run.stderr)")
        #expect(run.stderr.contains("--metrics \(address):"), "\(run.stderr)")
    }
}
