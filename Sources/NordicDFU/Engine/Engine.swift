import GATT
import OTA
import OTAWire

/// Tunables of a Secure DFU transfer.
public struct NordicDFUConfig: Sendable, Hashable {
    /// Packets between two receipt notifications; nil picks the number of packets in a full data
    /// object, so the receipt of an object's last packet confirms the object and no CALCULATE
    /// CHECKSUM round trip is needed. 0 turns receipts off.
    public var prn: UInt16?
    /// Stream an object's packets right after CREATE, before its response. The bootloader handles
    /// writes in order, so this saves a round trip per object; it needs a transport that keeps
    /// control point writes and packet writes in order. Nil, the default, does so on links that
    /// say they keep that order (`GATTConnection.keepsWriteOrder`) and waits for CREATE's answer
    /// on others.
    public var streamBeforeCreateResponse: Bool?
    /// Stop streaming after every `prn` packets until their receipt arrives, as the mobile DFU
    /// libraries do. Off by default: receipts are checked as they come while streaming goes on.
    public var waitForReceipts: Bool
    /// How often a command is sent again after a timeout or a failed write.
    public var commandRetries: Int
    /// How often in a row an object may be re-created (or the device resynchronised) without an
    /// object being executed before the engine gives up.
    public var maxRecoveries: Int
    public var replyTimeout: Duration
    /// The last EXECUTE: the bootloader checks the whole image's hash before it answers.
    public var validationTimeout: Duration

    public init(prn: UInt16? = nil, streamBeforeCreateResponse: Bool? = nil, waitForReceipts: Bool = false, commandRetries: Int = 3,
                maxRecoveries: Int = 8, replyTimeout: Duration = .seconds(20), validationTimeout: Duration = .seconds(60)) {
        self.prn = prn
        self.waitForReceipts = waitForReceipts
        self.streamBeforeCreateResponse = streamBeforeCreateResponse
        self.commandRetries = commandRetries
        self.maxRecoveries = maxRecoveries
        self.replyTimeout = replyTimeout
        self.validationTimeout = validationTimeout
    }
}

extension NordicDFUConfig {
    /// nrfutil's BLE transport, for comparison: PRN 0; Create, stream, Calculate Checksum and
    /// Execute per object, each request's answer waited for.
    public static var nrfutilStrategy: NordicDFUConfig { NordicDFUConfig(prn: 0, streamBeforeCreateResponse: false) }
    /// Nordic's mobile DFU libraries, for comparison: a receipt every 12 packets, waited for, and
    /// CREATE's answer before an object's packets.
    public static var mobileLibraryStrategy: NordicDFUConfig {
        NordicDFUConfig(prn: 12, streamBeforeCreateResponse: false, waitForReceipts: true)
    }
}

/// What `NordicDFUProfile.attach` learns of a link for the engine.
public struct NordicDFULink: Sendable, Hashable {
    /// Control point and packet writes reach the bootloader in the order they were made
    /// (`GATTConnection.keepsWriteOrder`), so an object's packets may follow CREATE at once.
    public var keepsWriteOrder: Bool

    public init(keepsWriteOrder: Bool) {
        self.keepsWriteOrder = keepsWriteOrder
    }
}

/// The central side of Nordic Secure DFU for one image (init packet + firmware) as a pure state
/// machine: events in, actions out, no I/O and no clock. A session drives it like any
/// `TransferEngine`: requests go to the control point (write with response), the init packet's
/// packets to the packet characteristic as writes without response, the firmware's as `.data`
/// steps; control point notifications come back, and timeouts (`currentTimeout`, armed while
/// `isAwaitingReply`).
///
/// Flow (docs/NORDIC-DFU.md, "Flow"): SET PRN; SELECT command → CREATE, stream, CALCULATE
/// CHECKSUM, EXECUTE the init packet unless the device holds it; SELECT data → for each object of
/// the size SELECT reported: CREATE, stream, confirm the running CRC32 (a receipt at the object's
/// end or CALCULATE CHECKSUM), EXECUTE. Every receipt's offset and CRC are checked; an object
/// whose CRC disagrees is re-created, never executed. Resume follows the SELECT response.
public struct NordicDFUEngine: TransferEngine {
    public typealias Peer = NordicDFULink

    /// Where the transfer stands in Secure DFU's terms (`phase` says it in the shared ones).
    public enum Stage: String, Sendable, Hashable {
        case idle, preparing, sendingInitPacket, selectingData, sendingFirmware, done, failed
    }

