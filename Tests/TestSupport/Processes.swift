import Foundation
import Synchronization

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// A failure of the test machinery itself (not of the code under test).
public struct HarnessError: Error, CustomStringConvertible {
    public var description: String
    public init(_ description: String) { self.description = description }
}

/// A child process whose stdout is read line by line; stopped with SIGKILL by PID.
///
/// Spawned with an empty signal mask and default dispositions: a child started from a thread that
/// blocks SIGTERM would otherwise inherit that and ignore `terminate()` (shared/notes/libdbus-swift.md).
public final class SpawnedProcess: Sendable {
    public let pid: pid_t
    public let stdoutFD: Int32
    private let stopped = Mutex(false)
    /// Bytes read from stdout and not yet handed out as lines.
    private let pending = Mutex<[UInt8]>([])

    private init(pid: pid_t, stdoutFD: Int32) {
        self.pid = pid
        self.stdoutFD = stdoutFD
    }

    /// Spawns `arguments[0]` with stdout on a pipe and stderr to `stderrPath` (or inherited).
    public static func spawn(_ arguments: [String], stderrPath: String? = nil) throws -> SpawnedProcess {
        var pipeFDs: [Int32] = [0, 0]
        guard pipe(&pipeFDs) == 0 else { throw HarnessError("pipe failed") }
        let (readEnd, writeEnd) = (pipeFDs[0], pipeFDs[1])
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_adddup2(&actions, writeEnd, 1)
        posix_spawn_file_actions_addclose(&actions, readEnd)
        posix_spawn_file_actions_addclose(&actions, writeEnd)
        if let stderrPath {
            posix_spawn_file_actions_addopen(&actions, 2, stderrPath, O_WRONLY | O_CREAT | O_APPEND, 0o644)
        }
        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        var emptyMask = sigset_t()
        sigemptyset(&emptyMask)
        posix_spawnattr_setsigmask(&attributes, &emptyMask)
        var allSignals = sigset_t()
        sigfillset(&allSignals)
        posix_spawnattr_setsigdefault(&attributes, &allSignals)
        posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF))
        var argv: [UnsafeMutablePointer<CChar>?] = arguments.map { strdup($0) } + [nil]
        defer { for pointer in argv { free(pointer) } }
        var pid: pid_t = 0
        let status = posix_spawn(&pid, arguments[0], &actions, &attributes, &argv, environ)
        close(writeEnd)
        guard status == 0 else {
            close(readEnd)
            throw HarnessError("posix_spawn(\(arguments[0])) failed: \(String(cString: strerror(status)))")
        }
        return SpawnedProcess(pid: pid, stdoutFD: readEnd)
    }

    /// Reads stdout until a line satisfying `accept` arrives, at most `timeoutMilliseconds`; nil at
    /// the deadline or when stdout ends first. Lines after the accepted one stay for the next call.
    public func waitForLine(timeoutMilliseconds: Int32, _ accept: (String) -> Bool) -> String? {
        let deadline = monotonicMilliseconds() + Int64(timeoutMilliseconds)
        while true {
            while let line = takeLine() {
                if accept(line) { return line }
            }
            guard readChunk(until: deadline) else { return nil }
        }
    }

    /// Every line left on stdout until the process closes it (normally by exiting), or nil when
    /// `timeoutMilliseconds` pass first.
    public func remainingLines(timeoutMilliseconds: Int32) -> [String]? {
        let deadline = monotonicMilliseconds() + Int64(timeoutMilliseconds)
        var lines: [String] = []
        while true {
            while let line = takeLine() { lines.append(line) }
            guard readChunk(until: deadline) else {
                guard monotonicMilliseconds() < deadline else { return nil }
                // stdout ended: a last line without a newline still counts.
                let rest = pending.withLock { bytes in defer { bytes.removeAll() }; return bytes }
                if !rest.isEmpty { lines.append(String(decoding: rest, as: UTF8.self)) }
                return lines
            }
        }
    }

    /// Waits for the process to end (call once its stdout has ended) and returns its wait status;
    /// `stop` does nothing afterwards.
    public func waitForExit() -> Int32 {
        var status: Int32 = 0
        let first = stopped.withLock { (done: inout Bool) -> Bool in defer { done = true }; return !done }
        guard first else { return -1 }
        waitpid(pid, &status, 0)
        close(stdoutFD)
        return status
    }

    /// Kills the process (once; later calls do nothing, so a reused PID is never hit).
    public func stop() {
        guard stopped.withLock({ (done: inout Bool) -> Bool in defer { done = true }; return !done }) else { return }
        kill(pid, SIGKILL)
        waitpid(pid, nil, 0)
        close(stdoutFD)
    }

    private func takeLine() -> String? {
        pending.withLock { bytes in
            guard let newline = bytes.firstIndex(of: UInt8(ascii: "\n")) else { return nil }
            let line = String(decoding: bytes[..<newline], as: UTF8.self)
            bytes.removeSubrange(...newline)
            return line
        }
    }

    /// Reads what stdout has, waiting at most until `deadline`; false at the deadline or at the end
    /// of stdout.
    private func readChunk(until deadline: Int64) -> Bool {
        while true {
            let left = deadline - monotonicMilliseconds()
            guard left > 0 else { return false }
            var pfd = pollfd(fd: stdoutFD, events: Int16(POLLIN), revents: 0)
            let ready = poll(&pfd, 1, Int32(min(left, Int64(Int32.max))))
            if ready < 0, errno == EINTR { continue }
            guard ready > 0 else { continue }
            var chunk = [UInt8](repeating: 0, count: 4096)
            let count = read(stdoutFD, &chunk, chunk.count)
            if count < 0, errno == EINTR { continue }
            guard count > 0 else { return false }
            pending.withLock { $0 += chunk[0..<count] }
            return true
        }
    }
}

