import Foundation
import OTA
import OTACommandLine
import OTAFlashCLI
import Testing
@_exported import TestSupport

/// The repository root, three levels above this file (Tests/CLITestSupport/<file>).
package let repositoryRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()

/// A committed sample's path (firmware-samples/NAME): `Samples.path`, as the command tests name it.
package func samplePath(_ name: String) -> String { Samples.path(name) }

/// What one in-process run of `otaflash` printed and returned.
package struct Run {
    package let code: Int32
    package let stdout: String
    package let stderr: String

    package var stdoutLines: [String] { stdout.split(separator: "\n", omittingEmptySubsequences: true).map(String.init) }
    package var errorLines: [String] { stderr.split(separator: "\n").map(String.init).filter { $0.hasPrefix("otaflash: error:") } }

    /// Each stdout line parsed as a JSON object; a line that is not one is recorded as an issue.
    package var jsonEvents: [[String: Any]] {
        stdoutLines.compactMap { line in
            let object = (try? JSONSerialization.jsonObject(with: Data(line.utf8))) as? [String: Any]
            if object == nil { Issue.record("not a JSON object: \(line)") }
            return object
        }
    }
}

/// A run refused its arguments: exit 2 and one error line containing each of `texts`.
package func expectOneUsageLine(_ run: Run, saying texts: [String], sourceLocation: SourceLocation = #_sourceLocation) {
    #expect(run.code == 2, "\(run.stderr)", sourceLocation: sourceLocation)
    #expect(run.errorLines.count == 1, "\(run.stderr)", sourceLocation: sourceLocation)
    for text in texts {
        #expect(run.errorLines.first?.contains(text) == true, "\(run.stderr) does not say \(text)", sourceLocation: sourceLocation)
    }
}

/// The simulator on virtual time: a whole update finishes at CPU speed.
package let simulator = ["--simulator", "--sim-time", "virtual"]

/// The tests' own state folder: a run that reaches a real device's default ledger (or journal)
/// writes there, never into the machine's `~/.local/state`. Set once, before the first run.
package let testStateHome: String = {
    let path = NSTemporaryDirectory() + "otaflash-cli-tests-state-\(getpid())"
    setenv("XDG_STATE_HOME", path, 1)
    return path
}()

package func otaflash(_ arguments: [String]) async -> Run {
    _ = testStateHome
    let output = CapturedOutput()
    let code = await runOtaflash(arguments, output: output)
    return Run(code: code, stdout: output.stdout, stderr: output.stderr)
}

