import GATT
import OTADevice
import OTAWire

/// A Zephyr device with MCUmgr's SMP server and MCUboot (`SMPServer`) with its GATT table, as the
/// simulator and `otaflash simulate --protocol smp` serve it: the SMP service with its one
/// characteristic (write without response, notify), and the Device Information Service.
///
/// Transport, as Zephyr's `smp_bt.c` with `CONFIG_MCUMGR_TRANSPORT_BT_REASSEMBLY`:
/// - writes are reassembled into frames by the header's length. A first fragment shorter than a
///   header, or a frame over `buf_size` (over one write too, for a server that does not report
///   `buf_size`), is dropped with no answer (Zephyr's reassembly refuses it
///   with -ENODATA / -ENOSR and `smp_bt` drops it; a write without response has nothing to carry
///   an error back), and so are the rest of that frame's fragments (Zephyr would read each as a
///   new frame's start; the model skips them by the header's length). A fragment running past its
///   frame's end drops the frame (-EOVERFLOW).
/// - each frame holds one of `buf_count` buffers from its first fragment until its answer is
///   sent. A frame that starts while every buffer is held is dropped, with no answer (the pool is
///   empty: Zephyr has nothing to collect it in, nor to answer with).
/// - requests are handled one at a time, in order; an upload chunk takes the flash time
///   (`FaultPlan.slowFlashPerKiB`, the first chunk also erasing the image's length). Each answer
///   goes out as notifications of at most ATT MTU − 3 bytes.
/// - a reset is answered, then after `resetDelay` the link drops and MCUboot runs
///   (`SMPServer.boot()`): the device is away for `bootDuration`.
/// - answers are written as `SMPServer.Config.encoding` says (`SMPServer.reply(_:to:)`: Zephyr's
///   zcbor by default, indefinite-length maps in its handlers' field order).
///
/// Faults come from the shared `FaultInjector`, at image offsets for upload chunks (a chunk's
/// data is its packet): a dropped chunk or request gets no answer, a corrupted one is written
/// with a byte flipped (the file's SHA-256 and the slot's hash then differ), link losses, reboots
/// (MCUboot runs, the upload's RAM state is lost), a hang, lost notifications, slow flash, a bit
/// flipped in flash (`SMPServer.flashBitFlipAt`) and refused connections. ATT error faults do not
/// apply: nothing here is a write with response.
public struct SMPPeripheral: PeripheralModel {
    public private(set) var server: SMPServer
    /// From the reset's answer to the reset: time for the answer to go out
    /// (`SimulatedDeviceConfig.bootDelay` in the simulator).
    public var resetDelay: Duration
    /// How long the device is away while it resets (MCUboot's swap and the boot).
    public var bootDuration: Duration
    /// How long the server takes for each request, besides the flash.
    public var requestTime: Duration
    /// How long a new upload's first request erases the slot before it is answered, besides
    /// the flash time per KiB (Zephyr's `img_mgmt_upload` erases in the request's handler; the
    /// link and the ATT layer go on, the SMP answer waits).
    public var eraseTime: Duration = .zero
    public var manufacturer: String
    public var modelNumber: String

    private var injector: FaultInjector
    private var awayUntil = Duration.zero
    private var busyUntil = Duration.zero
    private var maxWrite = 20
    /// The frame being collected: its bytes and its whole size; or the bytes still to skip of a
    /// dropped one.
    private var collecting: [UInt8] = []
    private var expected = 0
    private var skipping = 0
    /// When each held buffer is freed (its answer sent).
    private var held: [Duration] = []
    /// Buffers held at once, at most, so far.
    public private(set) var peakBuffers = 0
    /// Frames dropped for want of a buffer, or for being over `buf_size` or malformed.
    public private(set) var droppedFrames = 0
    /// Images MCUboot swapped in, oldest first, with their version.
    public private(set) var activations: [(image: [UInt8], version: String)] = []

    public init(server: SMPServer = SMPServer(), faults: FaultPlan = .none, resetDelay: Duration = .milliseconds(100),
                bootDuration: Duration = .milliseconds(500), requestTime: Duration = .zero,
                manufacturer: String = "otaflash", modelNumber: String = "simulated-smp-server") {
        self.server = server
        self.server.flashBitFlipAt = faults.flashBitFlipAt ?? server.flashBitFlipAt
        self.injector = FaultInjector(faults)
        self.resetDelay = resetDelay
        self.bootDuration = bootDuration
        self.requestTime = requestTime
        self.manufacturer = manufacturer
        self.modelNumber = modelNumber
    }

