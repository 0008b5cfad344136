import Foundation
import Ledger

/// The records as JUnit XML, the test report CI systems read (Jenkins, GitLab, Azure DevOps):
/// one `testsuite` per station, one `testcase` per device attempt, a `failure` with the error
/// code and the full reason for each attempt that did not succeed.
///
/// Valid against the common schema (the Ant formatter's, as windyroad's JUnit.xsd writes it down):
/// each `testsuite` has `name`, `package`, `id`, `timestamp` (no zone), `hostname`, `tests`,
/// `failures`, `errors`, `time`, then `properties`, its test cases, `system-out` and `system-err`;
/// each `testcase` has `name`, `classname` and `time`; a `failure` has `type` and `message`.
public enum JUnitReport {
    public static func xml(_ records: [LedgerRecord]) -> String {
        let attempts = records.filter { !$0.isEncounter }
        let byStation = Dictionary(grouping: attempts, by: \.station)
        var s = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites>\n"
        for (id, station) in byStation.keys.sorted().enumerated() {
            let rows = byStation[station]!.sorted { a, b in a.startedAt != b.startedAt ? a.startedAt < b.startedAt : (a.id ?? 0) < (b.id ?? 0) }
            let failures = rows.filter { !$0.result.succeeded }.count
            let time = rows.reduce(0) { $0 + $1.seconds }
            // xs:dateTime without a zone or fraction (the schema's pattern); the ledger's times are UTC.
            let timestamp = String((rows.first?.startedAt ?? "1970-01-01T00:00:00").prefix(19))
            s += "  <testsuite name=\"\(attribute(station))\" package=\"otaflash\" id=\"\(id)\" timestamp=\"\(timestamp)\" "
                + "hostname=\"\(attribute(station))\" tests=\"\(rows.count)\" failures=\"\(failures)\" errors=\"0\" time=\"\(seconds(time))\">\n"
            s += "    <properties>\n"
            for image in Set(rows.map { "\($0.imageName) \($0.imageSHA256)" }).sorted() {
                s += "      <property name=\"image\" value=\"\(attribute(image))\"/>\n"
            }
            s += "    </properties>\n"
            for r in rows {
                let name = "\(r.device) attempt \(r.attempts)" + (r.serialNumber.map { " (\($0))" } ?? "")
                let classname = "otaflash.\(r.protocolName).\(r.imageName)"
                s += "    <testcase name=\"\(attribute(name))\" classname=\"\(attribute(classname))\" time=\"\(seconds(r.seconds))\""
                if r.result.succeeded {
                    s += "/>\n"
                } else {
                    let code = r.errorCode ?? r.result.rawValue
                    let message = r.message ?? code
                    s += ">\n      <failure type=\"\(attribute(code))\" message=\"\(attribute(message))\">"
                        + LineHTML.escape("\(code) (exit \(r.exitCode)) at \(r.startedAt) on \(r.station)\(r.adapter.map { ", adapter \($0)" } ?? ""): \(message)")
                        + "</failure>\n    </testcase>\n"
                }
            }
            s += "    <system-out/>\n    <system-err/>\n  </testsuite>\n"
        }
        return s + "</testsuites>\n"
    }

    /// An attribute value: escaped, newlines as character references so they survive
    /// attribute-value normalisation.
    static func attribute(_ text: String) -> String {
        LineHTML.escape(text).replacingOccurrences(of: "\n", with: "&#10;").replacingOccurrences(of: "\t", with: "&#9;")
    }

    static func seconds(_ x: Double) -> String { String(format: "%.3f", x.isFinite ? max(0, x) : 0) }
}
