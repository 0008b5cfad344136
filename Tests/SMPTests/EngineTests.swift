import Crypto
import GATT
import OTA
import OTAWire
import SMP
import Testing

/// A scripted SMP server for driving `SMPEngine` by hand: it reassembles the engine's writes into
/// requests and answers them as the test says.
struct ScriptedServer {
    var reassembler = SMPReassembler()
    var requests: [(header: SMPHeader, request: SMPRequest)] = []

    /// Takes every write the engine has to send now, returning the requests they complete.
    mutating func drain(_ engine: inout SMPEngine) throws -> [(header: SMPHeader, request: SMPRequest)] {
        var out: [(SMPHeader, SMPRequest)] = []
        while case .write(let write) = engine.nextStreamStep() {
            #expect(!write.withResponse)
            for frame in try reassembler.append(write.bytes) {
                out.append((frame.header, try SMPRequest(decoding: frame)))
            }
        }
        requests += out
        return out
    }

    /// The answer to `header` as the notification bytes the engine gets.
    static func answer(_ response: SMPResponse, to header: SMPHeader) throws -> TransferEvent<SMPLink> {
        .notification(.data, try response.frame(replyingTo: header).encoded)
    }
}

@Suite("SMP engine")
struct SMPEngineTests {
    static let image = FirmwareImage(bytes: (0..<20_000).map { UInt8(truncatingIfNeeded: $0 &* 7 &+ 3) })
    static let hash = Array(SHA256.hash(data: [1, 2, 3]))
    static var sha: [UInt8] { Array(SHA256.hash(data: image.bytes)) }
    static let link = SMPLink(parameters: SMPParameters(bufferSize: 2475, bufferCount: 4), states: nil)

    static func engine(activate: Bool = true, confirm: Bool = false, reset: Bool = true, hash: [UInt8]? = SMPEngineTests.hash) -> SMPEngine {
        SMPEngine(image: image, config: EngineConfig(activate: activate),
                  settings: SMPUploadSettings(fileSHA256: sha, imageHash: hash, confirm: confirm, reset: reset))
    }

    static func states(hash: [UInt8], pending: Bool = false) -> SMPResponse {
        .imageStates(SMPImageStates(images: [
            SMPImageSlot(slot: 0, version: "1.0.0", hash: Array(repeating: 0xAA, count: 32), bootable: true, confirmed: true, active: true),
            SMPImageSlot(slot: 1, version: "1.2.3", hash: hash, bootable: true, pending: pending),
        ]))
    }

    /// Answers every upload request in order with the offset its data ends at, until the engine
    /// asks something else; returns that request.
    static func upload(_ engine: inout SMPEngine, _ server: inout ScriptedServer, maxInFlight: inout Int) throws -> (SMPHeader, SMPRequest)? {
        var pending = try server.drain(&engine)
        while !pending.isEmpty {
            maxInFlight = max(maxInFlight, pending.count)
            let (header, request) = pending.removeFirst()
            guard case .imageUpload(let chunk) = request else { return (header, request) }
            let actions = engine.handle(try ScriptedServer.answer(.upload(SMPUploadStatus(offset: chunk.offset + UInt64(chunk.data.count))), to: header))
            #expect(actions.isEmpty)
            pending += try server.drain(&engine)
        }
        return nil
    }