    /// Counters of Secure DFU's own, beside the shared `stats`: there, receipts and checksums
    /// count as checkpoints, re-created objects as rollbacks, tails sent again as rewinds.
    public struct Counts: Sendable, Hashable {
        public var objectsCreated = 0
        public var objectsExecuted = 0
        public var receipts = 0
        public var checksumRequests = 0
        /// Receipts or checksums whose offset or CRC disagreed with the image.
        public var crcMismatches = 0
        /// The init packet was already on the device and was not sent again.
        public var initPacketSkipped = 0
    }

    /// A request awaiting its answer, and how often it was sent.
    struct Command: Sendable {
        var request: DFURequest
        var attempts = 1
        /// A CALCULATE CHECKSUM sent when no receipt can be pending (after a timeout): the next
        /// checksum notification is its answer.
        var answersNextChecksum = false
    }

    /// Where the object being sent stands, with the request in flight where one may be.
    enum ObjectStep: Sendable {
        /// CREATE sent, its response not yet in: packets wait.
        case creating(Command)
        /// Packets go out (CREATE may still be in flight when they go before its answer).
        case streaming(Command?)
        /// The stream waits for a receipt (every packet sent, or `waitForReceipts`).
        case awaitingReceipt(Command?)
        /// CALCULATE CHECKSUM in flight.
        case checking(Command)
        /// The device holds the whole object with the right CRC: EXECUTE is next, once nothing is in flight.
        case confirmed(Command?)
        /// A receipt or checksum disagreed: re-create the object once nothing is in flight (a
        /// CALCULATE CHECKSUM may still be).
        case bad(Command?)
        /// EXECUTE in flight. `resume`: sent on resume at an object boundary, where a 0x08 answer
        /// means the object was created but never filled (link lost right after CREATE).
        case executing(Command, resume: Bool)

        var command: Command? {
            switch self {
            case .creating(let c), .checking(let c), .executing(let c, _): c
            case .streaming(let c), .awaitingReceipt(let c), .confirmed(let c), .bad(let c): c
            }
        }

        /// The same step with `command` in flight instead; a step that is its request (CREATE,
        /// CALCULATE CHECKSUM, EXECUTE) streams once it is answered.
        func replacing(_ command: Command?) -> ObjectStep {
            switch self {
            case .creating: command.map { .creating($0) } ?? .streaming(nil)
            case .checking: command.map { .checking($0) } ?? .streaming(nil)
            case .executing(_, let resume): command.map { .executing($0, resume: resume) } ?? .streaming(nil)
            case .streaming: .streaming(command)
            case .awaitingReceipt: .awaitingReceipt(command)
            case .confirmed: .confirmed(command)
            case .bad: .bad(command)
            }
        }
    }

    /// How a transfer ended well.
    public enum Ending: Sendable, Hashable {
        /// The device answered the last EXECUTE: the image is validated and being activated.
        case validated
        /// The bootloader reported the firmware already present (extended error 0x0E).
        case alreadyPresent
    }

    /// Where the engine stands, with what holds only there.
    enum State: Sendable {
        case idle
        /// SET PRN, then SELECT of the command object. `afterUnconfirmedExecute`: the link was lost
        /// during the last EXECUTE of an earlier connection.
        case preparing(Command, afterUnconfirmedExecute: Bool)
        /// An object of the init packet or the firmware (`objectType`) on its way.
        case sending(ObjectStep)
        /// SELECT of the data object; or SET PRN fitted to the object size, with SELECT's answer
        /// (`selected`) held until its reply.
        case selectingData(Command, selected: (offset: Int, crc: UInt32)?)
        case done(Ending)
        /// `finalExecuteUnconfirmed`: the link was lost while the last EXECUTE was in flight, so
        /// the device may have activated the image (it resets right after answering) or not.
        case failed(in: Stage, finalExecuteUnconfirmed: Bool)
    }

    public let initPacket: [UInt8]
    public let firmware: FirmwareImage
    public let config: NordicDFUConfig
    private(set) var state = State.idle
    private var tally = ResendTally()
    public private(set) var counts = Counts()
    /// Packet size: ATT MTU − 3.
    public private(set) var chunkSize = 0
    /// The data object size SELECT reported.
    public private(set) var maxObjectSize = 0
    /// Firmware bytes the device has confirmed (receipts, checksums, SELECT), for progress and the
    /// session's stall budget.
    public private(set) var confirmed = 0
    /// Why the transfer last started over from the init packet, for logs.
    public private(set) var lastRestartReason: String?

