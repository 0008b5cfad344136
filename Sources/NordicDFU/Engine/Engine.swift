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

/// The central side of Nordic Secure DFU for one image (init packet + firmware) as a pure state
/// machine: events in, actions out, no I/O and no clock. A session drives it like `OTAEngine`:
/// it sends `.send` requests to the control point (write with response), writes `.data` steps
/// from `nextStreamStep()` to the packet characteristic (write without response), feeds control
/// point notifications back, and reports timeouts (`currentTimeout`, armed while `isAwaitingReply`).
///
/// Flow (docs/NORDIC-DFU.md, "Flow"): SET PRN; SELECT command → CREATE, stream, CALCULATE
/// CHECKSUM, EXECUTE the init packet unless the device holds it; SELECT data → for each object of
/// the size SELECT reported: CREATE, stream, confirm the running CRC32 (a receipt at the object's
/// end or CALCULATE CHECKSUM), EXECUTE. Every receipt's offset and CRC are checked; an object
/// whose CRC disagrees is re-created, never executed. Resume follows the SELECT response.
public struct NordicDFUEngine: Sendable {
    public enum Phase: String, Sendable, Hashable {
        case idle, preparing, sendingInitPacket, selectingData, sendingFirmware, done, failed
    }

    public enum Event: Sendable {
        /// Connected, characteristics found, control point notifications enabled.
        /// `keepsWriteOrder`: the link delivers control point and packet writes in the order they
        /// were made (`GATTConnection.keepsWriteOrder`).
        case connected(mtu: Int, keepsWriteOrder: Bool = false)
        /// A control point notification.
        case notification([UInt8])
        /// The control point write of the command in flight failed.
        case commandFailed(GATTError)
        /// Nothing arrived within `currentTimeout` while `isAwaitingReply`.
        case timeout
        case disconnected(DisconnectReason)
    }

    public enum Action: Sendable, Hashable {
        /// Write `request.encoded` to the control point (with response).
        case send(DFURequest)
        /// The last EXECUTE succeeded: the bootloader validated the image and activates it.
        case finished
        case failed(OTAError)
    }

    public enum StreamStep: Sendable, Hashable {
        /// Write these bytes to the packet characteristic (without response). `offset` is where
        /// they start in the init packet (`.command`) or the firmware (`.data`).
        case data(DFUObjectType, offset: Int, bytes: ArraySlice<UInt8>)
        /// Send this control point request now.
        case command(DFURequest)
        case idle
    }

    public struct Stats: Sendable, Hashable {
        /// Payload bytes put on the packet characteristic (init packet and firmware), resends included.
        public var bytesSent = 0
        /// Bytes sent again after a re-created object or a resume below what was sent.
        public var bytesResent = 0
        public var packets = 0
        public var objectsCreated = 0
        public var objectsExecuted = 0
        /// Objects created again after a CRC mismatch, a refused EXECUTE or a resync.
        public var objectsRecreated = 0
        public var receipts = 0
        public var checksumRequests = 0
        /// Receipts or checksums whose offset or CRC disagreed with the image.
        public var crcMismatches = 0
        /// CALCULATE CHECKSUM showed the device lacks the end of an object (its CRC matching
        /// up to there): the rest was sent again without re-creating the object.
        public var tailsResent = 0
        /// Transfers started over from the init packet (CREATE of the command object resets the
        /// device's progress) after the device's data disagreed in a way CREATE cannot repair.
        public var restarts = 0
        public var commandRetries = 0
        /// The firmware offset SELECT reported on each connection.
        public var resumedFrom: [Int] = []
        /// For each resume that sent firmware (a connection after the first): the bytes it sent
        /// again, from where streaming restarted up to the furthest sent before the link was lost.
        public var resumeResends: [Int] = []
        /// The init packet was already on the device and was not sent again.
        public var initPacketSkipped = 0
        public var connections = 0
    }

