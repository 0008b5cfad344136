import Foundation
import GATT
import OTA
import OTAWire
import Testing
@testable import NordicDFU

// Expectations in Secure DFU's own terms: a request is the write of its encoding to the control
// point, an answer a control point notification.
extension TransferEvent where Peer == NordicDFULink {
    static func connected(mtu: Int, keepsWriteOrder: Bool = false) -> TransferEvent {
        .connected(NordicDFULink(keepsWriteOrder: keepsWriteOrder), mtu: mtu)
    }
    static func notification(_ bytes: [UInt8]) -> TransferEvent { .notification(.control, bytes) }
}

extension TransferAction {
    static func send(_ request: DFURequest) -> TransferAction { .write(TransferWrite(request.encoded)) }
}

/// Drives the engine against the bootloader model in a loop, no I/O and no clock: control point
/// requests get their notification at once; packets go to the device unless a fault drops them.
struct Bench {
    var engine: NordicDFUEngine
    var device: NordicDFUBootloader
    var mtu = 247
    /// Deliver each notification as soon as it exists (between packets) rather than when the
    /// engine has nothing more to stream.
    var eager = false
    /// Packets (1-based, over the whole run) the device never receives.
    var dropPackets: Set<Int> = []
    /// Packets whose first byte arrives flipped.
    var corruptPackets: Set<Int> = []
    /// Lose the link right after the device handled this packet.
    var linkLossAfterPacket: Set<Int> = []
    /// Lose the link once, right after the device handled a request matching this (its answer is lost).
    var linkLossAfterRequest: (@Sendable (DFURequest, NordicDFUBootloader) -> Bool)?
    /// Lose the link right after the device handled these control point requests (1-based count).
    var linkLossAfterRequests: Set<Int> = []
    /// The device ignores every control point write (never answers).
    var silent = false
    var maxConnections = 5
    /// A link lost during the last EXECUTE after the device activated counts as finished.
    var activationCountsAsFinished = true
    /// What the link says on `.connected`: control point and packet writes arrive in order.
    var keepsWriteOrder = false

    private(set) var packets = 0
    private(set) var requests = 0
    /// Every control point write, in order.
    private(set) var controlLog: [[UInt8]] = []
    private(set) var timeouts = 0
    private(set) var linkLosses = 0
    /// Packets sent while a CREATE's answer had not reached the engine yet.
    private(set) var packetsBeforeCreateAnswer = 0
    private var createAnswerPending = false
    private var queue: [[UInt8]] = []
    private var linkUp = false

    init(engine: NordicDFUEngine, device: NordicDFUBootloader = NordicDFUBootloader()) {
        self.engine = engine
        self.device = device
    }

    enum Outcome: Equatable {
        case finished
        case failed(OTAError)
        case stuck(String)
    }

    /// Runs to the end; reconnects after a resumable failure, like the session's supervisor.
    mutating func run(stepLimit: Int = 2_000_000) -> Outcome {
        var steps = 0
        var pending = connect()
        while steps < stepLimit {
            steps += 1
            if let outcome = apply(pending) {
                pending = []
                // The link went down during the last EXECUTE after the device activated the image:
                // the session finds it running the new firmware.
                if case .failed = outcome, engine.finalExecuteUnconfirmed, device.resetPending, activationCountsAsFinished { return .finished }
                if case .failed(let e) = outcome, e.resumable, engine.stats.connections < maxConnections, !linkUp {
                    pending = connect()
                    continue
                }
                return outcome
            }
            pending = []
            if !linkUp {
                pending = engine.handle(.disconnected(.linkLost("test")))
                continue
            }
            if eager, !queue.isEmpty {
                pending = deliverNext()
                continue
            }
            switch engine.nextStreamStep() {
            case .data(let offset, let count):
                let bytes = engine.dataPacket(offset: offset, count: count)
                packets += 1
                if createAnswerPending { packetsBeforeCreateAnswer += 1 }
                var b = Array(bytes)
                if corruptPackets.contains(packets) { b[0] ^= 0xFF }
                if !dropPackets.contains(packets), let note = device.handlePacket(b) { queue.append(note) }
                if linkLossAfterPacket.contains(packets) { loseLink() }
                continue
            case .write(let write) where write.role == .data:
                // An init packet's packet.
                packets += 1
                if createAnswerPending { packetsBeforeCreateAnswer += 1 }
                var b = write.bytes
                if corruptPackets.contains(packets) { b[0] ^= 0xFF }
                if !dropPackets.contains(packets), let note = device.handlePacket(b) { queue.append(note) }
                if linkLossAfterPacket.contains(packets) { loseLink() }
                continue
            case .write(let write):
                guard let request = try? DFURequest(decoding: write.bytes) else { return .stuck("the engine wrote \(write.bytes), not a request") }
                control(request)
                continue
            case .idle:
                break
            }
            if !queue.isEmpty {
                pending = deliverNext()
            } else if engine.isAwaitingReply {
                timeouts += 1
                pending = engine.handle(.timeout)
            } else {
                return .stuck("engine idle in \(engine.phase) with nothing in flight")
            }
        }
        return .stuck("no end within \(stepLimit) steps")
    }

