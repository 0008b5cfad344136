import Foundation
#if canImport(Glibc)
import Glibc
#endif
import OTA
import OTACommandLine
import OTAWire
import Synchronization

/// Where a command writes. The real one writes to the process's stdout and stderr; tests capture.
public protocol OutputSink: Sendable {
    func out(_ text: String)
    func err(_ text: String)
    /// True when stderr is a terminal (progress bars go there).
    var isTerminal: Bool { get }
    /// The terminal's size (a live view cuts its lines to the width and fits the height).
    var terminalSize: (columns: Int, rows: Int) { get }
    /// Why output stopped, once a write failed for good (a closed pipe, a full disk): the command
    /// then stops cleanly and exits `outputFailed`.
    var failure: String? { get }
    /// Calls `handler` once, when output first fails (at once if it already has).
    func onFailure(_ handler: @escaping @Sendable () -> Void)
}

extension OutputSink {
    public var terminalSize: (columns: Int, rows: Int) { (80, 24) }
    public var failure: String? { nil }
    public func onFailure(_ handler: @escaping @Sendable () -> Void) {}
}

/// The first output failure and who wants to hear of it: shared by every writer of a process's
/// (or a capture's) output.
final class OutputFailures: Sendable {
    private let state = Mutex<(failure: String?, handlers: [@Sendable () -> Void])>((nil, []))

    var failure: String? { state.withLock { $0.failure } }

    /// Records the first failure and runs the handlers; later failures are ignored.
    func fail(_ message: String) {
        let handlers = state.withLock { s -> [@Sendable () -> Void] in
            guard s.failure == nil else { return [] }
            s.failure = message
            defer { s.handlers = [] }
            return s.handlers
        }
        for handler in handlers { handler() }
    }

    func onFailure(_ handler: @escaping @Sendable () -> Void) {
        let failed = state.withLock { s -> Bool in
            if s.failure == nil { s.handlers.append(handler) }
            return s.failure != nil
        }
        if failed { handler() }
    }
}

/// The process's stdout and stderr, written with write(2): a closed pipe (EPIPE, with SIGPIPE
/// ignored) or a full disk (ENOSPC) ends that stream's output and is reported through `failure`,
/// never as a trap.
public struct StandardOutput: OutputSink {
    private static let failures = OutputFailures()
    /// Per stream: set once a write to it failed, so later writes are skipped.
    private static let broken = Mutex<Set<Int32>>([])

    public init() {
        signal(SIGPIPE, SIG_IGN)
    }

    public func out(_ text: String) { Self.write(STDOUT_FILENO, "stdout", text) }
    public func err(_ text: String) { Self.write(STDERR_FILENO, "stderr", text) }
    public var isTerminal: Bool { isatty(STDERR_FILENO) == 1 }
    public var failure: String? { Self.failures.failure }
    public func onFailure(_ handler: @escaping @Sendable () -> Void) { Self.failures.onFailure(handler) }

    public var terminalSize: (columns: Int, rows: Int) {
        var size = winsize()
        guard ioctl(STDERR_FILENO, UInt(TIOCGWINSZ), &size) == 0, size.ws_col > 0, size.ws_row > 0 else { return (80, 24) }
        return (Int(size.ws_col), Int(size.ws_row))
    }

    private static func write(_ fd: Int32, _ name: String, _ text: String) {
        guard !broken.withLock({ $0.contains(fd) }) else { return }
        var bytes = Array(text.utf8)[...]
        while !bytes.isEmpty {
            let written = bytes.withUnsafeBytes { Glibc.write(fd, $0.baseAddress, $0.count) }
            if written >= 0 {
                bytes = bytes.dropFirst(written)
                continue
            }
            let code = errno
            if code == EINTR { continue }
            if code == EAGAIN {
                var ready = pollfd(fd: fd, events: Int16(POLLOUT), revents: 0)
                _ = poll(&ready, 1, 1000)
                continue
            }
            broken.withLock { _ = $0.insert(fd) }
            failures.fail("cannot write to \(name): \(String(cString: strerror(code)))")
            return
        }
    }
}

