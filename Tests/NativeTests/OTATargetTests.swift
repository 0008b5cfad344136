import Native
import OTADevice
import OTAWire
import Testing

/// Deterministic test bytes (SplitMix64).
func targetBytes(_ count: Int, seed: UInt64 = 1) -> [UInt8] {
    var state = seed
    return (0..<count).map { _ in
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return UInt8(truncatingIfNeeded: z ^ (z >> 31))
    }
}

/// Drives an `OTATarget` with encoded commands and packets, decoding what it answers.
struct Bench {
    var target: OTATarget
    let image: [UInt8]
    let version = FirmwareVersion(major: 2, minor: 1, patch: 7)

    init(image: [UInt8] = targetBytes(10_000), slot: Int = 64 * 1024) {
        self.image = image
        target = OTATarget(slotSize: slot, firmwareVersion: FirmwareVersion(major: 1, minor: 0, patch: 0))
    }

    var beginRequest: ControlRequest {
        .begin(.init(imageSize: UInt32(image.count), imageCRC: CRC32.checksum(image), version: version, restart: false))
    }

    mutating func command(_ request: ControlRequest, from central: String? = nil) -> ControlResponse {
        let bytes = target.handleControl(request.encoded, from: central)
        do {
            return try ControlResponse(decoding: bytes)
        } catch {
            Issue.record("undecodable reply \(bytes): \(error)")
            return ControlResponse(opcode: request.opcode, status: OTAStatus(rawValue: 0xFF))
        }
    }

    mutating func begin(restart: Bool = false, from central: String? = nil) -> ControlResponse {
        var request = beginRequest
        if restart, case .begin(var b) = request { b.restart = true; request = .begin(b) }
        return command(request, from: central)
    }

    /// Sends `image[range]` as one data packet; returns the event the device notifies, if any.
    @discardableResult
    mutating func send(_ range: Range<Int>, from central: String? = nil) -> [UInt8]? {
        target.handleData(DataPacket.encode(offset: UInt32(range.lowerBound), payload: image[range]), from: central)
    }

    /// Sends `image[range]` in packets of `chunk` bytes.
    mutating func stream(_ range: Range<Int>, chunk: Int = 240) {
        var at = range.lowerBound
        while at < range.upperBound {
            let end = min(at + chunk, range.upperBound)
            #expect(send(at..<end) == nil)
            at = end
        }
    }

    func crc(upTo offset: Int) -> UInt32 { CRC32.checksum(image[0..<offset]) }

    func position(_ offset: Int) -> ControlResponse.Payload { .position(offset: UInt32(offset), crc: crc(upTo: offset)) }

    mutating func checkpoint(_ offset: Int) -> ControlResponse {
        command(.checkpoint(offset: UInt32(offset), crc: crc(upTo: offset)))
    }
}