    private mutating func connect() -> [TransferAction] {
        device.linkLost()
        queue = []
        createAnswerPending = false
        linkUp = true
        return engine.handle(.connected(mtu: mtu, keepsWriteOrder: keepsWriteOrder))
    }

    /// Hands the oldest notification to the engine.
    private mutating func deliverNext() -> [TransferAction] {
        let note = queue.removeFirst()
        if (try? DFUResponse(decoding: note))?.request == .create { createAnswerPending = false }
        return engine.handle(.notification(note))
    }

    private mutating func loseLink() {
        linkUp = false
        linkLosses += 1
        queue = []
    }

    private mutating func control(_ request: DFURequest) {
        guard !silent else { return }
        controlLog.append(request.encoded)
        if case .create = request { createAnswerPending = true }
        let note = device.handleControl(request.encoded)
        queue.append(note)
        requests += 1
        if linkLossAfterRequests.contains(requests) { loseLink() }
        if let hook = linkLossAfterRequest, hook(request, device) {
            linkLossAfterRequest = nil  // once
            loseLink()
        }
        // Every data object the device executed holds the image's bytes.
        let executed = device.executedOffset
        if device.validInit != nil, Array(device.bank.prefix(executed)) != Array(engine.firmware.bytes.prefix(executed)) {
            badExecutes += 1
        }
    }

    /// Times the device held executed data that differs from the image.
    private(set) var badExecutes = 0

    private mutating func apply(_ actions: [TransferAction]) -> Outcome? {
        for action in actions {
            switch action {
            case .write(let write):
                if linkUp, let request = try? DFURequest(decoding: write.bytes) { control(request) }
            case .finished: return .finished
            case .failed(let e): return .failed(e)
            }
        }
        return nil
    }
}

func makeEngine(firmware: [UInt8], version: UInt32 = 2, config: NordicDFUConfig = NordicDFUConfig(),
                edit: (inout DFUInitCommand) -> Void = { _ in },
                signature: DFUInitPacket.Signature? = placeholderSignature) -> NordicDFUEngine {
    var c = DFUInitCommand.application(firmware: firmware, version: version, softDeviceRequirements: [0xAF])
    edit(&c)
    let dat = DFUInitPacket(command: c, signature: signature).bytes
    return NordicDFUEngine(initPacket: dat, firmware: FirmwareImage(bytes: firmware), config: config)
}

@Suite struct EngineHappyPathTests {
    @Test(arguments: [23, 27, 100, 185, 247, 517], [false, true])
    func flashesAtEveryMTU(mtu: Int, eager: Bool) {
        let fw = firmwareBytes(4096 * 3 + 1234)
        var bench = Bench(engine: makeEngine(firmware: fw))
        bench.mtu = mtu
        bench.eager = eager
        #expect(bench.run() == .finished)
        #expect(bench.device.activated(fw))
        let s = bench.engine.stats
        let c = bench.engine.counts
        #expect(c.objectsExecuted == 4)
        #expect(c.objectsCreated == 5)  // the init packet and four data objects
        #expect(c.crcMismatches == 0)
        #expect(s.bytesResent == 0)
        #expect(s.bytesSent == fw.count + bench.engine.initPacket.count)
        #expect(bench.timeouts == 0)
        #expect(bench.badExecutes == 0)
        #expect(bench.engine.validated)
        // What the shared session reads of any engine.
        #expect(bench.engine.sent == fw.count)
        #expect(bench.engine.highWater == fw.count)
        #expect(bench.engine.furthestAgreed == fw.count)
        #expect(bench.engine.acked == 4096 * 3)
        #expect(bench.engine.ackedCRC == CRC32.checksum(fw[0..<(4096 * 3)]))
    }