    /// The object being sent: its type and range in its payload.
    private var objectType = DFUObjectType.command
    private var objectStart = 0
    private var objectEnd = 0
    /// Next offset to send in the payload, and the CRC32 of everything before it.
    private var sentInPayload = 0
    private var runningCRC = CRC32()
    private var prefix: PrefixCRC
    private let initCRC: UInt32

    /// This connection streams an object's packets before CREATE's answer
    /// (`NordicDFUConfig.streamBeforeCreateResponse`, resolved against the link).
    public private(set) var streamsBeforeCreateResponse = false
    private var receipts = ReceiptCount()
    private var recoveries = 0
    private var sameObjectRecreates = 0
    private var lastRecreatedStart = -1

    /// The device's receipt counter as the engine follows it: packets and receipts since the
    /// device last reset its count (SET PRN, CREATE).
    struct ReceiptCount: Sendable {
        var prn: UInt16 = 0
        var packets = 0
        var receipts = 0
        /// Our packet count matches the device's, so a receipt can be waited for. Off after a
        /// receipt failed to come or a tail was sent again, until the counter restarts.
        var inStep = true

        mutating func restart() {
            packets = 0
            receipts = 0
            inStep = true
        }

        /// Receipts the device still owes for the packets sent.
        var pending: Bool { prn > 0 && receipts < packets / Int(prn) }
    }

    public init(initPacket: [UInt8], firmware: FirmwareImage, config: NordicDFUConfig = NordicDFUConfig()) {
        self.initPacket = initPacket
        self.firmware = firmware
        self.config = config
        self.prefix = PrefixCRC(image: firmware.bytes)
        self.initCRC = CRC32.checksum(initPacket)
    }

    /// One image of a package.
    public init(image: DFUPackage.Image, config: NordicDFUConfig = NordicDFUConfig()) {
        self.init(initPacket: image.initPacket.bytes, firmware: image.firmware, config: config)
    }

    /// Takes a confirmed position from a journal: only a shortcut for later CRC checks; SELECT
    /// still decides where streaming starts.
    public mutating func seed(confirmedOffset offset: Int, crc: UInt32) {
        prefix.record(offset: offset, crc: crc)
    }

    // MARK: What the session reads

    public var stage: Stage {
        switch state {
        case .idle: .idle
        case .preparing: .preparing
        case .sending: objectType == .command ? .sendingInitPacket : .sendingFirmware
        case .selectingData: .selectingData
        case .done: .done
        case .failed: .failed
        }
    }

    /// Sending the init packet and selecting the data object count as beginning; the last
    /// EXECUTE, while the bootloader checks the image's hash, as verifying.
    public var phase: TransferPhase {
        switch state {
        case .idle: .idle
        case .preparing, .selectingData: .beginning
        case .sending: objectType == .command ? .beginning : isFinalExecute ? .verifying : .streaming
        case .done: .done
        case .failed: .failed
        }
    }

    public var failedIn: TransferPhase? {
        guard case .failed(let stage, let unconfirmed) = state else { return nil }
        switch stage {
        case .idle: return .idle
        case .preparing, .sendingInitPacket, .selectingData: return .beginning
        case .sendingFirmware: return unconfirmed ? .verifying : .streaming
        case .done: return .done
        case .failed: return .failed
        }
    }

    public var stats: TransferStats { tally.stats }
    /// The highest firmware offset ever sent.
    public var highWater: Int { tally.highWater }
    public var furthestAgreed: Int { confirmed }
    /// Firmware bytes the device executed (or, on resume, holds at an object boundary), and their CRC32.
    public var acked: Int { objectType == .data ? min(objectStart, confirmed) : 0 }
    public var ackedCRC: UInt32 { prefix.crc(upTo: acked) ?? 0 }
    /// The next firmware offset to send (0 while the init packet goes).
    public var sent: Int { objectType == .data ? sentInPayload : 0 }

    /// The device answered the last EXECUTE: the image is validated and being activated.
    public var validated: Bool { if case .done(.validated) = state { true } else { false } }
    /// The bootloader reported the firmware already present (extended error 0x0E).
    public var alreadyPresent: Bool { if case .done(.alreadyPresent) = state { true } else { false } }
    /// The link was lost while the last EXECUTE was in flight: the device may have activated the
    /// image (it resets right after answering) or not.
    public var finalExecuteUnconfirmed: Bool {
        switch state {
        case .failed(_, let unconfirmed), .preparing(_, let unconfirmed): unconfirmed
        default: false
        }
    }

    public var isFinished: Bool { phase == .done || phase == .failed }