    @Test func uploadsWindowedVerifiesTheSlotHashMarksForTestAndResets() throws {
        var engine = Self.engine()
        var server = ScriptedServer()
        #expect(engine.handle(.connected(Self.link, mtu: 247)).isEmpty)
        #expect(engine.phase == .beginning)
        // One request until the server said where it stands.
        let first = try server.drain(&engine)
        #expect(first.count == 1)
        guard case .imageUpload(let opening) = first[0].request else { Issue.record("not an upload: \(first[0].request)"); return }
        #expect(opening.offset == 0 && opening.length == UInt64(Self.image.size) && opening.sha == Self.sha && opening.image == 0)
        #expect(first[0].header.encoded.count + (try first[0].request.frame(sequence: 0).payload.count) <= 2475)
        _ = engine.handle(try ScriptedServer.answer(.upload(SMPUploadStatus(offset: UInt64(opening.data.count))), to: first[0].header))
        #expect(engine.phase == .streaming)
        var most = 0
        let next = try Self.upload(&engine, &server, maxInFlight: &most)
        #expect(most == 4, "the window is the server's buffer count")
        #expect(engine.acked == Self.image.size)
        // The data sent, in order, is the image.
        let data = server.requests.compactMap { if case .imageUpload(let u) = $0.request { u.data } else { nil } }.flatMap { $0 }
        #expect(data == Self.image.bytes)
        guard let (readHeader, read) = next, read == .imageStateRead else { Issue.record("no state read after the upload: \(String(describing: next))"); return }
        #expect(engine.phase == .verifying)
        _ = engine.handle(try ScriptedServer.answer(Self.states(hash: Self.hash), to: readHeader))
        let mark = try server.drain(&engine)
        #expect(mark.map(\.request) == [.imageStateWrite(hash: Self.hash, confirm: false)])
        #expect(engine.phase == .activating)
        _ = engine.handle(try ScriptedServer.answer(Self.states(hash: Self.hash, pending: true), to: mark[0].header))
        let reset = try server.drain(&engine)
        #expect(reset.map(\.request) == [.reset(force: false)])
        // Answered: the device resets and drops the link; the next connection says what booted.
        #expect(engine.handle(try ScriptedServer.answer(.empty, to: reset[0].header)).isEmpty)
        #expect(engine.phase == .activating && engine.isAwaitingReply)
        guard case .failed(let lost)? = engine.handle(.disconnected(.linkLost("reset"))).first else { Issue.record("no reconnect asked"); return }
        #expect(lost.code == .connection && lost.resumable)
        #expect(engine.handle(.connected(Self.booted(Self.hash), mtu: 247)) == [.finished])
        #expect(engine.phase == .done)
        #expect(engine.stats.bytesResent == 0)
    }

    /// The link after the reset: slot 0 runs the image with `running` as its hash, slot 1 is
    /// empty (MCUboot erased a refused image, or moved the old one there after a swap).
    static func booted(_ running: [UInt8], version: String = "1.2.3") -> SMPLink {
        SMPLink(parameters: link.parameters, states: SMPImageStates(images: [
            SMPImageSlot(slot: 0, version: version, hash: running, bootable: true, confirmed: false, active: true),
        ]))
    }

    /// An engine that uploaded, verified and marked the image and sent the reset: the reset's header.
    static func resetting(confirm: Bool = false) throws -> (SMPEngine, ScriptedServer, SMPHeader) {
        var engine = Self.engine(confirm: confirm)
        var server = ScriptedServer()
        _ = engine.handle(.connected(Self.link, mtu: 247))
        var most = 0
        let first = try server.drain(&engine)
        guard case .imageUpload(let opening) = first[0].request else { throw OTAError(.internalError, "not an upload") }
        _ = engine.handle(try ScriptedServer.answer(.upload(SMPUploadStatus(offset: UInt64(opening.data.count))), to: first[0].header))
        guard let (header, _) = try Self.upload(&engine, &server, maxInFlight: &most) else { throw OTAError(.internalError, "no state read") }
        _ = engine.handle(try ScriptedServer.answer(Self.states(hash: Self.hash), to: header))
        let mark = try server.drain(&engine)
        #expect(mark.map(\.request) == [.imageStateWrite(hash: Self.hash, confirm: confirm)])
        _ = engine.handle(try ScriptedServer.answer(Self.states(hash: Self.hash, pending: true), to: mark[0].header))
        let reset = try server.drain(&engine)
        #expect(reset.map(\.request) == [.reset(force: false)])
        return (engine, server, reset[0].header)
    }

