import GATT
import OTAWire

/// The device side of the OTA protocol: a flash slot and the rules of docs/PROTOCOL.md.
///
/// A pure state machine: bytes written by a central go in, notification bytes come out. The
/// in-process simulator and `otaflash simulate` (peripheral mode over BlueZ) both run this code, so
/// there is one implementation of the device's rules.
///
/// What survives a reboot (`reboot()`): the transfer's parameters, the flash contents and the last
/// committed checkpoint. What does not: data received after that checkpoint.
public struct OTATarget: Sendable {
    public let slotSize: Int
    public private(set) var firmwareVersion: FirmwareVersion
    public private(set) var state: DeviceState = .idle
    /// The central that owns the transfer in progress, if the transport can tell centrals apart.
    public private(set) var owner: String?

    /// Parameters of the transfer in progress (BEGIN).
    public private(set) var pending: ControlRequest.Begin?
    /// The slot's contents, `pending.imageSize` bytes (0xFF where nothing was written).
    public private(set) var flash: [UInt8] = []
    /// Contiguous bytes received, and the CRC of `flash[0..<received]`.
    public private(set) var received = 0
    private var runningCRC = CRC32()
    /// The last checkpoint whose CRC the central confirmed; survives reboots.
    public private(set) var committed = 0
    private var committedCRC: UInt32 = 0
    private var gapReported = false
    /// Version 2: the end of the erase units erased for this transfer since BEGIN, a rollback or a
    /// reboot (docs/PROTOCOL.md, "Erasing"), and how many unit erases the device has done.
    private var erased = 0
    public private(set) var erases = 0

    /// How many images the device has activated. Only the count and the last activation are
    /// kept, so a device that serves update after update (a test jig running for a shift) holds
    /// one image, not all of them.
    public private(set) var activationCount = 0
    /// The image the device booted last: what its active slot holds.
    public private(set) var lastActivation: Activation?
    /// CRC32 of the image running since the last activation; persists across reboots.
    public private(set) var activeImageCRC: UInt32?

    /// Fault hook: a byte of flash that rots at rest after the transfer (it flips when VERIFY
    /// reads the image back), so checkpoints pass and only VERIFY can catch it. Fires once.
    public var flashBitFlipAt: Int?

    public struct Activation: Sendable, Hashable {
        public let image: [UInt8]
        public let crc: UInt32
        public let version: FirmwareVersion
    }

    /// What a version 2 device declares about its flash (docs/PROTOCOL.md, "Info characteristic").
    public struct Version2: Sendable, Hashable {
        /// Bytes per erase unit, a power of two: commits are rounded down to its multiples.
        public var eraseUnit: Int
        /// Bytes beyond `received` kept when they arrive early; a packet ending further is dropped.
        public var reorderCapacity: Int
        /// Separate ranges beyond a hole the device can hold.
        public var reorderRanges: Int
        /// Worst-case erase time of one unit, as the info value reports it; `DeviceModel` keeps the
        /// flash busy this long per erase.
        public var eraseTimeMs: UInt16
        /// Time to program one 4-byte word; `DeviceModel` keeps the flash busy this long per word.
        public var wordProgramTime: Duration

        public init(eraseUnit: Int = 4096, reorderCapacity: Int = 32 * 1024, reorderRanges: Int = 16, eraseTimeMs: UInt16 = 85,
                    wordProgramTime: Duration = .microseconds(40)) {
            self.eraseUnit = eraseUnit
            self.reorderCapacity = reorderCapacity
            self.reorderRanges = reorderRanges
            self.eraseTimeMs = eraseTimeMs
            self.wordProgramTime = wordProgramTime
        }

        /// Flash time of `erases` unit erases and `bytes` programmed bytes.
        public func flashTime(erases: Int, bytes: Int) -> Duration {
            .milliseconds(Int(eraseTimeMs)) * erases + wordProgramTime * ((bytes + 3) / 4)
        }
    }