    private var command: Command? {
        switch state {
        case .preparing(let c, _), .selectingData(let c, _): c
        case .sending(let step): step.command
        case .idle, .done, .failed: nil
        }
    }

    public var commandInFlight: DFURequest? { command?.request }

    /// A reply or receipt is due: the session arms a `currentTimeout` timer while this holds.
    public var isAwaitingReply: Bool {
        if command != nil { return true }
        if case .sending(.awaitingReceipt) = state { return true }
        return false
    }

    /// The last EXECUTE is in flight: the bootloader checks the whole image before it answers.
    private var isFinalExecute: Bool {
        command?.request == .execute && objectType == .data && objectEnd == firmware.size
    }

    public var currentTimeout: Duration { isFinalExecute ? config.validationTimeout : config.replyTimeout }

    public func dataPacket(offset: Int, count: Int) -> [UInt8] {
        Array(firmware.bytes[offset..<(offset + count)])
    }

    // MARK: Events

    public mutating func handle(_ event: TransferEvent<NordicDFULink>) -> [TransferAction] {
        switch event {
        case .connected(let link, let mtu):
            return start(mtu: mtu, keepsWriteOrder: link.keepsWriteOrder)
        case .notification(let role, let bytes):
            guard role == .control, !isFinished, phase != .idle else { return [] }
            guard let response = try? DFUResponse(decoding: bytes) else { return [] }
            return handleNotification(response)
        case .commandFailed(let error):
            if error.code == .notConnected || isFinished { return [] }
            if error.code == .notAuthorized || error.code == .permissionDenied {
                return fail(OTAError.from(error, device: "the device"))
            }
            return retry(after: "\(error)", code: .connection, cause: error)
        case .timeout:
            return handleTimeout()
        case .disconnected(let reason):
            guard !isFinished, phase != .idle else { return [] }
            if isFinalExecute {
                state = .failed(in: stage, finalExecuteUnconfirmed: true)
                // nRF5 SDK: the bootloader answers the last EXECUTE, then resets into the image;
                // its disconnect can overtake the answer. Its next state says which it was.
                return [.failed(OTAError(.notConfirmed, "\(reason) during the last EXECUTE, before its answer came: the bootloader validated the image and reset into it, or did not",
                                         hint: "check the version the device runs; a bootloader still in DFU mode continues where it stopped when the same command runs again",
                                         resumable: true))]
            }
            let held = confirmed > 0 ? " (\(confirmed) of \(firmware.size) bytes confirmed)" : ""
            return fail(OTAError(.connection, "\(reason)\(held)", hint: "run the same command again to resume", resumable: true))
        }
    }

    /// Starts, or after a link loss restarts, on a fresh connection; the device's SELECT answers
    /// decide what is sent again.
    private mutating func start(mtu: Int, keepsWriteOrder: Bool) -> [TransferAction] {
        if case .done = state { return [] }
        let unconfirmed = finalExecuteUnconfirmed
        state = .idle
        guard !firmware.bytes.isEmpty else {
            return fail(OTAError(.image, "\(firmware.source): the firmware is empty; nothing to send"))
        }
        guard mtu >= 23 else {
            return fail(OTAError(.incompatibleDevice, "the link reports ATT MTU \(mtu), below the minimum of 23 every BLE link supports; the transport is misbehaving"))
        }
        tally.connectionBegan(streamAt: sent)
        chunkSize = ATTWriteLimit.value(mtu: mtu)
        streamsBeforeCreateResponse = config.streamBeforeCreateResponse ?? keepsWriteOrder
        // Until SELECT reports the object size, assume the SDK's 4096 bytes.
        receipts = ReceiptCount(prn: config.prn ?? Self.autoPRN(objectSize: maxObjectSize > 0 ? maxObjectSize : 4096, chunk: chunkSize))
        return send(.setPRN(receipts.prn), as: { .preparing($0, afterUnconfirmedExecute: unconfirmed) })
    }

