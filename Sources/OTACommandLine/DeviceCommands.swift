import ArgumentParser
import Foundation
import GATT
import OTA
import OTADevice
import Simulator

/// The command line's side of a protocol's own device commands (SMP's `otaflash image`, `reset`,
/// `echo`): the options that name one device and reach it (a real one through BlueZ, or with
/// `--simulator` the one the protocol makes), and the output. The command line has one type of
/// these; a protocol's commands are generic over it (`ProtocolCommandLine.commands`).
public protocol DeviceCommandContext: ParsableArguments {
    /// Connects to the device the options name; with `--simulator`, to the device `simulated`
    /// makes of the simulated device's configuration.
    ///
    /// - Throws: `CLIFailure` with the failure's exit code (no device given, not reached).
    func connect(simulated: @escaping @Sendable (SimulatedDeviceConfig) -> any PeripheralModel) async throws(CLIFailure)
        -> (connection: any GATTConnection, address: DeviceAddress)

    /// Whether the device is the simulated one (`--simulator`).
    var simulates: Bool { get }

    /// Runs a command's work with the output its options ask for, then prints its `done` line:
    /// `Done()`, or `Done(failure:)` for the `CLIFailure` the work throws (thrown on).
    func run<Done: CommandDone>(_: Done.Type, _ work: (any CommandOutput) async throws -> Void) async throws
}

/// Where a command's results go: JSON Lines with `--json`, else lines and tables for people.
public protocol CommandOutput: Sendable {
    /// One event line (JSON mode only).
    func json(_ event: some JSONEvent)
    /// The command's result for people (stdout in human mode).
    func result(_ text: String)
    /// A table for people, the first row its heading (human mode only).
    func table(_ rows: [[String]])
    /// A line for people about the work (stderr in human mode).
    func note(_ text: String)
    /// A transfer's progress for people: the bar `otaflash flash` draws on a terminal (human mode only).
    func progress(_ progress: TransferProgress)
}

/// One example of an event a protocol's own commands print, for docs/EVENTS.md and the test that
/// holds the two together.
public struct EventSample: Sendable {
    /// The section of docs/EVENTS.md: "otaflash image".
    public var section: String
    public var event: any JSONEvent

    public init(_ section: String, _ event: any JSONEvent) {
        self.section = section
        self.event = event
    }
}

/// A byte count for people: "512 B", "4.0 KiB", "1.25 MiB".
public func formatBytes(_ n: Int) -> String {
    if n < 1024 { return "\(n) B" }
    if n < 1024 * 1024 { return String(format: "%.1f KiB", Double(n) / 1024) }
    return String(format: "%.2f MiB", Double(n) / 1048576)
}
