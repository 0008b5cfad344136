import Foundation
#if canImport(FoundationXML)
import FoundationXML
#endif
import Ledger
@testable import LineView
import Testing

/// The line's model from records: the counts (the summary's rules), the plots' series, the page
/// with nothing external, and JUnit XML as the common schema wants it.
@Suite("Line view")
struct LineModelTests {
    static func record(_ device: String, at minute: Int, seconds: Double = 30, result: LedgerResult = .ok, error: String? = nil,
                       station: String = "st-1", attempt: Int = 1, message: String? = nil, image: String = "aa") -> LedgerRecord {
        let start = 1_795_000_000.0 + Double(minute) * 60
        return LedgerRecord(runID: "run", startedAt: LedgerRecord.timestamp(Date(timeIntervalSince1970: start)),
                            endedAt: LedgerRecord.timestamp(Date(timeIntervalSince1970: start + seconds)), station: station,
                            device: device, serialNumber: "SN-" + device.suffix(2), protocolName: "native", imageName: "app.bin",
                            imageSize: 4096, imageSHA256: image, bytesSent: 4096, seconds: seconds, rate: 4096 / seconds, attempts: attempt,
                            result: result, exitCode: result == .ok ? 0 : 10, errorCode: error,
                            message: message ?? (result == .ok ? nil : "\(device): gone"), otaflashVersion: "0.1.0", otaflashCommit: "abc")
    }

    /// 6 devices over 25 minutes on two stations: one flaky (fails, then ok), one failing twice
    /// (quarantined with one retry), one skipped, three ok.
    static let shift: [LedgerRecord] = [
        record("AA:00:00:00:00:01", at: 0, seconds: 20),
        record("AA:00:00:00:00:02", at: 2, seconds: 40, station: "st-2"),
        record("AA:00:00:00:00:03", at: 4, result: .error, error: "connection", attempt: 1),
        record("AA:00:00:00:00:03", at: 6, seconds: 30, attempt: 2),
        record("AA:00:00:00:00:04", at: 8, result: .error, error: "gone", station: "st-2"),
        record("AA:00:00:00:00:04", at: 14, result: .error, error: "gone", station: "st-2", attempt: 2,
               message: "line one <b>\nline two & \"three\""),
        record("AA:00:00:00:00:05", at: 20, seconds: 0, result: .skipped),
        record("AA:00:00:00:00:06", at: 24, seconds: 60, station: "st-2"),
    ]

    @Test func theCountsFollowTheSummaryAndTheStationsRules() {
        let model = LineModel(records: Self.shift.shuffled())
        let summary = LedgerSummary(Self.shift)
        let c = model.counts
        #expect(c.attempts == 8 && c.devices == 6)
        #expect(c.done == 5, "ok or skipped")
        #expect(c.failedAttempts == 3)
        #expect(c.quarantined == 1, "two failures with --retries 1")
        #expect(LineModel(records: Self.shift, retries: 2).counts.quarantined == 0)
        #expect(c.firstPassYield == summary.firstPassYield && c.finalYield == summary.finalYield)
        #expect(c.medianSeconds == summary.medianSeconds && c.p95Seconds == summary.p95Seconds)
        // From the first start (minute 0) to the last end (minute 24 + 60 s): 25 minutes.
        #expect(abs(c.hours - 25.0 / 60) < 1e-9)
        #expect(abs(c.devicesPerHour - 5 / (25.0 / 60)) < 1e-9)
        #expect(model.stations.map(\.name) == ["st-1", "st-2"])
        #expect(model.stations.map(\.failed) == [1, 2] && model.stations.allSatisfy { $0.alive == nil })
        #expect(model.failures.map(\.device) == ["AA:00:00:00:00:04", "AA:00:00:00:00:04", "AA:00:00:00:00:03"], "newest first")
    }

    @Test func aLiveStationKeepsItsHeartbeatAndGetsItsCounts() {
        let model = LineModel(records: Self.shift, stations: [.init(name: "st-2", alive: false, lastBeatSeconds: 31), .init(name: "st-3", alive: true)])
        #expect(model.stations.map(\.name) == ["st-1", "st-2", "st-3"])
        #expect(model.stations[1].alive == false && model.stations[1].attempts == 4 && model.stations[2].attempts == 0)
    }

    @Test func everyPlotIsDrawnOnceWithItsSeries() throws {
        let model = LineModel(records: Self.shift)
        #expect(model.plots.map(\.kind) == LineModel.PlotKind.allCases)
        let throughput = try #require(model.plots.first { $0.kind == .throughput }).svg
        // Two stations, one polyline each; 25 minutes from a 10-minute boundary: 3 or 4 bins.
        #expect(throughput.components(separatedBy: "<polyline").count - 1 == 2)
        #expect(model.plots.first { $0.kind == .throughput }?.title.contains("10 minutes") == true)
        let durations = try #require(model.plots.first { $0.kind == .durations }).svg
        #expect(durations.contains("median 30.0 s") && durations.contains("p95 60.0 s"), "\(durations)")
        let failures = try #require(model.plots.first { $0.kind == .failures }).svg
        #expect(failures.contains(">gone<") && failures.contains(">connection<"))
        #expect(failures.components(separatedBy: "class=\"bar\"").count - 1 >= 2)
        let yield = try #require(model.plots.first { $0.kind == .yield }).svg
        #expect(yield.contains("first-pass yield") && yield.contains("final yield"))
    }

