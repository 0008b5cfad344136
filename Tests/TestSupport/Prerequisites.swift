import Foundation
import Testing

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// The test suites that need something from the machine besides the toolchain: a `dbus-daemon`,
/// Python with `dbus_fast` for the fake bluetoothd, a PostgreSQL server. scripts/deps.sh installs all of it.
public enum MachineSuite: String, CaseIterable, Sendable {
    /// Tests/DBusTests: the libdbus wrapper against a private dbus-daemon.
    case dbus
    /// Tests/BlueZTests/CentralTests: the BlueZ central against fake_bluez.py on a private bus.
    case bluez
    /// Tests/BlueZTests/PeripheralTests: peripheral mode against a stand-in bluetoothd on a private bus.
    case peripheral
    /// Tests/LedgerTests/PostgresLedgerTests: the PostgreSQL ledger against a private server
    /// (Debian's postgresql, started by scripts/pg-server).
    case postgres
    /// Tests/CLITests/MetricsTests: `station --metrics` checked by Prometheus' `promtool check
    /// metrics` (Debian's prometheus).
    case promtool
}

/// What a machine suite needs, and what happens when it is missing.
///
/// A missing prerequisite skips the test with the reason (`Test.cancel`, shown as a skip in the
/// test output), never a silent pass. When `OTAFLASH_REQUIRED_SUITES` names the suite (a comma
/// list of `MachineSuite` names, or `all`; scripts/test sets `all` under CI), the test fails
/// instead, so a CI run cannot turn green without having run it.
public enum Prerequisites {
    /// The variable that makes suites required.
    public static let requiredVariable = "OTAFLASH_REQUIRED_SUITES"
    /// The variable that names the dbus-daemon to run instead of the one on PATH (a missing path
    /// shows what a machine without dbus-daemon does).
    public static let daemonVariable = "OTAFLASH_TEST_DBUS_DAEMON"

    /// The suites `OTAFLASH_REQUIRED_SUITES` names; an unknown name is a failure of its own.
    public static func requiredSuites() throws -> Set<MachineSuite> {
        guard let value = environment(requiredVariable) else { return [] }
        var suites: Set<MachineSuite> = []
        for name in value.split(separator: ",").map({ $0.trimmingCharacters(in: .whitespaces).lowercased() }) where !name.isEmpty {
            if name == "all" {
                suites.formUnion(MachineSuite.allCases)
            } else if let suite = MachineSuite(rawValue: name) {
                suites.insert(suite)
            } else {
                throw HarnessError("\(requiredVariable)=\(value): unknown suite '\(name)' (known: all, "
                                   + MachineSuite.allCases.map(\.rawValue).joined(separator: ", ") + ")")
            }
        }
        return suites
    }

    /// The dbus-daemon executable, or why there is none.
    public static func dbusDaemon() -> Result<String, HarnessError> {
        if let chosen = environment(daemonVariable) {
            return access(chosen, X_OK) == 0 ? .success(chosen)
                : .failure(HarnessError("dbus-daemon is not executable at \(chosen) (\(daemonVariable))"))
        }
        guard let found = findExecutable("dbus-daemon") else {
            return .failure(HarnessError("dbus-daemon is not installed (apt-get install dbus-daemon, or run scripts/deps.sh)"))
        }
        return .success(found)
    }

    /// The Python interpreter that runs Tests/BlueZTests/fake_bluez: the first of Debian's
    /// `/usr/bin/python3` and `python3` on PATH that can `import dbus_fast` (Debian's
    /// python3-dbus-fast, which scripts/deps.sh installs; nothing is fetched from the network).
    public static let fakeBlueZPython: Result<String, HarnessError> = {
        var candidates: [String] = []
        if access("/usr/bin/python3", X_OK) == 0 { candidates.append("/usr/bin/python3") }
        if let python = findExecutable("python3"), !candidates.contains(python) { candidates.append(python) }
        guard !candidates.isEmpty else {
            return .failure(HarnessError("python3 is not installed (apt-get install python3 python3-dbus-fast, or run scripts/deps.sh)"))
        }
        for python in candidates where runToCompletion([python, "-c", "import dbus_fast"]) == 0 {
            return .success(python)
        }
        return .failure(HarnessError("no python3 here can import dbus_fast (tried \(candidates.joined(separator: ", "))); "
                                     + "apt-get install python3-dbus-fast, or run scripts/deps.sh"))
    }()

    /// Why `suite` cannot run on this machine, or nil when it can.
    public static func missing(_ suite: MachineSuite) -> String? {
        if suite == .postgres {
            if case .failure(let why) = PostgresServer.bin { return why.description }
            return nil
        }
        if suite == .promtool {
            return findExecutable("promtool") == nil ? "promtool is not installed (apt-get install prometheus, or run scripts/deps.sh)" : nil
        }
        var checks: [Result<String, HarnessError>] = [dbusDaemon()]
        if suite == .bluez { checks.append(fakeBlueZPython) }
        for case .failure(let why) in checks { return why.description }
        return nil
    }

    /// Ends the current test because `suite` cannot run here: a skip that prints `reason`, or a
    /// failure when the suite is required.
    public static func unavailable(_ suite: MachineSuite, _ reason: String) throws -> Never {
        if try requiredSuites().contains(suite) {
            throw HarnessError("the \(suite.rawValue) suite is required (\(requiredVariable)=\(environment(requiredVariable) ?? "")) but cannot run: \(reason)")
        }
        try Test.cancel(Comment(rawValue: "\(suite.rawValue) suite not run: \(reason); set \(requiredVariable)=\(suite.rawValue) to make this a failure"))
    }

    /// Returns `value`, or ends the test as `unavailable` does when it is a failure.
    public static func require<T>(_ value: Result<T, HarnessError>, for suite: MachineSuite) throws -> T {
        switch value {
        case .success(let v): return v
        case .failure(let why): try unavailable(suite, why.description)
        }
    }

    private static func environment(_ name: String) -> String? {
        guard let value = getenv(name) else { return nil }
        let string = String(cString: value)
        return string.isEmpty ? nil : string
    }
}

extension Trait where Self == ConditionTrait {
    /// Skips a suite or test of `suite`, printing the reason, when the machine lacks what it
    /// needs, unless the suite is required: then it runs, and fails on the missing piece.
    public static func needs(_ suite: MachineSuite) -> ConditionTrait {
        let reason = Prerequisites.missing(suite)
        let required = (try? Prerequisites.requiredSuites().contains(suite)) ?? true
        return .enabled(if: reason == nil || required,
                        Comment(rawValue: "\(suite.rawValue) suite not run: \(reason ?? ""); set \(Prerequisites.requiredVariable)=\(suite.rawValue) to make this a failure"))
    }
}
