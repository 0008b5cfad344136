import GATT
import OTADevice
import OTAWire
#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// What drops a central's link: BlueZ's `Device1.Disconnect`, or a power cycle of the adapter.
public protocol PeripheralLinkControl: Sendable {
    /// Drops the link to the central at `device` (a `Device1` path), or every link when nil.
    /// Returns a line saying what was done.
    func dropLink(device: String?) async -> String
}

extension PeripheralHost: PeripheralLinkControl {}

/// How `otaflash simulate` presents itself.
public struct OTAPeripheralConfig: Sendable {
    public var name: String
    public var slotSize: Int
    public var firmwareVersion: FirmwareVersion
    public var faults: FaultPlan
    /// Device Information Service strings (0x2A29, 0x2A24).
    public var manufacturer: String
    public var model: String
    /// Where verified-and-activated images are written as `<crc32>.bin`; nil keeps none.
    public var storeDirectory: String?
    /// How long after a successful ACTIVATE the device drops the link to boot the new image.
    public var bootDelay: Duration
    /// Called with one line per read and write and what became of it (debugging).
    public var trace: (@Sendable (String) -> Void)?

    public init(name: String = "otaflash-sim", slotSize: Int = 1 << 20,
                firmwareVersion: FirmwareVersion = FirmwareVersion(major: 1, minor: 0, patch: 0),
                faults: FaultPlan = .none, manufacturer: String = "otaflash", model: String = "otaflash simulate",
                storeDirectory: String? = nil, bootDelay: Duration = .milliseconds(300),
                trace: (@Sendable (String) -> Void)? = nil) {
        self.name = name
        self.slotSize = slotSize
        self.firmwareVersion = firmwareVersion
        self.faults = faults
        self.manufacturer = manufacturer
        self.model = model
        self.storeDirectory = storeDirectory
        self.bootDelay = bootDelay
        self.trace = trace
    }
}

/// What the served device does, for progress output. `central` is the writer's `Device1` path
/// when BlueZ passed one.
public enum OTAPeripheralEvent: Sendable, Hashable {
    case connected(central: String)
    case disconnected(central: String, reason: String)
    case begin(central: String?, size: Int, crc: UInt32, offset: Int)
    case progress(central: String?, received: Int, total: Int)
    case verified(central: String?, crc: UInt32)
    case activated(central: String?, size: Int, crc: UInt32, version: FirmwareVersion, stored: String?)
    /// A second central was told the device is busy with `owner`'s transfer.
    case busy(central: String, owner: String)
    /// An injected fault fired, or something worth a line (a failed store, a dropped link).
    case note(String)
}