/// Collects output in memory.
public final class CapturedOutput: OutputSink {
    private let state = Mutex<(out: String, err: String, outWrites: Int)>(("", "", 0))
    private let failures = OutputFailures()
    public let isTerminal: Bool
    public let terminalSize: (columns: Int, rows: Int)
    /// After this many writes to stdout, stdout fails as a closed pipe does.
    private let stdoutWritesBeforeFailure: Int?

    public init(isTerminal: Bool = false, terminalSize: (columns: Int, rows: Int) = (100, 40), stdoutFailsAfter writes: Int? = nil) {
        self.isTerminal = isTerminal
        self.terminalSize = terminalSize
        self.stdoutWritesBeforeFailure = writes
    }

    public func out(_ text: String) {
        let accepted = state.withLock { s -> Bool in
            s.outWrites += 1
            guard let limit = stdoutWritesBeforeFailure, s.outWrites > limit else {
                s.out += text
                return true
            }
            return false
        }
        if !accepted { failures.fail("cannot write to stdout: Broken pipe") }
    }

    public func err(_ text: String) { state.withLock { $0.err += text } }
    public var stdout: String { state.withLock { $0.out } }
    public var stderr: String { state.withLock { $0.err } }
    public var failure: String? { failures.failure }
    public func onFailure(_ handler: @escaping @Sendable () -> Void) { failures.onFailure(handler) }
}

/// The output sink of the command being run.
public enum CLIContext {
    @TaskLocal public static var output: any OutputSink = StandardOutput()
}

/// How a command reports: JSON Lines on stdout, a progress bar on a terminal, or quiet.
public enum OutputMode: Sendable {
    case json
    case human
    case quiet
}

/// Prints session events in the chosen mode.
public final class EventPrinter: CommandOutput {
    public let mode: OutputMode
    private let sink: any OutputSink
    private let barShown = Mutex(false)
    /// False when several devices report at once: one bar cannot show them all.
    private let bars: Bool
    /// With several devices on a terminal: one line per device, redrawn in place.
    private let live: LiveView?

    /// - Parameter live: several devices report at once; on a terminal in human mode they share a
    ///   view redrawn in place (`startLive`), elsewhere each event is a line naming its device.
    public init(mode: OutputMode, sink: any OutputSink = CLIContext.output, bars: Bool = true, live: Bool = false) {
        self.mode = mode
        self.sink = sink
        self.bars = bars
        self.live = mode == .human && live && sink.isTerminal ? LiveView(sink: sink) : nil
    }

    /// Shows the live view's devices (a terminal in human mode only).
    public func startLive(devices: [String]) {
        live?.start(devices: devices)
    }

    /// Draws the live view one last time with each device's result and leaves it on screen.
    public func finishLive(results: [(device: String, result: BatchOutcome.Result)] = []) {
        live?.finish(results: results)
    }

    /// A problem that does not stop the run, on stderr in every mode but quiet.
    public func warning(_ text: String) {
        guard mode != .quiet else { return }
        if let live, live.print("otaflash: warning: " + text) { return }
        clearBar()
        sink.err("otaflash: warning: \(text)\n")
    }