@Suite("OTATarget: data")
struct OTATargetDataTests {
    @Test func beginStartsAnEmptyTransfer() {
        var bench = Bench()
        #expect(bench.begin() == ControlResponse(opcode: .begin, status: .success, payload: .position(offset: 0, crc: 0)))
        #expect(bench.target.state == .receiving)
        #expect(bench.target.info == DeviceInfo(state: .receiving, maxImageSize: 64 * 1024,
                                                firmwareVersion: FirmwareVersion(major: 1, minor: 0, patch: 0),
                                                received: 0, pendingImageSize: 10_000))
    }

    @Test func contiguousPacketsAreAccepted() {
        var bench = Bench()
        _ = bench.begin()
        bench.stream(0..<5000)
        #expect(bench.target.received == 5000)
        #expect(Array(bench.target.flash[0..<5000]) == Array(bench.image[0..<5000]))
        #expect(bench.target.flash[5000...].allSatisfy { $0 == 0xFF })
        let status = bench.command(.status)
        #expect(status.payload == .status(.init(state: .receiving, offset: 5000, crc: bench.crc(upTo: 5000),
                                                imageSize: 10_000, imageCRC: CRC32.checksum(bench.image))))
    }

    @Test func duplicatePacketsAreIgnored() {
        var bench = Bench()
        _ = bench.begin()
        bench.stream(0..<1000)
        let flash = bench.target.flash
        #expect(bench.send(200..<400) == nil)
        #expect(bench.target.received == 1000)
        #expect(bench.target.flash == flash)
    }

    /// A packet that starts below `received` and ends beyond it adds only its new bytes (chunk
    /// boundaries move when the MTU changes between connections).
    @Test func overlappingPacketAddsItsNewBytes() {
        var bench = Bench()
        _ = bench.begin()
        bench.stream(0..<1000)
        #expect(bench.send(900..<1300) == nil)
        #expect(bench.target.received == 1300)
        #expect(Array(bench.target.flash[0..<1300]) == Array(bench.image[0..<1300]))
        #expect(bench.command(.status).payload == .status(.init(state: .receiving, offset: 1300, crc: bench.crc(upTo: 1300),
                                                                 imageSize: 10_000, imageCRC: CRC32.checksum(bench.image))))
    }

    @Test func overlapNeverRewritesBytesAlreadyHeld() {
        var bench = Bench()
        _ = bench.begin()
        bench.stream(0..<1000)
        var packet = DataPacket.encode(offset: 900, payload: bench.image[900..<1100])
        packet[4] ^= 0xFF  // byte 900, already held
        #expect(bench.target.handleData(packet) == nil)
        #expect(bench.target.flash[900] == bench.image[900])
        #expect(bench.target.received == 1100)
    }

    /// Packets that arrive out of order (EATT spreads write commands over bearers) are kept and
    /// absorbed once the hole before them is filled.
    @Test func reorderedPacketsAreKeptAndAbsorbedWhenTheHoleFills() {
        var bench = Bench()
        _ = bench.begin()
        bench.stream(0..<960)
        #expect(bench.send(1200..<1440) == nil)
        #expect(bench.send(1440..<1680) == nil)
        #expect(bench.target.received == 960)
        #expect(Array(bench.target.flash[1200..<1680]) == Array(bench.image[1200..<1680]))
        #expect(bench.send(960..<1200) == nil)
        #expect(bench.target.received == 1680)
        // The CRC kept pace: a checkpoint at the new position commits.
        #expect(bench.checkpoint(1680).status == .success)
    }

    /// Sends 240-byte packets starting at `offset` until one yields a notification; returns it and
    /// how many bytes were held beyond the hole when it came.
    func sendAheadUntilGap(_ bench: inout Bench, from offset: Int, limit: Int) -> (event: [UInt8]?, ahead: Int) {
        var at = offset
        while at + 240 <= limit {
            if let event = bench.send(at..<(at + 240)) { return (event, at + 240 - offset) }
            at += 240
        }
        return (nil, at - offset)
    }

    /// A hole that persists is a lost packet: reported once, with the device's position, after
    /// more than the allowance is held beyond it, and not again until it is filled.
    @Test func aPersistentHoleIsReportedOnceAfterTheAllowance() throws {
        var bench = Bench(image: targetBytes(20_000))
        _ = bench.begin()
        bench.stream(0..<960)
        let (event, ahead) = sendAheadUntilGap(&bench, from: 1200, limit: 10_000)
        let gap = try #require(event)
        #expect(ahead > OTATarget.gapAllowance && ahead <= OTATarget.gapAllowance + 240)
        #expect(gap == [0x81, 0x01] + le(960) + le(bench.crc(upTo: 960)))
        #expect(try DeviceEvent(decoding: gap) == .gap(expectedOffset: 960, crc: bench.crc(upTo: 960)))
        #expect(sendAheadUntilGap(&bench, from: 1200 + ahead, limit: 1200 + ahead + 2400).event == nil)
        #expect(bench.target.received == 960)

        bench.stream(960..<1200)
        #expect(bench.target.received == 1200 + ahead + 2400)
        // A new hole at the new position is reported again.
        let next = bench.target.received
        let again = sendAheadUntilGap(&bench, from: next + 240, limit: 20_000)
        #expect(again.event == DeviceEvent.gap(expectedOffset: UInt32(next), crc: bench.crc(upTo: next)).encoded)
    }

    /// docs/PROTOCOL.md: no further GAP events "until `received` changes or a checkpoint is handled".
    @Test func committedCheckpointRearmsGapReporting() {
        var bench = Bench(image: targetBytes(20_000))
        _ = bench.begin()
        bench.stream(0..<960)
        #expect(sendAheadUntilGap(&bench, from: 1200, limit: 10_000).event != nil)
        #expect(bench.checkpoint(960).status == .success)
        // The commit keeps what is held beyond the hole, which is still over the allowance: the
        // next packet beyond the hole reports it again.
        let again = sendAheadUntilGap(&bench, from: 1200, limit: 10_000)
        #expect(again.event == DeviceEvent.gap(expectedOffset: 960, crc: bench.crc(upTo: 960)).encoded)
        #expect(again.ahead == 240)
    }

    @Test func checkpointAnsweredWithGapRearmsGapReporting() {
        var bench = Bench(image: targetBytes(20_000))
        _ = bench.begin()
        bench.stream(0..<960)
        let first = sendAheadUntilGap(&bench, from: 1200, limit: 10_000)
        #expect(first.event != nil)
        #expect(bench.checkpoint(1200 + first.ahead).status == .gap)
        // Still more than the allowance held beyond the hole: the next packet reports it again.
        #expect(bench.send((1200 + first.ahead)..<(1440 + first.ahead)) == DeviceEvent.gap(expectedOffset: 960, crc: bench.crc(upTo: 960)).encoded)
    }

    @Test func packetBeyondTheImageEndIsIgnored() {
        var bench = Bench(image: targetBytes(1000))
        _ = bench.begin()
        bench.stream(0..<900)
        let packet = DataPacket.encode(offset: 900, payload: targetBytes(101, seed: 5)[...])
        #expect(bench.target.handleData(packet) == nil)
        #expect(bench.target.received == 900)
    }

    @Test func dataBeforeBeginIsIgnored() {
        var bench = Bench()
        #expect(bench.send(0..<240) == nil)
        #expect(bench.target.received == 0)
        #expect(bench.target.state == .idle)
    }

    @Test func packetWithoutPayloadIsIgnored() {
        var bench = Bench()
        _ = bench.begin()
        #expect(bench.target.handleData([0, 0, 0, 0]) == nil)
        #expect(bench.target.received == 0)
    }
}

