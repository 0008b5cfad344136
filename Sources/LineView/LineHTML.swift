import Foundation

/// The line as HTML: one self-contained document (inline CSS, the plots as inline SVG, no external
/// reference of any kind), for `otaflash ledger --html` and the dashboard's page.
public enum LineHTML {
    /// A whole document: `title`, then `body(model)`. `script` (the dashboard's) is inlined when given.
    public static func document(_ model: LineModel, title: String, subtitle: String, script: String? = nil) -> String {
        """
        <!DOCTYPE html>
        <html lang="en">
        <head>
        <meta charset="utf-8">
        <meta name="viewport" content="width=device-width, initial-scale=1">
        <title>\(escape(title))</title>
        <style>\(style)</style>
        </head>
        <body>
        <header><h1>\(escape(title))</h1><p id="subtitle">\(escape(subtitle))</p></header>
        <main id="line">\(body(model))</main>
        \(script.map { "<script>\($0)</script>" } ?? "")
        </body>
        </html>

        """
    }

    /// The page's content (what the dashboard replaces as the ledger changes): counts, stations,
    /// plots, last failures. Every count carries its exact value in `data-value`.
    public static func body(_ model: LineModel) -> String {
        let c = model.counts
        func percent(_ x: Double) -> String { String(format: "%.1f %%", x * 100) }
        func seconds(_ x: Double?) -> String { x.map { String(format: "%.1f s", $0) } ?? "–" }
        func exact(_ x: Double?) -> String { x.map { "\($0)" } ?? "" }
        let cells: [(String, String, String, String)] = [
            ("done", "done", "\(c.done)", "\(c.done)"),
            ("failed-attempts", "failed attempts", "\(c.failedAttempts)", "\(c.failedAttempts)"),
            ("quarantined", "quarantined", "\(c.quarantined)", "\(c.quarantined)"),
            ("first-pass-yield", "first-pass yield", percent(c.firstPassYield), exact(c.firstPassYield)),
            ("final-yield", "final yield", percent(c.finalYield), exact(c.finalYield)),
            ("devices-per-hour", "devices per hour", String(format: "%.1f", c.devicesPerHour), exact(c.devicesPerHour)),
            ("devices", "devices", "\(c.devices)", "\(c.devices)"),
            ("attempts", "attempts", "\(c.attempts)", "\(c.attempts)"),
            ("median-seconds", "median time (ok)", seconds(c.medianSeconds), exact(c.medianSeconds)),
            ("p95-seconds", "p95 time (ok)", seconds(c.p95Seconds), exact(c.p95Seconds)),
        ]
        var s = "<section id=\"counts\"><h2>The shift</h2><dl class=\"counts\">"
        for (id, label, text, value) in cells {
            s += "<div><dt>\(label)</dt><dd id=\"count-\(id)\" data-value=\"\(value)\">\(text)</dd></div>"
        }
        s += "</dl><p class=\"span\">\(escape(model.from.map { "from \($0) to \(model.to ?? $0) (UTC), \(String(format: "%.2f", c.hours)) h" } ?? "no attempts"))</p></section>"

        s += "<section id=\"stations\"><h2>Stations</h2><table><thead><tr><th>station</th><th>state</th><th>adapters</th>"
            + "<th>in progress</th><th>claims held</th><th>attempts</th><th>ok</th><th>failed</th></tr></thead><tbody>"
        for st in model.stations {
            let state = st.alive.map { $0 ? "alive" : "dead" } ?? "–"
            let beat = st.lastBeatSeconds.map { String(format: " (%.0f s ago)", $0) } ?? ""
            s += "<tr class=\"station\" data-station=\"\(escape(st.name))\" data-state=\"\(state)\"><td>\(escape(st.name))</td>"
                + "<td class=\"state \(state)\">\(state)\(beat)</td><td>\(escape(st.adapters.joined(separator: ", ")))</td>"
                + "<td>\(st.inProgress.map(String.init) ?? "–")</td><td>\(st.claimsHeld.map(String.init) ?? "–")</td>"
                + "<td>\(st.attempts)</td><td>\(st.done)</td><td>\(st.failed)</td></tr>"
        }
        if model.stations.isEmpty { s += "<tr><td colspan=\"8\">no station</td></tr>" }
        s += "</tbody></table></section>"

        s += "<section id=\"plots\">"
        for plot in model.plots {
            s += "<figure class=\"plot\" data-kind=\"\(plot.kind.rawValue)\"><figcaption>\(escape(plot.title))</figcaption>\(plot.svg)</figure>"
        }
        s += "</section>"

        s += "<section id=\"failures\"><h2>Last failures</h2><table><thead><tr><th>started (UTC)</th><th>station</th><th>device</th>"
            + "<th>serial</th><th>attempt</th><th>error</th><th>reason</th></tr></thead><tbody>"
        for f in model.failures {
            s += "<tr class=\"failure\"><td>\(escape(f.startedAt))</td><td>\(escape(f.station))</td><td>\(escape(f.device))</td>"
                + "<td>\(escape(f.serialNumber ?? "–"))</td><td>\(f.attempt)</td><td>\(escape(f.errorCode))</td><td class=\"reason\">\(escape(f.message))</td></tr>"
        }
        if model.failures.isEmpty { s += "<tr><td colspan=\"7\">no failed attempts</td></tr>" }
        s += "</tbody></table></section>"
        return s
    }