    /// MCUboot refused the image at boot (an mcumgr server let a corrupted upload through): the
    /// old image runs on. The engine uploads it again from 0 once; refused again, the run fails
    /// with what happened, never ok.
    @Test func anImageMCUbootRefusedAtBootIsUploadedAgainOnceThenFails() throws {
        var (engine, server, header) = try Self.resetting()
        _ = engine.handle(try ScriptedServer.answer(.empty, to: header))
        _ = engine.handle(.disconnected(.linkLost("reset")))
        let old = Array(repeating: UInt8(0xAA), count: 32)
        #expect(engine.handle(.connected(Self.booted(old, version: "1.0.0"), mtu: 247)).isEmpty)
        #expect(engine.phase == .beginning && engine.startOvers == 1)
        #expect(engine.notes.last?.contains("MCUboot refused the image at boot") == true)
        let again = try server.drain(&engine)
        guard case .imageUpload(let opening) = again.first?.request else { Issue.record("no new upload: \(again)"); return }
        #expect(opening.offset == 0 && opening.sha == Self.sha)
        _ = engine.handle(try ScriptedServer.answer(.upload(SMPUploadStatus(offset: UInt64(opening.data.count))), to: again[0].header))
        var most = 0
        guard let (read, _) = try Self.upload(&engine, &server, maxInFlight: &most) else { Issue.record("no state read"); return }
        #expect(engine.furthestAgreed == 2 * Self.image.size, "the second upload counts on for the stall budget")
        _ = engine.handle(try ScriptedServer.answer(Self.states(hash: Self.hash), to: read))
        let mark = try server.drain(&engine)
        _ = engine.handle(try ScriptedServer.answer(Self.states(hash: Self.hash, pending: true), to: mark[0].header))
        #expect(try server.drain(&engine).map(\.request) == [.reset(force: false)])
        _ = engine.handle(.disconnected(.linkLost("reset")))
        guard case .failed(let error)? = engine.handle(.connected(Self.booted(old, version: "1.0.0"), mtu: 247)).first else {
            Issue.record("refused twice, yet no failure"); return
        }
        #expect(error.code == .verifyFailed && error.resumable)
        #expect(error.message == "MCUboot refused the image at boot (its hash or signature did not check out) and the device runs its old image 1.0.0, also after uploading it again from 0")
        #expect(engine.phase == .failed)
    }

    /// A device that answered the reset but kept the link: bounded by the activate timeout, then
    /// a new connection reads what runs; the image still pending there is no success either.
    @Test func aResetThatKeepsTheLinkIsCheckedOnANewConnection() throws {
        var (engine, _, header) = try Self.resetting()
        _ = engine.handle(try ScriptedServer.answer(.empty, to: header))
        #expect(engine.currentTimeout == .seconds(10))
        guard case .failed(let waited)? = engine.handle(.timeout).first else { Issue.record("no failure at the timeout"); return }
        #expect(waited.code == .timeout && waited.resumable)
        let pending = SMPLink(parameters: Self.link.parameters, states: SMPImageStates(images: [
            SMPImageSlot(slot: 0, version: "1.0.0", hash: Array(repeating: 0xAA, count: 32), bootable: true, confirmed: true, active: true),
            SMPImageSlot(slot: 1, version: "1.2.3", hash: Self.hash, bootable: true, pending: true),
        ]))
        guard case .failed(let error)? = engine.handle(.connected(pending, mtu: 247)).first else { Issue.record("a pending image passed"); return }
        #expect(error.code == .timeout && error.message.contains("still lists the image in slot 1"))
    }

    /// An engine whose first request the server answered with `offset`: it held that much of the file.
    static func opened(at offset: Int) throws -> (SMPEngine, ScriptedServer) {
        var engine = Self.engine()
        var server = ScriptedServer()
        _ = engine.handle(.connected(Self.link, mtu: 247))
        let first = try server.drain(&engine)
        _ = engine.handle(try ScriptedServer.answer(.upload(SMPUploadStatus(offset: UInt64(offset))), to: first[0].header))
        #expect(engine.acked == offset)
        return (engine, server)
    }

    @Test func aServerHoldingPartOfTheSameFileResumesThere() throws {
        var (engine, server) = try Self.opened(at: 12_000)
        var most = 0
        _ = try Self.upload(&engine, &server, maxInFlight: &most)
        let later = server.requests.dropFirst().compactMap { if case .imageUpload(let u) = $0.request { u } else { nil } }
        #expect(later.first?.offset == 12_000)
        #expect(later.reduce(0) { $0 + $1.data.count } == Self.image.size - 12_000)
        #expect(engine.stats.resumedFrom == [12_000])
    }