func le(_ v: UInt32) -> [UInt8] { [UInt8(v & 0xFF), UInt8((v >> 8) & 0xFF), UInt8((v >> 16) & 0xFF), UInt8(v >> 24)] }
func le(_ v: Int) -> [UInt8] { le(UInt32(v)) }

@Suite("OTATarget: commands")
struct OTATargetCommandTests {
    // MARK: BEGIN

    @Test(arguments: [UInt8(0), 2, 0xFF])
    func beginWithAnotherProtocolVersionIsRefused(version: UInt8) {
        var bench = Bench()
        var begin = ControlRequest.Begin(imageSize: 100, imageCRC: 0, version: bench.version, restart: false)
        begin.protocolVersion = version
        #expect(bench.command(.begin(begin)).status == .unsupportedProtocol)
        #expect(bench.target.state == .idle)
    }

    @Test func beginWithSizeZeroIsRefused() {
        var bench = Bench()
        #expect(bench.command(.begin(.init(imageSize: 0, imageCRC: 0, version: bench.version, restart: false))).status == .invalidImage)
    }

    @Test(arguments: [(64 * 1024, OTAStatus.success), (64 * 1024 + 1, .imageTooLarge)])
    func beginChecksTheSlotSize(size: Int, status: OTAStatus) {
        var bench = Bench(slot: 64 * 1024)
        let reply = bench.command(.begin(.init(imageSize: UInt32(size), imageCRC: 0, version: bench.version, restart: false)))
        #expect(reply.status == status)
    }

