import Foundation
import OTA
import OTAWire
import Synchronization

/// Where a command writes. The real one writes to the process's stdout and stderr; tests capture.
public protocol OutputSink: Sendable {
    func out(_ text: String)
    func err(_ text: String)
    /// True when stderr is a terminal (progress bars go there).
    var isTerminal: Bool { get }
}

public struct StandardOutput: OutputSink {
    public init() {}
    public func out(_ text: String) { FileHandle.standardOutput.write(Data(text.utf8)) }
    public func err(_ text: String) { FileHandle.standardError.write(Data(text.utf8)) }
    public var isTerminal: Bool { isatty(STDERR_FILENO) == 1 }
}

/// Collects output in memory.
public final class CapturedOutput: OutputSink {
    private let state = Mutex<(out: String, err: String)>(("", ""))
    public let isTerminal: Bool

    public init(isTerminal: Bool = false) { self.isTerminal = isTerminal }
    public func out(_ text: String) { state.withLock { $0.out += text } }
    public func err(_ text: String) { state.withLock { $0.err += text } }
    public var stdout: String { state.withLock { $0.out } }
    public var stderr: String { state.withLock { $0.err } }
}

/// The output sink of the command being run.
public enum CLIContext {
    @TaskLocal public static var output: any OutputSink = StandardOutput()
}

/// A JSON value for event lines (`JSONEvent` encodes into it); keys keep their order so `"event"` comes first.
public enum JSON: Sendable, Equatable {
    case string(String)
    case int(Int)
    case double(Double)
    case bool(Bool)
    case null
    case object([(String, JSON)])
    case array([JSON])

    public static func == (a: JSON, b: JSON) -> Bool { a.text == b.text }

    public var text: String {
        switch self {
        case .string(let s): return JSON.quote(s)
        case .int(let i): return String(i)
        case .double(let d):
            guard d.isFinite else { return "null" }
            return String(format: "%.3f", d).replacingOccurrences(of: #"\.?0+$"#, with: "", options: .regularExpression)
        case .bool(let b): return b ? "true" : "false"
        case .null: return "null"
        case .object(let fields): return "{" + fields.map { JSON.quote($0.0) + ":" + $0.1.text }.joined(separator: ",") + "}"
        case .array(let items): return "[" + items.map(\.text).joined(separator: ",") + "]"
        }
    }

    static func quote(_ s: String) -> String {
        var out = "\""
        for scalar in s.unicodeScalars {
            switch scalar {
            case "\"": out += "\\\""
            case "\\": out += "\\\\"
            case "\n": out += "\\n"
            case "\r": out += "\\r"
            case "\t": out += "\\t"
            case _ where scalar.value < 0x20: out += String(format: "\\u%04x", scalar.value)
            default: out.unicodeScalars.append(scalar)
            }
        }
        return out + "\""
    }
}

/// How a command reports: JSON Lines on stdout, a progress bar on a terminal, or quiet.
public enum OutputMode: Sendable {
    case json
    case human
    case quiet
}

/// Prints session events in the chosen mode.
public final class EventPrinter: Sendable {
    public let mode: OutputMode
    private let sink: any OutputSink
    private let barShown = Mutex(false)
    /// False when several devices report at once: one bar cannot show them all.
    private let bars: Bool

    public init(mode: OutputMode, sink: any OutputSink = CLIContext.output, bars: Bool = true) {
        self.mode = mode
        self.sink = sink
        self.bars = bars
    }

    /// A table for people (human mode only), columns aligned, on stdout.
    public func table(_ rows: [[String]]) {
        guard mode == .human, let header = rows.first else { return }
        clearBar()
        var widths = header.map(\.count)
        for row in rows { for (i, cell) in row.enumerated() where i < widths.count { widths[i] = max(widths[i], min(cell.count, 60)) } }
        for row in rows {
            let cells = row.enumerated().map { i, cell in
                i == row.count - 1 ? cell : cell.padding(toLength: widths[i], withPad: " ", startingAt: 0)
            }
            sink.out(cells.joined(separator: "  ") + "\n")
        }
    }

