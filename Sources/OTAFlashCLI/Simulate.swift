import ArgumentParser
import BlueZ
import DBus
import Dispatch
import Foundation
import GATT
import NordicDFU
import OTA
import OTADevice
import OTAWire
import Synchronization

struct Simulate: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Serve an OTA target through BlueZ: this machine's adapter becomes a device otaflash can update.",
        discussion: """
            Registers a GATT application with bluetoothd and advertises its service, so `otaflash scan` on another \
            adapter or machine lists this one and `otaflash --device <its address> image` updates it. The device is \
            the same model the built-in simulator runs, with the same fault options and timing.

            --protocol native (the default) serves otaflash's own OTA service and the Device Information Service: \
            after an ACTIVATE it answers, then reboots into the image, refusing centrals for the reboot time. One \
            central's transfer at a time: a second central's commands fail with ATT error 0x89 (busy).

            --protocol nordic-dfu serves a Secure DFU bootloader (service 0xFE59, nRF5 SDK rules: object sizes, \
            init packet checks of hardware, SoftDevice, version and signature, the image's SHA-256), so \
            `otaflash --device <address> app_dfu_package.zip` can be tried without a Nordic board. It activates an \
            image once its hash matched and resets into it.

            Serves until SIGINT or SIGTERM, then unregisters and exits 0.

            Examples:
              otaflash simulate --adapter hci1 --store /tmp/images
              otaflash simulate --adapter hci1 --json --sim-drop-rate 0.01 --sim-disconnect-at 100000
              otaflash simulate --adapter hci1 --protocol nordic-dfu --public-key firmware-samples/nordic/test-key-public.pem
            """
    )

    @Option(name: .long, help: ArgumentHelp("Bluetooth adapter to serve on (default: the first powered one).", valueName: "hciN"))
    var adapter: String?

    @Option(name: .customLong("protocol"), help: ArgumentHelp("The protocol the served device speaks: \(Self.protocols.joined(separator: " or ")).", valueName: "name"))
    var protocolName: String = NativeProfile.name

    @Option(name: .long, help: "Name to advertise (default: otaflash-sim; DfuTarg for nordic-dfu, as Nordic's bootloaders).")
    var name: String?

    @Option(name: .customLong("slot-size"), parsing: .unconditional, help: Ranges.slotSize.help("Bytes the device's image slot (a bootloader's bank) holds", valueName: "bytes"))
    var slotSize: Int = 1 << 20

    @Option(name: .customLong("firmware-version"), help: "Firmware version the device runs before an update: 1.2.3 (native), a number (nordic-dfu's application version; default 1.0.0 or 0).")
    var firmwareVersion: String?

    @Option(name: .customLong("public-key"), help: ArgumentHelp("nordic-dfu: check init packet signatures with this ECDSA P-256 public key (PEM); without it any signature passes.", valueName: "file"), completion: .file())
    var publicKey: String?

    @Option(name: .customLong("sd-after-update"), parsing: .unconditional, help: Ranges.sdAfterUpdate.help("nordic-dfu: the SoftDevice FWID the bootloader reports once it installed a SoftDevice (what the package's application requires, e.g. 0xB6); default: unchanged", valueName: "fwid"))
    var softDeviceAfterUpdate: FWID?

    @Option(name: .long, help: ArgumentHelp("Write each verified and activated image to DIR/<crc32>.bin.", valueName: "DIR"), completion: .directory)
    var store: String?

    @OptionGroup(title: "Faults")
    var faults: FaultOptions

    @OptionGroup var output: OutputOptions

    static let protocols = [NativeProfile.name, NordicDFUProfile.name]

    mutating func validate() throws {
        try Ranges.slotSize.check(slotSize)
        guard Self.protocols.contains(protocolName) else {
            throw ValidationError("--protocol must be \(Self.protocols.joined(separator: " or ")), got '\(protocolName)'")
        }
        let nordic = protocolName == NordicDFUProfile.name
        if !nordic {
            for (option, given) in [("--public-key", publicKey != nil), ("--sd-after-update", softDeviceAfterUpdate != nil)] where given {
                throw ValidationError("\(option) configures a Secure DFU bootloader; add --protocol nordic-dfu")
            }
        }
        if let firmwareVersion {
            if nordic, UInt32(firmwareVersion) == nil {
                throw ValidationError("--firmware-version for nordic-dfu is the application version, a number 0-\(UInt32.max), got '\(firmwareVersion)'")
            } else if !nordic, FirmwareVersion(firmwareVersion) == nil {
                throw ValidationError("--firmware-version must look like 1.2.3, got '\(firmwareVersion)'")
            }
        }
        try Ranges.sdAfterUpdate.check(softDeviceAfterUpdate)
        if let name {
            guard !name.isEmpty, name.utf8.count <= 29 else { throw ValidationError("--name must be 1–29 bytes, got '\(name)'") }
        }
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
        let device = try served()
        let name = device.name
        let peripheral = OTAPeripheral(model: device.model, storeDirectory: store, trace: trace, events: { Self.print($0, printer) })
        let application = PeripheralApplication(connection: host.connection, root: Self.applicationRoot,
                                                services: peripheral.services)
        let advertisement = PeripheralAdvertisement(connection: host.connection, path: Self.applicationRoot + "/advertisement0",
                                                    localName: name, serviceUUIDs: device.model.advertisedServices)

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
            printer.json(SimulateEvents.Serving(adapter: host.adapter, address: host.address, name: name, protocol: protocolName,
                                                slotSize: slotSize, firmwareVersion: device.firmwareVersion, store: store))
            printer.note("serving \(device.what) \"\(name)\" on \(host.adapter)\(host.address.map { " (\($0))" } ?? ""): "
                         + "slot \(formatBytes(slotSize)), firmware \(device.firmwareVersion); Ctrl-C to stop")
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
        let activated = await peripheral.activations
        printer.json(SimulateEvents.Done(activations: activated))
    }

    /// The device `--protocol` names, as its options configure it.
    private func served() throws -> (model: any PeripheralModel, name: String, firmwareVersion: String, what: String) {
        guard protocolName == NordicDFUProfile.name else {
            let version = firmwareVersion.flatMap(FirmwareVersion.init) ?? FirmwareVersion(major: 1, minor: 0, patch: 0)
            let config = OTAPeripheralConfig(name: name ?? "otaflash-sim", slotSize: slotSize, firmwareVersion: version, faults: faults.plan)
            return (config.nativeModel, config.name, version.description, "OTA target")
        }
        var config = NordicDFUBootloader.Config()
        config.bankSize = slotSize
        config.applicationVersion = firmwareVersion.flatMap { UInt32($0) } ?? 0
        if let publicKey {
            let pem: String
            do {
                pem = try String(contentsOfFile: publicKey, encoding: .utf8)
            } catch {
                throw CLIFailure(.usage, "--public-key \(publicKey): cannot read it (\(error.localizedDescription))")
            }
            guard let check = NordicDFUBootloader.SignatureCheck.verify(pem: pem) else {
                throw CLIFailure(.usage, "--public-key \(publicKey) is not a PEM P-256 public key; make one with nrfutil keys display --key pk --format pem KEY.pem")
            }
            config.signatureCheck = check
        }
        let model = NordicDFUPeripheral(bootloader: NordicDFUBootloader(config: config), faults: faults.plan,
                                        softDeviceAfterUpdate: softDeviceAfterUpdate?.value)
        return (model, name ?? "DfuTarg", "\(config.applicationVersion)", "Secure DFU bootloader")
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
            printer.json(SimulateEvents.Begin(central: who(central), size: size, crc32: crc.map(hex32), offset: offset))
            printer.note("\(name(central)) begins a \(formatBytes(size)) image\(crc.map { ", CRC32 \(hex32($0))" } ?? "")"
                         + (offset > 0 ? ", resuming at \(formatBytes(offset))" : ""))
        case .progress(let central, let received, let total):
            printer.json(SimulateEvents.Progress(central: who(central), bytes: received, total: total))
            printer.note(String(format: "received %@ of %@ (%.0f%%)", formatBytes(received), formatBytes(total),
                                Double(received) * 100 / Double(max(total, 1))))
        case .verified(let central, let crc):
            printer.json(SimulateEvents.Verified(central: who(central), crc32: crc.map(hex32)))
            printer.note("image verified" + (crc.map { ": CRC32 \(hex32($0))" } ?? ": its hash matched"))
        case .activated(let central, let size, let crc, let version, let stored):
            printer.json(SimulateEvents.Activated(central: who(central), size: size, crc32: hex32(crc),
                                                  firmwareVersion: version, stored: stored))
            printer.note("activated \(formatBytes(size)) image \(hex32(crc))\(version.map { " (firmware \($0))" } ?? "")"
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