    private mutating func handleNotification(_ r: DFUResponse) -> [TransferAction] {
        if r.request == .calculateChecksum, case .checksum(let offset, let crc) = r.payload, r.result == .success {
            return checksumNotification(offset: Int(offset), crc: crc)
        }
        guard let flight = command, flight.request.opcode == r.request else { return [] }  // stale
        guard r.result == .success else { return refused(r, to: flight.request) }
        switch (state, flight.request, r.payload) {
        case (.preparing(_, let unconfirmed), .setPRN, _):
            return send(.select(.command), as: { .preparing($0, afterUnconfirmedExecute: unconfirmed) })
        case (.selectingData(_, let selected), .setPRN, _):
            return beginFirmware(selected: selected)
        case (.preparing(_, let unconfirmed), .select(.command), .select(let max, let offset, let crc)):
            return commandSelected(maxSize: Int(max), offset: Int(offset), crc: crc, afterUnconfirmedExecute: unconfirmed)
        case (.selectingData, .select(.data), .select(let max, let offset, let crc)):
            return dataSelected(maxSize: Int(max), offset: Int(offset), crc: crc)
        case (.sending(let step), .create, _):
            state = .sending(step.replacing(nil))
            return proceed()
        case (.sending(.executing(_, let resume)), .execute, _):
            return executed(resume: resume)
        default:
            return fail(OTAError(.protocolError, "the bootloader answered \(flight.request) with \(r), which Secure DFU does not define"))
        }
    }

    // MARK: The init packet

    private mutating func commandSelected(maxSize: Int, offset: Int, crc: UInt32, afterUnconfirmedExecute: Bool) -> [TransferAction] {
        guard initPacket.count <= maxSize else {
            return fail(OTAError(.incompatibleDevice, "the init packet is \(initPacket.count) bytes, the bootloader takes at most \(maxSize); regenerate the package for this bootloader"))
        }
        let holdsPrefix = offset > 0 && offset < initPacket.count && crc == CRC32.checksum(initPacket[0..<offset])
        if afterUnconfirmedExecute, !(offset == initPacket.count && crc == initCRC), !holdsPrefix {
            // A bootloader that never ran the last EXECUTE still holds this init packet; one that
            // ran it dropped the transfer after validating the image (and activated it) or after
            // rejecting it. Sending it all again would activate it a second time.
            state = .failed(in: stage, finalExecuteUnconfirmed: true)
            return [.failed(OTAError(.notConfirmed, "the link was lost during the last EXECUTE and the bootloader has since ended the transfer: it validated and activated the image, or rejected it",
                                     hint: "check the firmware version the device runs; to send the image anew run the same command again"))]
        }
        objectType = .command
        objectStart = 0
        objectEnd = initPacket.count
        if offset == initPacket.count, crc == initCRC {
            // The device holds this init packet: execute it (again); it keeps its firmware progress.
            counts.initPacketSkipped += 1
            return send(.execute, as: { .sending(.executing($0, resume: false)) })
        }
        if holdsPrefix {
            // Part of this init packet arrived: send the rest without CREATE.
            sentInPayload = offset
            runningCRC = CRC32(value: crc)
            state = .sending(.streaming(nil))
            return []
        }
        return createObject(start: 0)
    }

    // MARK: The firmware

    private mutating func dataSelected(maxSize: Int, offset: Int, crc: UInt32) -> [TransferAction] {
        guard maxSize > 0 else {
            return fail(OTAError(.protocolError, "the bootloader reports a data object size of 0; it is not following Secure DFU"))
        }
        maxObjectSize = maxSize
        tally.resumed(from: offset)
        objectType = .data
        let wanted = config.prn ?? Self.autoPRN(objectSize: maxSize, chunk: chunkSize)
        if wanted != receipts.prn {
            // The interval fitted to the object size (this also restarts the device's count).
            receipts.prn = wanted
            return send(.setPRN(wanted), as: { .selectingData($0, selected: (offset, crc)) })
        }
        return resume(offset: offset, crc: crc)
    }

    /// One receipt per full object, on its last packet.
    static func autoPRN(objectSize: Int, chunk: Int) -> UInt16 {
        UInt16(clamping: (objectSize + chunk - 1) / chunk)
    }

    private mutating func beginFirmware(selected: (offset: Int, crc: UInt32)?) -> [TransferAction] {
        receipts.restart()
        guard let selected else { return send(.select(.data), as: { .selectingData($0, selected: nil) }) }
        return resume(offset: selected.offset, crc: selected.crc)
    }