/// The OTA target of docs/PROTOCOL.md served through BlueZ: the device logic is `FaultyDevice`
/// (an `OTATarget` behind a `FaultPlan`), this actor only carries its writes, reads and outcomes
/// between BlueZ's GATT server API and the device.
///
/// - Control point writes go to `receiveCommand`; the reply is notified (unless a lost-notification
///   fault swallows it); an injected GATT error becomes `org.bluez.Error.Failed` (ATT 0x80).
/// - Data writes go to `receiveData`; a GAP event is notified; disconnect and reboot faults drop
///   the link (`Device1.Disconnect`, or a power cycle of the adapter when that fails), and for
///   `FaultPlan.rebootDuration` after a reboot every write is ignored and commands fail.
/// - Slow flash: each data packet keeps the device busy for `flashTime`; a command's write reply
///   waits until the device is idle (plus a whole-image read for VERIFY and ACTIVATE), as the
///   in-process simulator does. Data writes are not held back: bluetoothd sends write commands to
///   the application without waiting for a reply (src/gatt-database.c, `chrc_write_cb` passes no
///   owner queue for characteristics flagged write-without-response).
/// - One transfer at a time (docs/PROTOCOL.md): a command from a central other than the one that
///   began the pending transfer is answered with ATT application error 0x89 (0x80 + status
///   `busy`) on that central's write, and nothing is notified — a notification would reach every
///   subscribed central, the owner included.
public actor OTAPeripheral {
    public nonisolated let config: OTAPeripheralConfig
    public private(set) var device: FaultyDevice
    private let events: @Sendable (OTAPeripheralEvent) -> Void
    private var link: (any PeripheralLinkControl)?
    private var notifier: (@Sendable ([UInt8]) async throws -> Void)?
    private var rebootingUntil: ContinuousClock.Instant?
    private var busyUntil = ContinuousClock.now
    private var centrals: Set<String> = []
    private var lastProgress = 0
    /// Files written to the store, newest last.
    public private(set) var stored: [String] = []

    /// The ATT application error a second central's command gets: 0x80 + `busy` (0x09).
    public static let busyATTError: UInt8 = 0x80 | OTAStatus.busy.rawValue

    public init(config: OTAPeripheralConfig, events: @escaping @Sendable (OTAPeripheralEvent) -> Void = { _ in }) {
        self.config = config
        self.events = events
        var target = OTATarget(slotSize: config.slotSize, firmwareVersion: config.firmwareVersion)
        // Through BlueZ a CHECKPOINT can overtake its data (EATT bearers, a central's write socket
        // beside D-Bus): hold it for the data rather than answer `gap` at once.
        target.deferEarlyCheckpoints = true
        device = FaultyDevice(target: target, faults: config.faults)
    }

    /// How long a CHECKPOINT waits for data that may have been reordered before it is answered `gap`.
    public static let deferredCheckpointTimeout: Duration = .milliseconds(300)

    /// Set while a disconnect fault is taking the link down: the device behaves as gone.
    private var linkGoing = false

    private func expireDeferredCheckpoint() async {
        guard let reply = device.target.expireDeferredCheckpoint() else { return }
        config.trace?("deferred CHECKPOINT answered gap after \(Self.deferredCheckpointTimeout)")
        do { try await notifier?(reply) } catch { events(.note("notifying a reply failed: \(error)")) }
    }

    /// Connects the device to the link control and to the notification path of its application.
    public func attach(link: (any PeripheralLinkControl)?, application: PeripheralApplication) {
        self.link = link
        notifier = { [application] value in try await application.notify(OTAProtocol.controlPointUUID, value) }
    }

    /// The OTA service and the Device Information Service, wired to this device.
    public nonisolated var services: [PeripheralService] {
        let ota = PeripheralService(uuid: OTAProtocol.serviceUUID, characteristics: [
            PeripheralCharacteristic(uuid: OTAProtocol.controlPointUUID, flags: ["write", "notify"],
                                     write: { [self] bytes, request in try await self.command(bytes, request) },
                                     notifyChanged: { [self] on in await self.notifyChanged(on) }),
            PeripheralCharacteristic(uuid: OTAProtocol.dataUUID, flags: ["write-without-response"],
                                     write: { [self] bytes, request in await self.data(bytes, request) }),
            PeripheralCharacteristic(uuid: OTAProtocol.infoUUID, flags: ["read"],
                                     read: { [self] request in try await self.info(request) }),
        ])
        let dis = PeripheralService(uuid: DeviceInformationService.serviceUUID, characteristics: [
            .readOnly(DeviceInformationService.manufacturerNameUUID) { [config] in Array(config.manufacturer.utf8) },
            .readOnly(DeviceInformationService.modelNumberUUID) { [config] in Array(config.model.utf8) },
            .readOnly(DeviceInformationService.firmwareRevisionUUID) { [self] in
                Array(await self.device.target.firmwareVersion.description.utf8)
            },
        ])
        return [ota, dis]
    }

    // MARK: Connections

    /// A central showed up: by a read or write carrying its `device`, or by bluetoothd's
    /// `Connected` = true.
    public func centralConnected(_ central: String?) {
        guard let central, centrals.insert(central).inserted else { return }
        events(.connected(central: central))
    }

    public func centralDisconnected(_ central: String, reason: String = "the central disconnected") {
        guard centrals.remove(central) != nil else { return }
        events(.disconnected(central: central, reason: reason))
    }

    private var isRebooting: Bool {
        guard let until = rebootingUntil else { return false }
        if ContinuousClock.now < until { return true }
        rebootingUntil = nil
        return false
    }

    private func notifyChanged(_ on: Bool) {}

    // MARK: Characteristics

    func info(_ request: GATTServerRequest) throws -> [UInt8] {
        centralConnected(request.device)
        if isRebooting { throw GATTServerError.failed("the device is rebooting") }
        return device.target.info.encoded
    }

    func command(_ bytes: [UInt8], _ request: GATTServerRequest) async throws {
        centralConnected(request.device)
        if isRebooting { throw GATTServerError.failed("the device is rebooting") }
        if linkGoing { throw GATTServerError.failed("the link is going down") }
        let opcode = bytes.first.map { OTAOpcode(rawValue: $0) }
        let imageSize = Int(device.target.pending?.imageSize ?? 0)
        let outcome = device.receiveCommand(bytes, from: request.device)
        config.trace?("control point write \(bytes.count) B from \(request.device ?? "?") (mtu \(request.mtu.map(String.init) ?? "?")): \(outcome)")
        switch outcome {
        case .attError:
            events(.note("injected fault: control point write answered with an ATT error"))
            throw GATTServerError.failed("injected GATT error")

        case .handled(let response, let notify, let activated):
            let status = response.count >= 3 ? OTAStatus(rawValue: response[2]) : nil
            if status == .busy, let writer = request.device, let owner = device.target.owner, owner != writer {
                events(.busy(central: writer, owner: owner))
                throw GATTServerError.application(Self.busyATTError)
            }
            let now = ContinuousClock.now
            var ready = max(busyUntil, now)
            if opcode == .verify || opcode == .activate { ready += device.flashTime(bytes: imageSize) }
            busyUntil = ready
            report(opcode: opcode, status: status, response: response, central: request.device)
            if activated { activate(central: request.device) }
            if ready > now { try? await Task.sleep(until: ready, clock: .continuous) }
            if response.isEmpty {
                // A CHECKPOINT ahead of its data: answered when the data arrives, or after a while.
                let timeout = Self.deferredCheckpointTimeout
                Task { [weak self] in
                    try? await Task.sleep(for: timeout)
                    await self?.expireDeferredCheckpoint()
                }
                return
            }
            if notify {
                do {
                    try await notifier?(response)
                } catch {
                    events(.note("notifying the reply failed: \(error)"))
                }
            } else {
                events(.note("injected fault: the reply to \(opcode.map { "\($0)" } ?? "a command") is not notified"))
            }
        }
    }

    func data(_ bytes: [UInt8], _ request: GATTServerRequest) async {
        centralConnected(request.device)
        if isRebooting || linkGoing {
            config.trace?("data write ignored while \(linkGoing ? "the link goes down" : "rebooting")")
            return
        }
        let outcome = device.receiveData(bytes, from: request.device)
        if let trace = config.trace {
            let offset = DataPacket.decode(bytes).map { "offset \($0.offset) +\($0.payload.count)" } ?? "\(bytes.count) B, malformed"
            trace("data write \(offset) from \(request.device ?? "?"): \(outcome), received \(device.target.received)")
        }
        switch outcome {
        case .handled(let event):
            busyUntil = max(busyUntil, .now) + device.flashTime(bytes: max(0, bytes.count - OTAProtocol.dataHeaderSize))
            if let event {
                do { try await notifier?(event) } catch { events(.note("notifying a GAP event failed: \(error)")) }
            }
            reportProgress(central: request.device)
        case .dropped:
            break
        case .disconnect(let reason):
            events(.note("injected fault: \(reason)"))
            linkGoing = true
            dropLink(request.device, reason: reason)
        case .reboot(let reason):
            events(.note("injected fault: \(reason); away for \(device.faults.rebootDuration)"))
            rebootingUntil = .now + device.faults.rebootDuration
            lastProgress = device.target.received
            dropLink(request.device, reason: reason)
        }
    }

    // MARK: Outcomes

    private func report(opcode: OTAOpcode?, status: OTAStatus?, response: [UInt8], central: String?) {
        guard status == .success else { return }
        let target = device.target
        switch opcode {
        case .begin?:
            lastProgress = target.received
            events(.begin(central: central, size: Int(target.pending?.imageSize ?? 0), crc: target.pending?.imageCRC ?? 0,
                          offset: target.received))
        case .verify?:
            events(.verified(central: central, crc: target.pending?.imageCRC ?? 0))
        default:
            break
        }
    }

    private func reportProgress(central: String?) {
        guard let total = device.target.pending.map({ Int($0.imageSize) }), total > 0 else { return }
        let received = device.target.received
        let step = max(total / 20, 1)
        if received == total ? lastProgress != total : received >= lastProgress + step || received < lastProgress {
            lastProgress = received
            events(.progress(central: central, received: received, total: total))
        }
    }

    /// After a successful ACTIVATE: store the image, then "boot" it — drop the link shortly after
    /// the reply went out and stay away for the reboot time.
    private func activate(central: String?) {
        guard let activation = device.target.activations.last else { return }
        var path: String?
        if let directory = config.storeDirectory {
            do {
                path = try Self.store(activation.image, crc: activation.crc, in: directory)
                stored.append(path!)
            } catch {
                events(.note("storing the image failed: \(error)"))
            }
        }
        events(.activated(central: central, size: activation.image.count, crc: activation.crc,
                          version: activation.version, stored: path))
        lastProgress = 0
        let delay = config.bootDelay
        rebootingUntil = .now + delay + device.faults.rebootDuration
        Task { [weak self] in
            try? await Task.sleep(for: delay)
            await self?.dropLink(central, reason: "the device boots the new image")
        }
    }

    private func dropLink(_ central: String?, reason: String) {
        guard let link else { return }
        Task { [weak self] in
            let what = await link.dropLink(device: central)
            await self?.linkDropped(central, reason: reason, what: what)
        }
    }

    private func linkDropped(_ central: String?, reason: String, what: String) {
        linkGoing = false
        if let central {
            centralDisconnected(central, reason: "\(reason) (\(what))")
        } else {
            events(.note("\(reason): \(what)"))
            for c in centrals { centralDisconnected(c, reason: reason) }
        }
    }

    public struct StoreError: Error, CustomStringConvertible {
        public var description: String
    }

    /// Writes `image` to `directory/<crc32>.bin` atomically: a temporary file in the same
    /// directory, flushed, then renamed over the name.
    public static func store(_ image: [UInt8], crc: UInt32, in directory: String) throws -> String {
        var hex = String(crc, radix: 16)
        hex = String(repeating: "0", count: 8 - hex.count) + hex
        let path = "\(directory)/\(hex).bin"
        let temporary = "\(directory)/.\(hex).bin.\(getpid()).tmp"
        let fd = open(temporary, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o644)
        guard fd >= 0 else { throw StoreError(description: "cannot create \(temporary): \(String(cString: strerror(errno)))") }
        var written = 0
        let failure: String? = image.withUnsafeBytes { buffer in
            while written < buffer.count {
                let n = write(fd, buffer.baseAddress! + written, buffer.count - written)
                if n < 0 {
                    if errno == EINTR { continue }
                    return "writing \(temporary): \(String(cString: strerror(errno)))"
                }
                written += n
            }
            return fsync(fd) == 0 ? nil : "flushing \(temporary): \(String(cString: strerror(errno)))"
        }
        close(fd)
        if let failure {
            unlink(temporary)
            throw StoreError(description: failure)
        }
        guard rename(temporary, path) == 0 else {
            let message = "renaming \(temporary) to \(path): \(String(cString: strerror(errno)))"
            unlink(temporary)
            throw StoreError(description: message)
        }
        return path
    }
}

extension OTAPeripheralEvent {
    /// `AA:BB:CC:DD:EE:FF` from a `Device1` path such as `/org/bluez/hci1/dev_AA_BB_CC_DD_EE_FF`.
    public static func address(of central: String) -> String {
        guard let last = central.split(separator: "/").last, last.hasPrefix("dev_") else { return central }
        return String(last.dropFirst(4).map { $0 == "_" ? ":" : $0 })
    }
}