    /// A server that lost the upload (a reset clears img_mgmt's state) takes the first request
    /// of the next connection as a new upload: its offset, not the one confirmed before the link
    /// loss, is where the upload stands.
    @Test func aServerThatStartsOverIsFollowedFromTheStart() throws {
        var engine = Self.engine()
        var server = ScriptedServer()
        _ = engine.handle(.connected(Self.link, mtu: 247))
        let first = try server.drain(&engine)
        _ = engine.handle(try ScriptedServer.answer(.upload(SMPUploadStatus(offset: 12_000)), to: first[0].header))
        #expect(engine.acked == 12_000)
        _ = engine.handle(.disconnected(.linkLost("reboot")))
        _ = engine.handle(.connected(Self.link, mtu: 247))
        let again = try server.drain(&engine)
        guard case .imageUpload(let opening) = again.first?.request else { Issue.record("no first request"); return }
        #expect(opening.offset == 0 && opening.sha == Self.sha)
        _ = engine.handle(try ScriptedServer.answer(.upload(SMPUploadStatus(offset: UInt64(opening.data.count))), to: again[0].header))
        #expect(engine.acked == opening.data.count)
        #expect(engine.furthestAgreed == opening.data.count)
        #expect(engine.stats.resumedFrom == [12_000, 0])
        var most = 0
        _ = try Self.upload(&engine, &server, maxInFlight: &most)
        #expect(engine.acked == Self.image.size)
        // All the 12,000 bytes the server held go again, the second first request's among them.
        #expect(engine.stats.bytesResent == 12_000)
    }

    /// An answer at another offset than the request's end: the requests in flight are forgotten,
    /// their answers ignored, and the upload goes on from the server's offset.
    @Test func anAnswerElsewhereRewindsToTheServersOffset() throws {
        var engine = Self.engine()
        var server = ScriptedServer()
        _ = engine.handle(.connected(Self.link, mtu: 247))
        let first = try server.drain(&engine)
        guard case .imageUpload(let opening) = first[0].request else { return }
        _ = engine.handle(try ScriptedServer.answer(.upload(SMPUploadStatus(offset: UInt64(opening.data.count))), to: first[0].header))
        let window = try server.drain(&engine)
        #expect(window.count == 4)
        // The server lost the second chunk: it answers it, and every later one, with its offset.
        guard case .imageUpload(let second) = window[0].request else { return }
        let held = UInt64(opening.data.count)
        _ = engine.handle(try ScriptedServer.answer(.upload(SMPUploadStatus(offset: held)), to: window[0].header))
        #expect(engine.sent == Int(held))
        #expect(engine.stats.rewinds == 1)
        for stale in window.dropFirst() {
            #expect(engine.handle(try ScriptedServer.answer(.upload(SMPUploadStatus(offset: held)), to: stale.header)).isEmpty)
        }
        #expect(engine.stats.rewinds == 1, "answers to forgotten requests are ignored")
        let again = try server.drain(&engine)
        guard case .imageUpload(let resent) = again.first?.request else { Issue.record("nothing sent again"); return }
        #expect(resent.offset == second.offset)
        #expect(engine.stats.bytesResent > 0)
    }

    /// Uploads the whole image from a fresh first request (the server answers each request at its
    /// end, `match` on the last as given) until the engine asks something else or stops.
    static func uploadAll(_ engine: inout SMPEngine, _ server: inout ScriptedServer, match: Bool?) throws -> (last: [TransferAction], next: (SMPHeader, SMPRequest)?) {
        var requests = try server.drain(&engine)
        var last: [TransferAction] = []
        while let (header, request) = requests.first {
            requests.removeFirst()
            guard case .imageUpload(let chunk) = request else { return (last, (header, request)) }
            let end = chunk.offset + UInt64(chunk.data.count)
            last = engine.handle(try ScriptedServer.answer(.upload(SMPUploadStatus(offset: end, match: end == UInt64(Self.image.size) ? match : nil)), to: header))
            requests += try server.drain(&engine)
            if case .failed? = last.first { return (last, nil) }
            // Uploaded again from 0: the new first request is the next one to answer.
            if end == UInt64(Self.image.size), let first = requests.first, case .imageUpload(let u) = first.request, u.offset == 0 {
                return (last, first)
            }
        }
        return (last, nil)
    }

