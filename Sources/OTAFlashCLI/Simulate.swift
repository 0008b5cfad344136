import ArgumentParser
import BlueZ
import DBus
import Dispatch
import Foundation
import GATT
import OTADevice
import OTAWire
import Synchronization

struct Simulate: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Serve an OTA target through BlueZ: this machine's adapter becomes a device otaflash can update.",
        discussion: """
            Registers a GATT application (the OTA service and the Device Information Service) with bluetoothd \
            and advertises the OTA service, so `otaflash scan --ota-only` on another adapter or machine lists this \
            one and `otaflash --device <its address> image.bin` updates it. The device side is the same code as the \
            built-in simulator's, with the same fault options and timing: after an ACTIVATE it answers, then reboots \
            into the image and stops advertising for the reboot time. One central's transfer at a time: a second \
            central's commands fail with ATT error 0x89 (busy). Serves until SIGINT or SIGTERM, then unregisters and \
            exits 0.

            Examples:
              otaflash simulate --adapter hci1 --store /tmp/images
              otaflash simulate --adapter hci1 --json --sim-drop-rate 0.01 --sim-disconnect-at 100000
            """
    )

    @Option(name: .long, help: ArgumentHelp("Bluetooth adapter to serve on (default: the first powered one).", valueName: "hciN"))
    var adapter: String?

    @Option(name: .long, help: "Name to advertise.")
    var name: String = "otaflash-sim"

    @Option(name: .customLong("slot-size"), parsing: .unconditional, help: Ranges.slotSize.help("Bytes the device's image slot holds", valueName: "bytes"))
    var slotSize: Int = 1 << 20

    @Option(name: .customLong("firmware-version"), help: "Firmware version the device runs before an update.")
    var firmwareVersion: String = "1.0.0"

    @Option(name: .long, help: ArgumentHelp("Write each verified and activated image to DIR/<crc32>.bin.", valueName: "DIR"), completion: .directory)
    var store: String?

    @OptionGroup(title: "Faults")
    var faults: FaultOptions

    @OptionGroup var output: OutputOptions

    mutating func validate() throws {
        try Ranges.slotSize.check(slotSize)
        guard FirmwareVersion(firmwareVersion) != nil else {
            throw ValidationError("--firmware-version must look like 1.2.3, got '\(firmwareVersion)'")
        }
        guard !name.isEmpty, name.utf8.count <= 29 else { throw ValidationError("--name must be 1–29 bytes, got '\(name)'") }
        if let adapter, !(adapter.hasPrefix("hci") && adapter.dropFirst(3).allSatisfy(\.isNumber) && adapter.count > 3) {
            throw ValidationError("--adapter must look like hci0, got '\(adapter)'")
        }
    }

    func run() async throws {
        let printer = EventPrinter(mode: output.mode)
        do {
            try await serve(printer)
        } catch let failure as CLIFailure {
            printer.json(SimulateEvents.Done(failure: failure))
            throw failure
        }
    }

    static let applicationRoot = "/org/otaflash/simulate"

    private func serve(_ printer: EventPrinter) async throws {
        if let store { try Self.prepareStore(store) }
        // Signals first: a SIGINT during setup still ends in a clean teardown.
        let stop = StopLatch()
        let signals = InterruptHandler { stop.fire(.signal($0)) }
        defer { signals.cancel() }
        CLIContext.output.onFailure { stop.fire(.outputFailed) }

        let host: PeripheralHost
        do {
            host = try await PeripheralHost.open(adapter: adapter)
        } catch {
            throw Self.failure(error, "")
        }
        var trace: (@Sendable (String) -> Void)?
        if output.verbose {
            trace = { line in StandardOutput().err("otaflash: \(line)\n") }
        }
        let config = OTAPeripheralConfig(name: name, slotSize: slotSize, firmwareVersion: FirmwareVersion(firmwareVersion)!,
                                         faults: faults.plan, storeDirectory: store, trace: trace)
        let peripheral = OTAPeripheral(config: config) { Self.print($0, printer) }
        let application = PeripheralApplication(connection: host.connection, root: Self.applicationRoot,
                                                services: peripheral.services)
        let advertisement = PeripheralAdvertisement(connection: host.connection, path: Self.applicationRoot + "/advertisement0",
                                                    localName: name, serviceUUIDs: [OTAProtocol.serviceUUID])

        var failure: CLIFailure?
        do {
            try await application.export()
            try await advertisement.export()
            try await peripheral.attach(link: host, application: application)
            // bluetoothd going away ends the service with the bluetooth_unavailable code.
            try await host.connection.subscribe(DBusMatchRule(
                sender: "org.freedesktop.DBus", path: "/org/freedesktop/DBus", interface: "org.freedesktop.DBus",
                member: "NameOwnerChanged", arg0: "org.bluez")) { signal in
                if signal.arguments.count == 3, signal.arguments[2].string?.isEmpty == true { stop.fire(.stackGone) }
            }
            do {
                try await application.register(on: host.adapterPath)
            } catch {
                throw Self.failure(error, "registering the GATT application on \(host.adapter) (GattManager1.RegisterApplication)")
            }
            do {
                try await advertisement.register(on: host.adapterPath)
            } catch {
                throw Self.failure(error, "registering the advertisement on \(host.adapter) (LEAdvertisingManager1.RegisterAdvertisement)")
            }
            printer.json(SimulateEvents.Serving(adapter: host.adapter, address: host.address, name: name, slotSize: slotSize,
                                                firmwareVersion: config.firmwareVersion.description, store: store))
            printer.note("serving OTA target \"\(name)\" on \(host.adapter)\(host.address.map { " (\($0))" } ?? ""): "
                         + "slot \(formatBytes(slotSize)), firmware \(config.firmwareVersion); Ctrl-C to stop")
            switch await stop.wait() {
            case .signal(let number):
                printer.note("\(number == SIGINT ? "SIGINT" : "SIGTERM"): unregistering and exiting")
            case .stackGone:
                failure = CLIFailure(.bluetoothUnavailable, "bluetoothd stopped (org.bluez left the bus); the OTA target is gone")
            case .outputFailed:
                break  // runOtaflash reports it and exits outputFailed
            }
        } catch let error as CLIFailure {
            failure = error
        } catch {
            failure = Self.failure(error, "setting up the GATT application")
        }

        // Teardown, each step bounded by its own call timeout.
        await peripheral.stop()
        try? await advertisement.unregister()
        try? await application.unregister()
        await advertisement.unexport()
        await application.unexport()
        await host.close()
        if let failure { throw failure }
        let activated = await peripheral.model.target.activationCount
        printer.json(SimulateEvents.Done(activations: activated))
    }

    static func failure(_ error: any Error, _ operation: String) -> CLIFailure {
        let mapped = PeripheralError.from(error, operation)
        let code: ExitCode = mapped.kind == .permission ? .permission : .bluetoothUnavailable
        return CLIFailure(code, mapped.message)
    }

    static func prepareStore(_ directory: String) throws {
        try OutputPaths.prepareDirectory(directory, option: "--store")
    }

    static func print(_ event: OTAPeripheralEvent, _ printer: EventPrinter) {
        func who(_ central: String?) -> String? { central.map { OTAPeripheralEvent.address(of: $0) } }
        func name(_ central: String?) -> String { central.map { OTAPeripheralEvent.address(of: $0) } ?? "a central" }
        switch event {
        case .connected(let central):
            printer.json(SimulateEvents.Connected(central: name(central)))
            printer.note("\(name(central)) connected")
        case .disconnected(let central, let reason):
            printer.json(SimulateEvents.Disconnected(central: name(central), reason: reason))
            printer.note("\(name(central)) disconnected: \(reason)")
        case .begin(let central, let size, let crc, let offset):
            printer.json(SimulateEvents.Begin(central: who(central), size: size, crc32: hex32(crc), offset: offset))
            printer.note("\(name(central)) begins a \(formatBytes(size)) image, CRC32 \(hex32(crc))"
                         + (offset > 0 ? ", resuming at \(formatBytes(offset))" : ""))
        case .progress(let central, let received, let total):
            printer.json(SimulateEvents.Progress(central: who(central), bytes: received, total: total))
            printer.note(String(format: "received %@ of %@ (%.0f%%)", formatBytes(received), formatBytes(total),
                                Double(received) * 100 / Double(max(total, 1))))
        case .verified(let central, let crc):
            printer.json(SimulateEvents.Verified(central: who(central), crc32: hex32(crc)))
            printer.note("image verified: CRC32 \(hex32(crc))")
        case .activated(let central, let size, let crc, let version, let stored):
            printer.json(SimulateEvents.Activated(central: who(central), size: size, crc32: hex32(crc),
                                                  firmwareVersion: version.description, stored: stored))
            printer.note("activated \(formatBytes(size)) image \(hex32(crc)) (firmware \(version))"
                         + (stored.map { "; stored as \($0)" } ?? "") + "; rebooting into it")
        case .busy(let central, let owner):
            printer.json(SimulateEvents.Busy(central: name(central), owner: name(owner)))
            printer.note("\(name(central)) was told busy: \(name(owner)) owns the transfer in progress")
        case .note(let text):
            printer.json(SimulateEvents.Note(message: text))
            printer.note(text)
        }
    }
}

/// Why serving stopped.
enum StopReason: Sendable {
    case signal(Int32)
    case stackGone
    /// stdout or stderr could not be written.
    case outputFailed
}

/// Resolves one waiter with the first reason it is given; later reasons are ignored.
final class StopLatch: Sendable {
    private let state = Mutex<(reason: StopReason?, waiter: CheckedContinuation<StopReason, Never>?)>((nil, nil))

    func fire(_ reason: StopReason) {
        let waiter = state.withLock { s -> CheckedContinuation<StopReason, Never>? in
            guard s.reason == nil else { return nil }
            s.reason = reason
            defer { s.waiter = nil }
            return s.waiter
        }
        waiter?.resume(returning: reason)
    }

    func wait() async -> StopReason {
        await withCheckedContinuation { continuation in
            let ready = state.withLock { s -> StopReason? in
                if let reason = s.reason { return reason }
                s.waiter = continuation
                return nil
            }
            if let ready { continuation.resume(returning: ready) }
        }
    }
}