    /// A table for people (human mode only), columns aligned, on stdout. A cell of a column
    /// before the last that is longer than `Self.cellWidth` (a failure's reason) is cut at a word
    /// and marked [n]; its whole text follows the table, on a line of its own that starts with [n].
    public func table(_ rows: [[String]]) {
        guard mode == .human, let header = rows.first else { return }
        clearBar()
        var whole: [String] = []
        let shown = rows.map { row in
            row.enumerated().map { i, cell in
                guard i < row.count - 1, cell.count > Self.cellWidth else { return cell }
                whole.append(cell)
                let mark = " [\(whole.count)]"
                return LiveView.cut(cell, to: Self.cellWidth - mark.count) + mark
            }
        }
        var widths = header.map(\.count)
        for row in shown { for (i, cell) in row.enumerated() where i < widths.count { widths[i] = max(widths[i], cell.count) } }
        for row in shown {
            let cells = row.enumerated().map { i, cell in
                i == row.count - 1 ? cell : cell.padding(toLength: widths[i], withPad: " ", startingAt: 0)
            }
            sink.out(cells.joined(separator: "  ") + "\n")
        }
        for (index, text) in whole.enumerated() { sink.out("[\(index + 1)] \(text)\n") }
    }

    /// The widest a table's cell is shown before the last column.
    static let cellWidth = 60

    /// Emits one JSON Lines event (JSON mode only).
    public func json(_ event: some JSONEvent) {
        guard mode == .json else { return }
        sink.out(event.line + "\n")
    }

    /// Runs a command's work; a `CLIFailure` it throws ends the command's JSON output with its
    /// `done` event (`Done(failure:)`) and is thrown on, to print its one line and exit with its code.
    func endingWith<Done: CommandDone>(_: Done.Type, _ work: () async throws -> Void) async throws {
        do {
            try await work()
        } catch let failure as CLIFailure {
            json(Done(failure: failure))
            throw failure
        }
    }

    /// A line for people (human mode only), on stderr so stdout stays clean for results.
    public func note(_ text: String) {
        guard mode == .human else { return }
        if let live, live.print(text) { return }
        clearBar()
        sink.err(text + "\n")
    }

    public func session(_ event: SessionEvent) {
        if mode == .json { sink.out(Self.jsonLine(event) + "\n") }
        guard mode == .human else { return }
        if let live, live.update(event) { return }
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
            note("device firmware \(info.firmwareVersion?.description ?? "unknown")\(slot), state \(info.stateText)")
        case .transferStarted(_, let offset, let total):
            if offset > 0 { note("resuming at \(formatBytes(offset)) of \(formatBytes(total))") }
        case .progress(let p):
            bar(p)
        case .verifying(_, let check):
            note("verifying: the device \(check)…")
        case .activating:
            note("image verified; activating")
        case .reconnecting(_, let attempt, let reason, let delay):
            note("\(reason); reconnecting in \(String(format: "%.1f", delay.seconds)) s (attempt \(attempt))")
        case .notice(_, let message):
            note(message)
        }
    }

    /// A session event as one JSON Lines object (stdout with --json, and the per-device logs).
    public static func jsonLine(_ event: SessionEvent) -> String {
        FlashEvents.event(event).line
    }

    public func progress(_ progress: TransferProgress) { bar(progress) }

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

/// Several devices' progress on a terminal: a header and one line per device (or, when the
/// terminal is too short for that, a grid of cells), redrawn in place with ANSI cursor movement at
/// most every 100 ms. Lines printed meanwhile (notes, warnings) scroll above it.
final class LiveView: Sendable {
    /// Where a device stands, as its line says it.
    enum Phase: Equatable {
        case waiting
        case connecting
        case connected(mtu: Int)
        case firmware(FirmwareVersion?)
        case resuming(offset: Int, total: Int)
        case sending
        case verifying
        case activating
        case reconnecting(attempt: Int, reason: String)
        /// What the session noted.
        case notice(String)

        var text: String {
            switch self {
            case .waiting: "waiting"
            case .connecting: "connecting"
            case .connected(let mtu): "connected, MTU \(mtu)"
            case .firmware(let version): "firmware \(version.map { "\($0)" } ?? "unknown")"
            case .resuming(let offset, let total): "resuming at \(formatBytes(offset)) of \(formatBytes(total))"
            case .sending: "sending"
            case .verifying: "verifying"
            case .activating: "activating"
            case .reconnecting(let attempt, let reason): "reconnecting (attempt \(attempt)): \(reason)"
            case .notice(let message): message
            }
        }
    }