    public let initPacket: [UInt8]
    public let firmware: FirmwareImage
    public let config: NordicDFUConfig
    public private(set) var phase: Phase = .idle
    public private(set) var stats = Stats()
    /// Packet size: ATT MTU − 3.
    public private(set) var chunkSize = 0
    /// The data object size SELECT reported.
    public private(set) var maxObjectSize = 0
    /// Firmware bytes the device has confirmed (receipts, checksums, SELECT), for progress and the
    /// session's stall budget.
    public private(set) var confirmed = 0
    public var furthestAgreed: Int { confirmed }
    /// Firmware bytes the device executed (or, on resume, holds at an object boundary), and their CRC32.
    public var acked: Int { objectType == .data ? min(objectStart, confirmed) : 0 }
    public var ackedCRC: UInt32 { prefix.crc(upTo: acked) ?? 0 }
    /// The next firmware offset to send (0 while the init packet goes).
    public var sent: Int { objectType == .data ? sentInPayload : 0 }
    /// The highest firmware offset ever sent.
    public var highWater: Int { highWaters[1] }
    /// The device answered the last EXECUTE: the image is validated and being activated.
    public private(set) var validated = false
    /// The link was lost while the last EXECUTE was in flight: the device may have activated the
    /// image (it resets right after answering) or not.
    public private(set) var finalExecuteUnconfirmed = false
    /// The bootloader reported the firmware already present (extended error 0x0E).
    public private(set) var alreadyPresent = false
    public private(set) var failedIn: Phase?
    /// Why the transfer last started over from the init packet, for logs.
    public private(set) var lastRestartReason: String?

    /// The object being sent: its type and range in its payload.
    private var objectType = DFUObjectType.command
    private var objectStart = 0
    private var objectEnd = 0
    /// Next offset to send in the payload, and the CRC32 of everything before it.
    private var sentInPayload = 0
    private var runningCRC = CRC32()
    private var highWaters = [0, 0]
    private var prefix: PrefixCRC
    private let initCRC: UInt32

    private enum ObjectState: Equatable {
        /// CREATE sent, its response not yet in (packets wait unless configured otherwise).
        case creating
        case streaming
        /// Every packet sent; the receipt of the last one is due.
        case awaitingReceipt
        /// CALCULATE CHECKSUM in flight.
        case checking
        /// The device holds the whole object with the right CRC: EXECUTE is next.
        case confirmed
        /// A receipt or checksum disagreed: re-create the object once nothing is in flight.
        case bad
        case executing
    }

    private var objectState = ObjectState.creating
    /// This connection streams an object's packets before CREATE's answer
    /// (`NordicDFUConfig.streamBeforeCreateResponse`, resolved against the link).
    public private(set) var streamsBeforeCreateResponse = false
    private var inFlight: (request: DFURequest, attempts: Int)?
    private var prnInUse: UInt16 = 0
    /// Packets and receipts since the device last reset its receipt counter (SET PRN, CREATE).
    private var packetsSinceReset = 0
    private var receiptsSinceReset = 0
    /// A CALCULATE CHECKSUM was sent again after a timeout: no receipt can be pending, so the next
    /// checksum notification is its answer.
    private var nextChecksumIsAnswer = false
    /// EXECUTE sent on resume at an object boundary: a 0x08 answer means the object was created
    /// but never filled (link lost right after CREATE), so it is re-created.
    private var resumeExecute = false
    private var recoveries = 0
    /// Our packet count matches the device's receipt counter, so a receipt can be waited for.
    /// Off after a receipt failed to come or a tail was sent again, until the counter restarts.
    private var receiptsInStep = true
    private var sameObjectRecreates = 0
    /// The device's last receipt or checksum named an offset outside the object being sent.
    private var lastReportMisplaced = false
    private var lastRecreatedStart = -1
    /// The furthest firmware offset sent before the last link loss, until the first firmware
    /// packet of the next connection measures what the resume sends again.
    private var resumeFrom: Int?