    /// Emits one JSON Lines event (JSON mode only).
    public func json(_ event: some JSONEvent) {
        guard mode == .json else { return }
        sink.out(event.line + "\n")
    }

    /// A line for people (human mode only), on stderr so stdout stays clean for results.
    public func note(_ text: String) {
        guard mode == .human else { return }
        clearBar()
        sink.err(text + "\n")
    }

    public func session(_ event: SessionEvent) {
        if mode == .json { sink.out(Self.jsonLine(event) + "\n") }
        guard mode == .human else { return }
        // With several devices at once, say which one each line is about.
        let who = bars ? "" : "\(event.device ?? "?"): "
        func note(_ text: String) { self.note(who + text) }
        switch event {
        case .connecting(let device):
            note("connecting to \(device)…")
        case .connected(_, let mtu, let chunk):
            note("connected: MTU \(mtu), \(chunk) image bytes per packet")
        case .deviceInfo(_, let info):
            let slot = info.slotSize.map { ", slot \(formatBytes($0))" } ?? ""
            note("device firmware \(info.firmwareVersion?.description ?? "unknown")\(slot), state \(info.state)")
        case .transferStarted(_, let offset, let total):
            if offset > 0 { note("resuming at \(formatBytes(offset)) of \(formatBytes(total))") }
        case .progress(let p):
            bar(p)
        case .verifying:
            note("verifying: the device computes the CRC32 of the whole image…")
        case .activating:
            note("image verified; activating")
        case .reconnecting(_, let attempt, let reason, let delay):
            note("\(reason); reconnecting in \(String(format: "%.1f", delay.seconds)) s (attempt \(attempt))")
        }
    }

    /// A session event as one JSON Lines object (stdout with --json, and the per-device logs).
    public static func jsonLine(_ event: SessionEvent) -> String {
        FlashEvents.event(event).line
    }

    private func bar(_ p: TransferProgress) {
        guard mode == .human, bars, sink.isTerminal else { return }
        let width = 30
        let filled = Int((p.fraction * Double(width)).rounded(.down))
        let eta: String = p.eta.map { formatSeconds($0) } ?? "--"
        let gauge: String = String(repeating: "#", count: filled) + String(repeating: ".", count: width - filled)
        let percent: String = String(format: "%3.0f%%", p.fraction * 100)
        let amounts: String = "\(formatBytes(p.bytes))/\(formatBytes(p.total))"
        let line: String = "\r[\(gauge)] \(percent) \(amounts) \(formatRate(p.rate)) ETA \(eta)  "
        barShown.withLock { $0 = true }
        sink.err(line)
    }

    private func clearBar() {
        let shown = barShown.withLock { s -> Bool in
            defer { s = false }
            return s
        }
        if shown { sink.err("\r\u{1B}[K") }
    }

    /// The one-line error every failure ends with, on stderr in every mode.
    public func error(_ message: String) {
        clearBar()
        sink.err("otaflash: error: \(message)\n")
    }

    /// A line on stdout in human mode (the result a script may capture).
    public func result(_ text: String) {
        guard mode == .human else { return }
        clearBar()
        sink.out(text + "\n")
    }
}

func formatBytes(_ n: Int) -> String {
    if n < 1024 { return "\(n) B" }
    if n < 1024 * 1024 { return String(format: "%.1f KiB", Double(n) / 1024) }
    return String(format: "%.2f MiB", Double(n) / 1048576)
}

func formatRate(_ bytesPerSecond: Double) -> String {
    String(format: "%.1f kB/s", bytesPerSecond / 1000)
}

func formatSeconds(_ s: Double) -> String {
    s < 60 ? String(format: "%.0fs", s.rounded(.up)) : String(format: "%dm%02ds", Int(s) / 60, Int(s) % 60)
}