    /// Resume rules from SELECT's answer (docs/NORDIC-DFU.md, "Resume").
    private mutating func resume(offset: Int, crc: UInt32) -> [TransferAction] {
        let n = firmware.size
        if offset == 0 { return createObject(start: 0) }
        guard offset <= n, let local = prefix.crc(upTo: offset) else {
            return restartFromInitPacket(because: "the bootloader reports \(offset) bytes, more than the image's \(n)")
        }
        let remainder = offset % maxObjectSize
        let boundary = offset - remainder
        guard local == crc else {
            counts.crcMismatches += 1
            // Drop back to the start of the object in progress: at a boundary, the object before
            // it (written whole but not executed). CREATE discards it on the device.
            return createObject(start: remainder == 0 ? offset - maxObjectSize : boundary, recreate: true)
        }
        confirmed = offset
        if remainder != 0, offset != n {
            // Continue the object mid-way: no CREATE, the rest of it, then confirm and execute.
            // Without a CREATE the device's receipt count may include the init packet's packets:
            // check receipts as they come, but wait for none.
            objectStart = boundary
            objectEnd = min(boundary + maxObjectSize, n)
            sentInPayload = offset
            runningCRC = CRC32(value: crc)
            receipts.inStep = receipts.packets == 0
            state = .sending(.streaming(nil))
            return []
        }
        // At an object boundary or the end: execute what the device holds. An object that was
        // created but never filled answers 0x08, and is created again.
        objectStart = remainder == 0 ? max(0, offset - maxObjectSize) : boundary
        objectEnd = offset
        sentInPayload = offset
        runningCRC = CRC32(value: crc)
        return send(.execute, as: { .sending(.executing($0, resume: true)) })
    }

    private mutating func executed(resume: Bool) -> [TransferAction] {
        if objectType == .command {
            return send(.select(.data), as: { .selectingData($0, selected: nil) })
        }
        if !resume || objectEnd == firmware.size { counts.objectsExecuted += 1 }
        recoveries = 0
        sameObjectRecreates = 0
        confirmed = objectEnd
        if objectEnd == firmware.size {
            state = .done(.validated)
            return [.finished]
        }
        return createObject(start: objectEnd)
    }

    // MARK: Objects

    private mutating func createObject(start: Int, recreate: Bool = false, misplaced: Bool = false) -> [TransferAction] {
        if recreate {
            guard bumpRecoveries() else { return tooManyRecoveries() }
            if objectType == .data {
                sameObjectRecreates = start == lastRecreatedStart ? sameObjectRecreates + 1 : 1
                lastRecreatedStart = start
                if sameObjectRecreates > 3, misplaced {
                    // The device keeps reporting offsets outside the object: its idea of where the
                    // object starts differs from ours (it executed data we did not confirm), and
                    // only a new init packet resets its progress.
                    sameObjectRecreates = 0
                    return restartFromInitPacket(because: "the bootloader reported offsets outside the object at \(start) after it was created 3 times")
                }
            }
            tally.stats.rollbacks += 1
        }
        let payloadSize = objectType == .command ? initPacket.count : firmware.size
        let size = objectType == .command ? initPacket.count : min(maxObjectSize, payloadSize - start)
        objectStart = start
        objectEnd = start + size
        counts.objectsCreated += 1
        let create = Command(request: .create(objectType, size: UInt32(size)))
        streamFromObjectStart(create: create)
        return [.write(TransferWrite(create.request.encoded))]
    }

    /// Streams the object from its start again after CREATE (`create`, in flight): the device's
    /// receipt count restarts.
    private mutating func streamFromObjectStart(create: Command) {
        sentInPayload = objectStart
        runningCRC = CRC32(value: objectType == .command ? 0 : (prefix.crc(upTo: objectStart) ?? 0))
        receipts.restart()
        state = .sending(streamsBeforeCreateResponse ? .streaming(create) : .creating(create))
    }

    private mutating func restartFromInitPacket(because reason: String) -> [TransferAction] {
        guard bumpRecoveries() else { return tooManyRecoveries() }
        tally.stats.restarts += 1
        lastRestartReason = reason
        objectType = .command
        confirmed = 0
        return createObject(start: 0)
    }

    /// With nothing in flight, sends what the object's state calls for.
    private mutating func proceed(misplaced: Bool = false) -> [TransferAction] {
        switch state {
        case .sending(.bad(nil)):
            return createObject(start: objectType == .command ? 0 : objectStart, recreate: true, misplaced: misplaced)
        case .sending(.confirmed(nil)):
            return send(.execute, as: { .sending(.executing($0, resume: false)) })
        default:
            return []
        }
    }

    /// A checksum notification: CALCULATE CHECKSUM's answer or a packet receipt. Both say what
    /// the device holds; which one it is matters only for when the command in flight is over.
    private mutating func checksumNotification(offset: Int, crc: UInt32) -> [TransferAction] {
        guard case .sending(let step) = state else { return [] }
        if let checksum = step.command, checksum.request == .calculateChecksum {
            if !checksum.answersNextChecksum, receipts.pending, offset < objectEnd {
                countReceipt()
                return judge(offset: offset, crc: crc, final: false)
            }
            // Its answer: `judge` decides what the object needs next.
            state = .sending(.streaming(nil))
            return judge(offset: offset, crc: crc, final: true)
        }
        // A receipt. Those that come while CREATE is in flight belong to the object it replaces.
        switch step {
        case .streaming(nil), .awaitingReceipt(nil):
            countReceipt()
            return judge(offset: offset, crc: crc, final: false)
        default:
            return []
        }
    }