    /// The device holds another hash after the upload: the upload goes again from 0 once
    /// (a first request with the file's length and SHA-256); a second wrong hash fails,
    /// resumably, and nothing is ever marked.
    @Test func anotherHashAfterTheUploadUploadsAgainOnceThenNothingIsMarked() throws {
        var engine = Self.engine()
        var server = ScriptedServer()
        _ = engine.handle(.connected(Self.link, mtu: 247))
        for attempt in 0..<2 {
            let (_, next) = try Self.uploadAll(&engine, &server, match: nil)
            guard let (header, request) = next, request == .imageStateRead else { Issue.record("no state read: \(String(describing: next))"); return }
            let actions = engine.handle(try ScriptedServer.answer(Self.states(hash: Array(repeating: 0x55, count: 32)), to: header))
            if attempt == 0 {
                #expect(actions.isEmpty, "uploaded again instead: \(actions)")
                #expect(engine.phase == .beginning && engine.startOvers == 1 && engine.stats.restarts == 1)
                #expect(engine.notes.last?.contains("uploading it again from 0") == true)
                continue
            }
            guard case .failed(let error)? = actions.first else { Issue.record("a wrong hash was accepted: \(actions)"); return }
            #expect(error.code == .verifyFailed && error.resumable, "a retry must be allowed to send it anew")
            #expect(error.message.contains("also after uploading it again from 0"))
        }
        #expect(!server.requests.contains { if case .imageStateWrite = $0.request { true } else { false } }, "nothing marked")
        let firsts = server.requests.filter { if case .imageUpload(let u) = $0.request { u.offset == 0 && u.sha == Self.sha && u.length == UInt64(Self.image.size) } else { false } }
        #expect(firsts.count == 2)
    }

    /// A server that did not say `match` leaves the only check of the bytes to MCUboot: said
    /// before the mark; a server that said `match` true is not.
    @Test(arguments: [nil, true] as [Bool?])
    func aServerWithoutMatchIsSaidToLeaveTheCheckToMCUboot(match: Bool?) throws {
        var engine = Self.engine()
        var server = ScriptedServer()
        _ = engine.handle(.connected(Self.link, mtu: 247))
        let (_, next) = try Self.uploadAll(&engine, &server, match: match)
        guard let (header, request) = next, request == .imageStateRead else { Issue.record("no state read"); return }
        #expect(engine.handle(try ScriptedServer.answer(Self.states(hash: Self.hash), to: header)).isEmpty)
        #expect(try server.drain(&engine).map(\.request) == [.imageStateWrite(hash: Self.hash, confirm: false)])
        #expect(engine.notes.contains { $0.contains("only MCUboot's check at the reset") } == (match == nil))
    }

    /// `match` false on the last answer: the same once, then a resumable failure.
    @Test func aServerReportingAMismatchedSHAUploadsAgainOnce() throws {
        var engine = Self.engine()
        var server = ScriptedServer()
        _ = engine.handle(.connected(Self.link, mtu: 247))
        let (again, next) = try Self.uploadAll(&engine, &server, match: false)
        #expect(again.isEmpty && engine.startOvers == 1)
        guard let next else { Issue.record("not uploaded again"); return }
        // The second upload's first request is already in flight: the server answers it and the rest.
        var requests = [next]
        var last: [TransferAction] = []
        while let (header, request) = requests.first {
            requests.removeFirst()
            guard case .imageUpload(let chunk) = request else { break }
            let end = chunk.offset + UInt64(chunk.data.count)
            last = engine.handle(try ScriptedServer.answer(.upload(SMPUploadStatus(offset: end, match: end == UInt64(Self.image.size) ? false : nil)), to: header))
            requests += try server.drain(&engine)
        }
        guard case .failed(let error)? = last.first else { Issue.record("a mismatched upload went on: \(last)"); return }
        #expect(error.code == .verifyFailed && error.resumable)
        #expect(engine.stats.restarts == 1)
    }

    /// The start-over is one of the engine's recoveries: with none allowed, the first mismatch fails.
    @Test func noRecoveriesMeansNoStartOver() throws {
        var engine = SMPEngine(image: Self.image, config: EngineConfig(maxRecoveries: 0),
                               settings: SMPUploadSettings(fileSHA256: Self.sha, imageHash: Self.hash))
        var server = ScriptedServer()
        _ = engine.handle(.connected(Self.link, mtu: 247))
        let (last, _) = try Self.uploadAll(&engine, &server, match: false)
        guard case .failed(let error)? = last.first else { Issue.record("went on: \(last)"); return }
        #expect(error.code == .verifyFailed && engine.startOvers == 0)
    }