    /// Text for HTML or XML: `&`, `<`, `>`, quotes escaped; control characters other than tab and
    /// newline dropped (XML 1.0 cannot carry them).
    public static func escape(_ text: String) -> String {
        var out = ""
        out.reserveCapacity(text.utf8.count)
        for scalar in text.unicodeScalars {
            switch scalar {
            case "&": out += "&amp;"
            case "<": out += "&lt;"
            case ">": out += "&gt;"
            case "\"": out += "&quot;"
            case "'": out += "&#39;"
            case "\t", "\n": out.unicodeScalars.append(scalar)
            default:
                if scalar.value < 0x20 || (0xFFFE...0xFFFF).contains(scalar.value) || scalar.value == 0x7F { continue }
                out.unicodeScalars.append(scalar)
            }
        }
        return out
    }

    static let style = """
        body{font:14px/1.4 system-ui,sans-serif;margin:0;padding:0 16px 24px;color:#222;background:#fafafa}
        header h1{font-size:20px;margin:12px 0 0}header p{margin:2px 0 8px;color:#555}
        h2{font-size:16px;margin:16px 0 6px}
        dl.counts{display:flex;flex-wrap:wrap;gap:8px;margin:0}
        dl.counts div{background:#fff;border:1px solid #ddd;border-radius:4px;padding:6px 10px;min-width:110px}
        dl.counts dt{color:#555;font-size:12px}dl.counts dd{margin:0;font-size:22px;font-weight:600}
        #count-failed-attempts,#count-quarantined{color:#b22}
        table{border-collapse:collapse;background:#fff;width:100%}
        th,td{border:1px solid #ddd;padding:3px 6px;text-align:left;vertical-align:top}th{background:#f0f0f0}
        td.state.alive{color:#176b1c;font-weight:600}td.state.dead{color:#b22;font-weight:600}
        td.reason{white-space:pre-wrap;font-family:ui-monospace,monospace;font-size:12px}
        #plots{display:grid;grid-template-columns:repeat(auto-fit,minmax(480px,1fr));gap:12px;margin-top:12px}
        figure.plot{margin:0;background:#fff;border:1px solid #ddd;border-radius:4px;padding:6px}
        figure.plot figcaption{font-weight:600;margin-bottom:4px}figure.plot svg{width:100%;height:auto}
        svg .grid{stroke:#eee}svg .axis{stroke:#888}svg .tick,svg .legend,svg .unit{font-size:11px;fill:#444}
        svg .mark{stroke:#222;stroke-dasharray:4 3;font-size:11px}svg text.mark{stroke:none;fill:#222}
        svg .empty{font-size:14px;fill:#888}
        #auth{background:#fff3cd;border:1px solid #e0c060;padding:8px;margin:8px 0}
        """
}