    /// Checks a device position against the image. `final`: it answers CALCULATE CHECKSUM, so
    /// the device holds nothing beyond it.
    private mutating func judge(offset: Int, crc: UInt32, final: Bool) -> [TransferAction] {
        guard case .sending(let step) = state else { return [] }
        let local: UInt32? = if objectType == .command {
            offset <= initPacket.count ? CRC32.checksum(initPacket[0..<offset]) : nil
        } else {
            prefix.crc(upTo: offset)
        }
        let misplaced = offset < objectStart || offset > sentInPayload
        guard !misplaced, let local, local == crc else {
            counts.crcMismatches += 1
            state = .sending(.bad(step.command))
            return proceed(misplaced: misplaced)
        }
        if objectType == .data, offset > confirmed { confirmed = offset }
        if offset == objectEnd, sentInPayload == objectEnd {
            state = .sending(.confirmed(step.command))
            return proceed()
        }
        if final, offset < sentInPayload {
            // The device lacks the object's tail: send it again from where the device stands.
            guard bumpRecoveries() else { return tooManyRecoveries() }
            tally.stats.rewinds += 1
            receipts.inStep = false
            sentInPayload = offset
            runningCRC = CRC32(value: crc)
        }
        // A receipt (or the checksum asked for instead) that a paused stream waited for.
        if case .awaitingReceipt(let c) = step { state = .sending(.streaming(c)) }
        return proceed()
    }

    // MARK: Refusals and retries

    private mutating func refused(_ r: DFUResponse, to request: DFURequest) -> [TransferAction] {
        let ext: DFUExtendedError? = if case .extendedError(let e) = r.payload { e } else { nil }
        if request == .execute, r.result == .operationNotPermitted, objectType == .data {
            // EXECUTE of an object the device does not hold whole. On resume at a boundary: the
            // object after it was created but never filled (link lost right after CREATE), so
            // create it again; otherwise data was lost, so create this object again.
            let resume = if case .sending(.executing(_, true)) = state { true } else { false }
            let atBoundary = resume && objectEnd < firmware.size && objectEnd % maxObjectSize == 0
            return createObject(start: atBoundary ? objectEnd : objectStart, recreate: true)
        }
        if ext == .firmwareAlreadyPresent {
            state = .done(.alreadyPresent)
            return [.finished]
        }
        let reason = if let ext, request == .execute, objectType == .command {
            ext.initPacketDescription(debugPacket: (try? DFUInitPacket(decoding: initPacket))?.command.isDebug == true)
        } else {
            r.reason
        }
        let what: String = switch (request, objectType) {
        case (.execute, .command): "the bootloader refused the init packet"
        case (.execute, _) where objectEnd == firmware.size: "the bootloader refused the image at its last EXECUTE"
        case (.create(let type, let size), _): "the bootloader refused to create a \(type) of \(size) bytes"
        default: "the bootloader refused \(request)"
        }
        let code: OTAError.Code
        switch (ext, r.result) {
        case (.verificationFailed?, _) where objectType == .data:
            return fail(OTAError(.verifyFailed, "\(what): the firmware's hash does not match the init packet, nothing was activated; run the same command again to send it anew"))
        case (.firmwareVersionFailure?, _), (.hardwareVersionFailure?, _), (.softDeviceVersionFailure?, _), (.signatureMissing?, _),
             (.wrongSignatureType?, _), (.verificationFailed?, _), (.initCommandInvalid?, _), (.wrongHashType?, _),
             (.wrongCommandFormat?, _), (.unknownCommand?, _), (nil, .signatureMissing):
            code = .incompatibleDevice
        case (.insufficientSpace?, _), (nil, .insufficientResources):
            code = .imageTooLarge
        default:
            code = .protocolError
        }
        return fail(OTAError(code, "\(what): \(reason)"))
    }

