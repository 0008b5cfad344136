import Foundation
import Ledger

/// The series behind the four plots and their SVG: binned by time (10 minutes, wider for a span of
/// more than two days, so a plot has at most `maxBins` bins), drawn here in Swift.
struct LinePlots {
    static let maxBins = 288
    static let binSizes: [Double] = [600, 1800, 3600, 7200, 21_600, 86_400, 604_800]

    let plots: [LineModel.Plot]

    /// `records`: attempts, oldest first.
    init(_ records: [LedgerRecord], summary: LedgerSummary, start: Double?, end: Double?) {
        guard let start, let end else {
            plots = LineModel.PlotKind.allCases.map { LineModel.Plot(kind: $0, title: Self.title($0, bin: 600), svg: SVGChart.empty("no attempts")) }
            return
        }
        let span = max(0, end - start)
        let bin = Self.binSizes.first { span / $0 < Double(Self.maxBins) } ?? Self.binSizes.last!
        let first = (start / bin).rounded(.down) * bin
        let count = min(Self.maxBins, Int(((end - first) / bin).rounded(.down)) + 1)
        func index(_ t: Double) -> Int { min(count - 1, max(0, Int(((t - first) / bin).rounded(.down)))) }
        let edges = (0...count).map { first + Double($0) * bin }
        let withDate = end - first > 86_400

        // Devices done per bin per station (by the attempt's end).
        var perStation: [String: [Double]] = [:]
        for r in records where r.result == .ok {
            guard let t = LineTime.seconds(r.endedAt) else { continue }
            perStation[r.station, default: Array(repeating: 0, count: count)][index(t)] += 1
        }
        let throughput = SVGChart(x: first...(first + Double(count) * bin), y: 0...Self.niceMax(perStation.values.flatMap { $0 }.max() ?? 0, whole: true),
                                  xLabel: { LineTime.label($0, withDate: withDate) }, yLabel: { String(format: "%.0f", $0) })
            .lines(perStation.keys.sorted().map { name in
                (name, perStation[name]!.enumerated().map { (first + (Double($0.offset) + 0.5) * bin, $0.element) })
            }, yUnit: "devices")

        // Yield of the devices seen so far, at the end of each bin (attempts by their start).
        var firstOK: [String: Bool] = [:]
        var lastOK: [String: Bool] = [:]
        var (firstPass, final) = (0, 0)
        var firstSeries: [(Double, Double)] = []
        var finalSeries: [(Double, Double)] = []
        var i = 0
        let starts = records.map { LineTime.seconds($0.startedAt) ?? start }
        for b in 0..<count {
            while i < records.count, starts[i] < edges[b + 1] || b == count - 1 {
                let r = records[i]
                let device = r.device.uppercased()
                let ok = r.result.succeeded
                if firstOK[device] == nil {
                    firstOK[device] = ok
                    if ok { firstPass += 1 }
                }
                if lastOK[device] == true { final -= 1 }
                if ok { final += 1 }
                lastOK[device] = ok
                i += 1
            }
            guard !firstOK.isEmpty else { continue }
            let devices = Double(firstOK.count)
            firstSeries.append((edges[b + 1], Double(firstPass) / devices * 100))
            finalSeries.append((edges[b + 1], Double(final) / devices * 100))
        }
        let yield = SVGChart(x: first...(first + Double(count) * bin), y: 0...100,
                             xLabel: { LineTime.label($0, withDate: withDate) }, yLabel: { String(format: "%.0f %%", $0) })
            .lines([("first-pass yield", firstSeries), ("final yield", finalSeries)], yUnit: "%")

        // Seconds per device: attempts that ended ok.
        let times = records.compactMap { $0.result == .ok ? $0.seconds : nil }
        let durations: String
        if let longest = times.max() {
            let top = Self.niceMax(longest)
            let bins = 20
            var histogram = Array(repeating: 0.0, count: bins)
            for t in times { histogram[min(bins - 1, max(0, Int(t / top * Double(bins))))] += 1 }
            let width = top / Double(bins)
            var marks: [(String, Double)] = []
            if let median = summary.medianSeconds { marks.append((String(format: "median %.1f s", median), median)) }
            if let p95 = summary.p95Seconds { marks.append((String(format: "p95 %.1f s", p95), p95)) }
            durations = SVGChart(x: 0...top, y: 0...Self.niceMax(histogram.max() ?? 0, whole: true),
                                 xLabel: { String(format: top < 10 ? "%.1f s" : "%.0f s", $0) }, yLabel: { String(format: "%.0f", $0) })
                .bars([("devices", histogram.enumerated().map { (Double($0.offset) * width, width, $0.element) })], marks: marks, yUnit: "devices")
        } else {
            durations = SVGChart.empty("no attempt ended ok")
        }

        // Failed attempts per bin by error class: the five most frequent, the rest as "other".
        let classes = Array(summary.failuresByErrorCode.prefix(5).map(\.errorCode))
        let failures: String
        if summary.failuresByErrorCode.isEmpty {
            failures = SVGChart.empty("no failed attempts")
        } else {
            let names = classes + (summary.failuresByErrorCode.count > 5 ? ["other"] : [])
            var perClass = Dictionary(uniqueKeysWithValues: names.map { ($0, Array(repeating: 0.0, count: count)) })
            for r in records where !r.result.succeeded {
                guard let t = LineTime.seconds(r.endedAt) else { continue }
                let code = r.errorCode ?? "unknown"
                perClass[classes.contains(code) ? code : "other", default: Array(repeating: 0, count: count)][index(t)] += 1
            }
            var stacked = Array(repeating: 0.0, count: count)
            for name in names { for b in 0..<count { stacked[b] += perClass[name]![b] } }
            failures = SVGChart(x: first...(first + Double(count) * bin), y: 0...Self.niceMax(stacked.max() ?? 0, whole: true),
                                xLabel: { LineTime.label($0, withDate: withDate) }, yLabel: { String(format: "%.0f", $0) })
                .bars(names.map { name in (name, perClass[name]!.enumerated().map { (first + Double($0.offset) * bin, bin, $0.element) }) },
                      stacked: true, yUnit: "attempts")
        }
        plots = [LineModel.Plot(kind: .throughput, title: Self.title(.throughput, bin: bin), svg: throughput),
                 LineModel.Plot(kind: .yield, title: Self.title(.yield, bin: bin), svg: yield),
                 LineModel.Plot(kind: .durations, title: Self.title(.durations, bin: bin), svg: durations),
                 LineModel.Plot(kind: .failures, title: Self.title(.failures, bin: bin), svg: failures)]
    }