    public init(initPacket: [UInt8], firmware: FirmwareImage, config: NordicDFUConfig = NordicDFUConfig()) {
        self.initPacket = initPacket
        self.firmware = firmware
        self.config = config
        self.prefix = PrefixCRC(image: firmware.bytes)
        self.initCRC = CRC32.checksum(initPacket)
    }

    /// Takes a confirmed position from a journal: only a shortcut for later CRC checks; SELECT
    /// still decides where streaming starts.
    public mutating func seed(confirmedOffset offset: Int, crc: UInt32) {
        prefix.record(offset: offset, crc: crc)
    }

    /// One image of a package.
    public init(image: DFUPackage.Image, config: NordicDFUConfig = NordicDFUConfig()) {
        self.init(initPacket: image.initPacket.bytes, firmware: image.firmware, config: config)
    }

    public var isFinished: Bool { phase == .done || phase == .failed }

    /// A reply or receipt is due: the session arms a `currentTimeout` timer while this holds.
    public var isAwaitingReply: Bool { inFlight != nil || objectState == .awaitingReceipt && !isFinished && phase != .idle }

    public var commandInFlight: DFURequest? { inFlight?.request }

    public var currentTimeout: Duration {
        if inFlight?.request == .execute, objectType == .data, objectEnd == firmware.size { return config.validationTimeout }
        return config.replyTimeout
    }

    // MARK: Events

    public mutating func handle(_ event: Event) -> [Action] {
        switch event {
        case .connected(let mtu, let keepsWriteOrder):
            return start(mtu: mtu, keepsWriteOrder: keepsWriteOrder)
        case .notification(let bytes):
            guard !isFinished, phase != .idle else { return [] }
            guard let response = try? DFUResponse(decoding: bytes) else { return [] }
            return handleNotification(response)
        case .commandFailed(let error):
            if error.code == .notConnected || isFinished { return [] }
            if error.code == .notAuthorized || error.code == .permissionDenied {
                inFlight = nil
                return fail(OTAError.from(error, device: "the device"))
            }
            return retry(after: "\(error)", code: .connection, cause: error)
        case .timeout:
            return handleTimeout()
        case .disconnected(let reason):
            guard !isFinished, phase != .idle else { return [] }
            let finalExecute = inFlight?.request == .execute && objectType == .data && objectEnd == firmware.size
            inFlight = nil
            if finalExecute {
                finalExecuteUnconfirmed = true
                return fail(OTAError(.connection, "\(reason) during the last EXECUTE: the bootloader may have validated and activated the image, or not",
                                     hint: "run the same command again: a bootloader still in DFU mode continues where it stopped", resumable: true))
            }
            let held = confirmed > 0 ? " (\(confirmed) of \(firmware.size) bytes confirmed)" : ""
            return fail(OTAError(.connection, "\(reason)\(held)", hint: "run the same command again to resume", resumable: true))
        }
    }

    /// Starts, or after a link loss restarts, on a fresh connection; the device's SELECT answers
    /// decide what is sent again.
    private mutating func start(mtu: Int, keepsWriteOrder: Bool) -> [Action] {
        guard phase != .done else { return [] }
        guard !firmware.bytes.isEmpty else {
            return fail(OTAError(.image, "\(firmware.source): the firmware is empty; nothing to send"))
        }
        guard mtu >= 23 else {
            return fail(OTAError(.incompatibleDevice, "the link reports ATT MTU \(mtu), below the minimum of 23 every BLE link supports; the transport is misbehaving"))
        }
        stats.connections += 1
        resumeFrom = stats.connections > 1 ? highWaters[1] : nil
        chunkSize = ATTWriteLimit.value(mtu: mtu)
        streamsBeforeCreateResponse = config.streamBeforeCreateResponse ?? keepsWriteOrder
        inFlight = nil
        resumeExecute = false
        nextChecksumIsAnswer = false
        objectState = .creating
        phase = .preparing
        // Until SELECT reports the object size, assume the SDK's 4096 bytes.
        prnInUse = config.prn ?? Self.autoPRN(objectSize: maxObjectSize > 0 ? maxObjectSize : 4096, chunk: chunkSize)
        packetsSinceReset = 0
        receiptsSinceReset = 0
        receiptsInStep = true
        return send(.setPRN(prnInUse))
    }