    /// Version 2's flash declaration; nil for a version 1 device.
    public let version2: Version2?
    /// The protocol version the device speaks: 2 with `version2`, else 1.
    public var protocolVersion: UInt8 { version2 == nil ? OTAProtocol.version : OTAProtocol.version2 }

    public init(slotSize: Int, firmwareVersion: FirmwareVersion, version2: Version2? = nil) {
        self.slotSize = slotSize
        self.firmwareVersion = firmwareVersion
        self.version2 = version2
    }

    /// What a device keeps in non-volatile memory, without the flash contents.
    public struct Snapshot: Codable, Sendable, Hashable {
        public var slotSize: Int
        public var firmwareVersion: UInt32
        public var state: UInt8
        public var pendingSize: UInt32?
        public var pendingCRC: UInt32?
        public var pendingVersion: UInt32?
        public var received: Int
        public var receivedCRC: UInt32
        public var committed: Int
        public var committedCRC: UInt32
        public var activeImageCRC: UInt32?
    }

    public var snapshot: Snapshot {
        Snapshot(slotSize: slotSize, firmwareVersion: firmwareVersion.packed, state: state.rawValue,
                 pendingSize: pending?.imageSize, pendingCRC: pending?.imageCRC, pendingVersion: pending?.version.packed,
                 received: received, receivedCRC: runningCRC.value, committed: committed, committedCRC: committedCRC,
                 activeImageCRC: activeImageCRC)
    }

    /// Restores a device from its snapshot and flash. Nil when they do not fit together.
    public init?(snapshot s: Snapshot, flash: [UInt8]) {
        self.init(slotSize: s.slotSize, firmwareVersion: FirmwareVersion(packed: s.firmwareVersion))
        activeImageCRC = s.activeImageCRC
        if let size = s.pendingSize, let crc = s.pendingCRC, let version = s.pendingVersion {
            guard flash.count == Int(size), s.received <= flash.count, s.committed <= s.received,
                  CRC32.checksum(flash[0..<s.received]) == s.receivedCRC else { return nil }
            pending = ControlRequest.Begin(imageSize: size, imageCRC: crc, version: FirmwareVersion(packed: version), restart: false)
            self.flash = flash
            state = DeviceState(rawValue: s.state)
            received = s.received
            runningCRC = CRC32(value: s.receivedCRC)
            committed = s.committed
            committedCRC = s.committedCRC
        }
    }

    public var info: DeviceInfo {
        let flash = version2.map {
            DeviceInfo.Flash(eraseUnit: UInt32($0.eraseUnit), reorderCapacity: UInt32($0.reorderCapacity),
                             reorderRanges: UInt8(clamping: $0.reorderRanges), eraseTimeMs: $0.eraseTimeMs,
                             committed: UInt32(committed))
        }
        return DeviceInfo(protocolVersion: protocolVersion, state: state, maxImageSize: UInt32(clamping: slotSize),
                          firmwareVersion: firmwareVersion, received: UInt32(received), pendingImageSize: pending?.imageSize ?? 0,
                          activeImageCRC: activeImageCRC, flash: flash)
    }

    /// The C library run in lockstep (`runCLibraryInLockstep`), if any.
    private var lockstep: CDeviceLibrary?

    /// Runs the C device library (Sources/COTADevice) beside this model from now on: it gets every
    /// write, hold expiry, link loss and reboot this model gets, and must answer byte for byte
    /// alike (`lockstepDivergence` records the first difference). Version 2 only, on a fresh device.
    /// Returns false when it cannot (version 1, or a slot that is not a whole number of units).
    public mutating func runCLibraryInLockstep() -> Bool {
        guard let v2 = version2, state == .idle, lockstep == nil,
              let c = CDeviceLibrary(slotSize: slotSize, eraseUnit: v2.eraseUnit, eraseMicroseconds: UInt32(v2.eraseTimeMs) * 1000,
                                     reorderCapacity: v2.reorderCapacity, reorderRanges: v2.reorderRanges,
                                     holdMs: deferEarlyCheckpoints ? 300 : 0, firmwareVersion: firmwareVersion.packed)
        else { return false }
        lockstep = c
        return true
    }

