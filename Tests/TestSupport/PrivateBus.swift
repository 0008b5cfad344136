import DBus
import Foundation

/// A private `dbus-daemon` for one test, listening on a unix socket in a temporary folder; its
/// address is read from `--print-address` with a timeout and it is stopped with SIGKILL by PID.
public final class PrivateBus: Sendable {
    public let address: String
    public let directory: String
    private let process: SpawnedProcess

    public var pid: Int32 { process.pid }

    private init(address: String, directory: String, process: SpawnedProcess) {
        self.address = address
        self.directory = directory
        self.process = process
    }

    /// Starts a daemon for a test of `suite`. Without a dbus-daemon the test is skipped with the
    /// reason, or fails when the suite is required (`Prerequisites`).
    ///
    /// - Parameters:
    ///   - denying: bus names whose methods the policy refuses (AccessDenied), to provoke
    ///     permission errors.
    ///   - serviceDirectory: a folder of `.service` files the bus may start on demand (activation).
    public static func start(for suite: MachineSuite, denying: [String] = [], serviceDirectory: String? = nil,
                             timeoutMilliseconds: Int32 = 5000) throws -> PrivateBus {
        let daemon = try Prerequisites.require(Prerequisites.dbusDaemon(), for: suite)
        var template = Array("/tmp/otaflash-bus-XXXXXX".utf8CString)
        guard let made = mkdtemp(&template) else { throw HarnessError("mkdtemp failed") }
        let directory = String(cString: made)
        let deny = denying.map { #"<deny send_destination="\#($0)"/>"# }.joined()
        let config = """
            <!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
             "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
            <busconfig>
              <type>session</type>
              <listen>unix:path=\(directory)/bus</listen>
              <auth>EXTERNAL</auth>
              \(serviceDirectory.map { "<servicedir>\($0)</servicedir>" } ?? "")
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
        let process = try SpawnedProcess.spawn([daemon, "--config-file=\(directory)/bus.conf", "--print-address=1", "--nofork", "--nopidfile"],
                                               stderrPath: "/dev/null")
        guard let address = process.waitForLine(timeoutMilliseconds: timeoutMilliseconds, { !$0.isEmpty }) else {
            process.stop()
            try? FileManager.default.removeItem(atPath: directory)
            throw HarnessError("dbus-daemon did not print its address within \(timeoutMilliseconds) ms")
        }
        return PrivateBus(address: address, directory: directory, process: process)
    }

    public func stop() {
        process.stop()
        try? FileManager.default.removeItem(atPath: directory)
    }

    public func connect() async throws -> DBusConnection {
        try await DBusConnection.connect(address: address)
    }
}