    /// The first upload request is asked again once after the reply timeout, said with what the
    /// engine waits for (the slot's erase); then the erase allowance, and the chain ends: under a
    /// minute in all, not four erase allowances.
    @Test func anUnansweredFirstRequestIsAskedAgainOnceThenWaitedForTheErase() throws {
        var engine = Self.engine()
        var server = ScriptedServer()
        _ = engine.handle(.connected(Self.link, mtu: 247))
        _ = try server.drain(&engine)
        #expect(engine.notes.isEmpty)
        #expect(engine.currentTimeout == EngineConfig().replyTimeout)
        #expect(engine.handle(.timeout).isEmpty)
        #expect(engine.notes.count == 1)
        #expect(engine.notes.last?.contains("has not answered the first upload request in 5 s") == true)
        #expect(engine.notes.last?.contains("erases its slot for the \(Self.image.size)-byte image") == true)
        #expect(engine.notes.last?.hasSuffix("waiting up to 45 s for the erase") == true, "\(engine.notes)")
        let again = try server.drain(&engine)
        guard case .imageUpload(let u)? = again.first?.request else { Issue.record("not asked again"); return }
        #expect(u.offset == 0)
        #expect(engine.currentTimeout == SMPEngine.firstRequestTimeout)
        guard case .failed(let error)? = engine.handle(.timeout).first else { Issue.record("no failure"); return }
        #expect(error.code == .timeout && error.resumable)
        #expect(error.message.contains("kept the link but did not answer the first upload request in 50 s"), "\(error.message)")
        #expect(EngineConfig().replyTimeout + SMPEngine.firstRequestTimeout <= .seconds(60))
    }

    /// Without retries the first request gets the erase allowance once.
    @Test func withoutRetriesTheFirstRequestWaitsTheEraseOnce() throws {
        var engine = SMPEngine(image: Self.image, config: EngineConfig(commandRetries: 0),
                               settings: SMPUploadSettings(fileSHA256: Self.sha, imageHash: Self.hash))
        var server = ScriptedServer()
        _ = engine.handle(.connected(Self.link, mtu: 247))
        _ = try server.drain(&engine)
        #expect(engine.currentTimeout == SMPEngine.firstRequestTimeout)
        guard case .failed(let error)? = engine.handle(.timeout).first else { Issue.record("no failure"); return }
        #expect(error.message.contains("in 45 s"), "\(error.message)")
    }

    @Test func withoutParametersOneRequestIsInFlightInOneWrite() throws {
        var engine = Self.engine()
        var server = ScriptedServer()
        _ = engine.handle(.connected(SMPLink(parameters: nil, states: nil), mtu: 247))
        #expect(engine.window == 1)
        var writes = 0
        while case .write(let w) = engine.nextStreamStep() {
            writes += 1
            #expect(w.bytes.count <= 244)
            _ = try server.reassembler.append(w.bytes)
        }
        #expect(writes == 1)
    }

    /// `maxFrame` caps every request below the server's buffer: at MTU − 3, each request is one
    /// write (no reassembly needed on the server), the window still the one asked for.
    @Test func maxFrameKeepsEachRequestToOneWrite() throws {
        var engine = SMPEngine(image: Self.image, config: EngineConfig(),
                               settings: SMPUploadSettings(fileSHA256: Self.sha, imageHash: Self.hash, maxWindow: 3, maxFrame: 244))
        var server = ScriptedServer()
        _ = engine.handle(.connected(Self.link, mtu: 247))
        #expect(engine.frameLimit == 244)
        var writes = 0
        var frames = 0
        func drainCounting() throws -> [(header: SMPHeader, request: SMPRequest)] {
            var out: [(header: SMPHeader, request: SMPRequest)] = []
            while case .write(let w) = engine.nextStreamStep() {
                writes += 1
                #expect(w.bytes.count <= 244)
                for frame in try server.reassembler.append(w.bytes) {
                    #expect(frame.encoded.count <= 244)
                    out.append((frame.header, try SMPRequest(decoding: frame)))
                }
            }
            frames += out.count
            return out
        }
        let first = try drainCounting()
        guard case .imageUpload(let opening) = first.first?.request else { Issue.record("no first request"); return }
        _ = engine.handle(try ScriptedServer.answer(.upload(SMPUploadStatus(offset: UInt64(opening.data.count))), to: first[0].header))
        let window = try drainCounting()
        #expect(window.count == 3)
        #expect(writes == frames, "one write per request")
        // A limit above the buffer leaves the buffer's size, exactly (a given frame is not rounded).
        var wide = SMPEngine(image: Self.image, config: EngineConfig(),
                             settings: SMPUploadSettings(fileSHA256: Self.sha, imageHash: Self.hash, maxFrame: 10_000))
        _ = wide.handle(.connected(Self.link, mtu: 247))
        #expect(wide.frameLimit == 2475)
    }