    /// Whether the C library runs beside this model.
    public var runsCLibrary: Bool { lockstep != nil }

    /// The first way the C library answered differently from this model; nil while they agree.
    public var lockstepDivergence: String? { lockstep?.divergence }

    /// Handles a write to the control point and returns the notification to send back.
    public mutating func handleControl(_ bytes: [UInt8], from central: String? = nil) -> [UInt8] {
        let reply = handleControlInModel(bytes, from: central)
        if let lockstep {
            let c = lockstep.control(bytes, from: central)
            lockstep.check("control point write \(bytes.prefix(1)) from \(central ?? "?")", c: c, swift: reply, info: info.encoded)
        }
        return reply
    }

    private mutating func handleControlInModel(_ bytes: [UInt8], from central: String?) -> [UInt8] {
        let request: ControlRequest
        do {
            request = try ControlRequest(decoding: bytes)
        } catch {
            return ControlResponse(opcode: error.opcode ?? OTAOpcode(rawValue: 0), status: error.status).encoded
        }
        if let owner, let central, owner != central, state != .idle, request != .status, !resumesPending(request) {
            return ControlResponse(opcode: request.opcode, status: .busy).encoded
        }
        return handle(request, from: central)?.encoded ?? []
    }

    /// Version 2: a BEGIN that names the pending image is accepted from any central, so a central
    /// that comes back under an address the device cannot resolve resumes its own transfer.
    private func resumesPending(_ request: ControlRequest) -> Bool {
        guard version2 != nil, case .begin(let b) = request, let p = pending, !b.restart else { return false }
        return p.imageSize == b.imageSize && p.imageCRC == b.imageCRC && p.version == b.version
    }

    /// Hold a CHECKPOINT that arrives before the data it covers, instead of answering `gap` at
    /// once. For transports that can reorder writes; `DeviceModel` sets it from its timing and
    /// calls `expireDeferredCheckpoint()` at the hold's deadline.
    public var deferEarlyCheckpoints = false

    /// A CHECKPOINT held until its data arrives.
    public private(set) var deferred: (offset: Int, crc: UInt32)?

    /// Answers a deferred CHECKPOINT now (its data did not come in time); nil when none waits.
    public mutating func expireDeferredCheckpoint() -> [UInt8]? {
        let reply = expireDeferred()
        if let lockstep {
            lockstep.check("a held CHECKPOINT's deadline", c: lockstep.expireHold(), swift: reply ?? [], info: info.encoded)
        }
        return reply
    }

    private mutating func expireDeferred() -> [UInt8]? {
        guard deferred != nil else { return nil }
        deferred = nil
        gapReported = false
        return ControlResponse(opcode: .checkpoint, status: .gap, payload: position).encoded
    }

    /// Forgets a deferred CHECKPOINT without answering it: the link it came on is gone, and a
    /// reply would reach whoever connects next.
    public mutating func cancelDeferredCheckpoint() {
        deferred = nil
        lockstep?.linkLost()
    }

    /// The reply to a deferred CHECKPOINT once `received` reaches it, or `gap` once the hole persists.
    private mutating func answerDeferred() -> [UInt8]? {
        guard let (offset, crc) = deferred else { return nil }
        if offset <= received {
            deferred = nil
            return handle(.checkpoint(offset: UInt32(offset), crc: crc), from: owner)?.encoded
        }
        if version2 == nil, aheadBytes > Self.gapAllowance { return expireDeferred() }
        return nil
    }

