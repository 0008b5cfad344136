import ArgumentParser
import GATT
import OTA
import OTACommandLine
import OTADevice
import Simulator

/// What a protocol's own device commands (`otaflash image`, `reset`, `echo`) take from the command
/// line: the device (`--device`, `--adapter`, `--connect-timeout`), the simulated peripheral, and
/// the output.
struct DeviceCommandOptions: DeviceCommandContext {
    @OptionGroup var target: ConnectionOptions
    @OptionGroup(title: "Simulated peripheral") var simulator: LookedAtDeviceOptions
    @OptionGroup var output: OutputOptions

    var simulates: Bool { simulator.enabled }

    func connect(simulated: @escaping @Sendable (SimulatedDeviceConfig) -> any PeripheralModel) async throws(CLIFailure)
        -> (connection: any GATTConnection, address: DeviceAddress) {
        let address = try target.address(simulator: simulator.enabled)
        let central: any GATTCentral
        if simulator.enabled {
            let config = simulator.deviceConfig(address: address)
            // On the link's own (virtual) time: a command's reply timeout counts the simulated
            // link's time, not how long a loaded host took to run the device in this process.
            central = SimulatedCentral(devices: [SimulatedDevice(config, model: simulated(config))], clock: VirtualClock())
        } else {
            central = bluezCentral(adapter: target.adapter)
        }
        do {
            return (try await central.connect(to: address, timeout: Ranges.connectTimeout.duration(target.connectTimeout)), address)
        } catch {
            throw CLIFailure(OTAError.from(error, device: address.description))
        }
    }

    func run<Done: CommandDone>(_: Done.Type, _ work: (any CommandOutput) async throws -> Void) async throws {
        let printer = EventPrinter(mode: output.mode)
        try await printer.endingWith(Done.self) { try await work(printer) }
        printer.json(Done())
    }
}