    /// A simulated Zephyr device with an SMP server: `bufferCount` buffers of `bufferSize` bytes,
    /// two slots of `slotSize` bytes, slot 0 running a small MCUboot image of `firmwareVersion`,
    /// confirmed, answering in `encoding`. `resetDelay`: from the reset's answer to the reset (the simulator's
    /// `SimulatedDeviceConfig.bootDelay`).
    public init(bufferSize: Int = 384, bufferCount: Int = 4, slotSize: Int, firmwareVersion: FirmwareVersion,
                encoding: SMPReplyEncoding = .zephyr, faults: FaultPlan = .none, resetDelay: Duration = .milliseconds(100),
                bootDuration: Duration = .milliseconds(500)) {
        self.init(config: SMPServer.Config(bufferSize: bufferSize, bufferCount: bufferCount, slotSize: slotSize, encoding: encoding),
                  firmwareVersion: firmwareVersion, faults: faults, resetDelay: resetDelay, bootDuration: bootDuration)
    }

    /// A simulated Zephyr device whose server is configured by `config` (its buffers, slot size
    /// and refusals), slot 0 running a small MCUboot image of `firmwareVersion`, and slot 1
    /// holding what `leftover` says an earlier update left there: an image of the same version
    /// pending, or the previous one (a test image runs unconfirmed). `signatureKey`: the key its
    /// MCUboot checks signatures with (nil: the hash only).
    public init(config: SMPServer.Config, firmwareVersion: FirmwareVersion, leftover: SMPLeftover? = nil,
                signatureKey: MCUbootImage.PublicKey? = nil, faults: FaultPlan = .none, resetDelay: Duration = .milliseconds(100), bootDuration: Duration = .milliseconds(500)) {
        func image(_ what: String) -> [UInt8] {
            SMPSlotImage.build(major: firmwareVersion.major, minor: firmwareVersion.minor, revision: firmwareVersion.patch,
                               body: Array("otaflash \(what) image \(firmwareVersion)".utf8))
        }
        let slot1: SMPServer.Leftover? = switch leftover {
        case .pending: .pending(image("pending test"))
        case .unconfirmed: .revertTarget(image("previous"))
        case nil: nil
        }
        self.init(server: SMPServer(config: config, running: image(leftover == .unconfirmed ? "unconfirmed test" : "factory"), leftover: slot1,
                                    signatureKey: signatureKey),
                  faults: faults, resetDelay: resetDelay, bootDuration: bootDuration)
    }

    /// The faults still to come.
    public var faults: FaultPlan { injector.plan }

    public var services: [PeripheralService] {
        [
            PeripheralService(SMPService.serviceUUID, [PeripheralCharacteristic(SMPService.characteristicUUID, [.writeWithoutResponse, .notify])]),
            PeripheralService(DeviceInformationService.serviceUUID, [
                PeripheralCharacteristic(DeviceInformationService.manufacturerNameUUID, [.read]),
                PeripheralCharacteristic(DeviceInformationService.modelNumberUUID, [.read]),
                PeripheralCharacteristic(DeviceInformationService.firmwareRevisionUUID, [.read]),
            ]),
        ]
    }

    public var advertisedServices: [BluetoothUUID] { [SMPService.serviceUUID] }
    public var availableAt: Duration { awayUntil }

    public func refusesConnection(after connections: Int) -> Bool {
        injector.refusesConnection(after: connections)
    }

    public func read(_ characteristic: BluetoothUUID) -> [UInt8]? {
        switch characteristic {
        case DeviceInformationService.manufacturerNameUUID: Array(manufacturer.utf8)
        case DeviceInformationService.modelNumberUUID: Array(modelNumber.utf8)
        case DeviceInformationService.firmwareRevisionUUID: Array(server.primary.versionText.utf8)
        default: nil
        }
    }

    public mutating func mtuChanged(_ mtu: Int) {
        maxWrite = ATTWriteLimit.value(mtu: mtu)
    }

    public mutating func write(_ bytes: [UInt8], to characteristic: BluetoothUUID, withResponse: Bool,
                               from central: String?, at now: Duration) -> PeripheralWriteResult {
        guard characteristic == SMPService.characteristicUUID else {
            return PeripheralWriteResult(reply: .failure(.writeNotPermitted, "writing \(characteristic)"), outputs: [])
        }
        guard now >= awayUntil else { return PeripheralWriteResult(reply: .away, outputs: []) }
        var outputs: [PeripheralTimed] = []
        var reports: [PeripheralReport] = []
        if let frame = collect(bytes, at: now, reports: &reports) {
            outputs = handle(frame, at: now, reports: &reports)
        }
        return PeripheralWriteResult(reply: .success(at: now), outputs: outputs, reports: reports)
    }

