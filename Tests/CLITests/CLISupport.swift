import Foundation
import OTAFlashCLI
import Testing

/// The repository root, three levels above this file (Tests/CLITests/<file>).
let repositoryRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()

func samplePath(_ name: String) -> String {
    repositoryRoot.appendingPathComponent("firmware-samples").appendingPathComponent(name).path
}

struct SampleEntry: Decodable, Sendable, CustomTestStringConvertible {
    let file: String
    let size: Int
    let crc32: String
    var testDescription: String { file }
}

/// The entries of firmware-samples/manifest.json; empty (and the tests using them fail) when unreadable.
let manifestEntries: [SampleEntry] = {
    struct Manifest: Decodable { let files: [SampleEntry] }
    guard let data = FileManager.default.contents(atPath: samplePath("manifest.json")),
          let manifest = try? JSONDecoder().decode(Manifest.self, from: data) else { return [] }
    return manifest.files
}()

/// What one in-process run of `otaflash` printed and returned.
struct Run {
    let code: Int32
    let stdout: String
    let stderr: String

    var stdoutLines: [String] { stdout.split(separator: "\n", omittingEmptySubsequences: true).map(String.init) }
    var errorLines: [String] { stderr.split(separator: "\n").map(String.init).filter { $0.hasPrefix("otaflash: error:") } }

    /// Each stdout line parsed as a JSON object; a line that is not one is recorded as an issue.
    var jsonEvents: [[String: Any]] {
        stdoutLines.compactMap { line in
            let object = (try? JSONSerialization.jsonObject(with: Data(line.utf8))) as? [String: Any]
            if object == nil { Issue.record("not a JSON object: \(line)") }
            return object
        }
    }
}

/// A run refused its arguments: exit 2 and one error line containing each of `texts`.
func expectOneUsageLine(_ run: Run, saying texts: [String], sourceLocation: SourceLocation = #_sourceLocation) {
    #expect(run.code == 2, "\(run.stderr)", sourceLocation: sourceLocation)
    #expect(run.errorLines.count == 1, "\(run.stderr)", sourceLocation: sourceLocation)
    for text in texts {
        #expect(run.errorLines.first?.contains(text) == true, "\(run.stderr) does not say \(text)", sourceLocation: sourceLocation)
    }
}

/// The simulator on virtual time: a whole update finishes at CPU speed.
let simulator = ["--simulator", "--sim-time", "virtual"]

/// The tests' own state folder: a run that reaches a real device's default ledger (or journal)
/// writes there, never into the machine's `~/.local/state`. Set once, before the first run.
let testStateHome: String = {
    let path = NSTemporaryDirectory() + "otaflash-cli-tests-state-\(getpid())"
    setenv("XDG_STATE_HOME", path, 1)
    return path
}()

func otaflash(_ arguments: [String]) async -> Run {
    _ = testStateHome
    let output = CapturedOutput()
    let code = await runOtaflash(arguments, output: output)
    return Run(code: code, stdout: output.stdout, stderr: output.stderr)
}

/// A scratch directory removed when the value goes away.
final class Scratch {
    let url: URL

    init() throws {
        url = FileManager.default.temporaryDirectory.appendingPathComponent("otaflash-cli-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
    }

    deinit { try? FileManager.default.removeItem(at: url) }

    func file(_ name: String, _ contents: String) throws -> String {
        let path = url.appendingPathComponent(name).path
        try Data(contents.utf8).write(to: URL(fileURLWithPath: path))
        return path
    }
}
