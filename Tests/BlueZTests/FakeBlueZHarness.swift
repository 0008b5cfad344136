import Foundation
import Synchronization

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// The package's root directory (this file is Tests/BlueZTests/FakeBlueZHarness.swift).
let centralTestPackageRoot: String = {
    var url = URL(fileURLWithPath: #filePath)
    for _ in 0..<3 { url.deleteLastPathComponent() }
    return url.path
}()

struct HarnessError: Error, CustomStringConvertible {
    var description: String
    init(_ description: String) { self.description = description }
}

/// A spawned child process whose stdout we read line by line; stopped with SIGKILL by PID.
final class SpawnedProcess: Sendable {
    let pid: pid_t
    let stdoutFD: Int32
    private let stopped = Mutex(false)

    private init(pid: pid_t, stdoutFD: Int32) {
        self.pid = pid
        self.stdoutFD = stdoutFD
    }

    /// Spawns `arguments[0]` with an empty signal mask and default dispositions, stdout on a pipe,
    /// stderr to `stderrPath` (or inherited).
    static func spawn(_ arguments: [String], stderrPath: String? = nil) throws -> SpawnedProcess {
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

    /// Reads stdout until a line satisfying `accept` arrives, at most `timeoutMilliseconds`.
    func waitForLine(timeoutMilliseconds: Int32, _ accept: (String) -> Bool) -> String? {
        var buffer: [UInt8] = []
        var left = timeoutMilliseconds
        while left > 0 {
            if let newline = buffer.firstIndex(of: UInt8(ascii: "\n")) {
                let line = String(decoding: buffer[..<newline], as: UTF8.self)
                buffer.removeSubrange(...newline)
                if accept(line) { return line }
                continue
            }
            var pfd = pollfd(fd: stdoutFD, events: Int16(POLLIN), revents: 0)
            let started = centralTestMilliseconds()
            let ready = poll(&pfd, 1, left)
            left -= Int32(centralTestMilliseconds() - started)
            guard ready > 0 else { continue }
            var chunk = [UInt8](repeating: 0, count: 4096)
            let count = read(stdoutFD, &chunk, chunk.count)
            if count <= 0 { return nil }
            buffer += chunk[0..<count]
        }
        return nil
    }

    func stop() {
        guard stopped.withLock({ (done: inout Bool) -> Bool in defer { done = true }; return !done }) else { return }
        kill(pid, SIGKILL)
        waitpid(pid, nil, 0)
        close(stdoutFD)
    }
}

func centralTestMilliseconds() -> Int64 {
    var now = timespec()
    clock_gettime(CLOCK_MONOTONIC, &now)
    return Int64(now.tv_sec) * 1000 + Int64(now.tv_nsec) / 1_000_000
}

func centralTestFindExecutable(_ name: String) -> String? {
    let path = getenv("PATH").map { String(cString: $0) } ?? "/usr/bin:/bin"
    for directory in path.split(separator: ":") + ["/usr/bin", "/bin"] {
        let candidate = "\(directory)/\(name)"
        if access(candidate, X_OK) == 0 { return candidate }
    }
    return nil
}

/// Runs a command to completion (for the one-time Python setup); returns its exit status.
func centralTestRun(_ arguments: [String]) -> Int32 {
    guard let child = try? SpawnedProcess.spawn(arguments, stderrPath: "/dev/null") else { return -1 }
    // Drain stdout so the child cannot block on a full pipe.
    var chunk = [UInt8](repeating: 0, count: 4096)
    while read(child.stdoutFD, &chunk, chunk.count) > 0 {}
    var status: Int32 = 0
    waitpid(child.pid, &status, 0)
    close(child.stdoutFD)
    return (status & 0x7f) == 0 ? (status >> 8) & 0xff : -1
}

/// The Python interpreter that runs the fake: one that can `import dbus_fast`. When none can, a
/// venv is made under `.build/bluez-fake-venv` from `/usr/bin/python3` (or `python3` on PATH)
/// and `dbus-fast` is installed into it from PyPI. Nil, with the reason, when that fails.
enum FakePython {
    static let resolved: Result<String, HarnessError> = {
        let venv = "\(centralTestPackageRoot)/.build/bluez-fake-venv"
        let venvPython = "\(venv)/bin/python"
        var candidates: [String] = []
        if access(venvPython, X_OK) == 0 { candidates.append(venvPython) }
        if let python = centralTestFindExecutable("python3") { candidates.append(python) }
        for python in candidates where centralTestRun([python, "-c", "import dbus_fast"]) == 0 {
            return .success(python)
        }
        let base = access("/usr/bin/python3", X_OK) == 0 ? "/usr/bin/python3" : centralTestFindExecutable("python3")
        guard let base else {
            return .failure(HarnessError("python3 is not installed (apt-get install python3 python3-venv)"))
        }
        if access(venvPython, X_OK) != 0 {
            guard centralTestRun([base, "-m", "venv", venv]) == 0 else {
                return .failure(HarnessError("`\(base) -m venv \(venv)` failed (apt-get install python3-venv)"))
            }
        }
        guard centralTestRun([venvPython, "-m", "pip", "install", "--quiet", "dbus-fast"]) == 0,
              centralTestRun([venvPython, "-c", "import dbus_fast"]) == 0 else {
            return .failure(HarnessError("installing dbus-fast into \(venv) with pip failed (no network to PyPI?)"))
        }
        return .success(venvPython)
    }()
}

/// A private dbus-daemon plus, optionally, the fake bluetoothd on it.
final class FakeBlueZ: Sendable {
    let bus: SpawnedProcess
    let address: String
    let fake: SpawnedProcess?
    let directory: String

    var logPath: String { "\(directory)/fake.log" }
    var imagePath: String { "\(directory)/activated.bin" }
    var stderrPath: String { "\(directory)/fake.stderr" }

    private init(bus: SpawnedProcess, address: String, fake: SpawnedProcess?, directory: String) {
        self.bus = bus
        self.address = address
        self.fake = fake
        self.directory = directory
    }

    /// Why the BlueZ tests cannot run here, or nil when they can.
    static var skipReason: String? {
        if centralTestFindExecutable("dbus-daemon") == nil { return "dbus-daemon is not installed (apt-get install dbus-daemon)" }
        if case .failure(let error) = FakePython.resolved { return error.description }
        return nil
    }

    /// Starts a bus and (unless `fake` is false) the fake with `arguments`.
    ///
    /// - Parameter denyBlueZ: the bus policy refuses calls to org.bluez (AccessDenied).
    static func start(_ arguments: [String] = [], fake startFake: Bool = true, denyBlueZ: Bool = false) throws -> FakeBlueZ {
        guard let daemon = centralTestFindExecutable("dbus-daemon") else { throw HarnessError("dbus-daemon is not installed") }
        var template = Array("/tmp/otaflash-bluez-XXXXXX".utf8CString)
        guard let made = mkdtemp(&template) else { throw HarnessError("mkdtemp failed") }
        let directory = String(cString: made)
        let deny = denyBlueZ ? #"<deny send_destination="org.bluez"/>"# : ""
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
                \(deny)
              </policy>
              <limit name="max_replies_per_connection">100000</limit>
            </busconfig>
            """
        try config.write(toFile: "\(directory)/bus.conf", atomically: true, encoding: .utf8)
        let bus = try SpawnedProcess.spawn([daemon, "--config-file=\(directory)/bus.conf", "--print-address=1", "--nofork", "--nopidfile"],
                                  stderrPath: "/dev/null")
        guard let address = bus.waitForLine(timeoutMilliseconds: 5000, { !$0.isEmpty }) else {
            bus.stop()
            throw HarnessError("dbus-daemon did not print its address in time")
        }
        guard startFake else { return FakeBlueZ(bus: bus, address: address, fake: nil, directory: directory) }
        let python: String
        switch FakePython.resolved {
        case .success(let p): python = p
        case .failure(let error):
            bus.stop()
            throw error
        }
        let script = "\(centralTestPackageRoot)/Tests/BlueZTests/fake_bluez/fake_bluez.py"
        let fake = try SpawnedProcess.spawn([python, script, "--bus", address, "--log", "\(directory)/fake.log",
                                    "--image-out", "\(directory)/activated.bin"] + arguments,
                                   stderrPath: "\(directory)/fake.stderr")
        guard fake.waitForLine(timeoutMilliseconds: 20000, { $0 == "READY" }) != nil else {
            let stderr = (try? String(contentsOfFile: "\(directory)/fake.stderr", encoding: .utf8)) ?? ""
            fake.stop()
            bus.stop()
            throw HarnessError("the fake bluetoothd did not start: \(stderr)")
        }
        return FakeBlueZ(bus: bus, address: address, fake: fake, directory: directory)
    }

    var log: String { (try? String(contentsOfFile: logPath, encoding: .utf8)) ?? "" }
    var activatedImage: [UInt8]? { FileManager.default.contents(atPath: imagePath).map { [UInt8]($0) } }

    /// Kills the fake only (bluetoothd "crashes").
    func killFake() { fake?.stop() }

    func stop() {
        fake?.stop()
        bus.stop()
        try? FileManager.default.removeItem(atPath: directory)
    }
}

/// Runs `body` with a fresh bus and fake, stopped afterwards; prints why and returns when the
/// tests cannot run on this machine.
func withFake(_ arguments: [String] = [], fake: Bool = true, denyBlueZ: Bool = false,
              _ body: (FakeBlueZ) async throws -> Void) async throws {
    if let reason = FakeBlueZ.skipReason {
        print("SKIPPED: \(reason); the BlueZ transport test was not run")
        return
    }
    let setup = try FakeBlueZ.start(arguments, fake: fake, denyBlueZ: denyBlueZ)
    defer { setup.stop() }
    setenv("OTAFLASH_DBUS_ADDRESS", setup.address, 1)
    defer { unsetenv("OTAFLASH_DBUS_ADDRESS") }
    try await body(setup)
}