    @Test func theYieldSeriesEndsAtTheSummarysYield() throws {
        let model = LineModel(records: Self.shift)
        let yield = try #require(model.plots.first { $0.kind == .yield }).svg
        // The last point of each polyline is the shift's yield: y = bottom - share × plot height.
        let lines = yield.components(separatedBy: "points=\"").dropFirst().map { $0.prefix { $0 != "\"" } }
        #expect(lines.count == 2)
        for (line, share) in zip(lines, [model.counts.firstPassYield, model.counts.finalYield]) {
            let last = try #require(line.split(separator: " ").last?.split(separator: ",").last)
            let y = try #require(Double(last))
            let expected = SVGChart.height - SVGChart.bottom - share * (SVGChart.height - SVGChart.top - SVGChart.bottom)
            #expect(abs(y - expected) < 0.1, "\(line)")
        }
    }

    @Test func aLongSpanIsBinnedWiderAndNoRecordsDrawEmptyPlots() {
        let week = [Self.record("AA:00:00:00:00:01", at: 0), Self.record("AA:00:00:00:00:02", at: 7 * 24 * 60)]
        let model = LineModel(records: week)
        #expect(model.plots.first?.title.contains("1 h") == true, "\(model.plots.first?.title ?? "")")
        let empty = LineModel(records: [])
        #expect(empty.plots.count == 4 && empty.plots.allSatisfy { $0.svg.contains("no attempts") })
        #expect(empty.counts.devicesPerHour == 0 && empty.counts.done == 0)
    }

    @Test func thePageIsSelfContainedAndEscapesWhatItShows() {
        let page = LineHTML.document(LineModel(records: Self.shift), title: "report <1>", subtitle: "s")
        #expect(page.hasPrefix("<!DOCTYPE html>"))
        for external in ["src=", "href=", "url(", "@import", "http://", "https://"] where external != "http://" {
            #expect(!page.contains(external), "\(external)")
        }
        // The only URL is SVG's namespace name, which is never fetched.
        #expect(page.replacingOccurrences(of: "xmlns=\"http://www.w3.org/2000/svg\"", with: "").contains("http://") == false)
        #expect(page.components(separatedBy: "<figure class=\"plot\"").count - 1 == 4)
        #expect(page.contains("report &lt;1&gt;"))
        #expect(page.contains("line one &lt;b&gt;\nline two &amp; &quot;three&quot;"), "the full reason, escaped")
        #expect(page.contains("id=\"count-done\" data-value=\"5\""))
        #expect(page.contains("id=\"count-quarantined\" data-value=\"1\""))
    }

    @Test func timestampsParseAsTheLedgerWritesThem() {
        let date = Date(timeIntervalSince1970: 1_795_000_123.456)
        let parsed = LineTime.seconds(LedgerRecord.timestamp(date))
        #expect(parsed.map { abs($0 - 1_795_000_123.456) < 0.001 } == true)
        #expect(LineTime.seconds("2024-02-29T23:59:59Z") == 1_709_251_199)
        #expect(LineTime.seconds("not a time") == nil && LineTime.seconds("2024-13-01T00:00:00Z") == nil)
    }

    #if canImport(FoundationXML)
    /// The common JUnit schema's rules (the Ant formatter's): required attributes and the order of
    /// a suite's elements; one test case per attempt; a failure per attempt that did not succeed.
    @Test func junitFollowsTheCommonSchema() throws {
        let xml = JUnitReport.xml(Self.shift)
        let document = try XMLDocument(data: Data(xml.utf8))
        let root = try #require(document.rootElement())
        #expect(root.name == "testsuites")
        let suites = root.elements(forName: "testsuite")
        #expect(suites.count == 2)
        var cases = 0
        var failures = 0
        for suite in suites {
            for attribute in ["name", "package", "id", "timestamp", "hostname", "tests", "failures", "errors", "time"] {
                #expect(suite.attribute(forName: attribute)?.stringValue?.isEmpty == false, "\(attribute)")
            }
            let timestamp = try #require(suite.attribute(forName: "timestamp")?.stringValue)
            #expect(timestamp.wholeMatch(of: /[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}/) != nil, "\(timestamp)")
            let children = (suite.children ?? []).compactMap { $0 as? XMLElement }.map { $0.name ?? "" }
            #expect(children.first == "properties" && children.suffix(2) == ["system-out", "system-err"], "\(children)")
            #expect(Set(children.dropFirst().dropLast(2)) == ["testcase"])
            let testcases = suite.elements(forName: "testcase")
            #expect(Int(suite.attribute(forName: "tests")?.stringValue ?? "") == testcases.count)
            let failed = testcases.filter { !$0.elements(forName: "failure").isEmpty }
            #expect(Int(suite.attribute(forName: "failures")?.stringValue ?? "") == failed.count)
            for testcase in testcases {
                #expect(testcase.attribute(forName: "name")?.stringValue?.isEmpty == false)
                #expect(testcase.attribute(forName: "classname")?.stringValue == "otaflash.native.app.bin")
                #expect(Double(testcase.attribute(forName: "time")?.stringValue ?? "") != nil)
                for failure in testcase.elements(forName: "failure") {
                    #expect(failure.attribute(forName: "type")?.stringValue?.isEmpty == false)
                    #expect(failure.attribute(forName: "message") != nil)
                }
            }
            cases += testcases.count
            failures += failed.count
        }
        #expect(cases == 8 && failures == 3)
        let multiline = try #require(document.rootElement()?.elements(forName: "testsuite").flatMap { $0.elements(forName: "testcase") }
            .flatMap { $0.elements(forName: "failure") }.first { $0.stringValue?.contains("line two") == true })
        #expect(multiline.attribute(forName: "message")?.stringValue == "line one <b>\nline two & \"three\"", "the reason, whole, in the attribute too")
        #expect(multiline.attribute(forName: "type")?.stringValue == "gone")
    }
    #endif
}