    static func title(_ kind: LineModel.PlotKind, bin: Double) -> String {
        let per = bin < 3600 ? "\(Int(bin / 60)) minutes" : bin < 86_400 ? "\(Int(bin / 3600)) h" : "\(Int(bin / 86_400)) days"
        switch kind {
        case .throughput: return "Devices done per \(per), per station"
        case .yield: return "Yield over the shift (devices seen so far)"
        case .durations: return "Time per device (ok attempts), median and p95"
        case .failures: return "Failed attempts per \(per), by error class"
        }
    }

    /// An axis top at or above `value` whose four tick intervals are round (1, 2 or 5 × 10^n each);
    /// whole numbers with `whole` (counts: never a tick at 0.5 device). 1 (4 when whole) for nothing.
    static func niceMax(_ value: Double, whole: Bool = false) -> Double {
        guard value > 0 else { return whole ? 4 : 1 }
        let least = value / 4
        let magnitude = pow(10, log10(least).rounded(.down))
        var step = [1.0, 2, 5, 10].lazy.map { $0 * magnitude }.first { $0 >= least } ?? 10 * magnitude
        if whole { step = max(1, step.rounded(.up)) }
        return 4 * step
    }
}

/// One plot as an SVG element: axes with ticks, then lines or bars, and a legend. Sizes in the
/// viewBox; the page scales it to its width.
struct SVGChart {
    static let width = 640.0, height = 260.0
    static let left = 56.0, right = 24.0, top = 28.0, bottom = 34.0
    static let palette = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#17becf", "#bcbd22"]

    let x: ClosedRange<Double>
    let y: ClosedRange<Double>
    let xLabel: (Double) -> String
    let yLabel: (Double) -> String

    func px(_ v: Double) -> Double {
        let span = x.upperBound - x.lowerBound
        return Self.left + (span > 0 ? (v - x.lowerBound) / span : 0) * (Self.width - Self.left - Self.right)
    }

    func py(_ v: Double) -> Double {
        let span = y.upperBound - y.lowerBound
        return Self.height - Self.bottom - (span > 0 ? (v - y.lowerBound) / span : 0) * (Self.height - Self.top - Self.bottom)
    }

    static func open() -> String {
        "<svg xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 \(Int(width)) \(Int(height))\" role=\"img\">"
    }

    static func empty(_ text: String) -> String {
        open() + "<text x=\"\(Int(width / 2))\" y=\"\(Int(height / 2))\" text-anchor=\"middle\" class=\"empty\">\(LineHTML.escape(text))</text></svg>"
    }

    static func n(_ v: Double) -> String { String(format: "%.1f", v) }

