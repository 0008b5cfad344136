import Foundation
import OTA
import OTACommandLine
import OTAFlashCLI
import Testing

@Suite("JSON event schema")
struct EventSchemaTests {
    let docs = EventDocs.shared

    @Test func theDocsDocumentEveryEventOfEveryCommand() {
        #expect(Set(docs.sections.keys) == ["otaflash flash", "otaflash scan", "otaflash info", "otaflash pair and unpair", "otaflash simulate", "otaflash image", "otaflash files", "otaflash station", "any command"])
        let documented = docs.sections.flatMap { section, events in events.keys.map { "\(section)/\($0)" } }
        let coded = EventCatalog.examples.map { "\($0.section)/\(type(of: $0.event).name)" }
        #expect(Set(documented) == Set(coded))
        #expect(coded.count == Set(coded).count, "one example per event")
        // Every table starts with the event key, and no key is listed twice.
        for (section, events) in docs.sections {
            for (event, keys) in events {
                #expect(keys.first == EventDocs.Key(name: "event", type: "string"), "\(section)/\(event)")
                #expect(keys.count == Set(keys.map(\.name)).count, "\(section)/\(event)")
            }
        }
    }

    /// The types are the schema: each encodes exactly the documented keys, in the documented order,
    /// with the documented types, nil optionals included as null.
    @Test func everyEventTypeEncodesTheDocumentedKeysInOrder() throws {
        for (section, event) in EventCatalog.examples {
            let name = type(of: event).name
            guard case .object(let fields) = event.json else {
                Issue.record("\(name) does not encode to an object")
                continue
            }
            let documented = try #require(docs.keys(section, name), "\(section)/\(name)")
            #expect(fields.map(\.0) == documented.map(\.name), "\(section)/\(name)")
            for ((key, value), doc) in zip(fields, documented) {
                #expect(LineValue(value).matches(doc.type), "\(section)/\(name).\(key): \(value.text) is not \(doc.type)")
            }
            // The line is what a JSON parser reads back.
            #expect((try? JSONDecoder().decode([String: LineValue].self, from: Data(event.line.utf8)))?.count == fields.count)
        }
    }

    @Test func aSingleDeviceRunPrintsOnlyDocumentedEvents() async {
        let run = await otaflash(simulator + ["--json", samplePath("seeded-256k.bin")])
        #expect(run.code == 0)
        let events = expectDocumentedLines(run.stdoutLines, section: "otaflash flash")
        let names = events.compactMap { $0["event"]?.string }
        #expect(names.first == "start")
        #expect(names.last == "done")
        #expect(Set(names).isSuperset(of: ["start", "connecting", "device_info", "connected", "transfer", "progress", "verify", "activate", "done"]))
        expectNoProgressBeforeTransfer(events)
        let done = events.last
        #expect(done?["result"] == .string("ok"))
        #expect(done?["exit_code"] == .int(0))
        #expect(done?["attempts"] == .int(1))
        #expect(done?["firmware_before"] == .string("1.0.0"))
    }

    /// A batch prints the same `done` as a single device, with the error's exit code on a failed
    /// one, and the per-device logs hold the same lines.
    @Test func aBatchWithAFailingDevicePrintsOnlyDocumentedEvents() async throws {
        let scratch = try Scratch()
        let logs = scratch.url.appendingPathComponent("logs").path
        let run = await otaflash(simulator + ["--count", "3", "--json", "--retries", "0", "--reconnect-window", "0",
                                              "--sim-device-fault", "2:gone", "--log-dir", logs, samplePath("seeded-256k.bin")])
        #expect(run.code == 14)
        let events = expectDocumentedLines(run.stdoutLines, section: "otaflash flash")
        #expect(events.first?["event"] == .string("start"))
        #expect(events.first?["device"] == .null)
        #expect(events.dropFirst().first?["event"] == .string("batch"))
        #expect(events.last?["event"] == .string("summary"))
        #expect(events.last?["exit_code"] == .int(14))
        expectNoProgressBeforeTransfer(events)
        let done = Dictionary(events.filter { $0["event"] == .string("done") }.map { ($0["device"]?.string ?? "", $0) },
                              uniquingKeysWith: { a, _ in a })
        #expect(done.count == 3)
        let failed = try #require(done["C0:FF:EE:00:00:02"])
        #expect(failed["result"] == .string("error"))
        #expect(failed["exit_code"] == .int(6))
        #expect(failed["error"] == .string("connection"))
        #expect(failed["message"]?.string?.isEmpty == false)
        #expect(done["C0:FF:EE:00:00:01"]?["mtu"] == .int(247))
        #expect(done["C0:FF:EE:00:00:03"]?["checkpoints"]?.int ?? 0 > 0)
        for device in ["C0FFEE000001", "C0FFEE000002", "C0FFEE000003"] {
            let log = try String(contentsOfFile: logs + "/\(device).jsonl", encoding: .utf8)
            let lines = log.split(separator: "\n").map(String.init)
            let logged = expectDocumentedLines(lines, section: "otaflash flash")
            #expect(logged.last?["event"] == .string("done"), "\(device)")
            expectNoProgressBeforeTransfer(logged)
        }
    }