    /// The whole control point exchange of a fresh 20000-byte upload at MTU 247 (the note's nrfutil
    /// trace, less a Calculate Checksum per full object: the receipt of its last packet stands in).
    @Test func freshUploadControlPointTrace() {
        let fw = firmwareBytes(20000)
        var bench = Bench(engine: makeEngine(firmware: fw))
        #expect(bench.run() == .finished)
        let n = UInt8(bench.engine.initPacket.count)
        let full: [[UInt8]] = [[0x01, 0x02, 0x00, 0x10, 0x00, 0x00], [0x04]]
        let expected: [[UInt8]] = [[0x02, 0x11, 0x00], [0x06, 0x01], [0x01, 0x01, n, 0, 0, 0], [0x03], [0x04], [0x06, 0x02]]
            + full + full + full + full + [[0x01, 0x02, 0x20, 0x0e, 0x00, 0x00], [0x03], [0x04]]
        #expect(bench.controlLog == expected)
        #expect(bench.packets == 1 + 4 * 17 + 15)
    }

    @Test func resumeTraceAfterTheInitPacketAndTenThousandBytes() {
        // The note's "resume A": init packet present, 10000 bytes stored with a matching CRC.
        let fw = firmwareBytes(20000)
        var bench = Bench(engine: makeEngine(firmware: fw, config: .nrfutilStrategy))
        bench.linkLossAfterPacket = [1 + 2 * 17 + 7]  // 8192 + 7 × 244 = 9900 bytes: not quite the note's 10000
        #expect(bench.run() == .finished)
        let second = Array(bench.controlLog.drop { $0 != [0x02, 0x00, 0x00] }.dropFirst().drop { $0 != [0x02, 0x00, 0x00] })
        #expect(Array(second.prefix(6)) == [[0x02, 0x00, 0x00], [0x06, 0x01], [0x04], [0x06, 0x02], [0x03], [0x04]])
        #expect(bench.engine.stats.resumedFrom == [0, 9900])
        #expect(bench.engine.stats.bytesResent == 0)
    }

    @Test func autoPRNConfirmsFullObjectsWithoutChecksumRequests() {
        let fw = firmwareBytes(4096 * 4)
        var bench = Bench(engine: makeEngine(firmware: fw))
        #expect(bench.run() == .finished)
        // One receipt per object, on its last packet; only the init packet asks for a checksum.
        #expect(bench.engine.counts.receipts == 4)
        #expect(bench.engine.counts.checksumRequests == 1)
    }

