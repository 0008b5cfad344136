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

    /// Starts a bus and (unless `fake` is false) the fake with `arguments`. Without dbus-daemon
    /// or a Python that runs the fake, the test is skipped with the reason, or fails when the
    /// bluez suite is required (`Prerequisites`).
    ///
    /// - Parameter denyBlueZ: the bus policy refuses calls to org.bluez (AccessDenied).
    static func start(_ arguments: [String] = [], fake startFake: Bool = true, denyBlueZ: Bool = false) throws -> FakeBlueZ {
        let python = try startFake ? Prerequisites.require(Prerequisites.fakeBlueZPython, for: .bluez) : ""
        let bus = try PrivateBus.start(for: .bluez, denying: denyBlueZ ? ["org.bluez"] : [])
        let address = bus.address
        let directory = bus.directory
        guard startFake else { return FakeBlueZ(bus: bus, address: address, fake: nil, directory: directory) }
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

/// Runs `body` with a fresh bus and fake, stopped afterwards (`FakeBlueZ.start` says what
/// happens when they cannot run on this machine).
func withFake(_ arguments: [String] = [], fake: Bool = true, denyBlueZ: Bool = false,
              _ body: (FakeBlueZ) async throws -> Void) async throws {
    let setup = try FakeBlueZ.start(arguments, fake: fake, denyBlueZ: denyBlueZ)
    defer { setup.stop() }
    setenv("OTAFLASH_DBUS_ADDRESS", setup.address, 1)
    defer { unsetenv("OTAFLASH_DBUS_ADDRESS") }
    try await body(setup)
}
