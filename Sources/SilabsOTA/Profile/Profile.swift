import GATT
import OTA
import OTAWire
import Synchronization

/// Silicon Labs' Bluetooth OTA (EFR32, Gecko SDK and Simplicity SDK) as an `OTAProfile`: the
/// AppLoader or an application's OTA DFU component on the OTA service, `SilabsOTAEngine` on it;
/// an application with the in-place component alone is moved into its AppLoader first
/// (`enterUpdateMode`).
public struct SilabsOTAProfile: OTAProfile {
    public typealias Engine = SilabsOTAEngine

    /// The name `--protocol` takes.
    public static let name = "silabs-ota"

    /// The GBL's application version, to recognise it on the device after the update.
    public let imageVersion: UInt32?
    /// OTA Data as write commands where the device flags them (false: write requests, each
    /// answered, as Silicon Labs' host example sends them by default).
    public let writeCommands: Bool
    /// How long an application OTA DFU device is given to erase its slot again after a lost link.
    public let settle: Duration

    public init(imageVersion: UInt32? = nil, writeCommands: Bool = false, settle: Duration = .seconds(5)) {
        self.imageVersion = imageVersion
        self.writeCommands = writeCommands
        self.settle = settle
    }

    public var name: String { Self.name }
    public var serviceUUID: BluetoothUUID { SilabsOTAService.serviceUUID }
    public var imageFormats: Set<ImageFormat.Kind> { [.gbl] }
    public var otherFormatHint: String? {
        "Silicon Labs' OTA takes a GBL file: " + GBLFile.howToMake()
    }
    public var imageCheck: String {
        "checks the GBL (its CRC-32, and its signature where secure boot asks for one): the AppLoader before it answers 0x03, an application's OTA DFU component once the link closes"
    }
    /// Neither device keeps a stopped transfer: the GBL goes again whole.
    public var resumesTransfer: Bool { false }

    public func attach(to connection: any GATTConnection, device: String,
                       discoveryTimeout: Duration) async throws(OTAError) -> AttachedLink<SilabsOTALink> {
        do {
            return try await withTimeout(discoveryTimeout, clock: connection.clock, "discovering Silicon Labs' OTA service") { () async throws(GATTError) in
                let services = try await connection.discoverServices()
                guard let service = services.first(where: { $0.uuid == SilabsOTAService.serviceUUID }) else {
                    throw GATTError(.serviceNotFound, "\(device) does not expose Silicon Labs' OTA service 1d14d6ee-…; does its application include the application or in-place OTA DFU component?")
                }
                let control = try service.requireCharacteristic(SilabsOTAService.controlUUID, name: "OTA Control")
                guard control.properties.contains(.write) else {
                    throw GATTError(.notPermitted, "\(device)'s OTA Control characteristic takes no write requests (\(control.properties))")
                }
                let versions = await Self.versions(of: service, on: connection)
                guard let data = service.characteristic(SilabsOTAService.dataUUID) else {
                    // The in-place component: OTA Control alone (enterUpdateMode moves it).
                    let summary = DeviceSummary(protocolName: Self.name, firmwareVersion: versions.application.map(SilabsVersions.firmwareVersion),
                                                state: .idle, stateText: "application with in-place OTA DFU (OTA Control alone): it reboots into its AppLoader for the update")
                    return AttachedLink(characteristics: [.control: control, .data: control], peer: SilabsOTALink(mode: nil, versions: versions), summary: summary)
                }
                guard !data.properties.isDisjoint(with: [.write, .writeWithoutResponse]) else {
                    throw GATTError(.notPermitted, "\(device)'s OTA Data characteristic cannot be written (\(data.properties))")
                }
                let mode: SilabsOTAMode = service.characteristic(SilabsOTAService.otaVersionUUID) != nil ? .appLoader : .application
                let commands = data.properties.contains(.writeWithoutResponse) && (writeCommands || !data.properties.contains(.write))
                // What is handed over is what is sent: without the flag, each data write is a request the session awaits.
                let stream = commands ? data : GATTCharacteristic(uuid: data.uuid, properties: data.properties.subtracting(.writeWithoutResponse), id: data.id)
                let who = mode == .appLoader ? "AppLoader" : "application OTA DFU (bootloader storage slot)"
                let details = versions.text.isEmpty ? "" : "; \(versions.text)"
                let summary = DeviceSummary(protocolName: Self.name, firmwareVersion: versions.application.map(SilabsVersions.firmwareVersion), state: .idle,
                                            stateText: "\(who)\(details); OTA Data as write \(commands ? "commands" : "requests"); cannot resume")
                return AttachedLink(characteristics: [.control: control, .data: stream],
                                    peer: SilabsOTALink(mode: mode, versions: versions, writeCommands: commands), summary: summary)
            }
        } catch {
            throw OTAError.from(error, device: device)
        }
    }

    /// The version characteristics the service has, read; one that fails to read is left out.
    static func versions(of service: GATTService, on connection: any GATTConnection) async -> SilabsVersions {
        func read(_ uuid: BluetoothUUID) async -> [UInt8]? {
            guard let c = service.characteristic(uuid), c.properties.contains(.read) else { return nil }
            return try? await connection.read(c)
        }
        var versions = SilabsVersions()
        versions.otaVersion = await read(SilabsOTAService.otaVersionUUID).flatMap(SilabsVersions.otaVersion)
        versions.apploader = await read(SilabsOTAService.apploaderVersionUUID).flatMap(SilabsVersions.apploader)
        versions.bootloader = await read(SilabsOTAService.bootloaderVersionUUID).flatMap(SilabsVersions.word)
        versions.application = await read(SilabsOTAService.applicationVersionUUID).flatMap(SilabsVersions.word)
        return versions
    }