    @Test(arguments: [UInt16(0), 1, 4, 12, 1000])
    func anyPRNWorks(prn: UInt16) {
        let fw = firmwareBytes(10_000)
        var bench = Bench(engine: makeEngine(firmware: fw, config: NordicDFUConfig(prn: prn)))
        bench.mtu = 23
        bench.eager = prn % 2 == 0
        #expect(bench.run() == .finished)
        #expect(bench.device.activated(fw))
        #expect(bench.engine.counts.crcMismatches == 0)
        #expect(bench.timeouts == 0)
        if prn == 0 { #expect(bench.engine.counts.receipts == 0) }
    }

    /// The reference strategies the benchmarks compare with: nrfutil's (PRN 0, Calculate Checksum
    /// per object) and the mobile libraries' (a receipt every 12 packets, waited for).
    @Test(arguments: [(UInt16(0), false), (12, true), (1, true)], [false, true])
    func referenceStrategiesWork(strategy: (prn: UInt16, wait: Bool), eager: Bool) {
        let fw = firmwareBytes(4096 * 2 + 3000)
        let config = strategy.prn == 0 ? NordicDFUConfig.nrfutilStrategy
            : strategy.prn == 12 ? .mobileLibraryStrategy : NordicDFUConfig(prn: strategy.prn, waitForReceipts: strategy.wait)
        var bench = Bench(engine: makeEngine(firmware: fw, config: config))
        bench.eager = eager
        #expect(bench.run() == .finished)
        #expect(bench.device.activated(fw))
        #expect(bench.timeouts == 0)
        if strategy.prn == 1 {
            // The receipt of each object's last packet confirms it (the init packet's may stand
            // in for the checksum answer when it arrives after the request).
            #expect(bench.engine.counts.receipts >= bench.engine.stats.packets - 1)
            #expect(bench.engine.counts.checksumRequests <= 1)
        } else {
            // Objects of 17, 17 and 13 packets: no receipt lands on an object's end.
            #expect(bench.engine.counts.checksumRequests == 4)  // the init packet and every object
            #expect(bench.engine.counts.receipts == (strategy.prn == 12 ? 3 : 0))
        }
    }

    @Test func streamingBeforeCreatesResponseWorks() {
        let fw = firmwareBytes(4096 * 2 + 10)
        var bench = Bench(engine: makeEngine(firmware: fw, config: NordicDFUConfig(streamBeforeCreateResponse: true)))
        #expect(bench.run() == .finished)
        #expect(bench.device.activated(fw))
    }

    /// CREATE's answer is waited for only where the link may reorder writes: on a link that keeps
    /// their order an object's packets follow its CREATE at once; an explicit setting wins.
    @Test(arguments: [(Bool?.none, true, true), (nil, false, false), (false, true, false), (true, false, true)])
    func streamsBeforeCreatesAnswerWhereTheLinkKeepsWriteOrder(setting: Bool?, ordered: Bool, early: Bool) {
        let fw = firmwareBytes(4096 * 2 + 10)
        var bench = Bench(engine: makeEngine(firmware: fw, config: NordicDFUConfig(streamBeforeCreateResponse: setting)))
        bench.keepsWriteOrder = ordered
        #expect(bench.run() == .finished)
        #expect(bench.device.activated(fw))
        #expect(bench.engine.streamsBeforeCreateResponse == early)
        // The init packet's and every object's packets go before their CREATE's answer, or none do.
        #expect(bench.packetsBeforeCreateAnswer == (early ? bench.packets : 0))
        #expect(bench.packets == 1 + 17 + 17 + 1)
        #expect(bench.engine.stats.bytesResent == 0)
        #expect(bench.engine.counts.checksumRequests == 2)  // the init packet and the short last object
        #expect(bench.badExecutes == 0)
    }

    /// The reference strategies wait for CREATE's answer as those tools do, whatever the link.
    @Test func referenceStrategiesWaitForCreatesAnswerOnAnOrderedLink() {
        for config in [NordicDFUConfig.nrfutilStrategy, .mobileLibraryStrategy] {
            let fw = firmwareBytes(4096 + 100)
            var bench = Bench(engine: makeEngine(firmware: fw, config: config))
            bench.keepsWriteOrder = true
            #expect(bench.run() == .finished)
            #expect(bench.packetsBeforeCreateAnswer == 0)
            #expect(!bench.engine.streamsBeforeCreateResponse)
        }
    }

    @Test func imageOfExactlyOneObjectAndOfOneByte() {
        for size in [4096, 1, 4095, 4097] {
            let fw = firmwareBytes(size)
            var bench = Bench(engine: makeEngine(firmware: fw))
            #expect(bench.run() == .finished, "size \(size)")
            #expect(bench.device.activated(fw))
        }
    }

    @Test func realSignedSampleVerifiesWithTheCommittedKey() throws {
        let package = try DFUPackage.load(path: nordicSample("blinky-app.zip"))
        var config = NordicDFUBootloader.Config()
        config.signatureCheck = try sampleKeyCheck()
        var bench = Bench(engine: NordicDFUEngine(image: package.images[0]), device: NordicDFUBootloader(config: config))
        #expect(bench.run() == .finished)
        #expect(bench.device.activated(package.images[0].firmware.bytes))
    }

    @Test func combinedSampleGoesImageByImage() throws {
        let package = try DFUPackage.load(path: nordicSample("blinky-sd-bl-app.zip"))
        var config = NordicDFUBootloader.Config()
        config.signatureCheck = try sampleKeyCheck()
        var device = NordicDFUBootloader(config: config)
        for image in package.images {
            var bench = Bench(engine: NordicDFUEngine(image: image), device: device)
            #expect(bench.run() == .finished)
            device = bench.device
            // The bootloader resets into the new image; the next image starts on a new SoftDevice.
            device.reset()
            device.config.softDevice = 0xB6
        }
        #expect(device.activations.map(\.type) == [.softDeviceBootloader, .application])
        let sameImages = device.activations.map(\.image) == package.images.map(\.firmware.bytes)
        #expect(sameImages, "the images as sent, in order")
    }

    @Test func unsignedPackageOnAnOpenBootloader() {
        let fw = firmwareBytes(3000)
        var config = NordicDFUBootloader.Config()
        config.requireSignature = false
        var bench = Bench(engine: makeEngine(firmware: fw, signature: nil), device: NordicDFUBootloader(config: config))
        #expect(bench.run() == .finished)
    }
}

extension NordicDFUBootloader {
    /// The bootloader activated exactly this one image (compared without printing megabytes on failure).
    func activated(_ image: [UInt8]) -> Bool {
        activations.count == 1 && activations[0].image == image
    }
}

/// A bootloader that verifies signatures with the samples' public key.
func sampleKeyCheck() throws -> NordicDFUBootloader.SignatureCheck {
    try #require(.verify(pem: String(contentsOfFile: nordicSample("test-key-public.pem"), encoding: .utf8)))
}

@Suite struct EngineResumeTests {
    static let fw = firmwareBytes(4096 * 3 + 500)

