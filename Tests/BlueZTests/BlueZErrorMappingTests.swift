@testable import BlueZ
import DBus
import Foundation
import GATT
import OTA
import OTAFlashCLI
import TestSupport
import Testing

/// A bluetoothd that is not running, or that the bus cannot start, is "Bluetooth unavailable"
/// (exit 11) with the fix, whatever name the bus gives the failure.
@Suite struct BlueZErrorMappingTests {
    /// What buses answer when nothing owns org.bluez and activation fails, as seen in the wild.
    static let stackMissing: [DBusError] = [
        DBusError(name: "org.freedesktop.DBus.Error.ServiceUnknown", message: "The name org.bluez was not provided by any .service files"),
        DBusError(name: "org.freedesktop.DBus.Error.NameHasNoOwner", message: "Could not activate remote peer 'org.bluez': activation request failed: unknown unit"),
        DBusError(name: "org.freedesktop.DBus.Error.Spawn.ChildExited", message: "Process org.bluez exited with status 1"),
        DBusError(name: "org.freedesktop.DBus.Error.Spawn.ChildSignaled", message: "Process org.bluez received signal 11"),
        DBusError(name: "org.freedesktop.DBus.Error.Spawn.ExecFailed", message: "Failed to execute program org.bluez: No such file or directory"),
        DBusError(name: "org.freedesktop.DBus.Error.Spawn.ServiceNotFound", message: "The service file for org.bluez was not found"),
        DBusError(name: "org.freedesktop.systemd1.NoSuchUnit", message: "Unit dbus-org.bluez.service not found."),
        DBusError(name: "org.freedesktop.DBus.Error.TimedOut", message: "Failed to activate service 'org.bluez': timed out (service_start_timeout=25000ms)"),
    ]

    @Test(arguments: stackMissing)
    func activationFailuresMeanBluetoothdIsNotRunning(_ error: DBusError) {
        let mapped = BlueZErrors.map(error, "listing BlueZ's objects")
        #expect(mapped.code == .stackUnavailable, "\(error)")
        #expect(mapped.message.hasPrefix("bluetoothd is not running (org.bluez: "), "\(mapped.message)")
        #expect(mapped.message.contains(error.message), "the bus's words are kept: \(mapped.message)")
        #expect(mapped.message.contains("systemctl"), "\(mapped.message)")
        #expect(!mapped.message.contains("\n"))
        let failure = OTAError.from(mapped, device: "AA:BB:CC:DD:EE:FF")
        #expect(failure.code == .bluetoothUnavailable)
        #expect(ExitCode(failure.code) == .bluetoothUnavailable && ExitCode.bluetoothUnavailable.rawValue == 11)
        // Connecting maps the same way, not as a connection failure.
        #expect(BlueZErrors.mapConnect(error, device: "AA:BB:CC:DD:EE:FF", adapter: "hci0", timeout: .seconds(5)).code == .stackUnavailable)
        // Peripheral mode says the same.
        #expect(PeripheralError.from(error, "listing BlueZ adapters").message == mapped.message)
    }

    /// A missing systemd unit alias only exists while bluetooth.service is enabled: enable it too.
    @Test func aMissingSystemdUnitIsFixedByEnablingTheService() {
        let unit = BlueZErrors.map(Self.stackMissing[6], "listing BlueZ's objects")
        #expect(unit.message.hasSuffix("start it with `systemctl enable --now bluetooth`"), "\(unit.message)")
        let spawn = BlueZErrors.map(Self.stackMissing[2], "listing BlueZ's objects")
        #expect(spawn.message == "bluetoothd is not running (org.bluez: Spawn.ChildExited: Process org.bluez exited with status 1); start it with `systemctl start bluetooth`")
    }

    /// Timeouts and failures that are not about starting bluetoothd keep their own class.
    @Test(arguments: [
        (DBusError(name: "org.freedesktop.DBus.Error.NoReply", message: "Did not receive a reply"), GATTError.Code.timeout),
        (DBusError(name: "org.freedesktop.DBus.Error.TimedOut", message: "Operation timed out"), .timeout),
        (DBusError(name: "org.bluez.Error.Failed", message: "Operation failed"), .failed),
        (DBusError(name: "org.freedesktop.DBus.Error.UnknownObject", message: "no such object"), .failed),
    ])
    func otherErrorsAreNotTheStack(_ error: DBusError, _ code: GATTError.Code) {
        #expect(BlueZErrors.map(error, "reading").code == code)
        #expect(!error.isActivationFailure)
    }
}

/// The whole path on a real bus: org.bluez has an activation file whose program exits at once,
/// as when bluetoothd crashes on start, so the bus answers `Spawn.ChildExited`.
extension ProcessBusSuites {
    @Suite(.serialized)
    struct BluetoothdNotRunningTests {
        static let image = "\(centralTestPackageRoot)/firmware-samples/seeded-4k.bin"

        /// Starts a bus where org.bluez is activatable through `exec` (or not at all), runs `otaflash
        /// arguments` in process against it, and returns the exit code and stderr.
        static func otaflash(_ arguments: [String], activation exec: String?) async throws -> (Int32, String) {
            let services = FileManager.default.temporaryDirectory.appendingPathComponent("otaflash-services-\(UUID().uuidString)").path
            try FileManager.default.createDirectory(atPath: services, withIntermediateDirectories: true)
            defer { try? FileManager.default.removeItem(atPath: services) }
            if let exec {
                try "[D-BUS Service]\nName=org.bluez\nExec=\(exec)\n".write(toFile: "\(services)/org.bluez.service", atomically: true, encoding: .utf8)
            }
            let bus = try PrivateBus.start(for: .bluez, serviceDirectory: services)
            defer { bus.stop() }
            setenv("OTAFLASH_DBUS_ADDRESS", bus.address, 1)
            defer { unsetenv("OTAFLASH_DBUS_ADDRESS") }
            let output = CapturedOutput()
            let code = await runOtaflash(arguments, output: output)
            return (code, output.stderr)
        }

        @Test func aFailedActivationOfOrgBluezExitsBluetoothUnavailable() async throws {
            let falseProgram = try #require(findExecutable("false"))
            let (code, err) = try await Self.otaflash(["--device", "AA:BB:CC:DD:EE:FF", "--quiet", "--journal-dir", NSTemporaryDirectory() + "otaflash-journal-\(UUID().uuidString)", Self.image],
                                                      activation: falseProgram)
            #expect(code == 11, "\(err)")
            #expect(err.split(separator: "\n").count == 1, "\(err)")
            #expect(err.contains("bluetoothd is not running (org.bluez: Spawn.ChildExited"), "\(err)")
            #expect(err.contains("start it with `systemctl start bluetooth`"), "\(err)")
        }

        @Test func noOwnerAndNoActivationFileExitsBluetoothUnavailable() async throws {
            let (code, err) = try await Self.otaflash(["info", "--device", "AA:BB:CC:DD:EE:FF", "--quiet"], activation: nil)
            #expect(code == 11, "\(err)")
            #expect(err.split(separator: "\n").count == 1, "\(err)")
            #expect(err.contains("bluetoothd is not running (org.bluez: ServiceUnknown"), "\(err)")
        }
    }
}