    private mutating func handle(_ request: ControlRequest, from central: String?) -> ControlResponse? {
        // A new command means the central stopped waiting for a deferred checkpoint's reply.
        deferred = nil
        switch request {
        case .begin(let begin):
            return handleBegin(begin, from: central)

        case .checkpoint(let offset, let crc):
            guard state == .receiving, pending != nil else {
                return ControlResponse(opcode: .checkpoint, status: .invalidState)
            }
            let offset = Int(offset)
            if version2 != nil, offset < committed {
                // Below what is committed: nothing changes; the central reconciles with this position.
                return ControlResponse(opcode: .checkpoint, status: .success,
                                       payload: .position(offset: UInt32(committed), crc: committedCRC))
            }
            if offset > received {
                // Ahead of its data: on a stack that reorders (EATT bearers; a write socket beside
                // D-Bus), the data may still be on its way. Answer once it arrives, or once the
                // hole persists (handleData), or when the transport's timer expires.
                if deferEarlyCheckpoints, canHold(offset) {
                    deferred = (offset, crc)
                    return nil
                }
                gapReported = false  // a handled checkpoint re-arms GAP reporting
                return ControlResponse(opcode: .checkpoint, status: .gap, payload: position)
            }
            if prefixCRC(offset) == crc {
                // Commit; data already held beyond the checkpoint stays (it may have overtaken
                // the checkpoint on its way). Version 2 commits the erase-unit boundary at or
                // below it, so a rollback or a reboot rewrites whole units only.
                let boundary = commitBoundary(offset)
                if boundary > committed {
                    committedCRC = prefixCRC(boundary)
                    committed = boundary
                }
                gapReported = false
                return ControlResponse(opcode: .checkpoint, status: .success, payload: .position(offset: UInt32(offset), crc: crc))
            }
            // What the central sent and what arrived differ somewhere: fall back to the last
            // checkpoint both sides agreed on.
            truncate(to: committed, crc: committedCRC)
            return ControlResponse(opcode: .checkpoint, status: .crcMismatch, payload: position)

        case .status:
            let s = ControlResponse.Status(state: state, offset: UInt32(received), crc: runningCRC.value,
                                           imageSize: pending?.imageSize ?? 0, imageCRC: pending?.imageCRC ?? 0)
            return ControlResponse(opcode: .status, status: .success, payload: .status(s))

        case .verify:
            guard let pending, state == .receiving || state == .verified else {
                return ControlResponse(opcode: .verify, status: .invalidState)
            }
            guard received == Int(pending.imageSize) else {
                return ControlResponse(opcode: .verify, status: .incomplete, payload: .computedCRC(runningCRC.value))
            }
            if let flip = flashBitFlipAt, flip < flash.count {
                flash[flip] ^= 0x01
                lockstep?.flip(at: flip, mask: 0x01)
                flashBitFlipAt = nil
            }
            let computed = CRC32.checksum(flash)
            if computed == pending.imageCRC {
                state = .verified
                return ControlResponse(opcode: .verify, status: .success, payload: .computedCRC(computed))
            }
            // Never resume onto data that failed verification.
            discardTransfer()
            return ControlResponse(opcode: .verify, status: .crcMismatch, payload: .computedCRC(computed))

        case .activate:
            guard let pending, state == .verified else {
                return ControlResponse(opcode: .activate, status: .notVerified)
            }
            // Check again right before booting: nothing is activated without a whole-image match.
            let crc = CRC32.checksum(flash)
            guard crc == pending.imageCRC else {
                discardTransfer()
                return ControlResponse(opcode: .activate, status: .crcMismatch)
            }
            activationCount += 1
            lastActivation = Activation(image: flash, crc: crc, version: pending.version)
            activeImageCRC = crc
            firmwareVersion = pending.version
            discardTransfer()
            return ControlResponse(opcode: .activate, status: .success)

        case .abort:
            discardTransfer()
            return ControlResponse(opcode: .abort, status: .success)
        }
    }

    /// Whether a CHECKPOINT ahead of `received` may be held for its data.
    private func canHold(_ offset: Int) -> Bool {
        guard let v2 = version2 else { return aheadBytes <= Self.gapAllowance }
        return offset <= Int(pending?.imageSize ?? 0) && offset - received <= v2.reorderCapacity
    }

    /// The offset a matching CHECKPOINT at `offset` commits.
    private func commitBoundary(_ offset: Int) -> Int {
        guard let v2 = version2, offset != Int(pending?.imageSize ?? 0) else { return offset }
        return offset - offset % v2.eraseUnit
    }

