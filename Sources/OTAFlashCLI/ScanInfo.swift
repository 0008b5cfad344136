import ArgumentParser
import GATT
import OTA
import OTAWire

struct Scan: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "List nearby devices: address, name, RSSI, and whether they advertise the OTA service.",
        discussion: """
            Examples:
              otaflash scan --timeout 5
              otaflash scan --ota-only --name-prefix Sensor --min-rssi -70 --json
            """
    )

    @Option(name: .long, help: ArgumentHelp("Bluetooth adapter to scan on (default: the first powered one).", valueName: "hciN"))
    var adapter: String?

    @OptionGroup(title: "Simulated peripheral") var simulator: SimulatedDeviceOptions
    @OptionGroup var output: OutputOptions

    @Option(name: .long, parsing: .unconditional, help: Ranges.scanTimeout.help("Seconds to scan", valueName: "seconds"))
    var timeout: Double = 5

    @Flag(name: .customLong("ota-only"), help: "Only devices advertising a service otaflash updates over: the OTA service, or Secure DFU (0xFE59).")
    var otaOnly = false

    @Option(name: .customLong("name-prefix"), help: "Only devices whose name starts with this.")
    var namePrefix: String?

    @Option(name: .customLong("min-rssi"), parsing: .unconditional, help: Ranges.minRSSI.help("Only devices at least this strong, e.g. -70", valueName: "dBm"))
    var minRSSI: Int?

    mutating func validate() throws {
        try Ranges.scanTimeout.check(timeout)
        try Ranges.minRSSI.check(minRSSI)
    }

    func run() async throws {
        let printer = EventPrinter(mode: output.mode)
        try await printer.endingWith(ScanEvents.Done.self) { try await scan(printer) }
    }

    private func scan(_ printer: EventPrinter) async throws {
        let central = simulator.enabled ? simulator.central(address: SimulatorOptions.defaultAddress) : bluezCentral(adapter: adapter)
        let updatable = ProtocolRegistry.cli.profiles.map(\.serviceUUID)
        let filter = ScanFilter(serviceUUIDs: otaOnly ? updatable : [], namePrefix: namePrefix, minimumRSSI: minRSSI)
        let found: [Advertisement]
        do {
            found = try await central.scan(filter: filter, timeout: Ranges.scanTimeout.duration(timeout))
        } catch {
            throw CLIFailure(OTAError.from(error, device: adapter ?? "the adapter"))
        }
        for ad in found {
            let spoken = ProtocolRegistry.cli.profiles.first { ad.serviceUUIDs.contains($0.serviceUUID) }?.name
            printer.json(ScanEvents.Device(address: ad.address.description, name: ad.name, rssi: ad.rssi,
                                           ota: spoken != nil, protocol: spoken))
            let column = (spoken ?? "").padding(toLength: 10, withPad: " ", startingAt: 0)
            printer.result("\(ad.address)  \(ad.rssi.map { String(format: "%4d dBm", $0) } ?? "   ? dBm")  \(column)  \(ad.name ?? "")")
        }
        printer.json(ScanEvents.Done(count: found.count))
        if found.isEmpty { printer.note("no devices found in \(timeout) s") }
    }
}

struct Info: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Read a device's Device Information Service and OTA state.",
        discussion: """
            Example:
              otaflash info --device AA:BB:CC:DD:EE:FF
            """
    )

    @OptionGroup var target: ConnectionOptions
    @OptionGroup(title: "Simulated peripheral") var simulator: SimulatedDeviceOptions
    @OptionGroup var output: OutputOptions

    func run() async throws {
        let printer = EventPrinter(mode: output.mode)
        try await printer.endingWith(InfoEvents.Done.self) { try await info(printer) }
        printer.json(InfoEvents.Done())
    }

    private func info(_ printer: EventPrinter) async throws {
        let address = try target.address(simulator: simulator.enabled)
        let central = simulator.enabled ? simulator.central(address: address) : bluezCentral(adapter: target.adapter)
        do {
            let connection = try await central.connect(to: address, timeout: Ranges.connectTimeout.duration(target.connectTimeout))
            defer { Task { await connection.disconnect() } }
            let report = try await DeviceReport.read(from: connection)
            printer.json(report.event(device: address.description))
            for (key, value) in report.fields { printer.result("\(key): \(value ?? "-")") }
            await connection.disconnect()
        } catch {
            throw CLIFailure(OTAError.from(error, device: address.description))
        }
    }
}

/// What `otaflash info` reads: the Device Information Service and the OTA info characteristic.
/// Each is optional; a device without the OTA service still reports its DIS.
struct DeviceReport {
    var fields: [(String, String?)] = []

    static func read(from connection: any GATTConnection) async throws(GATTError) -> DeviceReport {
        var report = DeviceReport()
        let services = try await connection.discoverServices()
        // A device may expose more than one DIS (bluetoothd adds its own, with only a PnP ID, beside
        // an application's): take each characteristic from whichever instance has it.
        let instances = services.filter { $0.uuid == DeviceInformationService.serviceUUID }
        for (key, uuid) in [("manufacturer", DeviceInformationService.manufacturerNameUUID),
                            ("model", DeviceInformationService.modelNumberUUID),
                            ("firmware_revision", DeviceInformationService.firmwareRevisionUUID)] {
            var value: String?
            if let c = instances.lazy.compactMap({ $0.characteristic(uuid) }).first(where: { $0.properties.contains(.read) }) {
                value = String(decoding: try await connection.read(c), as: UTF8.self)
            }
            report.fields.append((key, value))
        }
        if let ota = services.first(where: { $0.uuid == OTAProtocol.serviceUUID }),
           let c = ota.characteristic(OTAProtocol.infoUUID),
           let info = try? DeviceInfo(decoding: try await connection.read(c)) {
            report.fields += [("ota_protocol", "\(info.protocolVersion)"), ("ota_state", info.state.description),
                              ("ota_slot_size", "\(info.maxImageSize)"), ("ota_firmware_version", info.firmwareVersion.description),
                              ("ota_received", "\(info.received)")]
        } else {
            report.fields.append(("ota_protocol", nil))
        }
        return report
    }

    /// The `info` JSON event: every key, null for what the device did not report.
    func event(device: String) -> InfoEvents.Info {
        func value(_ key: String) -> String? { fields.first { $0.0 == key }?.1 }
        return InfoEvents.Info(device: device, manufacturer: value("manufacturer"), model: value("model"),
                               firmwareRevision: value("firmware_revision"), otaProtocol: value("ota_protocol"),
                               otaState: value("ota_state"), otaSlotSize: value("ota_slot_size"),
                               otaFirmwareVersion: value("ota_firmware_version"), otaReceived: value("ota_received"))
    }
}
