import ArgumentParser
import GATT
import OTA
import OTACommandLine
import OTAWire

struct Scan: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "List nearby devices: address, name, RSSI, and the update protocol each advertises.",
        discussion: """
            A device shows the protocol it speaks when its advertisement carries that protocol's
            service UUID. Some advertise none (mcumgr's Mynewt smp_svr sample advertises only its
            name): --ota-only leaves them out and counts them, --probe connects to each and looks.

            Examples:
              otaflash scan --timeout 5
              otaflash scan --ota-only --name-prefix Sensor --min-rssi -70 --json
              otaflash scan --ota-only --probe --name-prefix smp
            """
    )

    @Option(name: .long, help: ArgumentHelp("Bluetooth adapter to scan on (default: the first powered one).", valueName: "hciN"), completion: .adapters)
    var adapter: String?

    @OptionGroup(title: "Simulated peripheral") var simulator: LookedAtDeviceOptions
    @OptionGroup var output: OutputOptions

    @Option(name: .long, parsing: .unconditional, help: Ranges.scanTimeout.help("Seconds to scan", valueName: "seconds"))
    var timeout: Double = 5

    @Flag(name: .customLong("ota-only"), help: ArgumentHelp(ProtocolTexts.otaOnly(ProtocolCommandLine.all)))
    var otaOnly = false

    @Flag(name: .customLong("probe"), help: "Connect to each device whose advertisement names no protocol of otaflash's, and look at its services (one at a time, --probe-timeout each).")
    var probe = false

    @Option(name: .customLong("probe-timeout"), parsing: .unconditional, help: Ranges.probeTimeout.help("Seconds to connect to and discover one device with --probe", valueName: "seconds"))
    var probeTimeout: Double = 10

    @Option(name: .customLong("name-prefix"), help: "Only devices whose name starts with this.")
    var namePrefix: String?

    @Option(name: .customLong("min-rssi"), parsing: .unconditional, help: Ranges.minRSSI.help("Only devices at least this strong, e.g. -70", valueName: "dBm"))
    var minRSSI: Int?

    mutating func validate() throws {
        try Ranges.scanTimeout.check(timeout)
        try Ranges.probeTimeout.check(probeTimeout)
        try Ranges.minRSSI.check(minRSSI)
    }

    func run() async throws {
        let printer = EventPrinter(mode: output.mode)
        try await printer.endingWith(ScanEvents.Done.self) { try await scan(printer) }
    }

    private func scan(_ printer: EventPrinter) async throws {
        let central = try simulator.enabled ? simulator.central(address: SimulatorOptions.defaultAddress) : bluezCentral(adapter: adapter)
        // Scanned without a service filter: a device may host a protocol it does not advertise.
        let filter = ScanFilter(namePrefix: namePrefix, minimumRSSI: minRSSI)
        let found: [Advertisement]
        do {
            found = try await central.scan(filter: filter, timeout: Ranges.scanTimeout.duration(timeout))
        } catch {
            throw CLIFailure(OTAError.from(error, device: adapter ?? "the adapter"))
        }
        var listed = 0
        var unclassified = 0
        for ad in found {
            var spoken = Self.protocolName(serving: ad.serviceUUIDs)
            var probed = false
            if spoken == nil, probe {
                spoken = await probeProtocol(of: ad.address, on: central, printer)
                probed = true
            }
            if otaOnly, spoken == nil {
                if !probed { unclassified += 1 }
                continue
            }
            listed += 1
            printer.json(ScanEvents.Device(address: ad.address.description, name: ad.name, rssi: ad.rssi,
                                           ota: spoken != nil, protocol: spoken, probed: probed))
            let column = (spoken ?? "").padding(toLength: 10, withPad: " ", startingAt: 0)
            printer.result("\(ad.address)  \(ad.rssi.map { String(format: "%4d dBm", $0) } ?? "   ? dBm")  \(column)  \(ad.name ?? "")")
        }
        printer.json(ScanEvents.Done(count: listed, unclassified: otaOnly && !probe ? unclassified : nil))
        if found.isEmpty { printer.note("no devices found in \(timeout) s") }
        if unclassified > 0 {
            printer.note("\(unclassified) device\(unclassified == 1 ? "" : "s") left out: \(unclassified == 1 ? "it advertises" : "they advertise") no service otaflash updates over, "
                + "yet may host one (mcumgr's smp_svr sample advertises none); --probe connects to each and looks")
        }
    }

    /// The registered protocol whose service is among `uuids`, by name.
    static func protocolName(serving uuids: [BluetoothUUID]) -> String? {
        ProtocolRegistry.cli.profiles.first { uuids.contains($0.serviceUUID) }?.name
    }

    /// Connects to `address`, discovers its services and names the protocol it serves; nil when it
    /// serves none or cannot be reached within `--probe-timeout` (a note says which).
    private func probeProtocol(of address: DeviceAddress, on central: any GATTCentral, _ printer: EventPrinter) async -> String? {
        let limit = Ranges.probeTimeout.duration(probeTimeout)
        do {
            let connection = try await central.connect(to: address, timeout: limit)
            let discovered: Result<[GATTService], GATTError>
            do throws(GATTError) {
                discovered = .success(try await withTimeout(limit, clock: connection.clock, "discovering \(address)'s services") {
                    () async throws(GATTError) -> [GATTService] in try await connection.discoverServices()
                })
            } catch {
                discovered = .failure(error)
            }
            await connection.disconnect()
            let services = try discovered.get()
            return Self.protocolName(serving: services.map(\.uuid))
        } catch {
            printer.note("\(address): not probed: \(OTAError.from(error, device: address.description).message)")
            return nil
        }
    }
}

struct Info: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Read a device's Device Information Service and OTA state.",
        usage: "otaflash info [--device <address> | --simulator] [<options>]",
        discussion: """
            Example:
              otaflash info --device AA:BB:CC:DD:EE:FF
            """
    )

    @OptionGroup var target: ConnectionOptions
    @OptionGroup(title: "Simulated peripheral") var simulator: LookedAtDeviceOptions
    @OptionGroup var output: OutputOptions

    func run() async throws {
        let printer = EventPrinter(mode: output.mode)
        try await printer.endingWith(InfoEvents.Done.self) { try await info(printer) }
        printer.json(InfoEvents.Done())
    }

    private func info(_ printer: EventPrinter) async throws {
        let address = try target.address(simulator: simulator.enabled)
        let central = try simulator.enabled ? simulator.central(address: address) : bluezCentral(adapter: target.adapter)
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
        // The fields of the first protocol whose service the device exposes and that reports any.
        var own: [(String, String?)]?
        for registration in ProtocolCommandLine.all where own == nil {
            own = await registration.info?(connection, services)
        }
        report.fields += own ?? [("ota_protocol", nil)]
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