    @Test func resumesMidObjectWhenTheCRCMatches() {
        var bench = Bench(engine: makeEngine(firmware: Self.fw))
        bench.linkLossAfterPacket = [1 + 17 + 5]  // the init packet, a whole object, five packets of the second at MTU 247
        #expect(bench.run() == .finished)
        let s = bench.engine.stats
        let c = bench.engine.counts
        #expect(bench.linkLosses == 1)
        #expect(s.resumedFrom == [0, 4096 + 5 * 244])
        #expect(c.initPacketSkipped == 1)
        #expect(s.bytesResent == 0)
        #expect(s.rollbacks == 0)
        #expect(bench.device.activated(Self.fw))
    }

    @Test func recreatesTheObjectWhenTheCRCDisagrees() {
        var bench = Bench(engine: makeEngine(firmware: Self.fw, config: NordicDFUConfig(prn: 0)))
        bench.corruptPackets = [1 + 17 + 2]
        bench.linkLossAfterPacket = [1 + 17 + 5]
        #expect(bench.run() == .finished)
        let s = bench.engine.stats
        let c = bench.engine.counts
        #expect(s.resumedFrom == [0, 4096 + 5 * 244])
        #expect(s.rollbacks == 1)
        #expect(c.crcMismatches == 1)
        // Only the current object is sent again.
        #expect(s.bytesResent == 5 * 244)
        #expect(bench.badExecutes == 0)
        #expect(bench.device.activated(Self.fw))
    }

    @Test func linkLossRightAfterCreateRecreatesTheEmptyObject() {
        var bench = Bench(engine: makeEngine(firmware: Self.fw))
        bench.linkLossAfterRequest = { request, device in
            request == .create(.data, size: 4096) && device.executedOffset == 4096
        }
        #expect(bench.run() == .finished)
        let s = bench.engine.stats
        #expect(bench.linkLosses == 1)
        #expect(s.resumedFrom == [0, 4096])
        #expect(s.rollbacks == 1)
        #expect(s.bytesResent == 0)
        #expect(bench.device.activated(Self.fw))
    }

    @Test func linkLossAtAnExecutedBoundaryExecutesAgainAndGoesOn() {
        var bench = Bench(engine: makeEngine(firmware: Self.fw))
        bench.linkLossAfterRequest = { request, device in request == .execute && device.executedOffset == 8192 }
        #expect(bench.run() == .finished)
        #expect(bench.engine.stats.resumedFrom == [0, 8192])
        #expect(bench.engine.stats.rollbacks == 0)
        #expect(bench.engine.stats.bytesResent == 0)
    }

    @Test func linkLossInTheInitPacketSendsItsTail() {
        var bench = Bench(engine: makeEngine(firmware: Self.fw, config: NordicDFUConfig(prn: 0)))
        bench.mtu = 23
        bench.linkLossAfterPacket = [3]  // the init packet is several 20-byte packets at MTU 23
        #expect(bench.run() == .finished)
        #expect(bench.engine.counts.objectsCreated == 1 + 4)  // no second CREATE for the init packet
        #expect(bench.device.activated(Self.fw))
    }

