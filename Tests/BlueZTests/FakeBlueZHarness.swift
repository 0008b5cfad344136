import Foundation
import Synchronization
import TestSupport
import Testing

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

func centralTestMilliseconds() -> Int64 { monotonicMilliseconds() }

func centralTestFindExecutable(_ name: String) -> String? { findExecutable(name) }

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
    let bus: PrivateBus
    let address: String
    let fake: SpawnedProcess?
    let directory: String

    var logPath: String { "\(directory)/fake.log" }
    var imagePath: String { "\(directory)/activated.bin" }
    var stderrPath: String { "\(directory)/fake.stderr" }

    private init(bus: PrivateBus, address: String, fake: SpawnedProcess?, directory: String) {
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
        guard let privateBus = try PrivateBus.start(denying: denyBlueZ ? ["org.bluez"] : []) else {
            throw HarnessError("dbus-daemon is not installed")
        }
        let bus = privateBus
        let address = privateBus.address
        let directory = privateBus.directory
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
    }
}

/// The suites that point otaflash at a private bus through the process-wide
/// `OTAFLASH_DBUS_ADDRESS`: they run one after another, never beside each other (Swift Testing runs
/// separate suites in parallel).
@Suite(.serialized)
enum ProcessBusSuites {}

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
