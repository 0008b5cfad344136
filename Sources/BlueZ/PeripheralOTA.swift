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

/// The link operations of a device served on several adapters (an application on one, its
/// bootloader on another): a central's link is dropped through the adapter it came on, and
/// connections are watched on every adapter.
public struct AdapterLinks: PeripheralLinkControl {
    public let hosts: [PeripheralHost]

    public init(_ hosts: [PeripheralHost]) {
        self.hosts = hosts
    }

    public func dropLink(device: String?) async -> String {
        guard let device else {
            var done: [String] = []
            for host in hosts { done.append(await host.dropLink(device: nil)) }
            return done.joined(separator: "; ")
        }
        guard let host = hosts.first(where: { device.hasPrefix($0.adapterPath + "/") }) else {
            return "no served adapter has \(device)"
        }
        return await host.dropLink(device: device)
    }

    public func watchConnections(_ handler: @escaping @Sendable (String, Bool) -> Void) async throws {
        for host in hosts { try await host.watchConnections(handler) }
    }
}

/// What the served device does, for progress output. `central` is the writer's `Device1` path
/// when BlueZ passed one.
public enum OTAPeripheralEvent: Sendable, Hashable {
    case connected(central: String)
    case disconnected(central: String, reason: String)
    /// `crc`: the image's CRC32 when the protocol announces one (native BEGIN does).
    case begin(central: String?, size: Int, crc: UInt32?, offset: Int)
    case progress(central: String?, received: Int, total: Int)
    case verified(central: String?, crc: UInt32?)
    /// `version` in the protocol's notation ("1.2.0" native, "2" for a Secure DFU fw_version).
    case activated(central: String?, size: Int, crc: UInt32, version: String?, stored: String?)
    /// A second central was told the device is busy with `owner`'s transfer.
    case busy(central: String, owner: String)
    /// An injected fault fired, or something worth a line (a failed store, a dropped link).
    case note(String)
    /// The device reset and now answers at another address (`PeripheralModel.currentAddress`):
    /// a host that serves each address on its own adapter moves its advertising there.
    case moved(address: DeviceAddress?)
}