    struct Row {
        var phase = Phase.waiting
        var progress: TransferProgress?
        /// How it ended; nil while it runs.
        var result: BatchOutcome.Result?

        var failed: Bool { if case .failed? = result { true } else { false } }
    }

    struct State {
        var order: [String] = []
        var rows: [String: Row] = [:]
        var active = false
        /// Lines of the frame on screen, counted from the cursor up.
        var drawn = 0
        var lastDraw: ContinuousClock.Instant?
        var redrawScheduled = false
    }

    static let interval = Duration.milliseconds(100)
    private let sink: any OutputSink
    private let state = Mutex(State())

    init(sink: any OutputSink) { self.sink = sink }

    func start(devices: [String]) {
        state.withLock { s in
            s.order = devices
            for device in devices { s.rows[device] = Row() }
            s.active = true
        }
        draw(force: true)
    }

    /// Takes in a session event; false when the view is not showing (the caller prints a line).
    func update(_ event: SessionEvent) -> Bool {
        guard let device = event.device else { return false }
        let shown = state.withLock { s -> Bool in
            guard s.active else { return false }
            var row = s.rows[device] ?? Row()
            if s.rows[device] == nil { s.order.append(device) }
            switch event {
            case .connecting: row.phase = .connecting
            case .connected(_, let mtu, _): row.phase = .connected(mtu: mtu)
            case .deviceInfo(_, let info): row.phase = .firmware(info.firmwareVersion)
            case .transferStarted(_, let offset, let total):
                row.phase = offset > 0 ? .resuming(offset: offset, total: total) : .sending
            case .progress(let p):
                // The last progress report may follow the verify or activate event.
                if row.phase != .verifying && row.phase != .activating { row.phase = .sending }
                row.progress = p
            case .verifying: row.phase = .verifying
            case .activating: row.phase = .activating
            case .reconnecting(_, let attempt, let reason, _): row.phase = .reconnecting(attempt: attempt, reason: reason)
            case .notice(_, let message): row.phase = .notice(message)
            }
            s.rows[device] = row
            return true
        }
        if shown { draw(force: false) }
        return shown
    }

    /// Prints `line` above the view; false when the view is not showing.
    func print(_ line: String) -> Bool {
        let text = state.withLock { s -> String? in
            guard s.active else { return nil }
            let text = Self.up(s.drawn) + "\u{1B}[J" + line + "\n" + frame(s)
            s.drawn = frameLines(s)
            s.lastDraw = .now
            return text
        }
        guard let text else { return false }
        sink.err(text)
        return true
    }

    func finish(results: [(device: String, result: BatchOutcome.Result)]) {
        state.withLock { s in
            for (device, result) in results { s.rows[device, default: Row()].result = result }
        }
        draw(force: true)
        state.withLock { $0.active = false }
    }

    private func draw(force: Bool) {
        let text = state.withLock { s -> String? in
            guard s.active else { return nil }
            if !force, let last = s.lastDraw, last.duration(to: .now) < Self.interval {
                // Too soon: draw once the interval has passed, so the last state always shows.
                if !s.redrawScheduled {
                    s.redrawScheduled = true
                    DispatchQueue.global().asyncAfter(deadline: .now() + .milliseconds(100)) { [self] in
                        state.withLock { $0.redrawScheduled = false }
                        draw(force: false)
                    }
                }
                return nil
            }
            let text = Self.up(s.drawn) + frame(s) + "\u{1B}[J"
            s.drawn = frameLines(s)
            s.lastDraw = .now
            return text
        }
        if let text { sink.err(text) }
    }

    /// Moves the cursor to the start of the frame `lines` lines up.
    private static func up(_ lines: Int) -> String { lines > 0 ? "\r\u{1B}[\(lines)A" : "\r" }