    @Test func aStaleInitPacketOfAnotherImageIsReplaced() {
        var device = NordicDFUBootloader()
        var first = Bench(engine: makeEngine(firmware: firmwareBytes(6000, seed: 9)), device: device)
        first.linkLossAfterPacket = [20]
        first.maxConnections = 1
        guard case .failed = first.run() else { Issue.record("the first transfer should stop at the link loss"); return }
        device = first.device
        var bench = Bench(engine: makeEngine(firmware: Self.fw), device: device)
        #expect(bench.run() == .finished)
        #expect(bench.engine.counts.initPacketSkipped == 0)
        #expect(bench.device.activated(Self.fw))
    }

    @Test func badDataAnotherCentralExecutedIsReplacedFromTheInitPacket() {
        // Another central executed a wrong first object; SELECT shows the boundary with a CRC
        // that disagrees, and CREATE cannot take an executed object back.
        var engine = makeEngine(firmware: Self.fw)
        var device = NordicDFUBootloader()
        _ = device.handle(.create(.command, size: UInt32(engine.initPacket.count)))
        _ = device.handlePacket(engine.initPacket)
        #expect(device.handle(.execute).result == .success)
        _ = device.handle(.create(.data, size: 4096))
        _ = device.handlePacket([UInt8](repeating: 0xEE, count: 4096))
        #expect(device.handle(.execute).result == .success)
        engine = makeEngine(firmware: Self.fw)
        var bench = Bench(engine: engine, device: device)
        #expect(bench.run() == .finished)
        #expect(bench.engine.stats.restarts == 1)
        #expect(bench.engine.lastRestartReason?.contains("offsets outside the object") == true)
        #expect(bench.device.activated(Self.fw))
    }

    @Test func lastExecuteLinkLossIsReportedAsUnconfirmed() {
        var bench = Bench(engine: makeEngine(firmware: Self.fw))
        bench.maxConnections = 1
        bench.activationCountsAsFinished = false
        bench.linkLossAfterRequest = { request, device in request == .execute && device.resetPending }
        guard case .failed(let e) = bench.run() else { Issue.record("expected a failure"); return }
        #expect(e.code == .notConfirmed)
        #expect(e.resumable)
        #expect(bench.engine.finalExecuteUnconfirmed)
        #expect(e.message.contains("last EXECUTE"))
    }

    /// The answer to the last EXECUTE was lost with the link, and the bootloader, on the next
    /// connection, holds no init packet: it ran the EXECUTE. Sending the image again would
    /// activate it a second time, so the engine stops there and says so.
    @Test func afterAnUnconfirmedLastExecuteABootloaderThatEndedTheTransferGetsNothingAgain() {
        var bench = Bench(engine: makeEngine(firmware: Self.fw))
        bench.maxConnections = 2
        bench.activationCountsAsFinished = false
        bench.linkLossAfterRequest = { request, device in request == .execute && device.resetPending }
        guard case .failed(let e) = bench.run() else { Issue.record("expected a failure"); return }
        #expect(bench.engine.stats.connections == 2)
        #expect(!e.resumable)
        #expect(e.code == .notConfirmed)
        #expect(e.message.contains("ended the transfer"), "\(e.message)")
        #expect(bench.device.activations.map(\.image) == [Self.fw])
        // The second connection asked where the device stands and created nothing.
        let lastExecute = bench.controlLog.lastIndex(of: DFURequest.execute.encoded) ?? 0
        let after = bench.controlLog[lastExecute...].dropFirst()
        #expect(!after.contains { $0.first == DFUOpcode.create.rawValue }, "\(after)")
        #expect(after.contains(DFURequest.select(.command).encoded))
    }
}

@Suite struct EngineLossTests {
    static let fw = firmwareBytes(4096 * 3 + 700)

    /// A dropped packet (first, middle, last of an object) under several PRN settings: a
    /// receipt or the checksum catches it, the object is re-created, nothing bad is executed.
    @Test(arguments: [1 + 1, 1 + 9, 1 + 17, 1 + 17 + 17, 1 + 17 * 3 + 2], [UInt16?.none, 0, 4])
    func droppedPacketIsCaughtAndTheObjectRecreated(packet: Int, prn: UInt16?) {
        var bench = Bench(engine: makeEngine(firmware: Self.fw, config: NordicDFUConfig(prn: prn)))
        bench.dropPackets = [packet]
        let outcome = bench.run()
        #expect(outcome == .finished)
        #expect(bench.badExecutes == 0)
        // A dropped last packet leaves a prefix the device holds correctly: only the tail is sent again.
        #expect(bench.engine.stats.rollbacks + bench.engine.stats.rewinds == 1)
        #expect(bench.device.activated(Self.fw))
        #expect(bench.device.dataExecutes == 4)
    }