    public func chunkSize(mtu: Int) -> Int { SilabsOTAEngine.chunk(mtu: mtu) }

    public func makeEngine(image: FirmwareImage, config: EngineConfig) -> SilabsOTAEngine {
        SilabsOTAEngine(image: image, config: config, imageVersion: imageVersion, settle: settle)
    }

    /// An application with the in-place component (OTA Control, no OTA Data): any write to OTA
    /// Control reboots it into its AppLoader, after it closed the link (`sl_bt_in_place_ota_dfu.c`).
    /// The AppLoader answers at the same address, or at a random static one when the application
    /// configured it so, advertising its name ("OTA" unless set): the sessions look for it there.
    ///
    /// - Throws: `OTAError` `.permission` when it refuses the write with 0x80 (it requires a bond).
    public func enterUpdateMode(on connection: any GATTConnection, services: [GATTService], device: DeviceAddress,
                                limits: UpdateModeLimits) async throws(OTAError) -> UpdateModeEntry? {
        guard let service = services.first(where: { $0.uuid == SilabsOTAService.serviceUUID }),
              service.characteristic(SilabsOTAService.dataUUID) == nil,
              let control = service.characteristic(SilabsOTAService.controlUUID) else { return nil }
        do {
            try await withTimeout(limits.reply, clock: connection.clock, "writing 0x00 to OTA Control") { () async throws(GATTError) in
                try await connection.write(SilabsControl.begin.encoded, to: control, type: .withResponse)
            }
        } catch {
            if error.attError?.rawValue == 0x80 {
                throw OTAError(.permission, "\(device) refused to reboot into its AppLoader (ATT error 0x80: \(SilabsRefusal(code: 0x80, mode: .application).meaning))",
                               hint: "pass --pair to bond with it first", cause: error)
            }
            throw OTAError.from(error, device: device.description)
        }
        // The application closes the link after a delay of its own, then resets.
        let clock = connection.clock
        let deadline = clock.now + limits.disconnect
        while true {
            let left = deadline - clock.now
            guard left > .zero, let event = await connection.nextEvent(timeout: left) else { break }
            if case .disconnected = event { break }
        }
        await connection.disconnect()
        return UpdateModeEntry(application: device, address: device, name: SilabsOTAService.appLoaderName,
                               mode: "its AppLoader, through in-place OTA DFU")
    }

    /// Runs the session, and reads an ATT error that ended it as the device that answered means it.
    public func run(_ session: OTASession, events: @escaping @Sendable (SessionEvent) -> Void) async throws(OTAError) -> OTAResult {
        let seen = ModeSeen()
        do {
            return try await Recording(inner: self, seen: seen).run(session, events: events)
        } catch {
            throw Self.explained(error, mode: seen.mode)
        }
    }

    /// `error` with the meaning of the ATT application error that caused it, when one did.
    public static func explained(_ error: OTAError, mode: SilabsOTAMode?) -> OTAError {
        guard let gatt = error.cause as? GATTError, let code = gatt.attError?.rawValue, (0x80...0x9F).contains(code) else { return error }
        let refusal = SilabsRefusal(code: code, mode: mode)
        let hint = switch refusal.failureCode {
        case .verifyFailed: "check the GBL (commander gbl parse; --gbl-key checks its signature); the device stays in its AppLoader and takes the next run"
        case .imageTooLarge: "the GBL does not fit the device: build a smaller application, or one for its flash layout"
        case .permission: "pass --pair to bond with it first"
        default: "run the same command again: the whole GBL goes again"
        }
        return OTAError(refusal.failureCode, "the device refused a write with \(refusal)", hint: hint, cause: gatt)
    }
}

/// The mode a run's device attached in, for `SilabsOTAProfile.explained`.
final class ModeSeen: Sendable {
    private let value = Mutex<SilabsOTAMode?>(nil)
    var mode: SilabsOTAMode? { value.withLock { $0 } }
    func set(_ mode: SilabsOTAMode?) { value.withLock { $0 = mode ?? $0 } }
}

/// The profile as the session runs it (`OTAProfile.run`'s default), noting the mode it attaches in.
struct Recording: OTAProfile {
    typealias Engine = SilabsOTAEngine
    let inner: SilabsOTAProfile
    let seen: ModeSeen

    var name: String { inner.name }
    var serviceUUID: BluetoothUUID { inner.serviceUUID }
    var imageFormats: Set<ImageFormat.Kind> { inner.imageFormats }
    var otherFormatHint: String? { inner.otherFormatHint }
    var imageCheck: String { inner.imageCheck }
    var resumesTransfer: Bool { inner.resumesTransfer }

    func attach(to connection: any GATTConnection, device: String, discoveryTimeout: Duration) async throws(OTAError) -> AttachedLink<SilabsOTALink> {
        let link = try await inner.attach(to: connection, device: device, discoveryTimeout: discoveryTimeout)
        seen.set(link.peer.mode)
        return link
    }

    func chunkSize(mtu: Int) -> Int { inner.chunkSize(mtu: mtu) }
    func makeEngine(image: FirmwareImage, config: EngineConfig) -> SilabsOTAEngine { inner.makeEngine(image: image, config: config) }
}