    @Test func beginForTheSameImageResumesWhereTheDeviceStands() {
        var bench = Bench()
        _ = bench.begin()
        bench.stream(0..<3000)
        #expect(bench.begin() == ControlResponse(opcode: .begin, status: .success, payload: bench.position(3000)))
        #expect(bench.target.received == 3000)
    }

    @Test func beginWithRestartErasesThePartialTransfer() {
        var bench = Bench()
        _ = bench.begin()
        bench.stream(0..<3000)
        #expect(bench.begin(restart: true).payload == .position(offset: 0, crc: 0))
        #expect(bench.target.received == 0)
        #expect(bench.target.flash.allSatisfy { $0 == 0xFF })
    }

    @Test func beginForAnotherImageErasesThePartialTransfer() {
        var bench = Bench()
        _ = bench.begin()
        bench.stream(0..<3000)
        let other = ControlRequest.begin(.init(imageSize: 10_000, imageCRC: 0x1234, version: bench.version, restart: false))
        #expect(bench.command(other).payload == .position(offset: 0, crc: 0))
        #expect(bench.target.received == 0)
    }

    // MARK: CHECKPOINT

    @Test func matchingCheckpointCommits() {
        var bench = Bench()
        _ = bench.begin()
        bench.stream(0..<4000)
        #expect(bench.checkpoint(4000) == ControlResponse(opcode: .checkpoint, status: .success, payload: bench.position(4000)))
        #expect(bench.target.committed == 4000)
    }

    /// A checkpoint below `received` that matches commits there and keeps what was received beyond
    /// it: that data may simply have overtaken the checkpoint.
    @Test func matchingCheckpointBelowTheReceivedOffsetCommitsAndKeepsTheRest() {
        var bench = Bench()
        _ = bench.begin()
        bench.stream(0..<4000)
        #expect(bench.checkpoint(2000) == ControlResponse(opcode: .checkpoint, status: .success, payload: bench.position(2000)))
        #expect(bench.target.committed == 2000)
        #expect(bench.target.received == 4000)
        #expect(bench.checkpoint(4000).status == .success)
    }

    /// With deferral on (transports that reorder), a checkpoint ahead of its data waits for it.
    @Test func earlyCheckpointIsAnsweredWhenItsDataArrives() throws {
        var bench = Bench()
        _ = bench.begin()
        bench.target.deferEarlyCheckpoints = true
        bench.stream(0..<960)
        #expect(bench.target.handleControl(ControlRequest.checkpoint(offset: 1440, crc: bench.crc(upTo: 1440)).encoded) == [])
        #expect(bench.send(1200..<1440) == nil)  // reordered: arrives before the hole is filled
        let filled = bench.send(960..<1200)
        let reply = try #require(filled)
        #expect(try ControlResponse(decoding: reply) == ControlResponse(opcode: .checkpoint, status: .success, payload: bench.position(1440)))
        #expect(bench.target.committed == 1440)
        #expect(bench.target.deferred == nil)
    }

    @Test func earlyCheckpointExpiresAsAGapWhenItsDataNeverComes() throws {
        var bench = Bench()
        _ = bench.begin()
        bench.target.deferEarlyCheckpoints = true
        bench.stream(0..<960)
        #expect(bench.target.handleControl(ControlRequest.checkpoint(offset: 1440, crc: bench.crc(upTo: 1440)).encoded) == [])
        let expired = bench.target.expireDeferredCheckpoint()
        let reply = try #require(expired)
        #expect(try ControlResponse(decoding: reply) == ControlResponse(opcode: .checkpoint, status: .gap, payload: bench.position(960)))
        #expect(bench.target.expireDeferredCheckpoint() == nil)
    }

    @Test func checkpointBeyondTheReceivedOffsetReportsAGap() {
        var bench = Bench()
        _ = bench.begin()
        bench.stream(0..<1000)
        #expect(bench.checkpoint(2000) == ControlResponse(opcode: .checkpoint, status: .gap, payload: bench.position(1000)))
        #expect(bench.target.committed == 0)
    }

