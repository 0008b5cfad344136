import Foundation
import Native
import OTA
import OTACommandLine
import OTAFlashCLI
import Testing

/// docs/EVENTS.md writes each set of values a key takes as "one of `a`, `b` or `c`"; each such
/// set is the code's, value for value and in its order.
@Suite("docs/EVENTS.md's enumerations")
struct EventEnumerationTests {
    /// "section/event.key" → the values documented, for every row that says "one of".
    static func documented(_ markdown: String) -> [String: [String]] {
        var found: [String: [String]] = [:]
        var section = ""
        var event = ""
        for line in markdown.split(separator: "\n").map(String.init) {
            if line.hasPrefix("## ") { section = String(line.dropFirst(3)) }
            if line.hasPrefix("### ") { event = line.dropFirst(4).trimmingCharacters(in: CharacterSet(charactersIn: "` ")) }
            guard line.hasPrefix("| `"), let start = line.range(of: "one of ") else { continue }
            let key = line.split(separator: "|").first?.trimmingCharacters(in: CharacterSet(charactersIn: "` ")) ?? ""
            found["\(section)/\(event).\(key)"] = values(line[start.upperBound...])
        }
        return found
    }

    /// The backticked values of a list that starts `text`: "`a`, `b` or `c`…", each value perhaps
    /// followed by what it means in parentheses.
    static func values(_ text: Substring) -> [String] {
        var rest = text
        var values: [String] = []
        while let match = rest.prefixMatch(of: /`([^`]+)`/) {
            values.append(String(match.output.1))
            rest = rest[match.range.upperBound...]
            if rest.hasPrefix(" ("), let close = rest.firstIndex(of: ")") { rest = rest[rest.index(after: close)...] }
            guard let separator = [", or ", ", ", " or "].first(where: { rest.hasPrefix($0) }) else { break }
            rest = rest.dropFirst(separator.count)
        }
        return values
    }

    @Test func aListIsReadValueByValue() {
        #expect(Self.values("`a`, `b-c` or `d` (`e`)") == ["a", "b-c", "d"])
        #expect(Self.values("`a`, `b`, or `c`; `d`") == ["a", "b", "c"])
        #expect(Self.values("`a` (the first), `b` (the `b`) or `c`, then `d`") == ["a", "b", "c"])
    }

    @Test func everyEnumerationTheDocsListIsTheCodes() throws {
        let text = try String(contentsOf: repositoryRoot.appendingPathComponent("docs/EVENTS.md"), encoding: .utf8)
        let protocols = ProtocolCommandLine.all.map(\.name)
        let expected: [String: [String]] = [
            "otaflash flash/start.protocol": protocols,
            "otaflash flash/device_info.protocol_name": protocols,
            "otaflash flash/device_info.state": DeviceSummary.State.allCases.map(\.rawValue),
            "otaflash flash/done.result": EventResult.allCases.map(\.rawValue),
            "otaflash scan/device.protocol": protocols,
            "otaflash info/info.ota_state": [DeviceState.idle, .receiving, .verified].map(\.description),
            "otaflash simulate/serving.protocol": protocols,
        ]
        let documented = Self.documented(text)
        #expect(Set(documented.keys) == Set(expected.keys), "documented: \(documented.keys.sorted())")
        for (key, values) in expected.sorted(by: { $0.key < $1.key }) {
            #expect(documented[key] == values, "docs/EVENTS.md's \(key)")
        }
    }
}