    private func axes(yUnit: String) -> String {
        var s = ""
        for i in 0...4 {
            let v = y.lowerBound + (y.upperBound - y.lowerBound) * Double(i) / 4
            s += "<line class=\"grid\" x1=\"\(Self.n(Self.left))\" x2=\"\(Self.n(Self.width - Self.right))\" y1=\"\(Self.n(py(v)))\" y2=\"\(Self.n(py(v)))\"/>"
            s += "<text class=\"tick\" x=\"\(Self.n(Self.left - 4))\" y=\"\(Self.n(py(v) + 4))\" text-anchor=\"end\">\(LineHTML.escape(yLabel(v)))</text>"
        }
        for i in 0...5 {
            let v = x.lowerBound + (x.upperBound - x.lowerBound) * Double(i) / 5
            s += "<text class=\"tick\" x=\"\(Self.n(px(v)))\" y=\"\(Self.n(Self.height - Self.bottom + 16))\" text-anchor=\"middle\">\(LineHTML.escape(xLabel(v)))</text>"
        }
        s += "<line class=\"axis\" x1=\"\(Self.n(Self.left))\" x2=\"\(Self.n(Self.left))\" y1=\"\(Self.n(Self.top))\" y2=\"\(Self.n(Self.height - Self.bottom))\"/>"
        s += "<line class=\"axis\" x1=\"\(Self.n(Self.left))\" x2=\"\(Self.n(Self.width - Self.right))\" y1=\"\(Self.n(Self.height - Self.bottom))\" y2=\"\(Self.n(Self.height - Self.bottom))\"/>"
        s += "<text class=\"unit\" x=\"4\" y=\"14\">\(LineHTML.escape(yUnit))</text>"
        return s
    }

    private func legend(_ names: [String]) -> String {
        var s = ""
        var at = Self.left + 8
        for (i, name) in names.enumerated() {
            let color = Self.palette[i % Self.palette.count]
            s += "<rect x=\"\(Self.n(at))\" y=\"6\" width=\"10\" height=\"10\" fill=\"\(color)\"/>"
            s += "<text class=\"legend\" x=\"\(Self.n(at + 14))\" y=\"15\">\(LineHTML.escape(name))</text>"
            at += 24 + Double(name.count) * 6.5
        }
        return s
    }

    /// One polyline (with a dot per point) per series.
    func lines(_ series: [(String, [(Double, Double)])], yUnit: String) -> String {
        var s = Self.open() + axes(yUnit: yUnit)
        for (i, (_, points)) in series.enumerated() {
            let color = Self.palette[i % Self.palette.count]
            let coordinates = points.map { "\(Self.n(px($0.0))),\(Self.n(py($0.1)))" }
            s += "<polyline class=\"series\" fill=\"none\" stroke=\"\(color)\" stroke-width=\"2\" points=\"\(coordinates.joined(separator: " "))\"/>"
            if points.count <= 96 {
                for c in coordinates {
                    let xy = c.split(separator: ",")
                    s += "<circle cx=\"\(xy[0])\" cy=\"\(xy[1])\" r=\"2.5\" fill=\"\(color)\"/>"
                }
            }
        }
        return s + legend(series.map(\.0)) + "</svg>"
    }

    /// Bars (start, width, height) per series, side by side in one colour each, or stacked; `marks`
    /// are labelled vertical lines (a median, a percentile).
    func bars(_ series: [(String, [(Double, Double, Double)])], stacked: Bool = false, marks: [(String, Double)] = [], yUnit: String) -> String {
        var s = Self.open() + axes(yUnit: yUnit)
        var base: [Int: Double] = [:]
        for (i, (_, bars)) in series.enumerated() {
            let color = Self.palette[i % Self.palette.count]
            for (j, bar) in bars.enumerated() where bar.2 > 0 {
                let below = stacked ? base[j, default: 0] : 0
                let x0 = px(bar.0), x1 = px(bar.0 + bar.1)
                let yTop = py(below + bar.2), yBottom = py(below)
                s += "<rect class=\"bar\" x=\"\(Self.n(x0 + 0.5))\" y=\"\(Self.n(yTop))\" width=\"\(Self.n(max(0.5, x1 - x0 - 1)))\" height=\"\(Self.n(max(0, yBottom - yTop)))\" fill=\"\(color)\"/>"
                if stacked { base[j] = below + bar.2 }
            }
        }
        for (i, (label, at)) in marks.enumerated() {
            let x = px(at)
            s += "<line class=\"mark\" x1=\"\(Self.n(x))\" x2=\"\(Self.n(x))\" y1=\"\(Self.n(Self.top))\" y2=\"\(Self.n(Self.height - Self.bottom))\"/>"
            s += "<text class=\"mark\" x=\"\(Self.n(x + 4))\" y=\"\(Self.n(Self.top + 12 + Double(i) * 14))\">\(LineHTML.escape(label))</text>"
        }
        return s + legend(series.map(\.0)) + "</svg>"
    }
}