    private mutating func handleBegin(_ begin: ControlRequest.Begin, from central: String?) -> ControlResponse {
        guard begin.protocolVersion == protocolVersion else {
            return ControlResponse(opcode: .begin, status: .unsupportedProtocol)
        }
        guard begin.imageSize > 0 else { return ControlResponse(opcode: .begin, status: .invalidImage) }
        guard Int(begin.imageSize) <= slotSize else { return ControlResponse(opcode: .begin, status: .imageTooLarge) }
        var sameImage = false
        if let p = pending, state != .idle, !begin.restart {
            sameImage = p.imageSize == begin.imageSize && p.imageCRC == begin.imageCRC && p.version == begin.version
        }
        if sameImage {
            // Whatever was verified is verified again before it may be activated.
            state = .receiving
        } else {
            pending = begin
            flash = [UInt8](repeating: 0xFF, count: Int(begin.imageSize))
            received = 0
            runningCRC = CRC32()
            committed = 0
            committedCRC = 0
            erased = 0
            ahead.removeAll()
            state = .receiving
        }
        owner = central
        gapReported = false
        return ControlResponse(opcode: .begin, status: .success, payload: position)
    }

    /// Handles a data packet; returns a GAP event to notify when the packet skipped ahead.
    public mutating func handleData(_ bytes: [UInt8], from central: String? = nil) -> [UInt8]? {
        let note = handleDataInModel(bytes, from: central)
        if let lockstep {
            let c = lockstep.data(bytes, from: central)
            lockstep.check("data write of \(bytes.count) bytes", c: c, swift: note ?? [], info: info.encoded)
        }
        return note
    }

    private mutating func handleDataInModel(_ bytes: [UInt8], from central: String?) -> [UInt8]? {
        guard state == .receiving, let pending, let (offset32, payload) = DataPacket.decode(bytes) else { return nil }
        if let owner, let central, owner != central { return nil }
        let offset = Int(offset32)
        let end = offset + payload.count
        guard end <= Int(pending.imageSize) else { return nil }
        if offset > received, let v2 = version2 {
            // Ahead of a hole, the normal case on BlueZ: keep it within the declared capacity and
            // ranges; a packet beyond them is dropped and answers the held CHECKPOINT or one GAP.
            var ranges = ahead
            Self.insert(offset..<end, into: &ranges)
            guard end - received <= v2.reorderCapacity, ranges.count <= v2.reorderRanges else {
                if deferred != nil { return expireDeferred() }
                guard !gapReported else { return nil }
                gapReported = true
                return DeviceEvent.gap(expectedOffset: UInt32(received), crc: runningCRC.value).encoded
            }
            eraseUnits(to: end, unit: v2.eraseUnit)
            for r in Self.uncovered(offset..<end, by: ahead) {
                flash.replaceSubrange(r, with: payload[(payload.startIndex + r.lowerBound - offset)...].prefix(r.count))
            }
            ahead = ranges
            return nil
        }
        if offset > received {
            // Ahead of a hole: a reordered packet (EATT spreads write commands over several
            // bearers) or one after a lost packet. Keep it; report the hole only once it persists.
            flash.replaceSubrange(offset..<end, with: payload)
            insertAhead(offset..<end)
            if let reply = answerDeferred() { return reply }
            guard deferred == nil, !gapReported, aheadBytes > Self.gapAllowance else { return nil }
            gapReported = true
            return DeviceEvent.gap(expectedOffset: UInt32(received), crc: runningCRC.value).encoded
        }
        guard end > received else { return nil }  // a duplicate of what is held
        if let v2 = version2 {
            // Each byte is written once: bytes a held range covers are already in flash.
            eraseUnits(to: end, unit: v2.eraseUnit)
            for r in Self.uncovered(received..<end, by: ahead) {
                flash.replaceSubrange(r, with: payload[(payload.startIndex + r.lowerBound - offset)...].prefix(r.count))
            }
            Self.insert(received..<end, into: &ahead)
            absorbAhead()
            gapReported = false
            return answerDeferred()
        }
        let fresh = payload.dropFirst(received - offset)
        flash.replaceSubrange(received..<end, with: fresh)
        runningCRC.update(fresh)
        received = end
        absorbAhead()
        gapReported = false
        return answerDeferred()
    }