    private func frameLines(_ s: State) -> Int { layout(s).count }

    private func frame(_ s: State) -> String {
        layout(s).map { "\u{1B}[2K" + $0 + "\n" }.joined()
    }

    /// The frame's lines, each cut to the terminal's width.
    private func layout(_ s: State) -> [String] {
        let (columns, rows) = sink.terminalSize
        let width = max(columns - 1, 20)
        let rowsOf = s.order.map { ($0, s.rows[$0] ?? Row()) }
        let ok = rowsOf.filter { if case .ok? = $0.1.result { true } else { false } }.count
        let failed = rowsOf.filter(\.1.failed).count
        let waiting = rowsOf.filter { $0.1.phase == .waiting && $0.1.result == nil }.count
        var header = "\(s.order.count) devices: "
        header += rowsOf.allSatisfy({ $0.1.result != nil })
            ? "\(ok) ok, \(rowsOf.count - ok - failed) skipped, \(failed) failed"
            : "\(s.order.count - waiting) started, \(waiting) waiting"
        var lines = [header]
        if rowsOf.count + 1 < rows {
            for (device, row) in rowsOf { lines.append(Self.line(device, row)) }
        } else {
            // Too many for one line each: a grid of short cells, as many lines as the terminal allows.
            let cellWidth = 24
            let perLine = max(1, width / cellWidth)
            var cells = rowsOf.map { device, row in
                (String(device.suffix(5)) + " " + Self.short(row)).padding(toLength: cellWidth, withPad: " ", startingAt: 0)
            }
            let maxLines = max(1, rows - 2)
            while !cells.isEmpty && lines.count <= maxLines {
                lines.append(cells.prefix(perLine).joined())
                cells.removeFirst(min(perLine, cells.count))
            }
            if !cells.isEmpty { lines[lines.count - 1] = "… \(cells.count) more devices" }
        }
        return lines.map { Self.cut($0, to: width) }
    }

    /// `line` cut to `width` at a word's end (never inside a number such as "1024"), with "…".
    static func cut(_ line: String, to width: Int) -> String {
        guard line.count > width else { return line }
        let head = line.prefix(width - 1)
        guard let space = head.lastIndex(of: " "), head.distance(from: head.startIndex, to: space) > width / 2 else {
            return String(head) + "…"
        }
        return String(head[..<space]) + " …"
    }

    /// What a device's line says once it ended.
    private static func text(_ result: BatchOutcome.Result) -> String {
        switch result {
        case .ok: "ok"
        case .skipped: "skipped"
        case .failed(let e): "FAILED: \(e.description)"
        }
    }

    private static func line(_ device: String, _ row: Row) -> String {
        if let result = row.result { return "\(device)  \(text(result))" }
        guard let p = row.progress, row.phase == .sending else { return "\(device)  \(row.phase.text)" }
        let width = 20
        let filled = Int((p.fraction * Double(width)).rounded(.down))
        let gauge = String(repeating: "#", count: filled) + String(repeating: ".", count: width - filled)
        return "\(device)  [\(gauge)] " + String(format: "%3.0f%%", p.fraction * 100) + "  \(formatRate(p.rate))"
    }

    private static func short(_ row: Row) -> String {
        if let result = row.result { return row.failed ? "FAILED" : text(result) }
        if let p = row.progress, row.phase == .sending { return String(format: "%3.0f%%", p.fraction * 100) }
        return String(row.phase.text.prefix(while: { $0 != "," && $0 != " " }))
    }
}

func formatRate(_ bytesPerSecond: Double) -> String {
    String(format: "%.1f kB/s", bytesPerSecond / 1000)
}

func formatSeconds(_ s: Double) -> String {
    s < 60 ? String(format: "%.0fs", s.rounded(.up)) : String(format: "%dm%02ds", Int(s) / 60, Int(s) % 60)
}