    @Test(arguments: [
        (["--sim-flash-bitflip-at", "10", samplePath("seeded-4k.bin")], 8, "verify_failed", false),
        ([samplePath("no-such-image.bin")], 3, "image_file", true),
    ])
    func aFailedSingleDeviceRunEndsWithADocumentedDone(arguments: [String], code: Int, error: String, beforeSession: Bool) async {
        let run = await otaflash(simulator + ["--json"] + arguments)
        #expect(run.code == Int32(code))
        let events = expectDocumentedLines(run.stdoutLines, section: "otaflash flash")
        let done = events.last
        #expect(done?["event"] == .string("done"))
        #expect(done?["result"] == .string("error"))
        #expect(done?["exit_code"] == .int(code))
        #expect(done?["error"] == .string(error))
        #expect(done?["device"] == .string("C0:FF:EE:00:00:01"))
        #expect((done?["attempts"] == .null) == beforeSession)
        #expect(run.errorLines.count == 1)
    }

    @Test func aSkippedSingleDeviceEndsWithADoneSkipped() async {
        let run = await otaflash(simulator + ["--json", "--skip-if-version", "1.0.0", samplePath("seeded-4k.bin")])
        #expect(run.code == 0)
        let events = expectDocumentedLines(run.stdoutLines, section: "otaflash flash")
        #expect(!events.contains { $0["event"] == .string("transfer") })
        #expect(events.last?["result"] == .string("skipped"))
        #expect(events.last?["firmware_after"] == .string("1.0.0"))
    }

    /// With --json among the arguments, a rejected command line still answers in JSON: one
    /// `error` line on stdout, then the usual line on stderr.
    @Test(arguments: [
        ["--json", "--bogus", "x.bin"],
        simulator + ["--json", "--quiet", "x.bin"],
        simulator + ["--json", "--checkpoint-interval", "12", "x.bin"],
        ["scan", "--json", "--timeout", "0"],
        ["simulate", "--json", "--slot-size", "0"],
    ])
    func aUsageErrorUnderJSONPrintsOneErrorEvent(arguments: [String]) async {
        let run = await otaflash(arguments)
        #expect(run.code == 2)
        let events = expectDocumentedLines(run.stdoutLines, section: "any command")
        #expect(events.count == 1)
        #expect(events.first?["event"] == .string("error"))
        #expect(events.first?["exit_code"] == .int(2))
        #expect(events.first?["error"] == .string("usage"))
        let message = events.first?["message"]?.string ?? ""
        #expect(!message.isEmpty && run.stderr.hasPrefix("otaflash: error: \(message)\n"))
    }

    @Test func aUsageErrorWithoutJSONPrintsNothingOnStdout() async {
        let run = await otaflash(["--bogus", "x.bin"])
        #expect(run.code == 2)
        #expect(run.stdout.isEmpty)
    }

    @Test func scanAndInfoPrintOnlyDocumentedEvents() async {
        let scan = await otaflash(["scan", "--simulator", "--json", "--timeout", "0.5"])
        #expect(scan.code == 0)
        let found = expectDocumentedLines(scan.stdoutLines, section: "otaflash scan")
        #expect(found.map { $0["event"]?.string } == ["device", "done"])
        #expect(found.last?["count"] == .int(1))

        let info = await otaflash(["info", "--simulator", "--json"])
        #expect(info.code == 0)
        let read = expectDocumentedLines(info.stdoutLines, section: "otaflash info")
        #expect(read.map { $0["event"]?.string } == ["info", "done"])
        #expect(read.first?["ota_state"] == .string("idle"))
    }