    /// A frame keeps to whole ATT writes: no short last write costing a packet for little data;
    /// a buffer smaller than one write is one frame of its size.
    @Test(arguments: [(384, 185, 364), (384, 247, 244), (384, 517, 384), (2475, 247, 2440), (2475, 517, 2040), (384, 23, 380)])
    func framesAreWholeWrites(bufferSize: Int, mtu: Int, frame: Int) throws {
        var engine = Self.engine()
        var server = ScriptedServer()
        _ = engine.handle(.connected(SMPLink(parameters: SMPParameters(bufferSize: UInt32(bufferSize), bufferCount: 4), states: nil), mtu: mtu))
        #expect(engine.frameLimit == frame)
        let first = try server.drain(&engine)
        guard case .imageUpload(let opening) = first.first?.request else { Issue.record("no first request"); return }
        _ = engine.handle(try ScriptedServer.answer(.upload(SMPUploadStatus(offset: UInt64(opening.data.count))), to: first[0].header))
        for (header, request) in try server.drain(&engine) {
            let size = try request.frame(sequence: header.sequence).encoded.count
            #expect(size <= frame && size > frame - 8, "a \(size)-byte frame for a \(frame)-byte limit")
        }
    }

    /// A resume records what it sends again: the bytes sent past the server's offset before the
    /// link was lost.
    @Test func aResumeRecordsTheBytesSentPastTheServersOffset() throws {
        var engine = Self.engine()
        var server = ScriptedServer()
        _ = engine.handle(.connected(Self.link, mtu: 247))
        let first = try server.drain(&engine)
        guard case .imageUpload(let opening) = first[0].request else { Issue.record("no first request"); return }
        _ = engine.handle(try ScriptedServer.answer(.upload(SMPUploadStatus(offset: UInt64(opening.data.count))), to: first[0].header))
        let window = try server.drain(&engine)
        #expect(window.count == 4)
        guard case .imageUpload(let second) = window[0].request else { return }
        let held = Int(second.offset) + second.data.count
        _ = engine.handle(try ScriptedServer.answer(.upload(SMPUploadStatus(offset: UInt64(held))), to: window[0].header))
        _ = try server.drain(&engine)
        let sentAtLoss = engine.sent
        _ = engine.handle(.disconnected(.linkLost("gone")))
        // The session attaches again: the first request finds the server at `held`.
        _ = engine.handle(.connected(Self.link, mtu: 247))
        let again = try server.drain(&engine)
        _ = engine.handle(try ScriptedServer.answer(.upload(SMPUploadStatus(offset: UInt64(held))), to: again[0].header))
        // Measured as streaming goes on from the server's offset.
        let resumed = try server.drain(&engine)
        guard case .imageUpload(let next) = resumed.first?.request else { Issue.record("the upload did not go on"); return }
        #expect(next.offset == UInt64(held))
        #expect(engine.stats.resumeResends == [sentAtLoss - held])
        #expect(sentAtLoss - held > 0)
    }

    /// A server that lost the upload at a reset answers the next connection's first request as
    /// a new upload: the engine's offset follows it back, and the upload goes on from there.
    @Test func aServerThatStartedOverIsFollowedBack() throws {
        var (engine, server) = try Self.opened(at: 12_000)
        _ = engine.handle(.disconnected(.linkLost("reset")))
        _ = engine.handle(.connected(Self.link, mtu: 247))
        let again = try server.drain(&engine)
        guard case .imageUpload(let opening) = again.first?.request, opening.offset == 0 else { Issue.record("no first request"); return }
        _ = engine.handle(try ScriptedServer.answer(.upload(SMPUploadStatus(offset: UInt64(opening.data.count))), to: again[0].header))
        #expect(engine.acked == opening.data.count)
        #expect(engine.resumeOffset == 0)
        #expect(engine.stats.resumeResends.isEmpty)
        let next = try server.drain(&engine)
        guard case .imageUpload(let second) = next.first?.request else { Issue.record("the upload did not go on"); return }
        #expect(second.offset == UInt64(opening.data.count))
    }