    /// The largest frame taken: `buf_size`; for a server that does not report it (an older one,
    /// mcumgr), at least one write, which is what a client then sends a request in (smpclient's
    /// fallback) and what such a device is configured to hold.
    private var frameLimit: Int {
        server.config.answersParameters ? server.config.bufferSize : max(server.config.bufferSize, maxWrite)
    }

    /// Takes one write into the frame being collected; returns the frame it completes.
    private mutating func collect(_ fragment: [UInt8], at now: Duration, reports: inout [PeripheralReport]) -> SMPFrame? {
        held.removeAll { $0 <= now }
        if skipping > 0 {
            skipping -= min(skipping, fragment.count)
            return nil
        }
        if collecting.isEmpty {
            guard fragment.count >= SMPHeader.size, let header = try? SMPHeader(decoding: fragment.prefix(SMPHeader.size)) else {
                droppedFrames += 1
                reports.append(.note("dropped a \(fragment.count)-byte write that starts no SMP frame"))
                return nil
            }
            let size = SMPHeader.size + Int(header.length)
            guard size <= frameLimit else {
                droppedFrames += 1
                skipping = max(0, size - fragment.count)
                reports.append(.note("dropped a \(size)-byte SMP frame (\(header)): over the \(frameLimit)-byte buffer"))
                return nil
            }
            guard held.count < server.config.bufferCount else {
                droppedFrames += 1
                skipping = max(0, size - fragment.count)
                reports.append(.note("dropped an SMP frame (\(header)): all \(server.config.bufferCount) buffers are in use"))
                return nil
            }
            expected = size
            peakBuffers = max(peakBuffers, held.count + 1)
        }
        guard collecting.count + fragment.count <= expected else {
            droppedFrames += 1
            collecting = []
            reports.append(.note("dropped an SMP frame: a write ran past its end"))
            return nil
        }
        collecting += fragment
        guard collecting.count == expected else { return nil }
        defer { collecting = [] }
        // The header decoded above; the frame cannot fail to build from it.
        return try? SMPFrame(decoding: collecting)
    }

    /// Handles a whole request frame: the faults, the server, the answer's timing.
    private mutating func handle(_ frame: SMPFrame, at now: Duration, reports: inout [PeripheralReport]) -> [PeripheralTimed] {
        var frame = frame
        var chunk: SMPImageUpload?
        if case .imageUpload(let c)? = try? SMPRequest(decoding: frame) { chunk = c }
        // Faults place an upload chunk (of an image or a file) and a file download request at
        // their offsets; other requests take the rate faults only.
        let file = chunk == nil ? Self.filePosition(frame, bufferSize: server.config.bufferSize) : nil
        let offset = chunk.flatMap { Int(exactly: $0.offset) } ?? file?.offset
        switch injector.packet(at: offset, count: chunk?.data.count ?? file?.count ?? frame.payload.count) {
        case .dropped:
            reports.append(.note("injected fault: \(frame.header) is dropped"))
            return []
        case .disconnect(let reason):
            return [PeripheralTimed(at: now, .dropLink(reason: reason))]
        case .corrupt(let index, let mask):
            if var c = chunk, index < c.data.count {
                c.data[index] ^= mask
                if let corrupted = try? SMPRequest.imageUpload(c).frame(sequence: frame.header.sequence),
                   let rebuilt = try? SMPFrame(header: frame.header, payload: corrupted.payload) {
                    frame = rebuilt
                }
                reports.append(.note("injected fault: a byte of the chunk at \(c.offset) arrives flipped"))
            }
        case .deliver:
            break
        }
        if chunk != nil, let limit = server.config.busyAbove, held.count >= limit {
            // Fewer buffers free than the device reported: the request is refused, not held.
            reports.append(.note("\(frame.header) finds \(held.count) requests held: answered busy"))
            let answer = server.reply(.error(.general(.busy)), to: frame.header).encoded
            return SMPFraming.segments(answer, maxWrite: maxWrite).map {
                PeripheralTimed(at: now + requestTime, .notify(SMPService.characteristicUUID, Array($0)))
            }
        }
        if case .echo? = try? SMPRequest(decoding: frame), server.crashesOnEcho {
            // A broken test image: its watchdog resets the device before it answers.
            return reboot(at: now + requestTime, reason: "the test image crashed (its watchdog reset the device)", injected: false, reports: &reports)
        }
        let before = server.upload
        let (response, resetRequested) = server.handle(frame)
        var work = requestTime
        if let chunk, case .upload = response {
            work += injector.flashTime(bytes: chunk.data.count)
            if chunk.offset == 0, !Self.resumed(before, server.upload) {
                // A new upload erases the slot first.
                work += injector.flashTime(bytes: Int(clamping: chunk.length ?? 0)) + eraseTime
            }
        }
        let done = max(busyUntil, now) + work
        busyUntil = done
        held.append(done)
        reports += uploadReports(chunk, before: before, response: response)

        var outputs: [PeripheralTimed] = []
        if injector.plan.loseFinalAnswer, resetRequested {
            // `--sim-lose-final-answer`: the reset overtakes its answer.
            reports.append(.note("injected fault: the answer to the reset is lost; the device resets"))
        } else if injector.losesNotification() {
            reports.append(.note("injected fault: the answer to \(frame.header) is not notified"))
        } else {
            for segment in SMPFraming.segments(server.reply(response, to: frame.header).encoded, maxWrite: maxWrite) {
                outputs.append(PeripheralTimed(at: done, .notify(SMPService.characteristicUUID, Array(segment))))
            }
        }
        if resetRequested {
            outputs += reboot(at: done + resetDelay, reason: "the device resets (SMP reset request)", injected: false, reports: &reports)
        } else if let offset, let chunk, injector.rebootsAfterPacket(at: offset, count: chunk.data.count) {
            outputs += reboot(at: done, reason: "device rebooted at offset \(offset)", reports: &reports)
        }
        return outputs
    }

