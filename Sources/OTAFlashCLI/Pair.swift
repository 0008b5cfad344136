import ArgumentParser
import GATT
import OTA
import OTACommandLine
import Simulator

/// `otaflash pair`: bond with a device, without updating it.
struct Pair: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Pair and bond with a device through BlueZ, answering it from the command line.",
        discussion: """
            Connects, and pairs unless BlueZ already holds a bond with the device: Just Works, passkey entry \
            with --passkey (or the device's line in --passkey-file), or a numeric comparison accepted with \
            --confirm-pairing. otaflash registers its own pairing agent for the call and unregisters it \
            however the command ends. A refused pairing exits \(ExitCode.pairingFailed.rawValue) (pairing_failed).

            Examples:
              otaflash pair --device AA:BB:CC:DD:EE:FF
              otaflash pair --device AA:BB:CC:DD:EE:FF --passkey 123456
            """
    )

    @OptionGroup var target: ConnectionOptions
    @OptionGroup(title: "Pairing") var answers: PairingAnswers
    @OptionGroup(title: "Simulated peripheral") var simulator: LookedAtDeviceOptions
    @OptionGroup(title: "Simulated peripheral") var simulatedSecurity: SimulatedSecurityOptions
    @OptionGroup var output: OutputOptions

    func run() async throws {
        let printer = EventPrinter(mode: output.mode)
        try await printer.endingWith(PairEvents.Done.self) {
            let address = try target.address(simulator: simulator.enabled)
            let central: any GATTCentral = try simulator.enabled
                ? SimulatedCentral(devices: [simulator.lookedAtDevice(simulatedSecurity.apply(to: simulator.deviceConfig(address: address)))], clock: SystemClock())
                : bluezCentral(adapter: target.adapter)
            let policy = PairingPolicy(pair: true, credentials: answers.credentials(for: address, file: try answers.passkeys()),
                                       timeout: answers.timeout)
            let connection: any GATTConnection
            do throws(GATTError) {
                connection = try await central.connect(to: address, timeout: Ranges.connectTimeout.duration(target.connectTimeout))
            } catch {
                throw CLIFailure(OTAError.from(error, device: address.description))
            }
            let paired: Bool
            do throws(OTAError) {
                paired = try await policy.pairIfNeeded(connection, device: address.description)
            } catch {
                await connection.disconnect()
                throw CLIFailure(error)
            }
            await connection.disconnect()
            printer.result(paired ? "\(address): paired and bonded (\(policy.method))" : "\(address): already bonded; nothing to do")
            printer.json(PairEvents.Done(device: address, bonded: true))
        }
    }
}

/// `otaflash unpair`: remove a bond.
struct Unpair: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Remove the bond with a device (BlueZ Adapter1.RemoveDevice); no error when there is none.",
        usage: "otaflash unpair [--device <address> | --simulator] [<options>]",
        discussion: """
            Example:
              otaflash unpair --device AA:BB:CC:DD:EE:FF
            """
    )

    @OptionGroup var target: ConnectionOptions
    @OptionGroup(title: "Simulated peripheral") var simulator: LookedAtDeviceOptions
    @OptionGroup var output: OutputOptions

    func run() async throws {
        let printer = EventPrinter(mode: output.mode)
        try await printer.endingWith(PairEvents.Done.self) {
            let address = try target.address(simulator: simulator.enabled)
            let central = try simulator.enabled ? simulator.central(address: address) : bluezCentral(adapter: target.adapter)
            guard let store = central as? any GATTBondStore else {
                throw CLIFailure(.internalError, "this transport keeps no bonds")
            }
            do throws(GATTError) {
                try await store.removeBond(address)
            } catch {
                throw CLIFailure(OTAError.from(error, device: address.description))
            }
            printer.result("\(address): no bond left")
            printer.json(PairEvents.Done(device: address, bonded: false))
        }
    }
}

public enum PairEvents {
    /// How `pair` or `unpair` ended: the device and whether a bond with it is held now.
    public struct Done: CommandDone {
        public static let name = "done"
        public var result = EventResult.ok
        public var device: String?
        public var bonded: Bool?
        public var exitCode = 0
        public var error: String?
        public var message: String?

        public init() {}

        /// How a command that succeeded ended: `device` is bonded or not now.
        init(device: DeviceAddress, bonded: Bool) {
            self.device = device.description
            self.bonded = bonded
        }
    }
}
