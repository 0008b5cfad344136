import ArgumentParser
import BlueZ
import GATT
import Logging

/// Options of the BlueZ transport.
public struct BlueZTransportOptions: ParsableArguments {
    @Option(name: .customLong("write-path"),
            help: ArgumentHelp("How data packets reach bluetoothd: acquire-write (a socket from AcquireWrite, falling back to write-value when BlueZ refuses it) or write-value (one WriteValue D-Bus call per packet).",
                               valueName: "acquire-write|write-value"))
    public var writePath: BlueZCentral.WritePath = .acquireWrite

    public init() {}
}

extension BlueZCentral.WritePath: ExpressibleByArgument {
    public init?(argument: String) { self.init(rawValue: argument) }
    public static var allValueStrings: [String] { allCases.map(\.rawValue) }
}

extension TargetOptions {
    /// A BlueZ central on `--adapter` (default: the first powered adapter). The bus is the system
    /// bus, or the address in `OTAFLASH_DBUS_ADDRESS`.
    func bluezCentral() -> any GATTCentral {
        bluezCentral(adapter: adapter)
    }

    /// A BlueZ central on one adapter of a batch.
    func bluezCentral(adapter: String?) -> any GATTCentral {
        OTAFlashCLI.bluezCentral(adapter: adapter, writePath: bluez.writePath)
    }
}

/// A BlueZ central on `adapter` (default: the first powered adapter); `scan` and `info` only read,
/// so the write path does not matter to them.
func bluezCentral(adapter: String?, writePath: BlueZCentral.WritePath = .acquireWrite) -> any GATTCentral {
    BlueZCentral(adapter: adapter, writePath: writePath,
                 logger: Logger(label: "otaflash.bluez", factory: { _ in SwiftLogNoOpLogHandler() }))
}