/// A device model (`PeripheralModel`: the native OTA target, a Secure DFU bootloader, ...) served
/// through BlueZ: the same model the in-process simulator hosts, with the same faults and timing.
/// This actor only carries reads and writes from BlueZ's GATT server API to the model and does
/// what the model decides, when it says:
///
/// - Writes with response are answered at once with the model's verdict (a refusal is an ATT
///   error: an application error 0x80-0x9F as such, anything else `org.bluez.Error.Failed`);
///   replies the protocol sends as notifications are due at the model's time. Answering at once
///   matters: a central that saw the notification could otherwise disconnect while its write was
///   still unanswered, which crashes bluetoothd 5.66.
/// - Writes without response (bluetoothd sends them without waiting for a reply,
///   src/gatt-database.c `chrc_write_cb`) go to the model as they come.
/// - Link drops (a disconnect fault) are `Device1.Disconnect`, or a power cycle of the adapter when
///   that fails. A reboot (fault, or booting an activated image) drops the links, and while the
///   model is away a central that connects has its reads and writes refused. Every request is
///   answered before its link goes down.
///   (It keeps advertising: withdrawing the advertisement and registering it again on BlueZ 5.66
///   left it unseen by later scans from other controllers.)
///
/// Outputs run one at a time in time order, so a reply is always sent before the link drop that
/// follows it.
public actor OTAPeripheral {
    /// Where activated images are written as `<crc32>.bin`; nil keeps none.
    public nonisolated let storeDirectory: String?
    private let trace: (@Sendable (String) -> Void)?
    public private(set) var model: any PeripheralModel
    /// The model's GATT table when serving began.
    private nonisolated let table: [OTADevice.PeripheralService]
    /// Write commands go through BlueZ's AcquireWrite (``PeripheralWriteSocket`` says why) when the
    /// model's writes carry their place: BlueZ sends the writes it holds while it acquires from a
    /// buffer the next ATT PDU has overwritten (src/gatt-database.c, `pending_write_new` keeps a
    /// pointer, not a copy), and only such a protocol finds and resends them without more ado.
    private nonisolated let acquiresDataWrites: Bool
    private let clock: any MonotonicClock
    private let events: @Sendable (OTAPeripheralEvent) -> Void
    private var link: (any PeripheralLinkControl)?
    private var notifier: (@Sendable (BluetoothUUID, [UInt8]) async throws -> Void)?
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
    /// The last progress shown, and the transfer's size.
    private var lastProgress = 0
    /// Images activated while serving.
    public private(set) var activations = 0
    /// Due outputs, in time order (ties in the order they were decided).
    private var queue: [Job] = []
    private var sequence = 0
    private var runner: Task<Void, Never>?
    /// The time the runner sleeps until, while it sleeps; an earlier job wakes it.
    private var runnerWakesAt: Duration?
    private var stopped = false
    private var watcher: Task<Void, Never>?
    /// The address the device answered at when it last reset (`PeripheralModel.currentAddress`).
    private var servedAddress: DeviceAddress?

    private struct Job {
        var at: Duration
        var sequence: Int
        var output: PeripheralOutput
        var central: String?
    }

    /// What the characteristics require of the link (their BlueZ `encrypt-*` flags).
    public nonisolated let security: LinkSecurity

    /// Serves `model`.
    ///
    /// - Parameters:
    ///   - storeDirectory: where activated images are written as `<crc32>.bin`; nil keeps none.
    ///   - trace: called with one line per read and write and what became of it (debugging).
    ///   - clock: the time the device model runs on; real time unless a test injects one.
    ///   - security: what the characteristics require of the link; bluetoothd refuses reads and
    ///     writes on a weaker one, so the model sees only those of encrypted links.
    public init(model: any PeripheralModel, storeDirectory: String? = nil, trace: (@Sendable (String) -> Void)? = nil,
                clock: any MonotonicClock = SystemClock(), security: LinkSecurity = .none,
                events: @escaping @Sendable (OTAPeripheralEvent) -> Void = { _ in }) {
        var model = model
        model.linkEncrypted(security > .none)
        self.model = model
        self.security = security
        self.table = model.services
        self.acquiresDataWrites = model.writesCarryTheirPlace
        self.servedAddress = model.currentAddress
        self.storeDirectory = storeDirectory
        self.trace = trace
        self.clock = clock
        self.events = events
    }

    /// Whether a second implementation of the served model runs beside it in lockstep.
    public var runsLockstep: Bool { model.runsLockstep }

    /// With `runsLockstep`: the first point where the two answered differently.
    public var lockstepDivergence: String? { model.lockstepDivergence }

    /// Waits until the device is back from a reboot (at once when it is not away).
    public func waitUntilBack() async {
        let back = model.availableAt
        if back > clock.now { try? await clock.sleep(until: back) }
    }

    /// Connects the device to the link operations and the notification path of its application;
    /// starts watching connections.
    public func attach(link: (any PeripheralLinkControl)?, application: PeripheralApplication) async throws {
        try await attach(link: link, notify: { [application] uuid, value in try await application.notify(uuid, value) },
                         disconnected: { [application] central in await application.release(device: central) })
    }

    /// Connects the device to the link operations and a notification path (one that picks the
    /// application holding the characteristic, when the device is served by several); starts
    /// watching connections.
    public func attach(link: (any PeripheralLinkControl)?,
                       notify: @escaping @Sendable (BluetoothUUID, [UInt8]) async throws -> Void,
                       disconnected: (@Sendable (String) async -> Void)? = nil) async throws {
        self.link = link
        notifier = notify
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
                    await disconnected?(path)
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

    /// The model's GATT table as BlueZ objects, wired to this actor: a characteristic that takes
    /// writes without response only gets them as data, any other write is a write with response.
    public nonisolated var services: [PeripheralService] { services(for: table) }

    /// `table` as BlueZ objects wired to this actor, for a device whose table changes with what it
    /// runs (an application and its bootloader) and is served by an application per table.
    public nonisolated func services(for table: [OTADevice.PeripheralService]) -> [PeripheralService] {
        table.map { service in
            PeripheralService(uuid: service.uuid, characteristics: service.characteristics.map(characteristic))
        }
    }

    private nonisolated func characteristic(_ c: OTADevice.PeripheralCharacteristic) -> PeripheralCharacteristic {
        let uuid = c.uuid
        let properties = c.properties
        var read: PeripheralCharacteristic.ReadHandler?
        if properties.contains(.read) {
            read = { [self] request in try await self.read(uuid, request) }
        }
        var write: PeripheralCharacteristic.WriteHandler?
        var acquiresWrites = false
        if !properties.isDisjoint(with: [.write, .reliableWrite]) {
            write = { [self] bytes, request in try await self.command(bytes, to: uuid, request) }
        } else if properties.contains(.writeWithoutResponse) {
            write = { [self] bytes, request in await self.data(bytes, to: uuid, request) }
            acquiresWrites = acquiresDataWrites
        }
        var notifyChanged: PeripheralCharacteristic.NotifyHandler?
        if !properties.isDisjoint(with: [.notify, .indicate]) {
            notifyChanged = { [self] enabled in await self.notificationsChanged(enabled, for: uuid) }
        }
        return PeripheralCharacteristic(uuid: uuid, flags: properties.bluezFlagNames + Self.securityFlags(security, properties),
                                        read: read, write: write,
                                        notifyChanged: notifyChanged, acquiresWrites: acquiresWrites)
    }

    /// BlueZ's flags that make bluetoothd refuse a read, write or subscription on a weaker link with ATT
    /// insufficient authentication or encryption (doc/org.bluez.GattCharacteristic.rst, "Flags").
    nonisolated static func securityFlags(_ security: LinkSecurity, _ properties: CharacteristicProperties) -> [String] {
        guard security > .none else { return [] }
        let prefix = security == .authenticate ? "encrypt-authenticated-" : "encrypt-"
        var flags: [String] = []
        if properties.contains(.read) { flags.append(prefix + "read") }
        if !properties.isDisjoint(with: [.write, .writeWithoutResponse, .reliableWrite]) { flags.append(prefix + "write") }
        // The subscription too, as embedded stacks protect a protected characteristic's CCCD
        // (NimBLE, Zephyr): bluetoothd then refuses the CCCD write on a weaker link.
        if properties.contains(.notify) { flags.append(prefix + "notify") }
        if properties.contains(.indicate) { flags.append(prefix + "indicate") }
        return flags
    }

    /// A central subscribed to or unsubscribed from `uuid` (StartNotify / StopNotify).
    func notificationsChanged(_ enabled: Bool, for uuid: BluetoothUUID) {
        model.notificationsChanged(enabled, for: uuid)
    }

    // MARK: Connections

    /// A central showed up: by a read or write carrying its `device`, or by bluetoothd's
    /// `Connected` = true. While the device reboots it is refused.
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
        releaseWaiters()
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

    /// What a read or write that reached a rebooting device fails with.
    private static let rebooting = GATTServerError.failed("the device is rebooting")
    /// The longest a link drop waits for the replies still owed on it.
    static let replyGrace: Duration = .seconds(10)

    // MARK: Characteristics

    func read(_ uuid: BluetoothUUID, _ request: GATTServerRequest) async throws -> [UInt8] {
        answering()
        defer { answeredOne() }
        guard await admit(request.device) else { throw Self.rebooting }
        guard let value = model.read(uuid) else { throw GATTServerError.notPermitted("\(uuid) cannot be read") }
        return value
    }

    func command(_ bytes: [UInt8], to uuid: BluetoothUUID, _ request: GATTServerRequest) async throws {
        answering()
        defer { answeredOne() }
        guard await admit(request.device) else { throw Self.rebooting }
        if let central = request.device, dropping.contains(central) {
            throw GATTServerError.failed("the link is going down")
        }
        if let mtu = request.mtu { model.mtuChanged(mtu) }
        let result = model.write(bytes, to: uuid, withResponse: true, from: request.device, at: clock.now)
        trace?("write \(model.describe(bytes, to: uuid)) to \(uuid) from \(request.device ?? "?") (mtu \(request.mtu.map(String.init) ?? "?")): "
               + "\(result.reply), \(result.outputs.map(\.output))")
        report(result.reports, central: request.device)
        switch result.reply {
        case .away:
            if let central = request.device { refuse(central) }
            throw Self.rebooting
        case .failure(let error, let what):
            if (0x80...0x9F).contains(error.rawValue) { throw GATTServerError.application(error.rawValue) }
            if error == .writeNotPermitted { throw GATTServerError.notPermitted(what) }
            throw GATTServerError.failed("\(what): ATT error 0x\(String(error.rawValue, radix: 16))")
        case .success:
            // Answered at once; what the protocol replies is notified at the model's time.
            schedule(result.outputs, central: request.device)
        }
    }

    func data(_ bytes: [UInt8], to uuid: BluetoothUUID, _ request: GATTServerRequest) async {
        answering()
        defer { answeredOne() }
        guard await admit(request.device) else { return }
        if let central = request.device, dropping.contains(central) {
            trace?("data write ignored while the link goes down")
            return
        }
        if let mtu = request.mtu { model.mtuChanged(mtu) }
        let result = model.write(bytes, to: uuid, withResponse: false, from: request.device, at: clock.now)
        trace?("data write \(model.describe(bytes, to: uuid)) from \(request.device ?? "?"): \(result.outputs.map(\.output))")
        for timed in result.outputs {
            switch timed.output {
            case .dropLink(let reason):
                events(.note("injected fault: \(reason)"))
                // Writes that follow on this link are lost with it.
                if let central = request.device { dropping.insert(central) }
            case .reboot(let until, let reason, let injected):
                events(.note("\(injected ? "injected fault: " : "")\(reason); away for \(until - clock.now)"))
                lastProgress = 0
            case .notify, .wake:
                break
            }
        }
        schedule(result.outputs, central: request.device)
        report(result.reports, central: request.device)
    }

    // MARK: Carrying out the model's outputs

    private func schedule(_ outputs: [PeripheralTimed], central: String?) {
        guard !stopped, !outputs.isEmpty else { return }
        for timed in outputs { enqueue(Job(at: timed.at, sequence: 0, output: timed.output, central: central)) }
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
            await perform(next.output, central: next.central)
        }
        if !Task.isCancelled { runner = nil }
    }

    private func perform(_ output: PeripheralOutput, central: String?) async {
        switch output {
        case .notify(let uuid, let value):
            do { try await notifier?(uuid, value) } catch { events(.note("notifying a reply failed: \(error)")) }
        case .wake(let token):
            schedule(model.wake(token, at: clock.now), central: central)
        case .dropLink(let reason):
            await dropLink(central, reason: reason)
        case .reboot(_, let reason, _):
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
            if model.currentAddress != servedAddress {
                servedAddress = model.currentAddress
                events(.moved(address: servedAddress))
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
            model.linkDropped(central: nil)
            for c in centrals { centralDisconnected(c, reason: reason) }
        }
    }

    // MARK: Reporting

    private func report(_ reports: [PeripheralReport], central: String?) {
        for report in reports {
            switch report {
            case .begin(let size, let crc, let offset):
                lastProgress = offset
                events(.begin(central: central, size: size, crc: crc, offset: offset))
            case .progress(let received, let total):
                // Every 5 %, the end, and any step back.
                let step = max(total / 20, 1)
                if received == total ? lastProgress != total : received >= lastProgress + step || received < lastProgress {
                    lastProgress = received
                    events(.progress(central: central, received: received, total: total))
                }
            case .verified(let crc):
                events(.verified(central: central, crc: crc))
            case .activated(let image, let version):
                activated(image, version: version, central: central)
            case .busy(let owner):
                if let central { events(.busy(central: central, owner: owner)) }
            case .note(let text):
                events(.note(text))
            }
        }
    }

    /// An image was activated: store it and report it. The reboot into it is one of the write's
    /// outputs, due after the reply.
    private func activated(_ image: [UInt8], version: String?, central: String?) {
        activations += 1
        let crc = CRC32.checksum(image)
        var path: String?
        if let storeDirectory {
            do {
                path = try Self.store(image, crc: crc, in: storeDirectory)
            } catch {
                events(.note("storing the image failed: \(error)"))
            }
        }
        events(.activated(central: central, size: image.count, crc: crc, version: version, stored: path))
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
                let n = write(fd, buffer.baseAddress?.advanced(by: written), buffer.count - written)
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