    @Test(arguments: [false, true])
    func corruptedPacketIsNeverExecuted(eager: Bool) {
        var bench = Bench(engine: makeEngine(firmware: Self.fw))
        bench.eager = eager
        bench.corruptPackets = [1 + 17 + 3]
        #expect(bench.run() == .finished)
        #expect(bench.badExecutes == 0)
        #expect(bench.engine.stats.rollbacks == 1)
        #expect(bench.device.activated(Self.fw))
    }

    @Test func seededLossSoakNeverExecutesBadDataAndNeverHangs() {
        var rng = SeededGenerator(seed: UInt64(ProcessInfo.processInfo.environment["NORDIC_SOAK_SEED"] ?? "") ?? 42)
        let runs = Int(ProcessInfo.processInfo.environment["NORDIC_SOAK_RUNS"] ?? "") ?? 150
        for run in 0..<runs {
            let fw = firmwareBytes(1 + Int(rng.next() % 20_000), seed: UInt64(run))
            let prn: UInt16? = [nil, 0, 1, 5, 12][Int(rng.next() % 5)]
            let config = NordicDFUConfig(prn: prn, streamBeforeCreateResponse: rng.next() % 2 == 0, waitForReceipts: rng.next() % 3 == 0)
            var bench = Bench(engine: makeEngine(firmware: fw, config: config))
            bench.mtu = [23, 64, 185, 247][Int(rng.next() % 4)]
            bench.eager = rng.next() % 2 == 0
            bench.maxConnections = 20
            let packets = fw.count / (bench.mtu - 3) + 2
            for _ in 0..<Int(rng.next() % 3) { bench.dropPackets.insert(1 + Int(rng.next() % UInt64(packets))) }
            for _ in 0..<Int(rng.next() % 2) { bench.corruptPackets.insert(1 + Int(rng.next() % UInt64(packets))) }
            for _ in 0..<Int(rng.next() % 2) { bench.linkLossAfterPacket.insert(1 + Int(rng.next() % UInt64(packets))) }
            for _ in 0..<Int(rng.next() % 2) { bench.linkLossAfterRequests.insert(1 + Int(rng.next() % UInt64(4 + 3 * (fw.count / 4096 + 1)))) }
            let outcome = bench.run(stepLimit: 500_000)
            #expect(outcome == .finished, "run \(run): \(outcome)")
            #expect(bench.badExecutes == 0, "run \(run)")
            #expect(bench.device.activated(fw), "run \(run)")
            // A resume never sends more again than the object in progress plus lost-packet repairs.
            #expect(bench.engine.stats.bytesResent <= (bench.engine.stats.rollbacks + bench.linkLosses + 1) * 4096, "run \(run): \(bench.engine.stats), losses \(bench.linkLosses)")
        }
    }

    @Test func aDeviceThatDropsEverythingEndsInAnError() {
        var bench = Bench(engine: makeEngine(firmware: Self.fw))
        bench.dropPackets = Set(1...100_000)
        guard case .failed(let e) = bench.run() else { Issue.record("expected a failure"); return }
        #expect(e.code == .protocolError)
        #expect(e.message.contains("8 times in a row"))
        #expect(bench.badExecutes == 0)
        #expect(bench.device.activations.isEmpty)
    }

    @Test func aSilentDeviceTimesOut() {
        var bench = Bench(engine: makeEngine(firmware: Self.fw))
        bench.silent = true
        guard case .failed(let e) = bench.run() else { Issue.record("expected a failure"); return }
        #expect(e.code == .timeout)
        #expect(bench.timeouts == 4)  // the first SET PRN and three retries
        #expect(e.message.contains("SET PRN"))
    }
}

@Suite struct EngineRefusalTests {
    struct Case: Sendable, CustomStringConvertible {
        let name: String
        let code: OTAError.Code
        let says: String
        var device: @Sendable (inout NordicDFUBootloader.Config) -> Void = { _ in }
        var edit: @Sendable (inout DFUInitCommand) -> Void = { _ in }
        var signature: DFUInitPacket.Signature? = placeholderSignature
        var description: String { name }
    }