    /// A checkpoint whose CRC differs rolls the device back to its last committed checkpoint.
    @Test func mismatchingCheckpointRollsBackToTheCommittedOne() {
        var bench = Bench()
        _ = bench.begin()
        bench.stream(0..<2000)
        _ = bench.checkpoint(2000)
        bench.stream(2000..<4000)
        let reply = bench.command(.checkpoint(offset: 4000, crc: bench.crc(upTo: 4000) ^ 0x8000_0000))
        #expect(reply == ControlResponse(opcode: .checkpoint, status: .crcMismatch, payload: bench.position(2000)))
        #expect(bench.target.received == 2000)
        #expect(bench.target.committed == 2000)
    }

    /// Corruption in transit is caught by the next checkpoint.
    @Test func corruptedPacketIsCaughtAtTheNextCheckpoint() {
        var bench = Bench()
        _ = bench.begin()
        bench.stream(0..<1000)
        _ = bench.checkpoint(1000)
        var packet = DataPacket.encode(offset: 1000, payload: bench.image[1000..<1240])
        packet[50] ^= 0x5A
        #expect(bench.target.handleData(packet) == nil)
        bench.stream(1240..<2000)
        #expect(bench.checkpoint(2000).status == .crcMismatch)
        #expect(bench.target.received == 1000)
    }

    @Test func checkpointWithoutATransferIsInvalidState() {
        var bench = Bench()
        #expect(bench.command(.checkpoint(offset: 0, crc: 0)).status == .invalidState)
    }

    // MARK: Reboot

    @Test func rebootKeepsOnlyCommittedData() {
        var bench = Bench()
        _ = bench.begin()
        bench.stream(0..<2000)
        _ = bench.checkpoint(2000)
        bench.stream(2000..<3500)
        bench.target.reboot()
        #expect(bench.target.received == 2000)
        #expect(bench.target.info.received == 2000)
        #expect(bench.begin().payload == bench.position(2000))
    }

    @Test func rebootBeforeAnyCheckpointKeepsNothing() {
        var bench = Bench()
        _ = bench.begin()
        bench.stream(0..<3000)
        bench.target.reboot()
        #expect(bench.target.received == 0)
        #expect(bench.begin().payload == .position(offset: 0, crc: 0))
    }

    // MARK: VERIFY and ACTIVATE

    @Test func verifyBeforeEveryByteArrivedIsIncomplete() {
        var bench = Bench()
        _ = bench.begin()
        bench.stream(0..<5000)
        #expect(bench.command(.verify) == ControlResponse(opcode: .verify, status: .incomplete, payload: .computedCRC(bench.crc(upTo: 5000))))
        #expect(bench.target.state == .receiving)
    }

    @Test func verifyOfTheWholeImageSucceeds() {
        var bench = Bench()
        _ = bench.begin()
        bench.stream(0..<10_000)
        #expect(bench.command(.verify) == ControlResponse(opcode: .verify, status: .success, payload: .computedCRC(CRC32.checksum(bench.image))))
        #expect(bench.target.state == .verified)
    }

    /// VERIFY reads flash back: a byte that rots at rest after the transfer passed every checkpoint
    /// is caught there, and the transfer is discarded.
    @Test func verifyRecomputesFromFlashSoABitFlipIsRejected() {
        var bench = Bench()
        bench.target.flashBitFlipAt = 7777
        _ = bench.begin()
        bench.stream(0..<10_000)
        #expect(bench.checkpoint(10_000).status == .success)
        let reply = bench.command(.verify)
        #expect(reply.status == .crcMismatch)
        var rotten = bench.image
        rotten[7777] ^= 0x01
        #expect(reply.payload == .computedCRC(CRC32.checksum(rotten)))
        #expect(bench.target.state == .idle)
        #expect(bench.target.pending == nil)
        #expect(bench.command(.activate).status == .notVerified)
        #expect(bench.target.activationCount == 0)
    }

    @Test func activateIsRefusedUnlessVerified() {
        var bench = Bench()
        #expect(bench.command(.activate) == ControlResponse(opcode: .activate, status: .notVerified))
        _ = bench.begin()
        bench.stream(0..<10_000)
        #expect(bench.command(.activate).status == .notVerified)
        #expect(bench.target.activationCount == 0)
    }

