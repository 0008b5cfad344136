import Foundation
import Ledger
@testable import OTAFlashCLI
import Testing
import TestSupport

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// `--post-results` (docs/EVENTS.md, "Results to a server") against a real HTTP server
/// (scripts/mes-server, Python's http.server) that is down, slow and answers 500s on a schedule,
/// and counts records by their Idempotency-Key: every record delivered once, none lost when the
/// server is away or the station is killed, every body's signature checked by the server.
@Suite("Results to a server")
struct PostResultsTests {
    /// scripts/mes-server, started for one test; killed when the test ends.
    final class MES {
        let process: SpawnedProcess
        let port: Int
        let stats: String

        init(_ scratch: Scratch, schedule: String = "ok", secret: String? = nil, port: Int = 0) throws {
            stats = scratch.url.appendingPathComponent("mes-\(UUID().uuidString).json").path
            let script = repositoryRoot.appendingPathComponent("scripts/mes-server").path
            process = try SpawnedProcess.spawn(["/usr/bin/env", "python3", script, "--stats", stats, "--schedule", schedule, "--port", "\(port)",
                                                "--max-seconds", "300"] + (secret.map { ["--secret", $0] } ?? []))
            let line = process.waitForLine(timeoutMilliseconds: 20_000) { $0.hasPrefix("listening on ") }
            guard let line, let port = Int(line.dropFirst("listening on ".count)) else {
                process.stop()
                throw HarnessError("scripts/mes-server did not start")
            }
            self.port = port
        }

        deinit { process.stop() }

        var url: String { "http://127.0.0.1:\(port)/results" }

        struct Key: Decodable {
            var device: String?
            var result: String?
            var received: Int
        }

        struct Counts: Decodable {
            var requests: Int
            var stored: Int
            var duplicates: Int
            var bad_signature: Int
            var bad_body: Int
            var answered_500: Int
            var keys: [String: Key]
        }

        func counts() throws -> Counts {
            try JSONDecoder().decode(Counts.self, from: try #require(FileManager.default.contents(atPath: stats)))
        }
    }

    /// The attempt ids of every record in the ledger: what the server must have, once each.
    static func attemptIDs(_ ledger: String) async throws -> Set<String> {
        Set(try await SQLiteLedger(path: ledger).records(LedgerQuery()).map { ResultDocument(record: $0).attemptID })
    }

    static func batch(_ ledger: String, count: Int, _ extra: [String], image: String = "seeded-4k.bin") -> [String] {
        simulator + ["--count", "\(count)", "--parallel", "2", "--json", "--ledger", ledger, "--station", "mes-1"] + extra + [samplePath(image)]
    }

    @Test(.timeLimit(.minutes(3)))
    func aBatchDeliversEveryRecordOnceSignedThroughFiveHundredsAndASlowServer() async throws {
        let scratch = try Scratch()
        let secret = try scratch.file("secret", "s3cr3t-key\n")
        let mes = try MES(scratch, schedule: "500:2,slow@1:2,ok", secret: secret)
        let ledger = scratch.url.appendingPathComponent("l.sqlite").path
        let run = await otaflash(Self.batch(ledger, count: 6, ["--post-results", mes.url, "--post-secret", secret, "--post-timeout", "30"]))
        #expect(run.code == 0, "\(run.stderr)")
        let counts = try mes.counts()
        let ids = try await Self.attemptIDs(ledger)
        #expect(ids.count == 6)
        #expect(Set(counts.keys.keys) == ids, "every record delivered: \(counts)")
        #expect(counts.stored == 6 && counts.bad_signature == 0 && counts.bad_body == 0, "\(counts)")
        #expect(counts.answered_500 > 0, "the server's 500s were met: \(counts)")
        #expect(ResultsOutbox.names(in: ledger + ".results").isEmpty, "nothing left in the outbox")
        // What the server stored is the ledger's record: device and result.
        let rows = try await SQLiteLedger(path: ledger).records(LedgerQuery())
        for row in rows {
            let key = counts.keys[ResultDocument(record: row).attemptID]
            #expect(key?.device == row.device && key?.result == row.result.rawValue, "\(row.device)")
        }
    }