    static let cases: [Case] = [
        Case(name: "downgrade", code: .incompatibleDevice, says: "refuses a downgrade", device: { $0.applicationVersion = 5 }),
        Case(name: "wrong hardware", code: .incompatibleDevice, says: "--hw-version", device: { $0.hardwareVersion = 53 }),
        Case(name: "wrong SoftDevice", code: .incompatibleDevice, says: "--sd-req", device: { $0.softDevice = 0x101 }),
        Case(name: "unsigned on a secure bootloader", code: .incompatibleDevice, says: "signature missing (ext 0x08)", signature: nil),
        Case(name: "signed with another key", code: .incompatibleDevice, says: "signature does not verify (ext 0x0C)", device: { $0.signatureCheck = .reject }),
        Case(name: "debug package on a release bootloader", code: .incompatibleDevice, says: "a debug package (is_debug) needs a debug bootloader", edit: { $0.isDebug = true }),
        Case(name: "bank too small", code: .imageTooLarge, says: "insufficient space", device: { $0.bankSize = 8192 }),
        Case(name: "init packet too long for the bootloader", code: .incompatibleDevice, says: "takes at most 64", device: { $0.commandMaxSize = 64 }),
        Case(name: "wrong signature type", code: .incompatibleDevice, says: "wrong signature type",
             signature: .init(type: 1, bytes: Array(repeating: 1, count: 64))),
        Case(name: "hash of another image", code: .verifyFailed, says: "hash does not match", edit: { $0.hash = Array(repeating: 7, count: 32) }),
    ]

    @Test(arguments: cases)
    func deviceRefusalsMapToOneClearLine(c: Case) {
        let fw = firmwareBytes(9000)
        var config = NordicDFUBootloader.Config()
        c.device(&config)
        var bench = Bench(engine: makeEngine(firmware: fw, edit: c.edit, signature: c.signature), device: NordicDFUBootloader(config: config))
        guard case .failed(let e) = bench.run() else { Issue.record("\(c.name) was not refused"); return }
        #expect(e.code == c.code, "\(e)")
        #expect(e.description.contains(c.says), "\(e)")
        #expect(!e.description.contains("\n"))
        #expect(!e.resumable)
        #expect(bench.device.activations.isEmpty)
    }

    @Test func firmwareAlreadyPresentCountsAsDone() {
        var engine = makeEngine(firmware: firmwareBytes(100))
        _ = engine.handle(.connected(mtu: 247))
        _ = engine.handle(.notification([0x60, 0x02, 0x01]))
        _ = engine.handle(.notification(DFUResponse(request: .select, result: .success, payload: .select(maxSize: 256, offset: 0, crc: 0)).encoded))
        // CREATE command → a bootloader that already holds this firmware.
        #expect(engine.handle(.notification([0x60, 0x01, 0x0B, 0x0E])) == [.finished])
        #expect(engine.alreadyPresent)
    }

    @Test func staleAndUnknownNotificationsAreIgnored() {
        var engine = makeEngine(firmware: firmwareBytes(100))
        #expect(engine.handle(.connected(mtu: 247)) == [.send(.setPRN(17))])
        #expect(engine.handle(.notification([0x60, 0x04, 0x01])).isEmpty)  // answers nothing in flight
        #expect(engine.handle(.notification([0x01, 0x02])).isEmpty)        // not a response
        #expect(engine.handle(.notification([0x60, 0x02, 0x01])) == [.send(.select(.command))])
    }

    @Test func pairingRequiredFailsAtOnce() {
        var engine = makeEngine(firmware: firmwareBytes(100))
        _ = engine.handle(.connected(mtu: 247))
        let actions = engine.handle(.commandFailed(GATTError(.notAuthorized, "Not authorized")))
        guard case .failed(let e)? = actions.first else { Issue.record("expected a failure"); return }
        #expect(e.code == .permission)
    }

    @Test func mtuBelowTheMinimumIsRefused() {
        var engine = makeEngine(firmware: firmwareBytes(100))
        guard case .failed(let e)? = engine.handle(.connected(mtu: 20)).first else { Issue.record("expected a failure"); return }
        #expect(e.code == .incompatibleDevice)
    }
}