    /// BEGIN for the same image after VERIFY puts the device back into receiving: it must verify again.
    @Test func beginAfterVerifyRequiresAnotherVerify() {
        var bench = Bench()
        _ = bench.begin()
        bench.stream(0..<10_000)
        _ = bench.command(.verify)
        #expect(bench.begin().payload == bench.position(10_000))
        #expect(bench.target.state == .receiving)
        #expect(bench.command(.activate).status == .notVerified)
        #expect(bench.command(.verify).status == .success)
        #expect(bench.command(.activate).status == .success)
    }

    @Test func activateBootsTheVerifiedImageAndItsVersion() throws {
        var bench = Bench()
        _ = bench.begin()
        bench.stream(0..<10_000)
        _ = bench.command(.verify)
        #expect(bench.command(.activate) == ControlResponse(opcode: .activate, status: .success))
        let activation = try #require(bench.target.lastActivation)
        #expect(activation.image == bench.image)
        #expect(activation.crc == CRC32.checksum(bench.image))
        #expect(bench.target.firmwareVersion == bench.version)
        #expect(bench.target.state == .idle)
        #expect(bench.command(.activate).status == .notVerified)
        #expect(bench.target.activationCount == 1)
    }

    @Test func abortDiscardsTheTransfer() {
        var bench = Bench()
        _ = bench.begin()
        bench.stream(0..<3000)
        #expect(bench.command(.abort) == ControlResponse(opcode: .abort, status: .success))
        #expect(bench.target.state == .idle)
        #expect(bench.target.received == 0)
        #expect(bench.begin().payload == .position(offset: 0, crc: 0))
    }

    // MARK: Malformed writes

    @Test(arguments: [
        ([UInt8](), [UInt8]([0x80, 0x00, 0x02])),
        ([0x09], [0x80, 0x09, 0x01]),
        ([0x02, 0x00], [0x80, 0x02, 0x02]),
        ([0x04, 0x00], [0x80, 0x04, 0x02]),
    ])
    func malformedWritesAreAnsweredWithTheirStatus(write: [UInt8], reply: [UInt8]) {
        var target = OTATarget(slotSize: 1024, firmwareVersion: FirmwareVersion(major: 1, minor: 0, patch: 0))
        #expect(target.handleControl(write) == reply)
    }

    // MARK: One transfer at a time

    @Test func secondCentralIsBusyWhileATransferIsPending() {
        var bench = Bench()
        #expect(bench.begin(from: "A").status == .success)
        bench.stream(0..<1000)
        #expect(bench.begin(from: "B").status == .busy)
        #expect(bench.command(.checkpoint(offset: 0, crc: 0), from: "B").status == .busy)
        #expect(bench.command(.abort, from: "B").status == .busy)
        #expect(bench.command(.status, from: "B").status == .success)
        #expect(bench.send(1000..<1240, from: "B") == nil)
        #expect(bench.target.received == 1000)
        #expect(bench.target.owner == "A")
    }

    @Test func anotherCentralMayBeginOnceTheDeviceIsIdle() {
        var bench = Bench()
        _ = bench.begin(from: "A")
        #expect(bench.command(.abort, from: "A").status == .success)
        #expect(bench.begin(from: "B").status == .success)
        #expect(bench.target.owner == "B")
    }
}

/// The device's timing, as both transports run it.
@Suite("DeviceModel: timing")
struct DeviceModelTests {
    let image = targetBytes(4096)
    var crc: UInt32 { CRC32.checksum(image) }
    let version = FirmwareVersion(major: 2, minor: 0, patch: 0)

    func model(_ faults: FaultPlan = .none, hold: Duration? = nil, bootDelay: Duration = .milliseconds(30)) -> DeviceModel {
        let target = OTATarget(slotSize: 64 * 1024, firmwareVersion: FirmwareVersion(major: 1, minor: 0, patch: 0))
        return DeviceModel(device: FaultyDevice(target: target, faults: faults), timing: .init(holdEarlyCheckpoint: hold, bootDelay: bootDelay))
    }

