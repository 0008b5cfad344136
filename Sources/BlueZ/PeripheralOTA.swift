import DBus
import GATT
import OTADevice
import OTAWire
#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// The link operations a served device needs from the stack: drop a central's link, and hear of
/// centrals connecting and disconnecting. `PeripheralHost` implements them with BlueZ.
public protocol PeripheralLinkControl: Sendable {
    /// Drops the link to the central at `device` (a `Device1` path), or every link when nil.
    /// Returns a line saying what was done.
    func dropLink(device: String?) async -> String
    /// Calls `handler(devicePath, connected)` whenever a central connects or disconnects.
    func watchConnections(_ handler: @escaping @Sendable (String, Bool) -> Void) async throws
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
    /// How long after its ACTIVATE reply the device drops the link to boot the new image.
    public var bootDelay: Duration
    /// How long a CHECKPOINT that overtook its data is held for it before it is answered `gap`.
    public var holdEarlyCheckpoint: Duration
    /// Called with one line per read and write and what became of it (debugging).
    public var trace: (@Sendable (String) -> Void)?

    public init(name: String = "otaflash-sim", slotSize: Int = 1 << 20,
                firmwareVersion: FirmwareVersion = FirmwareVersion(major: 1, minor: 0, patch: 0),
                faults: FaultPlan = .none, manufacturer: String = "otaflash", model: String = "otaflash simulate",
                storeDirectory: String? = nil, bootDelay: Duration = .milliseconds(300),
                holdEarlyCheckpoint: Duration = .milliseconds(300), trace: (@Sendable (String) -> Void)? = nil) {
        self.name = name
        self.slotSize = slotSize
        self.firmwareVersion = firmwareVersion
        self.faults = faults
        self.manufacturer = manufacturer
        self.model = model
        self.storeDirectory = storeDirectory
        self.bootDelay = bootDelay
        self.holdEarlyCheckpoint = holdEarlyCheckpoint
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

/// The OTA target of docs/PROTOCOL.md served through BlueZ. The device is a `DeviceModel` (an
/// `OTATarget` behind a `FaultPlan`, with its timing), the same one the in-process simulator runs;
/// this actor only carries writes and reads from BlueZ's GATT server API to the model and does
/// what the model decides, when it says:
///
/// - Control point writes: the write's D-Bus reply waits until the model's reply time (slow
///   flash); the reply is notified unless a lost-notification fault swallows it. An injected GATT
///   error is `org.bluez.Error.Failed` (ATT 0x80). A command from a central other than the one
///   that began the pending transfer fails with ATT application error 0x89 (0x80 + status
///   `busy`) on that central's write, and nothing is notified: a notification would reach every
///   subscribed central, the owner included.
/// - Data writes: a GAP event is notified when the model says. Data writes are not held back:
///   bluetoothd sends write commands to the application without waiting for a reply
///   (src/gatt-database.c, `chrc_write_cb` passes no owner queue for characteristics flagged
///   write-without-response).
/// - Link drops (disconnect fault) are `Device1.Disconnect`, or a power cycle of the adapter when
///   that fails. A reboot (fault, or booting an activated image after its reply went out) drops
///   the links, and for `FaultPlan.rebootDuration` a central that connects has its reads and
///   writes refused. Every request is answered before its link goes down.
///   (It keeps advertising: withdrawing the advertisement and registering it again on BlueZ 5.66
///   left it unseen by later scans from other controllers.)
/// - A held CHECKPOINT's deadline wakes the model, which answers `gap` only if that very
///   CHECKPOINT is still held.
///
/// Outputs run one at a time in time order, so an ACTIVATE reply is always sent before the link
/// drop that follows it.
public actor OTAPeripheral {
    public nonisolated let config: OTAPeripheralConfig
    public private(set) var model: DeviceModel
    private let clock: any MonotonicClock
    private let events: @Sendable (OTAPeripheralEvent) -> Void
    private var link: (any PeripheralLinkControl)?
    private var notifier: (@Sendable ([UInt8]) async throws -> Void)?
    private var centrals: Set<String> = []
    /// Centrals whose link is being dropped: their writes are ignored until it is down.
    private var dropping: Set<String> = []
    /// `Device1.Disconnect` calls in flight, by central.
    private var linkDrops: [String: Task<String, Never>] = [:]
    /// Reads and writes whose D-Bus reply has not gone out yet. A link is dropped only once they
    /// are answered: bluetoothd 5.66 crashes (a use after free in its write completion) when a
    /// WriteValue is still unanswered as the link it came on goes down.
    private var unanswered = 0
    /// Centrals refused while the device was away (one note each).
    private var refused: Set<String> = []
    private var answered: [CheckedContinuation<Void, Never>] = []
    private var lastProgress = 0
    /// Due outputs, in time order (ties in the order they were decided).
    private var queue: [Job] = []
    private var sequence = 0
    private var runner: Task<Void, Never>?
    /// The time the runner sleeps until, while it sleeps; an earlier job wakes it.
    private var runnerWakesAt: Duration?
    private var stopped = false
    private var watcher: Task<Void, Never>?

    private struct Job {
        var at: Duration
        var sequence: Int
        var work: Work
    }

    private enum Work {
        case output(DeviceModel.Output, central: String?)
    }

    /// The ATT application error a second central's command gets: 0x80 + `busy` (0x09).
    public static let busyATTError: UInt8 = 0x80 | OTAStatus.busy.rawValue

    /// - Parameter clock: the time the device model runs on; real time unless a test injects one.
    public init(config: OTAPeripheralConfig, clock: any MonotonicClock = SystemClock(),
                events: @escaping @Sendable (OTAPeripheralEvent) -> Void = { _ in }) {
        self.config = config
        self.clock = clock
        self.events = events
        let target = OTATarget(slotSize: config.slotSize, firmwareVersion: config.firmwareVersion)
        // Through BlueZ a CHECKPOINT can overtake its data (EATT bearers, a central's write socket
        // beside D-Bus): hold it for the data rather than answer `gap` at once.
        let timing = DeviceModel.Timing(holdEarlyCheckpoint: config.holdEarlyCheckpoint, bootDelay: config.bootDelay)
        model = DeviceModel(device: FaultyDevice(target: target, faults: config.faults), timing: timing)
    }

    /// The device: its OTA state machine and faults.
    public var device: FaultyDevice { model.device }

    /// Waits until the device is back from a reboot (at once when it is not away).
    public func waitUntilBack() async {
        let back = model.availableAt
        if back > clock.now { try? await clock.sleep(until: back) }
    }

    /// Connects the device to the link operations and the notification path of its application;
    /// starts watching connections.
    public func attach(link: (any PeripheralLinkControl)?, application: PeripheralApplication) async throws {
        self.link = link
        notifier = { [application] value in try await application.notify(OTAProtocol.controlPointUUID, value) }
        guard let link else { return }
        // One consumer, so connects and disconnects reach the device in the order bluetoothd sent them.
        let (changes, continuation) = AsyncStream.makeStream(of: (String, Bool).self)
        try await link.watchConnections { path, connected in continuation.yield((path, connected)) }
        watcher = Task { [weak self] in
            for await (path, connected) in changes {
                if connected {
                    await self?.centralConnected(path)
                } else {
                    await self?.centralDisconnected(path)
                }
            }
        }
    }

    /// Stops carrying out outputs (a pending link drop, re-advertising after a reboot): the
    /// service is being torn down.
    public func stop() {
        stopped = true
        watcher?.cancel()
        watcher = nil
        runner?.cancel()
        runner = nil
        queue.removeAll()
    }

    /// The OTA service and the Device Information Service, wired to this device.
    public nonisolated var services: [PeripheralService] {
        let ota = PeripheralService(uuid: OTAProtocol.serviceUUID, characteristics: [
            PeripheralCharacteristic(uuid: OTAProtocol.controlPointUUID, flags: ["write", "notify"],
                                     write: { [self] bytes, request in try await self.command(bytes, request) }),
            PeripheralCharacteristic(uuid: OTAProtocol.dataUUID, flags: ["write-without-response"],
                                     write: { [self] bytes, request in await self.data(bytes, request) }),
            PeripheralCharacteristic(uuid: OTAProtocol.infoUUID, flags: ["read"],
                                     read: { [self] request in try await self.read(request) { $0.info.encoded } }),
        ])
        let values: [(BluetoothUUID, @Sendable (OTATarget) -> [UInt8])] = [
            (DeviceInformationService.manufacturerNameUUID, { [config] _ in Array(config.manufacturer.utf8) }),
            (DeviceInformationService.modelNumberUUID, { [config] _ in Array(config.model.utf8) }),
            (DeviceInformationService.firmwareRevisionUUID, { target in Array(target.firmwareVersion.description.utf8) }),
        ]
        let dis = PeripheralService(uuid: DeviceInformationService.serviceUUID, characteristics: values.map { uuid, value in
            PeripheralCharacteristic(uuid: uuid, flags: ["read"], read: { [self] request in try await self.read(request, value) })
        })
        return [ota, dis]
    }

    // MARK: Connections

    /// A central showed up: by a read or write carrying its `device`, or by bluetoothd's
    /// `Connected` = true. While the device reboots it is refused: its link is dropped.
    public func centralConnected(_ central: String?) async {
        _ = await admit(central)
    }

    /// Whether a central may talk to the device now; a rebooting device refuses it.
    private func admit(_ central: String?) async -> Bool {
        if model.isAway(at: clock.now) {
            if let central { refuse(central) }
            return false
        }
        if let central, centrals.insert(central).inserted { events(.connected(central: central)) }
        return true
    }

    public func centralDisconnected(_ central: String, reason: String = "the central disconnected") {
        model.linkDropped(central: central)
        refused.remove(central)
        guard centrals.remove(central) != nil else { return }
        events(.disconnected(central: central, reason: reason))
    }

    /// A rebooting device answers nothing: a central's request is refused. Its link is left to
    /// the central (dropping it from this side on BlueZ 5.66 left the adapter not advertising for
    /// scans from other controllers).
    private func refuse(_ central: String) {
        guard refused.insert(central).inserted else { return }
        events(.note("refused \(OTAPeripheralEvent.address(of: central)): the device is rebooting"))
    }

    /// Counts a request until its reply is on its way (the handler returned).
    private func answering() { unanswered += 1 }

    private func answeredOne() {
        unanswered -= 1
        guard unanswered == 0 else { return }
        let waiting = answered
        answered = []
        for waiter in waiting { waiter.resume() }
    }

    /// Waits until every request received so far is answered, or `limit` passed.
    private func allAnswered(within limit: Duration) async {
        guard unanswered > 0 else { return }
        let deadline = Task { [weak self] in
            try? await Task.sleep(for: limit)
            await self?.releaseWaiters()
        }
        await withCheckedContinuation { answered.append($0) }
        deadline.cancel()
    }

    private func releaseWaiters() {
        let waiting = answered
        answered = []
        for waiter in waiting { waiter.resume() }
    }

    /// Drops the link to `central`, or waits for the drop already under way.
    private func dropLinkOnce(_ central: String) async -> String {
        if let running = linkDrops[central] { return await running.value }
        guard let link else { return "no link control" }
        let drop = Task { await link.dropLink(device: central) }
        linkDrops[central] = drop
        let what = await drop.value
        linkDrops[central] = nil
        return what
    }

    /// What a read or write that reached a rebooting device fails with; its link is dropped right
    /// after the reply, and the central reconnects when the device is back.
    private static let rebooting = GATTServerError.failed("the device is rebooting")
    /// The longest a link drop waits for the replies still owed on it.
    static let replyGrace: Duration = .seconds(10)

    // MARK: Characteristics

    func read(_ request: GATTServerRequest, _ value: @Sendable (OTATarget) -> [UInt8]) async throws -> [UInt8] {
        answering()
        defer { answeredOne() }
        guard await admit(request.device) else { throw Self.rebooting }
        return value(model.target)
    }

    func command(_ bytes: [UInt8], _ request: GATTServerRequest) async throws {
        answering()
        defer { answeredOne() }
        guard await admit(request.device) else { throw Self.rebooting }
        if let central = request.device, dropping.contains(central) {
            throw GATTServerError.failed("the link is going down")
        }
        let opcode = bytes.first.map { OTAOpcode(rawValue: $0) }
        let result = model.receiveCommand(bytes, from: request.device, at: clock.now)
        config.trace?("control point write \(bytes.count) B from \(request.device ?? "?") (mtu \(request.mtu.map(String.init) ?? "?")): \(result.reply)")
        switch result.reply {
        case .away:
            if let central = request.device { refuse(central) }
            throw Self.rebooting
        case .injectedError:
            events(.note("injected fault: control point write answered with an ATT error"))
            throw GATTServerError.failed("injected GATT error")
        case .busy(let owner):
            if let writer = request.device { events(.busy(central: writer, owner: owner)) }
            throw GATTServerError.application(Self.busyATTError)
        case .success:
            let status = result.response.count >= 3 ? OTAStatus(rawValue: result.response[2]) : nil
            report(opcode: opcode, status: status, central: request.device)
            if result.activated { activated(central: request.device) }
            if result.notificationLost {
                events(.note("injected fault: the reply to \(opcode.map { "\($0)" } ?? "a command") is not notified"))
            }
            // The write is answered at once: its reply is the notification, due at `at`. Holding
            // the write's own answer until then let a central that saw the notification
            // disconnect while the write was still unanswered, which crashes bluetoothd 5.66.
            schedule(result.outputs, central: request.device)
        }
    }

    func data(_ bytes: [UInt8], _ request: GATTServerRequest) async {
        answering()
        defer { answeredOne() }
        guard await admit(request.device) else { return }
        if let central = request.device, dropping.contains(central) {
            config.trace?("data write ignored while the link goes down")
            return
        }
        let outputs = model.receiveData(bytes, from: request.device, at: clock.now)
        if let trace = config.trace {
            let offset = DataPacket.decode(bytes).map { "offset \($0.offset) +\($0.payload.count)" } ?? "\(bytes.count) B, malformed"
            trace("data write \(offset) from \(request.device ?? "?"): \(outputs), received \(model.target.received)")
        }
        for timed in outputs {
            switch timed.output {
            case .dropLink(let reason):
                events(.note("injected fault: \(reason)"))
                // Writes that follow on this link are lost with it.
                if let central = request.device { dropping.insert(central) }
            case .reboot(_, let reason):
                events(.note("injected fault: \(reason); away for \(model.device.faults.rebootDuration)"))
                lastProgress = model.target.received
            case .notify, .wake:
                break
            }
        }
        schedule(outputs, central: request.device)
        reportProgress(central: request.device)
    }

    // MARK: Carrying out the model's outputs

    private func schedule(_ outputs: [DeviceModel.Timed], central: String?) {
        guard !stopped, !outputs.isEmpty else { return }
        for timed in outputs { enqueue(Job(at: timed.at, sequence: 0, work: .output(timed.output, central: central))) }
    }

    private func enqueue(_ job: Job) {
        var job = job
        sequence += 1
        job.sequence = sequence
        let i = queue.firstIndex { ($0.at, $0.sequence) > (job.at, job.sequence) } ?? queue.count
        queue.insert(job, at: i)
        if runner == nil {
            runner = Task { await self.runQueue() }
        } else if let wakesAt = runnerWakesAt, job.at < wakesAt {
            // The runner sleeps past this job: start one that does not.
            runner?.cancel()
            runnerWakesAt = nil
            runner = Task { await self.runQueue() }
        }
    }

    private func runQueue() async {
        while !Task.isCancelled, let next = queue.first {
            if next.at > clock.now {
                runnerWakesAt = next.at
                do { try await clock.sleep(until: next.at) } catch { return }
                if Task.isCancelled { return }  // replaced by a runner for an earlier job, or stopped
                runnerWakesAt = nil
                continue
            }
            queue.removeFirst()
            await perform(next.work)
        }
        if !Task.isCancelled { runner = nil }
    }

    private func perform(_ work: Work) async {
        switch work {
        case .output(.notify(let value), _):
            do { try await notifier?(value) } catch { events(.note("notifying a reply failed: \(error)")) }
        case .output(.wake(let token), let central):
            if model.target.deferred != nil {
                config.trace?("held CHECKPOINT not reached by its data within \(config.holdEarlyCheckpoint)")
            }
            schedule(model.wake(token, at: clock.now), central: central)
        case .output(.dropLink(let reason), let central):
            await dropLink(central, reason: reason)
        case .output(.reboot(_, let reason), let central):
            // The advertisement stays registered while away (withdrawing and registering it again
            // on BlueZ 5.66 left it unseen by later scans from other controllers); a central that
            // connects meanwhile is refused. Every link is dropped; with none known, the adapter
            // is power-cycled, as a real device's reboot resets its radio.
            let links = centrals.union(central.map { [$0] } ?? [])
            if links.isEmpty {
                await dropLink(nil, reason: reason)
            } else {
                for c in links.sorted() { await dropLink(c, reason: reason) }
            }
        }
    }

    private func dropLink(_ central: String?, reason: String) async {
        guard let link else { return }
        let what: String
        if let central {
            dropping.insert(central)
            await allAnswered(within: Self.replyGrace)
            what = await dropLinkOnce(central)
            dropping.remove(central)
        } else {
            await allAnswered(within: Self.replyGrace)
            what = await link.dropLink(device: nil)
        }
        linkDropped(central, reason: reason, what: what)
    }

    private func linkDropped(_ central: String?, reason: String, what: String) {
        if let central {
            centralDisconnected(central, reason: "\(reason) (\(what))")
        } else {
            events(.note("\(reason): \(what)"))
            model.linkDropped()
            for c in centrals { centralDisconnected(c, reason: reason) }
        }
    }

    // MARK: Reporting

    private func report(opcode: OTAOpcode?, status: OTAStatus?, central: String?) {
        guard status == .success else { return }
        let target = model.target
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
        guard let total = model.target.pending.map({ Int($0.imageSize) }), total > 0 else { return }
        let received = model.target.received
        let step = max(total / 20, 1)
        if received == total ? lastProgress != total : received >= lastProgress + step || received < lastProgress {
            lastProgress = received
            events(.progress(central: central, received: received, total: total))
        }
    }

    /// After a successful ACTIVATE: store the image and report it. The reboot into it is one of
    /// the command's outputs, due after the reply.
    private func activated(central: String?) {
        guard let activation = model.target.lastActivation else { return }
        var path: String?
        if let directory = config.storeDirectory {
            do {
                path = try Self.store(activation.image, crc: activation.crc, in: directory)
            } catch {
                events(.note("storing the image failed: \(error)"))
            }
        }
        events(.activated(central: central, size: activation.image.count, crc: activation.crc,
                          version: activation.version, stored: path))
        lastProgress = 0
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