/// A scratch directory removed when the value goes away.
package final class Scratch {
    package let url: URL

    package init() throws {
        url = FileManager.default.temporaryDirectory.appendingPathComponent("otaflash-cli-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
    }

    deinit { try? FileManager.default.removeItem(at: url) }

    package func file(_ name: String, _ contents: String) throws -> String {
        let path = url.appendingPathComponent(name).path
        try Data(contents.utf8).write(to: URL(fileURLWithPath: path))
        return path
    }
}

/// docs/EVENTS.md's tables, read the way a script author reads them: per section (command) and
/// event, the keys in order with their types.
package struct EventDocs {
    package struct Key: Equatable, CustomStringConvertible {
        package let name: String
        package let type: String
        package var description: String { "\(name): \(type)" }

        package init(name: String, type: String) {
            self.name = name
            self.type = type
        }
    }

    /// section → event → keys.
    package let sections: [String: [String: [Key]]]

    package static let shared: EventDocs = {
        let path = repositoryRoot.appendingPathComponent("docs/EVENTS.md").path
        let text = (try? String(contentsOfFile: path, encoding: .utf8)) ?? ""
        return EventDocs(text)
    }()

    package init(_ markdown: String) {
        var sections: [String: [String: [Key]]] = [:]
        var section = ""
        var event: String?
        for line in markdown.split(separator: "\n").map(String.init) {
            if line.hasPrefix("## ") {
                section = String(line.dropFirst(3))
                event = nil
            } else if line.hasPrefix("### ") {
                event = line.dropFirst(4).trimmingCharacters(in: CharacterSet(charactersIn: "` "))
                sections[section, default: [:]][event!] = []
            } else if let current = event, line.hasPrefix("| `") {
                let cells = line.split(separator: "|").map { $0.trimmingCharacters(in: .whitespaces) }
                guard cells.count >= 3 else { continue }
                let name = cells[0].trimmingCharacters(in: CharacterSet(charactersIn: "`"))
                sections[section]![current]!.append(Key(name: name, type: cells[1]))
            }
        }
        self.sections = sections
    }

    /// The documented keys of `event` in `section`, or of the events every command may print.
    package func keys(_ section: String, _ event: String) -> [Key]? {
        sections[section]?[event] ?? sections["any command"]?[event]
    }
}

/// A JSON value as a line carries it, types kept apart (a boolean is not a number).
package enum LineValue: Decodable, Equatable {
    case null, bool(Bool), int(Int), double(Double), string(String), array([LineValue]), object([String: LineValue])

    package init(from decoder: any Decoder) throws {
        let c = try decoder.singleValueContainer()
        if c.decodeNil() { self = .null }
        else if let b = try? c.decode(Bool.self) { self = .bool(b) }
        else if let i = try? c.decode(Int.self) { self = .int(i) }
        else if let d = try? c.decode(Double.self) { self = .double(d) }
        else if let s = try? c.decode(String.self) { self = .string(s) }
        else if let a = try? c.decode([LineValue].self) { self = .array(a) }
        else { self = .object(try c.decode([String: LineValue].self)) }
    }

    package init(_ json: JSON) {
        switch json {
        case .null: self = .null
        case .bool(let b): self = .bool(b)
        case .int(let i): self = .int(i)
        case .double(let d): self = .double(d)
        case .string(let s): self = .string(s)
        case .array(let items): self = .array(items.map(LineValue.init))
        case .object(let fields): self = .object(Dictionary(fields.map { ($0.0, LineValue($0.1)) }, uniquingKeysWith: { a, _ in a }))
        }
    }

    /// Whether the value has the documented type (`integer`, `string or null`, `array of strings`…).
    package func matches(_ type: String) -> Bool {
        if type.hasSuffix(" or null") { return self == .null || matches(String(type.dropLast(" or null".count))) }
        switch (type, self) {
        case ("string", .string), ("integer", .int), ("number", .int), ("number", .double), ("boolean", .bool): return true
        case ("array of strings", .array(let items)):
            return items.allSatisfy { if case .string = $0 { true } else { false } }
        default: return false
        }
    }

    package var string: String? { if case .string(let s) = self { s } else { nil } }
    package var int: Int? { if case .int(let i) = self { i } else { nil } }
}

/// Checks every stdout line of a run against the docs: `"event"` first, exactly the documented
/// keys, each of its documented type. Returns the lines, parsed.
@discardableResult
package func expectDocumentedLines(_ lines: [String], section: String, sourceLocation: SourceLocation = #_sourceLocation) -> [[String: LineValue]] {
    lines.compactMap { line -> [String: LineValue]? in
        guard line.hasPrefix(#"{"event":""#),
              let object = try? JSONDecoder().decode([String: LineValue].self, from: Data(line.utf8)),
              let name = object["event"]?.string else {
            Issue.record("not an event line: \(line)", sourceLocation: sourceLocation)
            return nil
        }
        guard let documented = EventDocs.shared.keys(section, name) else {
            Issue.record("event \(name) is not documented under \(section) in docs/EVENTS.md", sourceLocation: sourceLocation)
            return object
        }
        #expect(Set(object.keys) == Set(documented.map(\.name)), "\(name): \(line)", sourceLocation: sourceLocation)
        for key in documented {
            if let value = object[key.name], !value.matches(key.type) {
                Issue.record("\(name).\(key.name) is \(value), documented as \(key.type)", sourceLocation: sourceLocation)
            }
        }
        return object
    }
}

/// Session events of one device, in order, never a progress before its connection's transfer.
package func expectNoProgressBeforeTransfer(_ events: [[String: LineValue]], sourceLocation: SourceLocation = #_sourceLocation) {
    var transferring: [String: Bool] = [:]
    for event in events {
        guard let device = event["device"]?.string else { continue }
        switch event["event"]?.string {
        case "connecting": transferring[device] = false
        case "transfer": transferring[device] = true
        case "progress":
            #expect(transferring[device] == true, "progress before transfer for \(device)", sourceLocation: sourceLocation)
        default: break
        }
    }
}

/// A value an option refuses, and what its one error line must say.
package struct BadValue: Sendable, CustomTestStringConvertible {
    package let arguments: [String]
    /// Text the error line must contain: the option, and its range.
    package let says: [String]
    package var testDescription: String { arguments.joined(separator: " ") }

    package init(arguments: [String], says: [String]) {
        self.arguments = arguments
        self.says = says
    }
}