    func begin(_ image: [UInt8]) -> [UInt8] {
        ControlRequest.begin(.init(imageSize: UInt32(image.count), imageCRC: CRC32.checksum(image), version: version, restart: false)).encoded
    }

    func packet(_ range: Range<Int>, of image: [UInt8]) -> [UInt8] {
        DataPacket.encode(offset: UInt32(range.lowerBound), payload: image[range])
    }

    /// Sends `image[0..<end]` in 256-byte packets at `at`.
    func send(_ model: inout DeviceModel, _ image: [UInt8], upTo end: Int, at: Duration) {
        for offset in stride(from: 0, to: end, by: 256) {
            #expect(model.receiveData(packet(offset..<min(offset + 256, end), of: image), at: at) == [])
        }
    }

    func checkpoint(_ offset: Int) -> [UInt8] {
        ControlRequest.checkpoint(offset: UInt32(offset), crc: CRC32.checksum(image[0..<offset])).encoded
    }

    @Test func slowFlashDelaysTheActivateReplyAndTheRebootFollowsIt() throws {
        var model = model(FaultPlan(rebootDuration: .milliseconds(500), slowFlashPerKiB: .milliseconds(100)))
        _ = model.receiveCommand(begin(image), at: .zero)
        send(&model, image, upTo: image.count, at: .zero)
        #expect(model.busyUntil == .milliseconds(400))  // 4 KiB of flash writes
        #expect(model.receiveCommand(ControlRequest.verify.encoded, at: .zero).reply == .success(at: .milliseconds(800)))

        let activate = model.receiveCommand(ControlRequest.activate.encoded, at: .milliseconds(900))
        let ready = Duration.milliseconds(1300)  // the whole-image read back
        #expect(activate.reply == .success(at: ready))
        #expect(activate.activated)
        #expect(activate.outputs == [
            .init(at: ready, .notify(OTAProtocol.controlPointUUID, ControlResponse(opcode: .activate, status: .success).encoded)),
            .init(at: ready + .milliseconds(30), .reboot(until: ready + .milliseconds(530), reason: "the device boots the new image", injected: false)),
        ])
        // Connectable until the reboot, refused during it, back after it.
        #expect(!model.refusesConnection(at: ready + .milliseconds(29), after: 1))
        #expect(model.refusesConnection(at: ready + .milliseconds(30), after: 1))
        #expect(model.receiveCommand(ControlRequest.status.encoded, at: ready + .milliseconds(100)).reply == .away)
        #expect(!model.refusesConnection(at: ready + .milliseconds(530), after: 1))
        #expect(model.availableAt == ready + .milliseconds(530))
        #expect(model.target.firmwareVersion == version)
    }

    @Test func anOldHoldsDeadlineDoesNotAnswerANewerCheckpoint() throws {
        var model = model(hold: .seconds(1))
        _ = model.receiveCommand(begin(image), at: .zero)
        send(&model, image, upTo: 256, at: .zero)
        let first = model.receiveCommand(checkpoint(768), at: .milliseconds(10))
        guard case .wake(let oldToken)? = first.outputs.first?.output else { throw HarnessFailure("no hold: \(first)") }
        #expect(first.reply == .success(at: .milliseconds(10)) && first.response.isEmpty)
        let second = model.receiveCommand(checkpoint(1024), at: .milliseconds(500))
        guard case .wake(let newToken)? = second.outputs.first?.output else { throw HarnessFailure("no hold: \(second)") }
        #expect(second.outputs.first?.at == .milliseconds(1500))

        #expect(model.wake(oldToken, at: .milliseconds(1010)) == [])
        #expect(model.target.deferred?.offset == 1024)
        let gap = ControlResponse(opcode: .checkpoint, status: .gap, payload: .position(offset: 256, crc: CRC32.checksum(image[0..<256])))
        #expect(model.wake(newToken, at: .milliseconds(1500)) == [.init(at: .milliseconds(1500), .notify(OTAProtocol.controlPointUUID, gap.encoded))])
        #expect(model.wake(newToken, at: .milliseconds(1600)) == [])
    }

    @Test func aHeldCheckpointIsAnsweredByItsDataOrForgottenWithTheLink() throws {
        var model = model(hold: .seconds(1))
        _ = model.receiveCommand(begin(image), at: .zero)
        send(&model, image, upTo: 256, at: .zero)
        let held = model.receiveCommand(checkpoint(512), at: .zero)
        guard case .wake(let token)? = held.outputs.first?.output else { throw HarnessFailure("no hold: \(held)") }
        // Its data arrives: answered now, and the deadline wakes nothing.
        let success = ControlResponse(opcode: .checkpoint, status: .success, payload: .position(offset: 512, crc: CRC32.checksum(image[0..<512])))
        #expect(model.receiveData(packet(256..<512, of: image), at: .milliseconds(5)) == [.init(at: .milliseconds(5), .notify(OTAProtocol.controlPointUUID, success.encoded))])
        #expect(model.wake(token, at: .seconds(1)) == [])

        let again = model.receiveCommand(checkpoint(1024), at: .milliseconds(10))
        guard case .wake(let second)? = again.outputs.first?.output else { throw HarnessFailure("no hold: \(again)") }
        model.linkDropped()
        #expect(model.target.deferred == nil)
        #expect(model.wake(second, at: .seconds(2)) == [])
    }

    @Test func anInOrderLinkGetsGapAtOnce() {
        var model = model()
        _ = model.receiveCommand(begin(image), at: .zero)
        let result = model.receiveCommand(checkpoint(512), at: .zero)
        let gap = ControlResponse(opcode: .checkpoint, status: .gap, payload: .position(offset: 0, crc: 0))
        #expect(result.outputs == [.init(at: .zero, .notify(OTAProtocol.controlPointUUID, gap.encoded))])
    }

    @Test func aRebootFaultDropsTheLinkAndTheDeviceIsAwayForItsDuration() {
        var model = model(FaultPlan(rebootAt: [300], rebootDuration: .milliseconds(500)))
        _ = model.receiveCommand(begin(image), at: .zero)
        #expect(model.receiveData(packet(0..<256, of: image), at: .milliseconds(1)) == [])
        #expect(model.receiveData(packet(256..<512, of: image), at: .milliseconds(2))
                == [.init(at: .milliseconds(2), .reboot(until: .milliseconds(502), reason: "device rebooted at offset 256"))])
        #expect(model.receiveData(packet(0..<256, of: image), at: .milliseconds(3)) == [])
        #expect(model.target.received == 0)
        #expect(model.refusesConnection(at: .milliseconds(501), after: 1))
        #expect(model.receiveCommand(ControlRequest.status.encoded, at: .milliseconds(502)).reply == .success(at: .milliseconds(502)))
    }

    /// A jig serving update after update keeps a count and the running image, not every image.
    @Test func fiftyActivationsKeepOneImage() throws {
        var model = model()
        var time = Duration.zero
        for n in 1...50 {
            let image = targetBytes(4096, seed: UInt64(n))
            time = model.availableAt + .milliseconds(1)
            _ = model.receiveCommand(begin(image), at: time)
            send(&model, image, upTo: image.count, at: time)
            _ = model.receiveCommand(ControlRequest.verify.encoded, at: time)
            #expect(model.receiveCommand(ControlRequest.activate.encoded, at: time).activated)
        }
        #expect(model.target.activationCount == 50)
        let last = try #require(model.target.lastActivation)
        #expect(last.image == targetBytes(4096, seed: 50))
        // What the device holds: the running image only, no slot contents, nothing per activation.
        #expect(model.target.flash.isEmpty)
        #expect(retainedBytes(model) == 4096)
    }

    /// Bytes held in every `[UInt8]` reachable from `value`, through stored properties, arrays and
    /// optionals: a list of past images would show here.
    func retainedBytes(_ value: Any) -> Int {
        if let bytes = value as? [UInt8] { return bytes.count }
        return Mirror(reflecting: value).children.reduce(0) { $0 + retainedBytes($1.value) }
    }
}

struct HarnessFailure: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}