    private mutating func handleNotification(_ r: DFUResponse) -> [Action] {
        if r.request == .calculateChecksum, case .checksum(let offset, let crc) = r.payload, r.result == .success {
            return checksumNotification(offset: Int(offset), crc: crc)
        }
        guard let flight = inFlight, flight.request.opcode == r.request else { return [] }  // stale
        inFlight = nil
        guard r.result == .success else { return refused(r, to: flight.request) }
        switch (flight.request, r.payload) {
        case (.setPRN, _):
            if phase == .preparing { return send(.select(.command)) }
            return beginFirmware()
        case (.select(.command), .select(let max, let offset, let crc)):
            return commandSelected(maxSize: Int(max), offset: Int(offset), crc: crc)
        case (.select(.data), .select(let max, let offset, let crc)):
            return dataSelected(maxSize: Int(max), offset: Int(offset), crc: crc)
        case (.create, _):
            if objectState == .creating { objectState = .streaming }
            return proceed()
        case (.execute, _):
            return executed()
        default:
            return fail(OTAError(.protocolError, "the bootloader answered \(flight.request) with \(r), which Secure DFU does not define"))
        }
    }

    // MARK: The init packet

    private mutating func commandSelected(maxSize: Int, offset: Int, crc: UInt32) -> [Action] {
        guard initPacket.count <= maxSize else {
            return fail(OTAError(.incompatibleDevice, "the init packet is \(initPacket.count) bytes, the bootloader takes at most \(maxSize); regenerate the package for this bootloader"))
        }
        let holdsPrefix = offset > 0 && offset < initPacket.count && crc == CRC32.checksum(initPacket[0..<offset])
        if finalExecuteUnconfirmed, !(offset == initPacket.count && crc == initCRC), !holdsPrefix {
            // A bootloader that never ran the last EXECUTE still holds this init packet; one that
            // ran it dropped the transfer after validating the image (and activated it) or after
            // rejecting it. Sending it all again would activate it a second time.
            return fail(OTAError(.connection, "the link was lost during the last EXECUTE and the bootloader has since ended the transfer: it validated and activated the image, or rejected it",
                                 hint: "check the firmware version the device runs; to send the image anew run the same command again"))
        }
        phase = .sendingInitPacket
        objectType = .command
        objectStart = 0
        objectEnd = initPacket.count
        if offset == initPacket.count, crc == initCRC {
            // The device holds this init packet: execute it (again); it keeps its firmware progress.
            stats.initPacketSkipped += 1
            objectState = .executing
            return send(.execute)
        }
        if holdsPrefix {
            // Part of this init packet arrived: send the rest without CREATE.
            sentInPayload = offset
            runningCRC = CRC32(value: crc)
            objectState = .streaming
            return []
        }
        return createObject(start: 0)
    }

    // MARK: The firmware

    private mutating func dataSelected(maxSize: Int, offset: Int, crc: UInt32) -> [Action] {
        guard maxSize > 0 else {
            return fail(OTAError(.protocolError, "the bootloader reports a data object size of 0; it is not following Secure DFU"))
        }
        maxObjectSize = maxSize
        stats.resumedFrom.append(offset)
        phase = .sendingFirmware
        objectType = .data
        let wanted = config.prn ?? Self.autoPRN(objectSize: maxSize, chunk: chunkSize)
        if wanted != prnInUse {
            // The interval fitted to the object size (this also restarts the device's count).
            prnInUse = wanted
            pendingSelect = (offset, crc)
            phase = .selectingData
            return send(.setPRN(wanted))
        }
        return resume(offset: offset, crc: crc)
    }

    private var pendingSelect: (offset: Int, crc: UInt32)?

