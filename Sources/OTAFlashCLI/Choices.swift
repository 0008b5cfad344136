import ArgumentParser
import BlueZ
import GATT
import Ledger
import OTA
import OTACommandLine
import OTAWire
import Simulator

// Every option that takes one of a fixed set of values has a type here (or a conformance): the
// values are listed once, ArgumentParser shows them in the help and the completions, and refuses
// anything else with a line that names them ("Please provide one of 'a', 'b' or 'c'").

/// `flash --protocol`: `auto`, or one of the protocols the command line speaks (their names come
/// from the registry, `ProtocolRegistry.cli`).
struct ProtocolChoice: ExpressibleByArgument, Hashable, Sendable, CustomStringConvertible {
    let name: String

    static let auto = ProtocolChoice(checked: ProtocolRegistry.auto)

    private init(checked name: String) { self.name = name }

    init?(argument: String) {
        guard Self.allValueStrings.contains(argument) else { return nil }
        name = argument
    }

    static var allValueStrings: [String] { [ProtocolRegistry.auto] + ProtocolRegistry.cli.names }
    static var defaultCompletionKind: CompletionKind { .list(allValueStrings) }
    var defaultValueDescription: String { name }
    var description: String { name }
}

/// `simulate --protocol`: the protocol the served device speaks (no `auto`: there is no image to
/// pick it from).
struct ServedProtocol: ExpressibleByArgument, Hashable, Sendable, CustomStringConvertible {
    let name: String

    private init(checked name: String) { self.name = name }

    /// The default: the first protocol registered, otaflash's own.
    static let native = ServedProtocol(checked: ProtocolCommandLine.all[0].name)

    init?(argument: String) {
        guard Self.allValueStrings.contains(argument) else { return nil }
        name = argument
    }

    static var allValueStrings: [String] { ProtocolRegistry.cli.names }
    static var defaultCompletionKind: CompletionKind { .list(allValueStrings) }
    var defaultValueDescription: String { name }
    var description: String { name }
}

/// `--skip-if-version`: a firmware version, or `image` for the version the image carries.
enum SkipVersion: ExpressibleByArgument, Hashable, Sendable {
    case version(FirmwareVersion)
    case imageOwn

    init?(argument: String) {
        if argument == "image" {
            self = .imageOwn
        } else if let version = FirmwareVersion(argument) {
            self = .version(version)
        } else {
            return nil
        }
    }

    /// What the line that refuses another value says is expected.
    static var expected: String { "a version like 1.2.3, or 'image' (the version in \(ProtocolTexts.imageVersions(ProtocolCommandLine.all)))" }
}

/// `--sim-device-fault N:mode`: simulated device N (1-based) of a batch fails in that way.
struct SimulatedDeviceFault: ExpressibleByArgument, Hashable, Sendable {
    enum Mode: String, CaseIterable, Sendable {
        /// It does not expose the protocol's service.
        case noOTAService = "no-ota-service"
        /// Its slot is smaller than the image.
        case smallSlot = "small-slot"
        /// Its link drops and it never comes back.
        case gone
    }

    let device: Int
    let mode: Mode

    init?(argument: String) {
        let parts = argument.split(separator: ":", maxSplits: 1).map(String.init)
        guard parts.count == 2, let device = Int(parts[0]), Ranges.simDevice.range.contains(device),
              let mode = Mode(rawValue: parts[1]) else { return nil }
        self.device = device
        self.mode = mode
    }

    static var expected: String {
        let modes = Mode.allCases.map { "N:" + $0.rawValue }
        return modes.dropLast().joined(separator: ", ") + " or " + modes[modes.count - 1] + ", with N " + Ranges.simDevice.text
    }
}

/// `--sim-security` (flash, pair) and `simulate --sim-security`: what the device requires of the link.
extension LinkSecurity: ExpressibleByArgument {}

/// `--sim-phy`: 1M or 2M (2m and 1m are taken too).
extension LinkModel.PHY: ExpressibleByArgument {
    public init?(argument: String) { self.init(rawValue: argument.uppercased()) }
}

/// `--sim-time`: how the simulated link's time passes.
enum SimulatedTime: String, CaseIterable, ExpressibleByArgument, Sendable {
    /// The link's real time (a demo).
    case real
    /// Computed on a virtual clock: the run finishes at CPU speed.
    case virtual
    /// No link timing at all.
    case unlimited
}

/// What a served Secure DFU device runs (`simulate`'s `moved` event): its application or its bootloader.
extension PeripheralServer.Mode: Encodable {}

/// A ledger record's result (`ledger --result`): one that `RunRecords` writes.
extension LedgerResult: ExpressibleByArgument {
    public init?(argument: String) {
        guard let known = Self.allCases.first(where: { $0.rawValue == argument }) else { return nil }
        self = known
    }
}

/// The adapters a shell completes `--adapter` with: BlueZ's controllers under /sys/class/bluetooth
/// (hci0, hci1…; the connections listed there, hci0:64, are left out).
extension CompletionKind {
    static let adapters = CompletionKind.shellCommand("ls /sys/class/bluetooth 2>/dev/null | grep -E '^hci[0-9]+$'")
}