    @Test(.timeLimit(.minutes(3)))
    func aBodyIsTheLedgersRecordWithItsSchemaAndAttemptID() async throws {
        let scratch = try Scratch()
        let ledger = scratch.url.appendingPathComponent("l.sqlite").path
        let port = try freeLoopbackPort()
        let run = await otaflash(Self.batch(ledger, count: 1, ["--post-results", "http://127.0.0.1:\(port)/r", "--post-timeout", "1"]))
        #expect(run.code == 0, "\(run.stderr)")
        let outbox = ledger + ".results"
        let name = try #require(ResultsOutbox.names(in: outbox).first)
        let body = try #require(FileManager.default.contents(atPath: outbox + "/" + name))
        let object = try #require(try JSONSerialization.jsonObject(with: body) as? [String: Any])
        let row = try #require(try await SQLiteLedger(path: ledger).records(LedgerQuery()).first)
        #expect(object["schema"] as? Int == 1)
        #expect(object["attempt_id"] as? String == ResultDocument(record: row).attemptID)
        #expect(object["id"] as? Int == row.id.map(Int.init))
        #expect(object["device"] as? String == row.device && object["image_sha256"] as? String == row.imageSHA256)
        #expect(object["result"] as? String == "ok" && object["station"] as? String == "mes-1" && object["run_id"] as? String == row.runID)
        #expect(Set(object.keys) == Set(LedgerRecord.columns + ["schema", "attempt_id"]), "every column of the record, no other key")
        // docs/EVENTS.md's table names exactly these keys.
        let docs = try String(contentsOf: repositoryRoot.appendingPathComponent("docs/EVENTS.md"), encoding: .utf8)
        let section = try #require(docs.components(separatedBy: "## Results to a server").last)
        let documented = section.split(separator: "\n").filter { $0.hasPrefix("| `") }.flatMap { line in
            (line.split(separator: "|").first.map(String.init) ?? "").matches(of: /`([a-z0-9_]+)`/).map { String($0.1) }
        }
        #expect(Set(documented) == Set(object.keys) && documented.count == object.keys.count, "\(documented)")
    }

    @Test(.timeLimit(.minutes(3)))
    func aServerThatIsDownNeverFailsTheRunAndTheNextRunDeliversWhatItKept() async throws {
        let scratch = try Scratch()
        let ledger = scratch.url.appendingPathComponent("l.sqlite").path
        let down = "http://127.0.0.1:\(try freeLoopbackPort())/results"
        let first = await otaflash(Self.batch(ledger, count: 2, ["--post-results", down, "--post-timeout", "1"]))
        #expect(first.code == 0, "\(first.stderr)")
        #expect(first.stderr.contains("2 records not yet delivered to \(down) stay in \(ledger).results"), "\(first.stderr)")
        // A server that takes the connection and never answers: the same. (Another image: the books
        // show no device flashed twice with one.)
        let silent = try SilentListener()
        let hangs = "http://127.0.0.1:\(silent.port)/results"
        let second = await otaflash(Self.batch(ledger, count: 1, ["--post-results", hangs, "--post-timeout", "1"], image: "seeded-256k.bin"))
        #expect(second.code == 0, "\(second.stderr)")
        #expect(second.stderr.contains("3 records not yet delivered to \(hangs)"), "\(second.stderr)")
        #expect(ResultsOutbox.names(in: ledger + ".results").count == 3)

        let check = await otaflash(["ledger", "--ledger", ledger, "--check"])
        #expect(check.code == 0, "\(check.stdout)\(check.stderr)")
        #expect(check.stdout.contains("results outbox \(ledger).results: 3 records not yet delivered, the oldest C0:FF:EE:00:00:0"), "\(check.stdout)")
        let json = await otaflash(["ledger", "--ledger", ledger, "--check", "--format", "json"])
        let depth = try #require(json.jsonEvents.first { $0["results_outbox"] != nil })
        #expect(depth["pending"] as? Int == 3 && depth["oldest_attempt_id"] as? String != nil, "\(depth)")

        // The server is back (on another URL): the next run sends what the first kept, then its own.
        let mes = try MES(scratch)
        let third = await otaflash(Self.batch(ledger, count: 2, ["--post-results", mes.url, "--post-timeout", "20"], image: "seeded-256k.bin"))
        #expect(third.code == 0, "\(third.stderr)")
        let counts = try mes.counts()
        #expect(Set(counts.keys.keys) == (try await Self.attemptIDs(ledger)) && counts.stored == 5, "\(counts)")
        let after = await otaflash(["ledger", "--ledger", ledger, "--check"])
        #expect(after.stdout.contains("results outbox \(ledger).results: every record delivered"), "\(after.stdout)")
    }