    /// One receipt per full object, on its last packet.
    static func autoPRN(objectSize: Int, chunk: Int) -> UInt16 {
        UInt16(clamping: (objectSize + chunk - 1) / chunk)
    }

    private mutating func beginFirmware() -> [Action] {
        packetsSinceReset = 0
        receiptsSinceReset = 0
        receiptsInStep = true
        guard let selected = pendingSelect else { return send(.select(.data)) }
        pendingSelect = nil
        phase = .sendingFirmware
        return resume(offset: selected.offset, crc: selected.crc)
    }

    /// Resume rules from SELECT's answer (docs/NORDIC-DFU.md, "Resume").
    private mutating func resume(offset: Int, crc: UInt32) -> [Action] {
        let n = firmware.size
        if offset == 0 { return createObject(start: 0) }
        guard offset <= n, let local = prefix.crc(upTo: offset) else {
            return restartFromInitPacket(because: "the bootloader reports \(offset) bytes, more than the image's \(n)")
        }
        let remainder = offset % maxObjectSize
        let boundary = offset - remainder
        guard local == crc else {
            stats.crcMismatches += 1
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
            receiptsInStep = packetsSinceReset == 0
            objectState = .streaming
            return []
        }
        // At an object boundary or the end: execute what the device holds. An object that was
        // created but never filled answers 0x08, and is created again.
        objectStart = remainder == 0 ? max(0, offset - maxObjectSize) : boundary
        objectEnd = offset
        sentInPayload = offset
        runningCRC = CRC32(value: crc)
        resumeExecute = true
        objectState = .executing
        return send(.execute)
    }

    private mutating func executed() -> [Action] {
        let wasResume = resumeExecute
        resumeExecute = false
        if objectType == .command {
            return send(.select(.data))
        }
        if !wasResume || objectEnd == firmware.size { stats.objectsExecuted += 1 }
        recoveries = 0
        sameObjectRecreates = 0
        confirmed = objectEnd
        if objectEnd == firmware.size {
            validated = true
            phase = .done
            return [.finished]
        }
        return createObject(start: objectEnd)
    }

    // MARK: Objects

    private mutating func createObject(start: Int, recreate: Bool = false) -> [Action] {
        if recreate {
            guard bumpRecoveries() else { return tooManyRecoveries() }
            if objectType == .data {
                sameObjectRecreates = start == lastRecreatedStart ? sameObjectRecreates + 1 : 1
                lastRecreatedStart = start
                if sameObjectRecreates > 3, lastReportMisplaced {
                    // The device keeps reporting offsets outside the object: its idea of where the
                    // object starts differs from ours (it executed data we did not confirm), and
                    // only a new init packet resets its progress.
                    sameObjectRecreates = 0
                    return restartFromInitPacket(because: "the bootloader reported offsets outside the object at \(start) after it was created 3 times")
                }
            }
            stats.objectsRecreated += 1
        }
        let payloadSize = objectType == .command ? initPacket.count : firmware.size
        let size = objectType == .command ? initPacket.count : min(maxObjectSize, payloadSize - start)
        objectStart = start
        objectEnd = start + size
        sentInPayload = start
        runningCRC = CRC32(value: objectType == .command ? 0 : (prefix.crc(upTo: start) ?? 0))
        packetsSinceReset = 0
        receiptsSinceReset = 0
        receiptsInStep = true
        nextChecksumIsAnswer = false
        stats.objectsCreated += 1
        objectState = streamsBeforeCreateResponse ? .streaming : .creating
        return send(.create(objectType, size: UInt32(size)))
    }

    private mutating func restartFromInitPacket(because reason: String) -> [Action] {
        guard bumpRecoveries() else { return tooManyRecoveries() }
        stats.restarts += 1
        lastRestartReason = reason
        phase = .sendingInitPacket
        objectType = .command
        confirmed = 0
        return createObject(start: 0)
    }