    private mutating func handleTimeout() -> [TransferAction] {
        guard !isFinished else { return [] }
        if case .sending(.awaitingReceipt(nil)) = state {
            // The receipt did not come: ask for the checksum instead, and wait for no more
            // receipts in this object (the device's count is off from ours).
            receipts.inStep = false
            countChecksumRequest()
            state = .sending(.checking(Command(request: .calculateChecksum, answersNextChecksum: true)))
            return [.write(TransferWrite(DFURequest.calculateChecksum.encoded))]
        }
        return retry(after: "no answer within \(currentTimeout)", code: .timeout)
    }

    private mutating func retry(after reason: String, code: OTAError.Code, cause: (any Error)? = nil) -> [TransferAction] {
        guard let flight = command else { return [] }
        guard flight.attempts <= config.commandRetries else {
            return fail(OTAError(code, "\(flight.request) failed \(flight.attempts) times, last: \(reason)",
                                 hint: "the bootloader may be stalled: power-cycle it and run the same command again to resume",
                                 resumable: true, cause: cause))
        }
        tally.stats.commandRetries += 1
        // A CALCULATE CHECKSUM sent again is answered next: no receipt is pending after a timeout.
        let again = Command(request: flight.request, attempts: flight.attempts + 1,
                            answersNextChecksum: flight.request == .calculateChecksum)
        switch state {
        case .preparing(_, let unconfirmed): state = .preparing(again, afterUnconfirmedExecute: unconfirmed)
        case .selectingData(_, let selected): state = .selectingData(again, selected: selected)
        case .sending where flight.request.opcode == .create:
            // A second CREATE resets the object: stream it from its start again.
            streamFromObjectStart(create: again)
        case .sending(let step): state = .sending(step.replacing(again))
        case .idle, .done, .failed: return []
        }
        return [.write(TransferWrite(flight.request.encoded))]
    }

    private mutating func bumpRecoveries() -> Bool {
        recoveries += 1
        return recoveries <= config.maxRecoveries
    }

    private mutating func tooManyRecoveries() -> [TransferAction] {
        fail(OTAError(.protocolError, "the bootloader lost or corrupted an object \(config.maxRecoveries) times in a row (\(counts.crcMismatches) CRC mismatches, \(stats.rollbacks) objects re-created); nothing bad was executed, check the link and run the same command again",
                      resumable: true))
    }

    private mutating func countReceipt() {
        counts.receipts += 1
        receipts.receipts += 1
        tally.stats.checkpoints += 1
    }

    private mutating func countChecksumRequest() {
        counts.checksumRequests += 1
        tally.stats.checkpoints += 1
    }

    /// Sends `request` as the request the state `next` waits for.
    private mutating func send(_ request: DFURequest, as next: (Command) -> State) -> [TransferAction] {
        state = next(Command(request: request))
        return [.write(TransferWrite(request.encoded))]
    }

    private mutating func fail(_ error: OTAError) -> [TransferAction] {
        state = .failed(in: stage, finalExecuteUnconfirmed: false)
        return [.failed(error)]
    }

    // MARK: Streaming

    /// The next thing to send. Call repeatedly until `.idle`, and again after each event.
    public mutating func nextStreamStep() -> TransferStep {
        guard case .sending(.streaming(let command)) = state else { return .idle }
        if config.waitForReceipts, receipts.inStep, receipts.prn > 0, sentInPayload < objectEnd,
           receipts.packets >= (receipts.receipts + 1) * Int(receipts.prn) {
            // The mobile libraries' way: stop after every PRN packets until the receipt comes.
            state = .sending(.awaitingReceipt(command))
            return .idle
        }
        if sentInPayload < objectEnd {
            let offset = sentInPayload
            let count = min(chunkSize, objectEnd - offset)
            sentInPayload += count
            receipts.packets += 1
            if objectType == .command {
                runningCRC.update(initPacket[offset..<(offset + count)])
                tally.streamedPreamble(offset: offset, count: count)
                return .write(TransferWrite(Array(initPacket[offset..<(offset + count)]), to: .data, withResponse: false))
            }
            runningCRC.update(firmware.bytes[offset..<(offset + count)])
            tally.streamed(offset: offset, count: count)
            return .data(offset: offset, count: count)
        }
        guard command == nil else { return .idle }
        if objectType == .data, receipts.inStep, receipts.prn > 0, receipts.packets > 0, receipts.packets % Int(receipts.prn) == 0,
           receipts.pending {
            // The device's receipt of the last packet will confirm the object.
            state = .sending(.awaitingReceipt(nil))
            return .idle
        }
        countChecksumRequest()
        let request = DFURequest.calculateChecksum
        state = .sending(.checking(Command(request: request)))
        return .write(TransferWrite(request.encoded))
    }
}