    /// The note names the refusal by its code, whatever the device's own words (`rsn`) say.
    @Test(arguments: [(SMPDeviceError.general(.busy), "busy (10)"),
                      (.general(.noMemory, reason: "netbuf: no room: 4 held"), "out of memory (2)")])
    func aServerOutOfBuffersDropsTheWindowToOne(refusal: SMPDeviceError, name: String) throws {
        var engine = Self.engine()
        var server = ScriptedServer()
        _ = engine.handle(.connected(Self.link, mtu: 247))
        let first = try server.drain(&engine)
        guard case .imageUpload(let opening) = first[0].request else { return }
        _ = engine.handle(try ScriptedServer.answer(.upload(SMPUploadStatus(offset: UInt64(opening.data.count))), to: first[0].header))
        let window = try server.drain(&engine)
        #expect(window.count == 4)
        #expect(engine.notes.isEmpty)
        _ = engine.handle(try ScriptedServer.answer(.error(refusal), to: window[1].header))
        #expect(engine.window == 1)
        #expect(engine.notes.count == 1)
        #expect(engine.notes.first?.contains("one request in flight") == true)
        #expect(engine.notes.first?.hasPrefix("the device answered \(name) with 4 requests") == true, "\(engine.notes)")
        #expect(try server.drain(&engine).count == 1)
        // Said once: a second refusal on a later connection adds nothing.
        _ = engine.handle(.disconnected(.linkLost("test")))
        _ = engine.handle(.connected(Self.link, mtu: 247))
        let again = try server.drain(&engine)
        _ = engine.handle(try ScriptedServer.answer(.error(refusal), to: again[0].header))
        #expect(engine.notes.count == 1)
    }

    @Test func aLinkLostWhileResettingIsTheReset() throws {
        var engine = Self.engine(confirm: true)
        var server = ScriptedServer()
        _ = engine.handle(.connected(Self.link, mtu: 247))
        var most = 0
        let first = try server.drain(&engine)
        guard case .imageUpload(let opening) = first[0].request else { return }
        _ = engine.handle(try ScriptedServer.answer(.upload(SMPUploadStatus(offset: UInt64(opening.data.count))), to: first[0].header))
        guard let (header, _) = try Self.upload(&engine, &server, maxInFlight: &most) else { return }
        _ = engine.handle(try ScriptedServer.answer(Self.states(hash: Self.hash), to: header))
        let confirm = try server.drain(&engine)
        #expect(confirm.map(\.request) == [.imageStateWrite(hash: Self.hash, confirm: true)])
        _ = engine.handle(try ScriptedServer.answer(Self.states(hash: Self.hash, pending: true), to: confirm[0].header))
        #expect(try server.drain(&engine).map(\.request) == [.reset(force: false)])
        guard case .failed(let lost)? = engine.handle(.disconnected(.linkLost("reset"))).first else { Issue.record("no reconnect asked"); return }
        #expect(lost.code == .connection && lost.resumable)
        #expect(engine.handle(.connected(Self.booted(Self.hash), mtu: 247)) == [.finished])
    }

    @Test func aLinkLostMidUploadIsResumable() throws {
        var engine = Self.engine()
        var server = ScriptedServer()
        _ = engine.handle(.connected(Self.link, mtu: 247))
        _ = try server.drain(&engine)
        guard case .failed(let error)? = engine.handle(.disconnected(.linkLost("gone"))).first else { Issue.record("no failure"); return }
        #expect(error.code == .connection && error.resumable)
    }

    @Test func noActivateStopsAfterTheVerifiedUpload() throws {
        var engine = Self.engine(activate: false)
        var server = ScriptedServer()
        _ = engine.handle(.connected(Self.link, mtu: 247))
        var most = 0
        let first = try server.drain(&engine)
        guard case .imageUpload(let opening) = first[0].request else { return }
        _ = engine.handle(try ScriptedServer.answer(.upload(SMPUploadStatus(offset: UInt64(opening.data.count))), to: first[0].header))
        guard let (header, _) = try Self.upload(&engine, &server, maxInFlight: &most) else { return }
        #expect(engine.handle(try ScriptedServer.answer(Self.states(hash: Self.hash), to: header)) == [.finished])
        #expect(try server.drain(&engine).isEmpty)
    }
}