    @Test(.timeLimit(.minutes(4)))
    func aStationKilledWithSIGKILLAndStartedAgainLosesNoRecordAndSendsNoneTwiceToTheServer() async throws {
        let binary = try #require(ExecutableTests.executable, "the otaflash executable is not built next to the tests")
        let scratch = try Scratch()
        let ledger = scratch.url.appendingPathComponent("l.sqlite").path
        let secret = try scratch.file("secret", "k")
        // Slow: records pile up in the outbox, some sent, some on their way, when the station is killed.
        let mes = try MES(scratch, schedule: "slow@3:600", secret: secret)
        func station(_ extra: [String] = []) -> [String] {
            ["station", "--simulator", "--sim-time", "real", "--json", "--ledger", ledger, "--station", "mes-k", "--sim-devices", "16",
             "--sim-arrivals", "36000", "--parallel", "2", "--claim-lease", "2", "--post-results", mes.url, "--post-secret", secret,
             "--post-timeout", "30"] + extra + [samplePath("seeded-4k.bin")]
        }
        let killed = try SpawnedProcess.spawn(["/usr/bin/env", "XDG_STATE_HOME=\(testStateHome)", binary.path] + station(),
                                              stderrPath: scratch.url.appendingPathComponent("stderr").path)
        defer { killed.stop() }
        var done = 0
        while done < 4, killed.waitForLine(timeoutMilliseconds: 60_000, { $0.contains(#""event":"done""#) }) != nil { done += 1 }
        #expect(done == 4, "four devices done before the kill")
        kill(killed.pid, SIGKILL)
        _ = killed.remainingLines(timeoutMilliseconds: 10_000)
        _ = killed.waitForExit()
        let kept = ResultsOutbox.names(in: ledger + ".results").count
        #expect(kept > 0, "the killed station left records for the server in its outbox")

        let again = await otaflash(station())
        #expect(again.code == 0, "\(again.stderr)")
        let counts = try mes.counts()
        let ids = try await Self.attemptIDs(ledger)
        #expect(Set(counts.keys.keys) == ids && counts.stored == ids.count, "every record once: \(counts.stored) stored, \(ids.count) in the ledger")
        #expect(counts.bad_signature == 0 && counts.bad_body == 0)
        #expect(ResultsOutbox.names(in: ledger + ".results").isEmpty)
    }

    @Test func badInputsAreOneLineAndExitTwoBeforeAnyRadioTime() async throws {
        let scratch = try Scratch()
        let ledger = scratch.url.appendingPathComponent("l.sqlite").path
        let empty = try scratch.file("empty", "")
        let newlineOnly = try scratch.file("nl", "\n")
        let missing = scratch.url.appendingPathComponent("nowhere").path
        let cases: [([String], [String])] = [
            (["--post-results", "ftp://mes.example/results"], ["--post-results ftp://mes.example/results", "http:// or https://"]),
            (["--post-results", "mes.example/results"], ["--post-results mes.example/results"]),
            (["--post-results", "http:///results"], ["no host"]),
            (["--post-results", "http://127.0.0.1:9/r", "--post-secret", missing], ["--post-secret \(missing)", "no such file"]),
            (["--post-results", "http://127.0.0.1:9/r", "--post-secret", empty], ["--post-secret \(empty)", "empty"]),
            (["--post-results", "http://127.0.0.1:9/r", "--post-secret", newlineOnly], ["empty"]),
            (["--post-secret", empty], ["--post-secret goes with --post-results"]),
            (["--post-results", "http://127.0.0.1:9/r", "--post-timeout", "0"], ["--post-timeout must be between 1 and 300"]),
        ]
        for (options, texts) in cases {
            let flash = await otaflash(Self.batch(ledger, count: 2, options))
            expectOneUsageLine(flash, saying: texts)
            #expect(!flash.stdout.contains(#""event":"transfer""#), "\(options): no radio time")
            let station = await otaflash(["station"] + simulator + ["--ledger", ledger, "--sim-devices", "2"] + options + [samplePath("seeded-4k.bin")])
            expectOneUsageLine(station, saying: texts)
        }
    }
}