    /// With nothing in flight, sends what the object's state calls for.
    private mutating func proceed() -> [Action] {
        guard inFlight == nil else { return [] }
        switch objectState {
        case .bad:
            if objectType == .command {
                return createObject(start: 0, recreate: true)
            }
            return createObject(start: objectStart, recreate: true)
        case .confirmed:
            objectState = .executing
            return send(.execute)
        default:
            return []
        }
    }

    /// A checksum notification: CALCULATE CHECKSUM's answer or a packet receipt. Both say what
    /// the device holds; which one it is matters only for when the command in flight is over.
    private mutating func checksumNotification(offset: Int, crc: UInt32) -> [Action] {
        let checking = inFlight?.request == .calculateChecksum
        if !checking {
            // A receipt. Those that come while CREATE is in flight belong to the object it replaces.
            guard objectState == .streaming || objectState == .awaitingReceipt, inFlight?.request.opcode != .create else { return [] }
            stats.receipts += 1
            receiptsSinceReset += 1
            return judge(offset: offset, crc: crc, final: false)
        }
        let receiptsPending = prnInUse > 0 && !nextChecksumIsAnswer && receiptsSinceReset < packetsSinceReset / Int(prnInUse)
        if receiptsPending, offset < objectEnd {
            stats.receipts += 1
            receiptsSinceReset += 1
            return judge(offset: offset, crc: crc, final: false)
        }
        inFlight = nil
        nextChecksumIsAnswer = false
        return judge(offset: offset, crc: crc, final: true)
    }

    /// Checks a device position against the image. `final`: it answers CALCULATE CHECKSUM, so
    /// the device holds nothing beyond it.
    private mutating func judge(offset: Int, crc: UInt32, final: Bool) -> [Action] {
        let local: UInt32? = if objectType == .command {
            offset <= initPacket.count ? CRC32.checksum(initPacket[0..<offset]) : nil
        } else {
            prefix.crc(upTo: offset)
        }
        lastReportMisplaced = offset < objectStart || offset > sentInPayload
        guard !lastReportMisplaced, let local, local == crc else {
            stats.crcMismatches += 1
            objectState = .bad
            return proceed()
        }
        if objectType == .data, offset > confirmed { confirmed = offset }
        if offset == objectEnd, sentInPayload == objectEnd {
            objectState = .confirmed
            return proceed()
        }
        if final, offset < sentInPayload {
            // The device lacks the object's tail: send it again from where the device stands.
            guard bumpRecoveries() else { return tooManyRecoveries() }
            stats.tailsResent += 1
            receiptsInStep = false
            sentInPayload = offset
            runningCRC = CRC32(value: crc)
        }
        // A receipt (or the checksum asked for instead) that a paused stream waited for.
        if final || objectState == .awaitingReceipt { objectState = .streaming }
        return proceed()
    }

    // MARK: Refusals and retries