    /// A device that advertises no service UUID (mcumgr's Mynewt smp_svr sample): `--ota-only`
    /// leaves it out and counts it; `--probe` connects, finds the service and lists it.
    @Test func scanCountsWhatItCannotClassifyAndProbeClassifiesIt() async {
        let hidden = ["scan", "--simulator", "--sim-advertise-no-uuid", "--json", "--timeout", "0.2", "--ota-only"]
        let counted = await otaflash(hidden)
        #expect(counted.code == 0, "\(counted.stderr)")
        let left = expectDocumentedLines(counted.stdoutLines, section: "otaflash scan")
        #expect(left.map { $0["event"]?.string } == ["done"])
        #expect(left.last?["count"] == .int(0))
        #expect(left.last?["unclassified"] == .int(1))
        let human = await otaflash(hidden.filter { $0 != "--json" })
        #expect(human.code == 0 && human.stdout.isEmpty, "\(human.stdout)")
        #expect(human.stderr.contains("1 device left out") && human.stderr.contains("--probe"), "\(human.stderr)")

        let probed = await otaflash(hidden + ["--probe", "--probe-timeout", "5"])
        #expect(probed.code == 0, "\(probed.stderr)")
        let found = expectDocumentedLines(probed.stdoutLines, section: "otaflash scan")
        #expect(found.map { $0["event"]?.string } == ["device", "done"])
        #expect(found.first?["protocol"] == .string("native"))
        #expect(found.first?["probed"] == .bool(true))
        #expect(found.last?["unclassified"] == .null)

        // Without --ota-only the device is listed, with no protocol, and nothing is counted.
        let all = await otaflash(["scan", "--simulator", "--sim-advertise-no-uuid", "--json", "--timeout", "0.2"])
        let listed = expectDocumentedLines(all.stdoutLines, section: "otaflash scan")
        #expect(listed.first?["protocol"] == .null)
        #expect(listed.first?["ota"] == .bool(false))
        #expect(listed.last?["unclassified"] == .null)
    }

    @Test func infoOnADeviceWithoutTheOTAServiceHasNullOTAKeys() async {
        let info = await otaflash(["info", "--simulator", "--sim-no-ota-service", "--json"])
        #expect(info.code == 0, "\(info.stderr)")
        let read = expectDocumentedLines(info.stdoutLines, section: "otaflash info")
        #expect(read.first?["ota_protocol"] == .null)
        #expect(read.first?["manufacturer"]?.string != nil)
    }
}

@Suite("OTAError codes")
struct OTAErrorCodeTests {
    /// One exit code per error code, and only the internal error maps to the internal error's code.
    @Test func everyCodeHasItsOwnExitCode() {
        let exits = OTAError.Code.allCases.map(ExitCode.init)
        #expect(Set(exits).count == OTAError.Code.allCases.count)
        for code in OTAError.Code.allCases where code != .internalError {
            #expect(ExitCode(code) != .internalError, "\(code)")
        }
        #expect(ExitCode(.internalError) == .internalError)
        #expect(ExitCode(.interrupted).rawValue == 130)
    }

    @Test func codesCompareByValueAndPrintTheirName() {
        #expect(OTAError.Code.verifyFailed == .verifyFailed)
        #expect(OTAError.Code.verifyFailed != .timeout)
        #expect(OTAError.Code.verifyFailed.description == "verifyFailed")
        #expect(OTAError.Code.allCases.count == Set(OTAError.Code.allCases).count)
    }

    @Test func theCauseTravelsWithTheErrorButNotIntoItsLine() {
        struct Errno: Error, CustomStringConvertible { var description: String { "ENOSPC" } }
        let error = OTAError(.connection, "link lost", hint: "run again", resumable: true, cause: Errno())
        #expect(error.description == "link lost; run again")
        #expect(error.cause is Errno)
        #expect(error != OTAError(.connection, "link lost", hint: "run again", resumable: true))
        #expect(CLIFailure(error).code == .connection)
    }
}
