import DBus
import Synchronization
import Testing

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// A private `dbus-daemon` for one test, listening on a unix socket in a temporary directory.
///
/// The daemon is spawned with an empty signal mask and default dispositions (a child started from
/// a thread that blocks SIGTERM would otherwise ignore it), its address is read from
/// `--print-address` with a timeout, and it is stopped with SIGKILL by PID.
final class TestBus: Sendable {
    let pid: pid_t
    let address: String
    private let directory: String
    private let stdoutFD: Int32
    private let stopped = Mutex(false)

    private init(pid: pid_t, address: String, directory: String, stdoutFD: Int32) {
        self.pid = pid
        self.address = address
        self.directory = directory
        self.stdoutFD = stdoutFD
    }

    static func daemonPath() -> String? {
        let path = String(cString: getenv("PATH") ?? strdup("/usr/bin:/bin"))
        for directory in path.split(separator: ":") + ["/usr/bin", "/bin"] {
            let candidate = "\(directory)/dbus-daemon"
            if access(candidate, X_OK) == 0 { return candidate }
        }
        return nil
    }

    struct StartError: Error, CustomStringConvertible {
        var description: String
    }

    /// Starts a daemon, or returns nil (after printing why) when dbus-daemon is not installed.
    static func start(timeoutMilliseconds: Int32 = 5000) throws -> TestBus? {
        guard let daemon = daemonPath() else {
            print("SKIPPED: dbus-daemon is not installed (apt-get install dbus-daemon); D-Bus test not run")
            return nil
        }
        var template = Array("/tmp/otaflash-dbus-XXXXXX".utf8CString)
        guard let made = mkdtemp(&template) else { throw StartError(description: "mkdtemp failed") }
        let directory = String(cString: made)
        let config = """
            <!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
             "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
            <busconfig>
              <type>session</type>
              <listen>unix:path=\(directory)/bus</listen>
              <auth>EXTERNAL</auth>
              <policy context="default">
                <allow send_destination="*" eavesdrop="true"/>
                <allow eavesdrop="true"/>
                <allow own="*"/>
              </policy>
              <limit name="max_replies_per_connection">100000</limit>
            </busconfig>
            """
        let configPath = "\(directory)/bus.conf"
        guard let file = fopen(configPath, "w") else { throw StartError(description: "cannot write \(configPath)") }
        fputs(config, file)
        fclose(file)

        var pipeFDs: [Int32] = [0, 0]
        guard pipe(&pipeFDs) == 0 else { throw StartError(description: "pipe failed") }
        let (readEnd, writeEnd) = (pipeFDs[0], pipeFDs[1])

        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_adddup2(&actions, writeEnd, 1)
        posix_spawn_file_actions_addclose(&actions, readEnd)
        posix_spawn_file_actions_addclose(&actions, writeEnd)

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

        let arguments = [daemon, "--config-file=\(configPath)", "--print-address=1", "--nofork", "--nopidfile"]
        var argv: [UnsafeMutablePointer<CChar>?] = arguments.map { strdup($0) } + [nil]
        defer { for pointer in argv { free(pointer) } }
        var pid: pid_t = 0
        let status = posix_spawn(&pid, daemon, &actions, &attributes, &argv, environ)
        close(writeEnd)
        guard status == 0 else {
            close(readEnd)
            throw StartError(description: "posix_spawn(dbus-daemon) failed: \(status)")
        }

        // Read the address line, waiting at most timeoutMilliseconds in total.
        var line: [UInt8] = []
        var deadline = timeoutMilliseconds
        while !line.contains(UInt8(ascii: "\n")) {
            var pollFD = pollfd(fd: readEnd, events: Int16(POLLIN), revents: 0)
            let started = monotonicMilliseconds()
            let ready = poll(&pollFD, 1, deadline)
            deadline -= Int32(monotonicMilliseconds() - started)
            var buffer = [UInt8](repeating: 0, count: 512)
            let count = ready > 0 ? read(readEnd, &buffer, buffer.count) : 0
            if count <= 0 || deadline <= 0 {
                kill(pid, SIGKILL)
                waitpid(pid, nil, 0)
                close(readEnd)
                throw StartError(description: "dbus-daemon did not print its address in time")
            }
            line += buffer[0..<count]
        }
        let address = String(decoding: line.prefix { $0 != UInt8(ascii: "\n") }, as: UTF8.self)
        return TestBus(pid: pid, address: address, directory: directory, stdoutFD: readEnd)
    }

    /// Kills the daemon (once; later calls do nothing, so the PID is never reused by mistake).
    func stop() {
        guard stopped.withLock({ (done: inout Bool) -> Bool in defer { done = true }; return !done }) else { return }
        kill(pid, SIGKILL)
        waitpid(pid, nil, 0)
        close(stdoutFD)
        unlink("\(directory)/bus")
        unlink("\(directory)/bus.conf")
        rmdir(directory)
    }

    func connect() async throws -> DBusConnection {
        try await DBusConnection.connect(address: address)
    }
}

func monotonicMilliseconds() -> Int64 {
    var now = timespec()
    clock_gettime(CLOCK_MONOTONIC, &now)
    return Int64(now.tv_sec) * 1000 + Int64(now.tv_nsec) / 1_000_000
}

/// Runs `body` against a fresh private bus, which is killed afterwards even if `body` throws.
func withTestBus(_ body: (TestBus) async throws -> Void) async throws {
    guard let bus = try TestBus.start() else { return }
    defer { bus.stop() }
    try await body(bus)
}

/// Waits for the next element of a stream, failing after `timeout`.
func next<T: Sendable>(_ stream: AsyncStream<T>, timeout: Duration = .seconds(5)) async throws -> T? {
    try await withThrowingTaskGroup(of: T?.self) { group in
        group.addTask {
            var iterator = stream.makeAsyncIterator()
            return await iterator.next()
        }
        group.addTask {
            try await Task.sleep(for: timeout)
            throw TimedOut()
        }
        defer { group.cancelAll() }
        return try await group.next()!
    }
}

struct TimedOut: Error {}