/// The exit code in a `waitpid` status, or nil when the process died of a signal.
public func exitCode(ofWaitStatus status: Int32) -> Int32? {
    (status & 0x7f) == 0 ? (status >> 8) & 0xff : nil
}

/// The signal that ended a process, from a `waitpid` status; nil when it exited.
public func terminatingSignal(ofWaitStatus status: Int32) -> Int32? {
    let signal = status & 0x7f
    return signal != 0 && signal != 0x7f ? signal : nil
}

/// Runs a command to completion with its stdout drained and stderr discarded; its exit status,
/// or -1 when it could not start, died of a signal, or ran past `timeoutMilliseconds` (then it
/// is killed).
public func runToCompletion(_ arguments: [String], timeoutMilliseconds: Int32 = 30_000) -> Int32 {
    guard let child = try? SpawnedProcess.spawn(arguments, stderrPath: "/dev/null") else { return -1 }
    guard child.remainingLines(timeoutMilliseconds: timeoutMilliseconds) != nil else {
        child.stop()
        return -1
    }
    return exitCode(ofWaitStatus: child.waitForExit()) ?? -1
}

public func monotonicMilliseconds() -> Int64 {
    var now = timespec()
    clock_gettime(CLOCK_MONOTONIC, &now)
    return Int64(now.tv_sec) * 1000 + Int64(now.tv_nsec) / 1_000_000
}

/// The first `name` on PATH (or in /usr/bin, /bin) that can be executed.
public func findExecutable(_ name: String) -> String? {
    let path = getenv("PATH").map { String(cString: $0) } ?? "/usr/bin:/bin"
    for directory in path.split(separator: ":") + ["/usr/bin", "/bin"] {
        let candidate = "\(directory)/\(name)"
        if access(candidate, X_OK) == 0 { return candidate }
    }
    return nil
}

public struct TimedOut: Error {
    public init() {}
}

/// The next element of a stream (nil when it ended), or `TimedOut` after `timeout`.
public func nextElement<T: Sendable>(_ stream: AsyncStream<T>, timeout: Duration = .seconds(5)) async throws -> T? {
    try await firstElement(of: stream, timeout: timeout) { _ in true }
}

/// The first element of a stream that satisfies `accept` (nil when the stream ended first), or
/// `TimedOut` after `timeout`. One consumer at a time.
public func firstElement<T: Sendable>(of stream: AsyncStream<T>, timeout: Duration = .seconds(5),
                                      where accept: @escaping @Sendable (T) -> Bool) async throws -> T? {
    try await withThrowingTaskGroup(of: T?.self) { group in
        group.addTask {
            for await element in stream where accept(element) { return element }
            return nil
        }
        group.addTask {
            try await Task.sleep(for: timeout)
            throw TimedOut()
        }
        defer { group.cancelAll() }
        return try await group.next()!
    }
}
