import ArgumentParser
import BlueZ
import DBus
import Dispatch
import Foundation
import GATT
import OTA
import OTACommandLine
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

            \(ProtocolTexts.served(ProtocolCommandLine.all))

            The device options have the names `otaflash --simulator` gives the same devices (`otaflash help simulator`); \
            their former names (--slot-size, --firmware-version, --public-key, --buf-size, --buf-count, --cbor, \
            --device-version, --security, --passkey, --buttonless) are still taken.

            Serves until SIGINT or SIGTERM, then unregisters and exits 0.

            Examples:
              otaflash simulate --adapter hci1 --store /tmp/images
              otaflash simulate --adapter hci1 --sim-device-version 2
              otaflash simulate --adapter hci1 --json --sim-drop-rate 0.01 \\
                  --sim-disconnect-at 100000
              otaflash simulate --adapter hci1 --protocol nordic-dfu \\
                  --sim-public-key firmware-samples/nordic/test-key-public.pem
              otaflash simulate --adapter hci1 --protocol nordic-dfu \\
                  --sim-buttonless unbonded --bootloader-adapter hci2
              otaflash simulate --adapter hci1 --protocol smp --sim-smp-buf-size 2475 \\
                  --sim-slot-size 262144
              otaflash simulate --adapter hci1 --protocol esp-ota --name ESP-C919
            """
    )

    @Option(name: .long, help: ArgumentHelp("Bluetooth adapter to serve on (default: the first powered one).", valueName: "hciN"), completion: .adapters)
    var adapter: String?

    @Option(name: .customLong("protocol"), help: ArgumentHelp("The protocol the served device speaks.", valueName: "name"))
    var served: ServedProtocol = .native

    @Option(name: .long, help: ArgumentHelp(ProtocolTexts.servedName(ProtocolCommandLine.all)))
    var name: String?

    @Option(name: .customLong("bootloader-adapter"), help: ArgumentHelp("With --sim-buttonless: the adapter the bootloader answers on, whose address is --adapter's + 1 (an adapter cannot change its address).", valueName: "hciN"), completion: .adapters)
    var bootloaderAdapter: String?

    @Option(name: .customLong("address"), help: ArgumentHelp("With --sim-buttonless: the address centrals see the application at, when BlueZ reports another (an adapter with a random static address reports its public one); default: --adapter's.", valueName: "AA:BB:CC:DD:EE:FF"))
    var applicationAddress: String?

    @Option(name: .customLong("sim-slot-size"), parsing: .unconditional, help: Ranges.simSlotSize.help(ProtocolTexts.simSlotSize(ProtocolCommandLine.all, default: 1 << 20), valueName: "bytes"))
    var slotSizeOption: Int?

    @Option(name: .customLong("sim-firmware-version"), help: ArgumentHelp(ProtocolTexts.simFirmwareVersion(ProtocolCommandLine.all), valueName: "version"))
    var firmwareVersionOption: String?

    @Option(name: .long, help: ArgumentHelp("Write each verified and activated image to DIR/<crc32>.bin.", valueName: "DIR"), completion: .directory)
    var store: String?

    @Option(name: .customLong("sim-security"), help: ArgumentHelp("What the device's characteristics require of the link: none; encrypt (a bond, Just Works will do); authenticate (a bond made with --sim-passkey, else by a confirmed numeric comparison). The device runs its own pairing agent.", valueName: "level"))
    var securityOption: LinkSecurity?

    @Option(name: .customLong("sim-passkey"), parsing: .unconditional, help: Ranges.simPasskey.help("With --sim-security authenticate: the passkey the device expects a central to enter", valueName: "n"))
    var passkeyOption: Int?

    @OptionGroup var devices: ServedProtocolOptions

    @OptionGroup(title: "Faults")
    var faults: FaultOptions

    @OptionGroup var output: OutputOptions

    /// The names these options had before they took `flash`'s `--sim-*` names; still taken.
    @OptionGroup var formerNames: SimulateFormerNames

    var protocolName: String { served.name }
    var slotSize: Int { slotSizeOption ?? formerNames.slotSize ?? 1 << 20 }
    var slotOption: String { formerNames.slotSize != nil ? "--slot-size" : "--sim-slot-size" }
    var security: LinkSecurity { securityOption ?? formerNames.security ?? .none }
    var passkey: Int? { passkeyOption ?? formerNames.passkey }
    /// `--sim-firmware-version` or the former `--firmware-version`, as text.
    var firmwareVersion: String? { firmwareVersionOption ?? formerNames.firmwareVersion }

    /// The served protocol's own options, which make the device.
    var device: (any ServedOptionGroup)? { devices.servedGroups.first { type(of: $0).commandLine.name == protocolName } }
    /// Whether the device starts in its application, its bootloader on `--bootloader-adapter`.
    var startsInApplication: Bool { device?.startsInApplication ?? false }

    /// What every served device takes, for the protocol's group; `address` once it is known.
    func request(address: DeviceAddress? = nil) -> ServeRequest {
        ServeRequest(name: name, slotSize: slotSize, firmwareVersion: firmwareVersion, faults: faults.plan, adapter: adapter, address: address)
    }

    mutating func validate() throws {
        try formerNames.check(against: self)
        try Ranges.simSlotSize.check(slotSizeOption)
        try Ranges.simPasskey.check(passkeyOption)
        if passkey != nil, security != .authenticate {
            throw ValidationError("\(formerNames.passkey != nil ? "--passkey" : "--sim-passkey") is what an authenticated pairing expects; add --sim-security authenticate")
        }
        try refuseOptionsOfOtherProtocols()
        try checkFirmwareVersion()
        try device?.check(request(), slotOption: slotOption)
        if let name {
            guard !name.isEmpty, name.utf8.count <= 29 else { throw ValidationError("--name must be 1–29 bytes, got '\(name)'") }
        }
        for (option, given) in [("--adapter", adapter), ("--bootloader-adapter", bootloaderAdapter)] {
            if let given, !(given.hasPrefix("hci") && given.dropFirst(3).allSatisfy(\.isNumber) && given.count > 3) {
                throw ValidationError("\(option) must look like hci0, got '\(given)'")
            }
        }
        try Self.checkApplicationFirst(startsInApplication, adapter: adapter, bootloaderAdapter: bootloaderAdapter)
        if let applicationAddress {
            guard startsInApplication else {
                throw ValidationError("--address is where a \(Self.applicationFirst) device's application answers; add \(Self.applicationFirst) unbonded")
            }
            guard DeviceAddress(applicationAddress) != nil else {
                throw ValidationError("--address must look like C0:11:22:33:44:10, got '\(applicationAddress)'")
            }
        }
    }

    /// Each protocol's own device options, refused with another protocol: one line that says
    /// which protocol they configure.
    private func refuseOptionsOfOtherProtocols() throws {
        for group in devices.servedGroups {
            let owner = type(of: group).commandLine
            if owner.name != protocolName, let option = group.given.first {
                throw ValidationError("\(option) configures a simulated \(owner.device); add --protocol \(owner.name)")
            }
        }
    }

    /// `--sim-firmware-version` only for a protocol that takes it; the former `--firmware-version`
    /// as such a protocol reads it (a device of another checks it as its own version).
    private func checkFirmwareVersion() throws {
        let registration = ProtocolCommandLine.named(protocolName)
        let takesVersions = registration?.takes.contains("--sim-firmware-version") ?? false
        if let firmwareVersionOption {
            guard takesVersions else {
                let owners = ProtocolCommandLine.owners(of: "--sim-firmware-version").joined(separator: " and ")
                throw ValidationError("--sim-firmware-version applies to \(owners) only"
                                      + (registration?.refuses["--sim-firmware-version"].map { " (\($0))" } ?? "") + "; drop it")
            }
            guard FirmwareVersion(firmwareVersionOption) != nil else {
                throw ValidationError("--sim-firmware-version must look like 1.2.3, got '\(firmwareVersionOption)'")
            }
        }
        if let version = formerNames.firmwareVersion, takesVersions, FirmwareVersion(version) == nil {
            throw ValidationError("--firmware-version must look like 1.2.3, got '\(version)'")
        }
    }

    /// The option that starts a device in its application, as its protocol registers it
    /// (`applicationFirst`); the words for it where no protocol has one.
    static var applicationFirst: String {
        ProtocolCommandLine.applicationFirstProtocol?.applicationFirst ?? "an option that starts the device in its application"
    }

    /// A device that starts in its application is served on two adapters: the application's and
    /// the bootloader's, at the address + 1.
    static func checkApplicationFirst(_ startsInApplication: Bool, adapter: String?, bootloaderAdapter: String?) throws {
        guard startsInApplication else {
            if bootloaderAdapter != nil {
                throw ValidationError("--bootloader-adapter is where a \(applicationFirst) device's bootloader answers; add \(applicationFirst) unbonded")
            }
            return
        }
        guard let bootloaderAdapter else {
            throw ValidationError("\(applicationFirst) needs --bootloader-adapter hciN: a BlueZ adapter cannot change its address, "
                                  + "so the bootloader answers on a second adapter whose address is the application's + 1")
        }
        guard let adapter else {
            throw ValidationError("\(applicationFirst) needs --adapter hciN, the adapter the application answers on (its address + 1 is --bootloader-adapter's)")
        }
        guard adapter != bootloaderAdapter else {
            throw ValidationError("--bootloader-adapter must be another adapter than --adapter (\(adapter)): the bootloader answers at another address")
        }
    }

    func run() async throws {
        let printer = EventPrinter(mode: output.mode)
        try await printer.endingWith(SimulateEvents.Done.self) { try await serve(printer) }
    }

    private func serve(_ printer: EventPrinter) async throws {
        if let store { try Self.prepareStore(store) }
        // Signals first: a SIGINT during setup still ends in a clean teardown.
        let stop = StopLatch()
        let signals = InterruptHandler { stop.fire(.signal($0)) }
        defer { signals.cancel() }
        CLIContext.output.onFailure { stop.fire(.outputFailed) }

        let server: PeripheralServer
        do {
            server = try await PeripheralServer.open(adapter: adapter, bootloaderAdapter: startsInApplication ? bootloaderAdapter : nil)
        } catch {
            throw Self.failure(error, "")
        }
        let host = server.host
        let device: ServedDevice
        do {
            device = try served(address: (applicationAddress ?? host.address).flatMap(DeviceAddress.init))
        } catch {
            await server.close()
            throw error
        }
        let security = security
        var trace: (@Sendable (String) -> Void)?
        if output.verbose {
            trace = { line in StandardOutput().err("otaflash: \(line)\n") }
        }
        let served = PeripheralServer.Device(model: device.model, name: device.name, bootloaderAddress: device.bootloaderAddress,
                                             bootloaderServices: device.bootloaderServices, security: security,
                                             passkey: passkey.map { UInt32($0) }, storeDirectory: store)
        let serving = Serving(protocolName: protocolName, slotSize: slotSize, store: store, applicationAddress: applicationAddress,
                              security: security, passkey: passkey.map { UInt32($0) })
        let result: PeripheralServer.Result
        do {
            result = try await server.serve(served, trace: trace, logger: output.logger("otaflash.agent"), until: {
                if case .signal(let number) = await stop.wait() {
                    printer.note("\(number == SIGINT ? "SIGINT" : "SIGTERM"): unregistering and exiting")
                }
            }, events: { event in
                serving.report(event, device: device, host: host, printer)
            })
        } catch {
            throw Self.failure(error, "")
        }
        if result.runsLockstep {
            if let divergence = result.lockstepDivergence {
                let line = "the C device library and the Swift device model answered differently: \(divergence)"
                printer.json(SimulateEvents.Note(message: line))
                printer.note(line)
                // A difference outranks how serving ended: it is the finding.
                throw CLIFailure(.internalError, line)
            }
            let line = "the C device library answered every write as the Swift model did"
            printer.json(SimulateEvents.Note(message: line))
            printer.note(line)
        }
        if result.ending == .stackGone {
            throw CLIFailure(.bluetoothUnavailable, "bluetoothd stopped (org.bluez left the bus); the OTA target is gone")
        }
        printer.json(SimulateEvents.Done(activations: result.activations))
    }

    /// The `serving` event and line: what is served where, how, and how to stop it.
    struct Serving: Sendable {
        var protocolName: String
        var slotSize: Int
        var store: String?
        var applicationAddress: String?
        var security: LinkSecurity
        var passkey: UInt32?

        /// What the server reports, as events and lines.
        func report(_ event: PeripheralServer.Event, device: ServedDevice, host: PeripheralHost, _ printer: EventPrinter) {
            switch event {
            case .device(let event):
                Simulate.print(event, printer)
            case .serving(let bootloaderAdapter):
                print(device, adapter: host.adapter, address: host.address, bootloaderAdapter: bootloaderAdapter, printer)
            case .moved(let address, let adapter, let mode, let name):
                let at = address?.description ?? "?"
                printer.note(mode == .bootloader ? "the device reset into its bootloader: \"\(name ?? "DfuTarg")\" at \(at) on \(adapter)"
                                                 : "the device reset into its application at \(at) on \(adapter)")
                printer.json(SimulateEvents.Moved(address: address?.description, adapter: adapter, mode: mode))
            case .problem(let line):
                printer.json(SimulateEvents.Note(message: line))
                printer.note(line)
            }
        }

        func print(_ device: ServedDevice, adapter: String, address: String?, bootloaderAdapter: String?, _ printer: EventPrinter) {
            let address = applicationAddress ?? address
            printer.json(SimulateEvents.Serving(adapter: adapter, address: address.flatMap(DeviceAddress.init)?.description ?? address,
                                                name: device.name, protocol: protocolName, slotSize: slotSize,
                                                firmwareVersion: device.firmwareVersion, store: store, bootloaderAdapter: bootloaderAdapter,
                                                bootloaderAddress: device.bootloaderAddress?.description))
            let requirement = security == .none ? ""
                : "; requires an \(security == .encrypt ? "encrypted" : "authenticated") link"
                  + (passkey.map { " (passkey \(PairingCredentials.text($0)))" } ?? "")
            printer.note("serving \(device.what) \"\(device.name)\" on \(adapter)\(address.map { " (\($0))" } ?? ""): "
                         + "slot \(formatBytes(slotSize)), firmware \(device.firmwareVersion)"
                         + (bootloaderAdapter.map { "; its bootloader on \($0)\(device.bootloaderAddress.map { " (\($0))" } ?? "")" } ?? "")
                         + requirement + "; Ctrl-C to stop")
        }
    }

    /// The device `--protocol` names, as its options configure it (its protocol's served-device
    /// group). `address`: the served adapter's, where a device that starts in its application answers.
    private func served(address: DeviceAddress?) throws -> ServedDevice {
        guard let device else {
            throw CLIFailure(.internalError, "the \(protocolName) protocol registers no served device; please report this")
        }
        return try device.served(request(address: address))
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
        case .moved:
            break  // the host that serves the new address says so (`SimulateEvents.Moved`)
        }
    }
}

/// Why serving stopped.
enum StopReason: Sendable {
    case signal(Int32)
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


/// `simulate`'s former option names, from before it took the `--sim-*` names `flash --simulator`
/// gives the same simulated devices: hidden from the help, still taken, so that scripts keep
/// working. Each is refused together with its new name.
struct SimulateFormerNames: ParsableArguments {
    @Option(name: .customLong("slot-size"), parsing: .unconditional, help: ArgumentHelp("The former name of --sim-slot-size.", visibility: .hidden)) var slotSize: Int?
    @Option(name: .customLong("firmware-version"), help: ArgumentHelp("The former name of --sim-firmware-version or --sim-app-version.", visibility: .hidden)) var firmwareVersion: String?
    @Option(name: .customLong("security"), help: ArgumentHelp("The former name of --sim-security.", visibility: .hidden)) var securityText: String?
    @Option(name: .customLong("passkey"), parsing: .unconditional, help: ArgumentHelp("The former name of --sim-passkey.", visibility: .hidden)) var passkey: Int?

    // Taken as text: ArgumentParser names the values of a hidden option's type in no refusal.
    var security: LinkSecurity? { securityText.flatMap(LinkSecurity.init(argument:)) }

    /// Each former name's range (as its new name's), and no value given under both names. (A
    /// protocol's own former names are in its served-device group.)
    func check(against new: Simulate) throws {
        try checkChoice(securityText, LinkSecurity.self, option: "--security")
        try Ranges.slotSize.check(slotSize)
        try Ranges.passkey.check(passkey)
        let pairs: [(String, Bool, String, Bool)] = [
            ("--slot-size", slotSize != nil, "--sim-slot-size", new.slotSizeOption != nil),
            ("--firmware-version", firmwareVersion != nil, "--sim-firmware-version", new.firmwareVersionOption != nil),
            ("--security", securityText != nil, "--sim-security", new.securityOption != nil),
            ("--passkey", passkey != nil, "--sim-passkey", new.passkeyOption != nil),
        ]
        for (former, formerGiven, current, currentGiven) in pairs where formerGiven && currentGiven {
            throw ValidationError("\(former) is the former name of \(current); give \(current) once")
        }
    }
}
