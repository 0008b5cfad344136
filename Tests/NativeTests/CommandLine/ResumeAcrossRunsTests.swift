import Foundation
import Testing

/// "Run the same command again to resume", on the simulator with --sim-state.
@Suite("otaflash resume across runs")
struct ResumeAcrossRunsTests {
    /// A simulated device kept in `scratch` between runs, with a journal beside it.
    struct Runs {
        let scratch: Scratch
        var journal: String { scratch.url.appendingPathComponent("journal").path }
        var common: [String] {
            simulator + ["--json", "--sim-state", scratch.url.appendingPathComponent("device").path, "--journal-dir", journal,
                         "--reconnect-window", "0", "--checkpoint-interval", "8192"]
        }

        init() throws { scratch = try Scratch() }

        /// The first run: the link drops at 100000 bytes (exit 6).
        func interrupted() async -> Run {
            let first = await otaflash(common + ["--sim-disconnect-at", "100000", samplePath("seeded-256k.bin")])
            #expect(first.code == 6, "\(first.stderr)")
            return first
        }
    }

    @Test func secondRunResumesWhereTheFirstLostTheLink() async throws {
        let runs = try Runs()
        let common = runs.common
        let first = await runs.interrupted()
        #expect(first.errorLines.count == 1)
        #expect(first.jsonEvents.last?["result"] as? String == "error")

        let second = await otaflash(common + [samplePath("seeded-256k.bin")])
        #expect(second.code == 0, "\(second.stderr)")
        let events = second.jsonEvents
        let transfer = try #require(events.first { $0["event"] as? String == "transfer" })
        let resumed = try #require(transfer["resume_offset"] as? Int)
        #expect(resumed > 0 && resumed <= 100_000)
        let done = try #require(events.last)
        #expect(done["crc32"] as? String == "cf1fc040")
        #expect((done["bytes_sent"] as? Int ?? .max) < 262_144)
    }

    /// The first run leaves a journal; `--restart` removes it, sends the whole image again,
    /// and a successful run leaves no journal behind.
    @Test func restartSendsTheWholeImageAndClearsTheJournal() async throws {
        let runs = try Runs()
        let journal = runs.journal
        _ = await runs.interrupted()
        let journals = try FileManager.default.contentsOfDirectory(atPath: journal)
        #expect(journals == ["C0FFEE000001-262144-cf1fc040.json"])

        let second = await otaflash(runs.common + ["--restart", samplePath("seeded-256k.bin")])
        #expect(second.code == 0, "\(second.stderr)")
        let transfer = try #require(second.jsonEvents.first { $0["event"] as? String == "transfer" })
        #expect(transfer["resume_offset"] as? Int == 0)
        #expect(second.jsonEvents.last?["bytes_sent"] as? Int == 262_144)
        #expect(try FileManager.default.contentsOfDirectory(atPath: journal).isEmpty)
    }
}