    /// Bytes held beyond a hole before the device reports the hole (docs/PROTOCOL.md, "Data
    /// characteristic"): more than reordering between bearers produces.
    public static let gapAllowance = 4096

    /// Data held beyond `received`, as disjoint ranges in ascending order.
    private var ahead: [Range<Int>] = []
    private var aheadBytes: Int { ahead.reduce(0) { $0 + $1.count } }

    private mutating func insertAhead(_ range: Range<Int>) {
        Self.insert(range, into: &ahead)
    }

    /// Erases every unit from `erased` up to the one holding byte `end - 1`.
    private mutating func eraseUnits(to end: Int, unit: Int) {
        guard unit > 1 else { return }
        while erased < end {
            let start = erased - erased % unit
            erases += 1
            erased = start + unit
        }
    }

    /// Merges `range` into disjoint ascending `ranges`, joining those it overlaps or touches.
    private static func insert(_ range: Range<Int>, into ranges: inout [Range<Int>]) {
        var merged = range
        ranges.removeAll { r in
            guard r.overlaps(merged) || r.upperBound == merged.lowerBound || merged.upperBound == r.lowerBound else { return false }
            merged = min(r.lowerBound, merged.lowerBound)..<max(r.upperBound, merged.upperBound)
            return true
        }
        let i = ranges.firstIndex { $0.lowerBound > merged.lowerBound } ?? ranges.count
        ranges.insert(merged, at: i)
    }

    /// The parts of `range` that none of `ranges` covers.
    private static func uncovered(_ range: Range<Int>, by ranges: [Range<Int>]) -> [Range<Int>] {
        var parts: [Range<Int>] = []
        var pos = range.lowerBound
        for r in ranges where r.upperBound > pos && r.lowerBound < range.upperBound {
            if r.lowerBound > pos { parts.append(pos..<r.lowerBound) }
            pos = max(pos, r.upperBound)
        }
        if pos < range.upperBound { parts.append(pos..<range.upperBound) }
        return parts
    }

    /// Moves `received` over data already held ahead of it, now that the hole before it is filled.
    private mutating func absorbAhead() {
        while let first = ahead.first, first.lowerBound <= received {
            if first.upperBound > received {
                runningCRC.update(flash[received..<first.upperBound])
                received = first.upperBound
            }
            ahead.removeFirst()
        }
    }

    /// Power cycle: data after the last committed checkpoint is lost; the rest stays.
    public mutating func reboot() {
        lockstep?.reboot()
        if state == .receiving {
            truncate(to: committed, crc: committedCRC)
        } else if version2 != nil, state == .verified {
            // Version 2: back to receiving at the committed offset; VERIFY runs again.
            state = .receiving
            truncate(to: committed, crc: committedCRC)
        }
        owner = nil
        gapReported = false
    }

    private var position: ControlResponse.Payload {
        .position(offset: UInt32(received), crc: runningCRC.value)
    }

    /// CRC of `flash[0..<offset]`, from the nearest known point below it.
    private func prefixCRC(_ offset: Int) -> UInt32 {
        if offset == received { return runningCRC.value }
        var crc = offset >= committed ? CRC32(value: committedCRC) : CRC32()
        crc.update(flash[(offset >= committed ? committed : 0)..<offset])
        return crc.value
    }

    private mutating func truncate(to offset: Int, crc: UInt32) {
        erased = offset
        received = offset
        runningCRC = CRC32(value: crc)
        ahead.removeAll()
        deferred = nil
        gapReported = false
    }

    private mutating func discardTransfer() {
        erased = 0
        pending = nil
        flash = []
        received = 0
        runningCRC = CRC32()
        committed = 0
        committedCRC = 0
        state = .idle
        owner = nil
        ahead.removeAll()
        deferred = nil
        gapReported = false
    }
}