    private mutating func refused(_ r: DFUResponse, to request: DFURequest) -> [Action] {
        let ext: DFUExtendedError? = if case .extendedError(let e) = r.payload { e } else { nil }
        if request == .execute, r.result == .operationNotPermitted, objectType == .data {
            // EXECUTE of an object the device does not hold whole. On resume at a boundary: the
            // object after it was created but never filled (link lost right after CREATE), so
            // create it again; otherwise data was lost, so create this object again.
            let atBoundary = resumeExecute && objectEnd < firmware.size && objectEnd % maxObjectSize == 0
            resumeExecute = false
            return createObject(start: atBoundary ? objectEnd : objectStart, recreate: true)
        }
        if ext == .firmwareAlreadyPresent {
            alreadyPresent = true
            phase = .done
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

    private mutating func handleTimeout() -> [Action] {
        guard !isFinished else { return [] }
        if inFlight == nil, objectState == .awaitingReceipt {
            // The receipt did not come: ask for the checksum instead, and wait for no more
            // receipts in this object (the device's count is off from ours).
            receiptsInStep = false
            stats.checksumRequests += 1
            objectState = .checking
            nextChecksumIsAnswer = true
            return send(.calculateChecksum)
        }
        return retry(after: "no answer within \(currentTimeout)", code: .timeout)
    }

    private mutating func retry(after reason: String, code: OTAError.Code, cause: (any Error)? = nil) -> [Action] {
        guard let flight = inFlight else { return [] }
        guard flight.attempts <= config.commandRetries else {
            inFlight = nil
            return fail(OTAError(code, "\(flight.request) failed \(flight.attempts) times, last: \(reason)",
                                 hint: "the bootloader may be stalled: power-cycle it and run the same command again to resume",
                                 resumable: true, cause: cause))
        }
        stats.commandRetries += 1
        if case .create = flight.request {
            // A second CREATE resets the object: stream it from its start again.
            sentInPayload = objectStart
            runningCRC = CRC32(value: objectType == .command ? 0 : (prefix.crc(upTo: objectStart) ?? 0))
            packetsSinceReset = 0
            receiptsSinceReset = 0
            receiptsInStep = true
            objectState = streamsBeforeCreateResponse ? .streaming : .creating
        }
        if flight.request == .calculateChecksum { nextChecksumIsAnswer = true }
        inFlight = (flight.request, flight.attempts + 1)
        return [.send(flight.request)]
    }

    private mutating func bumpRecoveries() -> Bool {
        recoveries += 1
        return recoveries <= config.maxRecoveries
    }

    private mutating func tooManyRecoveries() -> [Action] {
        fail(OTAError(.protocolError, "the bootloader lost or corrupted an object \(config.maxRecoveries) times in a row (\(stats.crcMismatches) CRC mismatches, \(stats.objectsRecreated) objects re-created); nothing bad was executed, check the link and run the same command again",
                      resumable: true))
    }

    private mutating func send(_ request: DFURequest) -> [Action] {
        inFlight = (request, 1)
        return [.send(request)]
    }

    private mutating func fail(_ error: OTAError) -> [Action] {
        failedIn = phase
        phase = .failed
        return [.failed(error)]
    }

    // MARK: Streaming

    /// The next thing to send. Call repeatedly until `.idle`, and again after each event.
    public mutating func nextStreamStep() -> StreamStep {
        guard phase == .sendingInitPacket || phase == .sendingFirmware, objectState == .streaming else { return .idle }
        if config.waitForReceipts, receiptsInStep, prnInUse > 0, sentInPayload < objectEnd, packetsSinceReset >= (receiptsSinceReset + 1) * Int(prnInUse) {
            // The mobile libraries' way: stop after every PRN packets until the receipt comes.
            objectState = .awaitingReceipt
            return .idle
        }
        if sentInPayload < objectEnd {
            let count = min(chunkSize, objectEnd - sentInPayload)
            let payload = objectType == .command ? initPacket[...] : firmware.bytes[...]
            let slice = payload[sentInPayload..<(sentInPayload + count)]
            let which = objectType == .command ? 0 : 1
            if which == 1, let from = resumeFrom {
                resumeFrom = nil
                stats.resumeResends.append(max(0, from - sentInPayload))
            }
            if sentInPayload < highWaters[which] { stats.bytesResent += min(count, highWaters[which] - sentInPayload) }
            runningCRC.update(slice)
            let offset = sentInPayload
            sentInPayload += count
            highWaters[which] = max(highWaters[which], sentInPayload)
            stats.bytesSent += count
            stats.packets += 1
            packetsSinceReset += 1
            return .data(objectType, offset: offset, bytes: slice)
        }
        guard inFlight == nil else { return .idle }
        if objectType == .data, receiptsInStep, prnInUse > 0, packetsSinceReset > 0, packetsSinceReset % Int(prnInUse) == 0,
           receiptsSinceReset < packetsSinceReset / Int(prnInUse) {
            // The device's receipt of the last packet will confirm the object.
            objectState = .awaitingReceipt
            return .idle
        }
        stats.checksumRequests += 1
        objectState = .checking
        inFlight = (.calculateChecksum, 1)
        return .command(.calculateChecksum)
    }
}