    /// The device goes away at `at`, MCUboot runs, and it is back `bootDuration` later.
    private mutating func reboot(at: Duration, reason: String, injected: Bool = true, reports: inout [PeripheralReport]) -> [PeripheralTimed] {
        let outcome = server.boot()
        if let core = server.network {
            switch core.lastUpdate {
            case .updated:
                activations.append((core.running.bytes, core.running.versionText))
                reports.append(.note("MCUboot handed image 1 to the network core: version \(core.running.versionText) runs there"))
            case .skipped:
                reports.append(.note("MCUboot skipped the network core's update: the application core's image was marked before it (NCSDK-34106); version \(core.running.versionText) runs on"))
            case .refused(let why):
                reports.append(.note("MCUboot refused the network core's image and erased it (\(why))"))
            case .none:
                break
            }
        }
        switch outcome {
        case .swapped(let permanent):
            activations.append((server.primary.bytes, server.primary.versionText))
            reports.append(.activated(image: server.primary.bytes, version: server.primary.versionText))
            reports.append(.note("MCUboot swapped in version \(server.primary.versionText)" + (permanent ? " for good" : " for test")))
        case .reverted:
            reports.append(.note("MCUboot reverted the unconfirmed image: version \(server.primary.versionText) runs again"))
        case .refused(let why):
            reports.append(.note("MCUboot refused the image in slot 1 and erased it (\(why)); version \(server.primary.versionText) runs on"))
        case .unchanged:
            break
        }
        collecting = []
        skipping = 0
        held = []
        awayUntil = at + bootDuration
        busyUntil = awayUntil
        return [PeripheralTimed(at: at, .reboot(until: awayUntil, reason: reason, injected: injected))]
    }

    /// A transfer began or resumed, its progress, the file verified.
    private func uploadReports(_ chunk: SMPImageUpload?, before: SMPServer.Upload?, response: SMPResponse) -> [PeripheralReport] {
        guard let chunk, case .upload(let status) = response else { return [] }
        var reports: [PeripheralReport] = []
        let total = Int(clamping: chunk.length ?? UInt64(before?.length ?? server.upload?.length ?? 0))
        if chunk.offset == 0 {
            reports.append(.begin(size: total, crc: nil, offset: Self.resumed(before, server.upload) ? Int(clamping: status.offset) : 0))
        }
        if let upload = server.upload {
            reports.append(.progress(received: upload.offset, total: upload.length))
        } else if status.match != false, server.secondaryComplete, before != nil {
            reports.append(.progress(received: Int(clamping: status.offset), total: Int(clamping: status.offset)))
            reports.append(.verified(crc: nil))
        }
        return reports
    }

    /// Whether a first chunk resumed the upload `before` (nothing was written).
    private static func resumed(_ before: SMPServer.Upload?, _ after: SMPServer.Upload?) -> Bool {
        before != nil && before == after
    }

    public mutating func wake(_ token: UInt64, at now: Duration) -> [PeripheralTimed] { [] }

    public mutating func linkDropped(central: String?) {
        collecting = []
        skipping = 0
    }

    public func describe(_ bytes: [UInt8], to characteristic: BluetoothUUID) -> String {
        let upload = server.upload.map { "upload at \($0.offset) of \($0.length)" } ?? "no upload"
        return "\(bytes.count) B, \(upload)"
    }
}

/// Slot 1 in use when the simulated device starts (`SMPServer.Leftover` with images made up).
public enum SMPLeftover: String, Sendable, Hashable, CaseIterable {
    /// An image marked for test, waiting for the reset.
    case pending
    /// A test image runs unconfirmed; slot 1 holds the previous one to revert to.
    case unconfirmed
}
