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

            --protocol native (the default) serves otaflash's own OTA service and the Device Information Service: \
            after an ACTIVATE it answers, then reboots into the image, refusing centrals for the reboot time. One \
            central's transfer at a time: a second central's commands fail with ATT error 0x89 (busy). \
            --sim-device-version 2 serves a protocol version 2 device on NOR flash (docs/PROTOCOL.md) with the C device \
            library (Sources/COTADevice) in lockstep: every write goes to both, and any difference between their \
            answers is reported when serving stops, with exit 1.

            --protocol nordic-dfu serves a Secure DFU bootloader (service 0xFE59, nRF5 SDK rules: object sizes, \
            init packet checks of hardware, SoftDevice, version and signature, the image's SHA-256), so \
            `otaflash --device <address> app_dfu_package.zip` can be tried without a Nordic board. It activates an \
            image once its hash matched and resets into it.

            --protocol smp serves a Zephyr device with MCUmgr's SMP server and MCUboot (the SMP service \
            8D53DC1D with its characteristic DA2E7828, write without response and notify): --sim-smp-buf-size and \
            --sim-smp-buf-count are its SMP buffers (what the MCUmgr parameters read reports; Zephyr's default is 4 × 384), \
            --sim-slot-size each of its two slots, --sim-firmware-version the version of the image it runs in slot 0, \
            --sim-smp-cbor how it encodes its answers (Zephyr's zcbor by default; tinycbor for an mcumgr device). \
            Uploads go to slot 1 and resume by the file's SHA-256; an image marked for test is swapped in at the \
            next reset and runs unconfirmed, a second reset without a confirm reverts it; one confirmed stays. \
            `smpmgr --ble <address> upgrade --slot 1 app.signed.bin` or `otaflash --protocol smp --device \
            <address> app.signed.bin` can update it.

            --sim-buttonless unbonded (with --protocol nordic-dfu) serves the device's application first, with Nordic's \
            buttonless service (8EC90003 in 0xFE59), on --adapter. After Enter Bootloader it resets and its \
            Secure DFU bootloader answers at the address whose least significant octet is one higher. A BlueZ \
            adapter cannot change its address, so the bootloader is served and advertised on \
            --bootloader-adapter, a second adapter whose address must be --adapter's + 1 (e.g. random static \
            addresses set with `btmgmt static-addr`); once it activated an application, the device answers on \
            --adapter again. --name is the application's name; the bootloader advertises DfuTarg, or the name \
            the central gave it.

            The device options have the names `otaflash --simulator` gives the same devices (`otaflash help simulator`); \
            their former names (--slot-size, --firmware-version, --public-key, --buf-size, --buf-count, --cbor, \
            --device-version, --security, --passkey, --buttonless) are still taken.

            Serves until SIGINT or SIGTERM, then unregisters and exits 0.

            Examples:
              otaflash simulate --adapter hci1 --store /tmp/images
              otaflash simulate --adapter hci1 --sim-device-version 2
              otaflash simulate --adapter hci1 --json --sim-drop-rate 0.01 --sim-disconnect-at 100000
              otaflash simulate --adapter hci1 --protocol nordic-dfu --sim-public-key firmware-samples/nordic/test-key-public.pem
              otaflash simulate --adapter hci1 --protocol nordic-dfu --sim-buttonless unbonded --bootloader-adapter hci2
              otaflash simulate --adapter hci1 --protocol smp --sim-smp-buf-size 2475 --sim-slot-size 262144
            """
    )

    @Option(name: .long, help: ArgumentHelp("Bluetooth adapter to serve on (default: the first powered one).", valueName: "hciN"), completion: .adapters)
    var adapter: String?

    @Option(name: .customLong("protocol"), help: ArgumentHelp("The protocol the served device speaks.", valueName: "name"))
    var served: ServedProtocol = .native

    @Option(name: .long, help: "Name to advertise (default: otaflash-sim; DfuTarg for nordic-dfu, as Nordic's bootloaders; otaflash-app for --sim-buttonless's application; otaflash-smp for smp).")
    var name: String?

    @Option(name: .customLong("sim-buttonless"), help: ArgumentHelp("nordic-dfu: serve the device's application with the buttonless service first; Enter Bootloader resets it into its bootloader on --bootloader-adapter. " + SimulatedButtonless.kinds, valueName: "kind"))
    var buttonlessKind: SimulatedButtonless?

    @Option(name: .customLong("bootloader-adapter"), help: ArgumentHelp("With --sim-buttonless: the adapter the bootloader answers on, whose address is --adapter's + 1 (an adapter cannot change its address).", valueName: "hciN"), completion: .adapters)
    var bootloaderAdapter: String?

    @Option(name: .customLong("address"), help: ArgumentHelp("With --sim-buttonless: the address centrals see the application at, when BlueZ reports another (an adapter with a random static address reports its public one); default: --adapter's.", valueName: "AA:BB:CC:DD:EE:FF"))
    var applicationAddress: String?

    @Option(name: .customLong("sim-slot-size"), parsing: .unconditional, help: Ranges.simSlotSize.help("Bytes the device's image slot (a bootloader's bank; each of an SMP server's two slots) holds (default 1048576)", valueName: "bytes"))
    var slotSizeOption: Int?

    @Option(name: .customLong("sim-firmware-version"), help: ArgumentHelp("native, smp: the firmware version the device runs before an update (default 1.0.0).", valueName: "version"))
    var firmwareVersionOption: String?

    @Option(name: .customLong("sim-app-version"), parsing: .unconditional, help: Ranges.simAppVersion.help("nordic-dfu: the version of the application the bootloader holds; a lower application fw_version is a downgrade (default 0)", valueName: "n"))
    var applicationVersionOption: Int?

    @Option(name: .customLong("sim-public-key"), help: ArgumentHelp("nordic-dfu: check init packet signatures with this ECDSA P-256 public key (PEM); without it any signature passes.", valueName: "pem"), completion: .file(extensions: ["pem"]))
    var publicKeyOption: String?

    @Option(name: .customLong("sd-after-update"), parsing: .unconditional, help: Ranges.sdAfterUpdate.help("nordic-dfu: the SoftDevice FWID the bootloader reports once it installed a SoftDevice (what the package's application requires, e.g. 0xB6); default: unchanged", valueName: "fwid"))
    var softDeviceAfterUpdate: FWID?

    @Option(name: .customLong("sim-smp-buf-size"), parsing: .unconditional, help: Ranges.smpBufferSize.help("smp: the largest SMP frame the server takes (its buf_size; Zephyr's CONFIG_MCUMGR_TRANSPORT_NETBUF_SIZE; default 384)", valueName: "bytes"))
    var bufferSizeOption: Int?

    @Option(name: .customLong("sim-smp-buf-count"), parsing: .unconditional, help: Ranges.smpBufferCount.help("smp: how many SMP frames the server holds at once (its buf_count; CONFIG_MCUMGR_TRANSPORT_NETBUF_COUNT; default 4)", valueName: "n"))
    var bufferCountOption: Int?

    @Option(name: .customLong("sim-smp-cbor"), help: ServedReplyEncoding.help)
    var cborOption: ServedReplyEncoding?

    @Option(name: .customLong("sim-smp-mode"), help: ServedBootMode.help)
    var smpMode: ServedBootMode?

    @Flag(name: .customLong("sim-smp-no-downgrade"), help: "smp: MCUboot prevents downgrades (it does not boot an image older than the running one), and its bootloader info says no-downgrade.")
    var smpNoDowngrade = false

    @Flag(name: .customLong("sim-smp-network-core"), help: "smp: the device is an nRF5340 with two images; image 1, its network core, takes its update at the application core's reset (skipped when the application core's image was marked first, as MCUboot does).")
    var smpNetworkCore = false

    @Option(name: .customLong("sim-smp-key"), help: ArgumentHelp("smp: MCUboot checks each image's signature with this key (PEM, ECDSA P-256 or Ed25519, as imgtool writes it) before it swaps the image in; without it the hash only.", valueName: "pem"), completion: .file(extensions: ["pem"]))
    var smpKey: String?

    @Option(name: .customLong("sim-device-version"), parsing: .unconditional, help: Ranges.simDeviceVersion.help("native: the OTA protocol version the device speaks: 2 runs it on NOR flash (4 KiB erase units, 85 ms per erase, 40 µs per word) with the C device library in lockstep; a difference between the two is a note and, at the end, exit 1 (default 1)", valueName: "n"))
    var deviceVersionOption: Int?

    @Option(name: .long, help: ArgumentHelp("Write each verified and activated image to DIR/<crc32>.bin.", valueName: "DIR"), completion: .directory)
    var store: String?

    @Option(name: .customLong("sim-security"), help: ArgumentHelp("What the device's characteristics require of the link: none; encrypt (a bond, Just Works will do); authenticate (a bond made with --sim-passkey, else by a confirmed numeric comparison). The device runs its own pairing agent.", valueName: "level"))
    var securityOption: LinkSecurity?

    @Option(name: .customLong("sim-passkey"), parsing: .unconditional, help: Ranges.simPasskey.help("With --sim-security authenticate: the passkey the device expects a central to enter", valueName: "n"))
    var passkeyOption: Int?

    @OptionGroup(title: "Faults")
    var faults: FaultOptions

    @OptionGroup var output: OutputOptions

    /// The names these options had before they took `flash`'s `--sim-*` names; still taken.
    @OptionGroup var formerNames: SimulateFormerNames

    var protocolName: String { served.name }
    var slotSize: Int { slotSizeOption ?? formerNames.slotSize ?? 1 << 20 }
    var publicKey: String? { publicKeyOption ?? formerNames.publicKey }
    var bufferSize: Int? { bufferSizeOption ?? formerNames.bufferSize }
    var bufferCount: Int? { bufferCountOption ?? formerNames.bufferCount }
    var cbor: ServedReplyEncoding? { cborOption ?? formerNames.cbor }
    var deviceVersion: Int { deviceVersionOption ?? formerNames.deviceVersion ?? 1 }
    var security: LinkSecurity { securityOption ?? formerNames.security ?? .none }
    var passkey: Int? { passkeyOption ?? formerNames.passkey }
    var buttonless: SimulatedButtonless? { buttonlessKind ?? (formerNames.buttonless ? .unbonded : nil) }

    /// The version the served device runs before an update, as text: `--sim-firmware-version`
    /// (native, smp), `--sim-app-version` (nordic-dfu), or the former `--firmware-version` (either).
    var firmwareVersion: String? {
        firmwareVersionOption ?? applicationVersionOption.map { "\($0)" } ?? formerNames.firmwareVersion
    }

    mutating func validate() throws {
        try formerNames.check(against: self)
        try Ranges.simSlotSize.check(slotSizeOption)
        try Ranges.simPasskey.check(passkeyOption)
        try Ranges.simAppVersion.check(applicationVersionOption)
        if passkey != nil, security != .authenticate {
            throw ValidationError("\(formerNames.passkey != nil ? "--passkey" : "--sim-passkey") is what an authenticated pairing expects; add --sim-security authenticate")
        }
        try Ranges.simDeviceVersion.check(deviceVersionOption)
        try SimulatedDeviceOptions.checkVersion2(deviceVersion, slotSize: slotSize,
                                                 option: formerNames.deviceVersion != nil ? "--device-version" : "--sim-device-version",
                                                 slotOption: formerNames.slotSize != nil ? "--slot-size" : "--sim-slot-size")
        try Ranges.smpBufferSize.check(bufferSizeOption)
        try Ranges.smpBufferCount.check(bufferCountOption)
        try refuseOptionsOfOtherProtocols()
        if let firmwareVersionOption, FirmwareVersion(firmwareVersionOption) == nil {
            throw ValidationError("--sim-firmware-version must look like 1.2.3, got '\(firmwareVersionOption)'")
        }
        try Ranges.sdAfterUpdate.check(softDeviceAfterUpdate)
        if let name {
            guard !name.isEmpty, name.utf8.count <= 29 else { throw ValidationError("--name must be 1–29 bytes, got '\(name)'") }
        }
        for (option, given) in [("--adapter", adapter), ("--bootloader-adapter", bootloaderAdapter)] {
            if let given, !(given.hasPrefix("hci") && given.dropFirst(3).allSatisfy(\.isNumber) && given.count > 3) {
                throw ValidationError("\(option) must look like hci0, got '\(given)'")
            }
        }
        try Self.checkButtonless(buttonless != nil, protocol: protocolName, adapter: adapter, bootloaderAdapter: bootloaderAdapter)
        if let applicationAddress {
            guard buttonless != nil else { throw ValidationError("--address is where a --sim-buttonless device's application answers; add --sim-buttonless unbonded") }
            guard DeviceAddress(applicationAddress) != nil else {
                throw ValidationError("--address must look like C0:11:22:33:44:10, got '\(applicationAddress)'")
            }
        }
    }

    /// Each served device's own options, refused with another protocol: one line that says which
    /// protocol they configure.
    private func refuseOptionsOfOtherProtocols() throws {
        let given: [(String, Bool)] = [
            (deviceVersionOption != nil ? "--sim-device-version" : "--device-version", deviceVersion != 1),
            ("--sim-smp-buf-size", bufferSizeOption != nil), ("--buf-size", formerNames.bufferSize != nil),
            ("--sim-smp-buf-count", bufferCountOption != nil), ("--buf-count", formerNames.bufferCount != nil),
            ("--sim-smp-cbor", cborOption != nil), ("--cbor", formerNames.cborText != nil), ("--sim-smp-key", smpKey != nil),
            ("--sim-smp-mode", smpMode != nil), ("--sim-smp-no-downgrade", smpNoDowngrade), ("--sim-smp-network-core", smpNetworkCore),
            ("--sim-public-key", publicKeyOption != nil), ("--public-key", formerNames.publicKey != nil),
            ("--sd-after-update", softDeviceAfterUpdate != nil), ("--sim-app-version", applicationVersionOption != nil),
        ]
        for (option, isGiven) in given where isGiven && !(ProtocolCommandLine.named(protocolName)?.servedOptions.contains(option) ?? false) {
            guard let owner = ProtocolCommandLine.all.first(where: { $0.servedOptions.contains(option) }) else { continue }
            throw ValidationError("\(option) configures a simulated \(owner.device); add --protocol \(owner.name)")
        }
        let takesVersions = ProtocolCommandLine.named(protocolName)?.takes.contains("--sim-firmware-version") ?? false
        if firmwareVersionOption != nil, !takesVersions {
            throw ValidationError("--sim-firmware-version is a native or SMP device's version; a Secure DFU bootloader's application version is --sim-app-version")
        }
        if let version = formerNames.firmwareVersion {
            if !takesVersions, UInt32(version) == nil {
                throw ValidationError("--firmware-version for \(protocolName) is the application version, a number 0-\(UInt32.max), got '\(version)'")
            } else if takesVersions, FirmwareVersion(version) == nil {
                throw ValidationError("--firmware-version must look like 1.2.3, got '\(version)'")
            }
        }
    }

    /// `--sim-buttonless` serves a Secure DFU device on two adapters: the application's and the bootloader's.
    static func checkButtonless(_ buttonless: Bool, protocol name: String, adapter: String?, bootloaderAdapter: String?) throws {
        guard buttonless else {
            if bootloaderAdapter != nil {
                throw ValidationError("--bootloader-adapter is where a --sim-buttonless device's bootloader answers; add --sim-buttonless unbonded")
            }
            return
        }
        guard ProtocolCommandLine.named(name)?.servedOptions.contains("--sim-buttonless") == true else {
            throw ValidationError("--sim-buttonless serves a Secure DFU device's application; add --protocol nordic-dfu")
        }
        guard let bootloaderAdapter else {
            throw ValidationError("--sim-buttonless needs --bootloader-adapter hciN: a BlueZ adapter cannot change its address, "
                                  + "so the bootloader answers on a second adapter whose address is the application's + 1")
        }
        guard let adapter else {
            throw ValidationError("--sim-buttonless needs --adapter hciN, the adapter the application answers on (its address + 1 is --bootloader-adapter's)")
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
            server = try await PeripheralServer.open(adapter: adapter, bootloaderAdapter: buttonless != nil ? bootloaderAdapter : nil)
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

    /// The device `--protocol` names, as its options configure it (its protocol's registration).
    /// `address`: the served adapter's, where a `--sim-buttonless` application answers.
    private func served(address: DeviceAddress?) throws -> ServedDevice {
        guard let registration = ProtocolCommandLine.named(protocolName) else {
            throw CLIFailure(.internalError, "the \(protocolName) protocol registers no served device; please report this")
        }
        var request = ServeRequest(
            name: name, slotSize: slotSize, firmwareVersion: firmwareVersion, faults: faults.plan, deviceVersion: deviceVersion,
            publicKey: publicKey, publicKeyOption: publicKeyOption != nil ? "--sim-public-key" : "--public-key",
            softDeviceAfterUpdate: softDeviceAfterUpdate?.value, buttonless: buttonless, adapter: adapter, address: address,
            bufferSize: bufferSize, bufferCount: bufferCount, replyEncoding: cbor?.rawValue)
        request.signatureKey = smpKey
        request.bootMode = smpMode?.rawValue
        request.noDowngrade = smpNoDowngrade
        request.networkCore = smpNetworkCore
        return try registration.served(request)
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
    @Option(name: .customLong("public-key"), help: ArgumentHelp("The former name of --sim-public-key.", visibility: .hidden)) var publicKey: String?
    @Option(name: .customLong("buf-size"), parsing: .unconditional, help: ArgumentHelp("The former name of --sim-smp-buf-size.", visibility: .hidden)) var bufferSize: Int?
    @Option(name: .customLong("buf-count"), parsing: .unconditional, help: ArgumentHelp("The former name of --sim-smp-buf-count.", visibility: .hidden)) var bufferCount: Int?
    @Option(name: .customLong("cbor"), help: ArgumentHelp("The former name of --sim-smp-cbor.", visibility: .hidden)) var cborText: String?
    @Option(name: .customLong("device-version"), parsing: .unconditional, help: ArgumentHelp("The former name of --sim-device-version.", visibility: .hidden)) var deviceVersion: Int?
    @Option(name: .customLong("security"), help: ArgumentHelp("The former name of --sim-security.", visibility: .hidden)) var securityText: String?

    // Taken as text: ArgumentParser names the values of a hidden option's type in no refusal.
    var cbor: ServedReplyEncoding? { cborText.flatMap(ServedReplyEncoding.init(argument:)) }
    var security: LinkSecurity? { securityText.flatMap(LinkSecurity.init(argument:)) }
    @Option(name: .customLong("passkey"), parsing: .unconditional, help: ArgumentHelp("The former name of --sim-passkey.", visibility: .hidden)) var passkey: Int?
    @Flag(name: .customLong("buttonless"), help: ArgumentHelp("The former name of --sim-buttonless unbonded.", visibility: .hidden)) var buttonless = false

    /// Each former name's range (as its new name's), and no value given under both names.
    func check(against new: Simulate) throws {
        try Self.checkChoice(cborText, ServedReplyEncoding.self, option: "--cbor")
        try Self.checkChoice(securityText, LinkSecurity.self, option: "--security")
        try Ranges.slotSize.check(slotSize)
        try Ranges.bufSize.check(bufferSize)
        try Ranges.bufCount.check(bufferCount)
        try Ranges.deviceVersion.check(deviceVersion)
        try Ranges.passkey.check(passkey)
        let pairs: [(String, Bool, String, Bool)] = [
            ("--slot-size", slotSize != nil, "--sim-slot-size", new.slotSizeOption != nil),
            ("--firmware-version", firmwareVersion != nil, "--sim-firmware-version", new.firmwareVersionOption != nil),
            ("--firmware-version", firmwareVersion != nil, "--sim-app-version", new.applicationVersionOption != nil),
            ("--public-key", publicKey != nil, "--sim-public-key", new.publicKeyOption != nil),
            ("--buf-size", bufferSize != nil, "--sim-smp-buf-size", new.bufferSizeOption != nil),
            ("--buf-count", bufferCount != nil, "--sim-smp-buf-count", new.bufferCountOption != nil),
            ("--cbor", cborText != nil, "--sim-smp-cbor", new.cborOption != nil),
            ("--device-version", deviceVersion != nil, "--sim-device-version", new.deviceVersionOption != nil),
            ("--security", securityText != nil, "--sim-security", new.securityOption != nil),
            ("--passkey", passkey != nil, "--sim-passkey", new.passkeyOption != nil),
            ("--buttonless", buttonless, "--sim-buttonless", new.buttonlessKind != nil),
        ]
        for (former, formerGiven, current, currentGiven) in pairs where formerGiven && currentGiven {
            throw ValidationError("\(former) is the former name of \(current); give \(current) once")
        }
    }

    /// ArgumentParser's refusal of a value outside `Choice`'s.
    static func checkChoice<Choice: ExpressibleByArgument>(_ text: String?, _: Choice.Type, option: String) throws {
        guard let text, Choice(argument: text) == nil else { return }
        let values = Choice.allValueStrings.map { "'\($0)'" }
        throw ValidationError("The value '\(text)' is invalid for '\(option)'. Please provide one of "
                              + values.dropLast().joined(separator: ", ") + " or " + (values.last ?? "") + ".")
    }
}
