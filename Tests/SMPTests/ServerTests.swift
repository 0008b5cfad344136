import Crypto
import GATT
import OTADevice
import OTAWire
import SMP
import Testing

/// The SMP server model's img_mgmt and MCUboot rules, request by request, no transport.
@Suite("SMP server model")
struct SMPServerTests {
    static let image = SMPSlotImage.build(major: 2, minor: 1, revision: 7, build: 3, body: (0..<3000).map { UInt8(truncatingIfNeeded: $0 &* 13) })
    static var sha: [UInt8] { Array(SHA256.hash(data: image)) }

    static func first(_ data: ArraySlice<UInt8>, sha: [UInt8]? = SMPServerTests.sha, length: Int = image.count) -> SMPRequest {
        .imageUpload(SMPImageUpload(image: 0, length: UInt64(length), offset: 0, sha: sha, data: Array(data), upgrade: false))
    }

    static func chunk(_ offset: Int, _ count: Int) -> SMPRequest {
        .imageUpload(SMPImageUpload(offset: UInt64(offset), data: Array(image[offset..<(offset + count)])))
    }

    static func offset(_ response: SMPResponse) -> UInt64? {
        if case .upload(let status) = response { return status.offset }
        return nil
    }

    /// A server whose slot 1 holds `image`, uploaded whole.
    static func uploaded(_ config: SMPServer.Config = SMPServer.Config()) -> SMPServer {
        var server = SMPServer(config: config)
        _ = server.handle(first(image[0..<1000]))
        _ = server.handle(chunk(1000, image.count - 1000))
        return server
    }

    @Test func theSlotHashIsMCUbootsOverHeaderAndBodyAndTheVersionIsTheHeaders() {
        let slot = SMPSlotImage(Self.image)
        #expect(slot.isMCUboot && slot.bootable)
        #expect(slot.versionText == "2.1.7.3")
        #expect(slot.hash == Array(SHA256.hash(data: Self.image[0..<(32 + 3000)])))
        #expect(slot.hash != Self.sha)
        let raw = SMPSlotImage([1, 2, 3])
        #expect(!raw.isMCUboot && !raw.bootable && raw.versionText == "0.0.0")
        #expect(raw.hash == Array(SHA256.hash(data: [1, 2, 3] as [UInt8])))
    }

    @Test func anUploadResumesBySHAAndAnswersItsOwnOffsetToAnyOther() {
        var server = SMPServer()
        #expect(Self.offset(server.handle(Self.first(Self.image[0..<1000]))) == 1000)
        // The same file again: the offset held, nothing written.
        #expect(Self.offset(server.handle(Self.first(Self.image[0..<1000]))) == 1000)
        #expect(server.secondaryBytes.count == 1000)
        // Elsewhere than the server stands: its offset, nothing written.
        #expect(Self.offset(server.handle(Self.chunk(2000, 100))) == 1000)
        #expect(server.secondaryBytes.count == 1000)
        #expect(Self.offset(server.handle(Self.chunk(1000, 500))) == 1500)
        // Another file: starts over.
        let other = Array(SHA256.hash(data: [9] as [UInt8]))
        #expect(Self.offset(server.handle(Self.first(Self.image[0..<200], sha: other))) == 200)
        #expect(server.upload?.sha == other)
        #expect(server.secondaryBytes == Array(Self.image[0..<200]))
    }

    @Test func theLastAnswerSaysWhetherTheFileMatchesItsSHA() {
        var server = SMPServer()
        _ = server.handle(Self.first(Self.image[0..<1000]))
        #expect(server.handle(Self.chunk(1000, Self.image.count - 1000)) == .upload(SMPUploadStatus(offset: UInt64(Self.image.count), match: true)))
        #expect(server.secondary?.bytes == Self.image)
        #expect(server.upload == nil)
        var wrong = SMPServer()
        _ = wrong.handle(Self.first(Self.image[0..<1000], sha: Array(repeating: 7, count: 32)))
        #expect(wrong.handle(Self.chunk(1000, Self.image.count - 1000)) == .upload(SMPUploadStatus(offset: UInt64(Self.image.count), match: false)))
        var noSHA = SMPServer()
        _ = noSHA.handle(Self.first(Self.image[0..<1000], sha: nil))
        #expect(noSHA.handle(Self.chunk(1000, Self.image.count - 1000)) == .upload(SMPUploadStatus(offset: UInt64(Self.image.count))))
    }

    @Test func uploadsThatCannotBeTakenAreRefusedWithImgMgmtsCodes() {
        var small = SMPServer(config: SMPServer.Config(slotSize: 1000))
        #expect(small.handle(Self.first(Self.image[0..<100])) == .error(.image(.imageTooLarge)))
        var server = SMPServer()
        #expect(server.handle(.imageUpload(SMPImageUpload(offset: 0, data: Array(Self.image[0..<100])))) == .error(.image(.invalidLength)))
        #expect(server.handle(Self.first([0, 1, 2, 3] + Self.image[4..<100])) == .error(.image(.invalidImageHeaderMagic)))
        #expect(server.handle(Self.first(Self.image[0..<100], sha: Array(repeating: 1, count: 33))) == .error(.image(.invalidHash)))
        #expect(Self.offset(server.handle(Self.first(Self.image[0..<100], length: 150))) == 100)
        #expect(server.handle(Self.chunk(100, 100)) == .error(.image(.dataOverrun)))
        // A downgrade with `upgrade` set.
        var newer = SMPServer(running: SMPSlotImage.build(major: 3, minor: 0, revision: 0, body: [1]))
        let upgrade = SMPImageUpload(image: 0, length: UInt64(Self.image.count), offset: 0, sha: Self.sha, data: Array(Self.image[0..<100]), upgrade: true)
        #expect(newer.handle(.imageUpload(upgrade)) == .error(.image(.currentVersionIsNewer)))
        // Any bytes, with the header check off.
        var any = SMPServer(config: SMPServer.Config(checksImageHeader: false))
        #expect(Self.offset(any.handle(Self.first([0, 1, 2, 3], length: 4))) == 4)
        #expect(SMPSlotImage(any.secondaryBytes).isMCUboot == false && any.secondaryComplete)
    }

    @Test func configuredRefusalsAreWhatParticularDevicesAnswer() {
        let opening = Self.first(Self.image[0..<100])
        // A downgrade check on every upload, `upgrade` or not: the same version is refused too.
        var same = SMPServer(config: SMPServer.Config(refusesDowngrade: true), running: Self.image)
        #expect(same.handle(opening) == .error(.image(.currentVersionIsNewer)))
        var older = SMPServer(config: SMPServer.Config(refusesDowngrade: true))  // runs 1.0.0
        #expect(Self.offset(older.handle(opening)) == 100)
        var busy = SMPServer(config: SMPServer.Config(busy: true))
        #expect(busy.handle(opening) == .error(.general(.busy)))
        #expect(busy.upload == nil)
        var refusing = SMPServer(config: SMPServer.Config(uploadRefusal: .flashEraseFailed))
        #expect(refusing.handle(opening) == .error(.image(.flashEraseFailed)))
        var old = SMPServer(config: SMPServer.Config(reportsParameters: false))
        #expect(old.handle(.mcumgrParameters) == .error(.general(.notSupported)))
        #expect(old.handle(.echo("hi")) == .echo("hi"))
    }

    @Test func slotOneLeftInUseRefusesUploadsUntilResetOrConfirmed() throws {
        let earlier = SMPSlotImage.build(major: 1, minor: 1, revision: 0, body: [7])
        var pending = SMPServer(leftover: .pending(earlier))
        #expect(pending.states.images.last?.pending == true)
        #expect(pending.handle(Self.first(Self.image[0..<100])) == .error(.image(.noFreeSlot)))
        // The reset runs it for test: slot 1 is still in use until it is confirmed.
        #expect(pending.boot() == .swapped(permanent: false))
        #expect(pending.handle(Self.first(Self.image[0..<100])) == .error(.image(.noFreeSlot)))
        _ = pending.handle(.imageStateWrite(hash: nil, confirm: true))
        #expect(Self.offset(pending.handle(Self.first(Self.image[0..<100]))) == 100)

        var unconfirmed = SMPServer(leftover: .revertTarget(earlier))
        let active = try #require(unconfirmed.states.images.first)
        #expect(active.active && !active.confirmed)
        #expect(unconfirmed.handle(Self.first(Self.image[0..<100])) == .error(.image(.noFreeSlot)))
        #expect(unconfirmed.boot() == .reverted)
        #expect(unconfirmed.primary.versionText == "1.1.0")
        #expect(Self.offset(unconfirmed.handle(Self.first(Self.image[0..<100]))) == 100)
    }

    @Test func testSwapRevertAndConfirmFollowMCUboot() throws {
        var server = Self.uploaded()
        let old = server.primary
        let new = try #require(server.secondary)
        #expect(server.states.images.map(\.slot) == [0, 1])
        // Marking the running image for test is refused; an unknown hash too.
        #expect(server.handle(.imageStateWrite(hash: old.hash, confirm: false)) == .error(.image(.testToActiveDenied)))
        #expect(server.handle(.imageStateWrite(hash: Array(repeating: 0, count: 32), confirm: false)) == .error(.image(.hashNotFound)))
        guard case .imageStates(let marked) = server.handle(.imageStateWrite(hash: new.hash, confirm: false)) else { Issue.record("no states"); return }
        #expect(marked.images[1] == SMPImageSlot(slot: 1, version: "2.1.7.3", hash: new.hash, bootable: true, pending: true))
        #expect(marked.images[0] == SMPImageSlot(slot: 0, version: "1.0.0", hash: old.hash, bootable: true, confirmed: true, active: true))
        // Pending: no upload, no erase.
        #expect(server.handle(Self.first(Self.image[0..<100])) == .error(.image(.noFreeSlot)))
        #expect(server.handle(.imageErase(slot: nil)) == .error(.image(.noFreeSlot)))

        #expect(server.boot() == .swapped(permanent: false))
        var states = server.states.images
        #expect(states[0] == SMPImageSlot(slot: 0, version: "2.1.7.3", hash: new.hash, bootable: true, active: true))
        #expect(states[1] == SMPImageSlot(slot: 1, version: "1.0.0", hash: old.hash, bootable: true, confirmed: true))
        // Running unconfirmed: slot 1 holds the way back.
        #expect(server.handle(Self.first(Self.image[0..<100])) == .error(.image(.noFreeSlot)))
        #expect(server.handle(.imageStateWrite(hash: old.hash, confirm: false)) == .error(.general(.badState)))

        // A reset without confirming reverts.
        var reverted = server
        #expect(reverted.boot() == .reverted)
        #expect(reverted.primary == old && reverted.confirmed)
        #expect(reverted.states.images[1] == SMPImageSlot(slot: 1, version: "2.1.7.3", hash: new.hash, bootable: true))

        // Confirming makes it permanent.
        #expect(server.handle(.imageStateWrite(hash: nil, confirm: true)) != .error(.general(.invalidValue)))
        states = server.states.images
        #expect(states[0].confirmed && states[0].active && !states[1].confirmed)
        #expect(server.boot() == .unchanged)
        #expect(server.primary == new)
    }

    @Test func aPermanentSwapRunsConfirmedAndEraseFreesSlotOne() throws {
        var server = Self.uploaded()
        let new = try #require(server.secondary)
        guard case .imageStates(let marked) = server.handle(.imageStateWrite(hash: new.hash, confirm: true)) else { Issue.record("no states"); return }
        #expect(marked.images[1].pending && marked.images[1].permanent)
        #expect(server.boot() == .swapped(permanent: true))
        #expect(server.primary == new && server.confirmed)
        #expect(server.states.images[0].confirmed)
        #expect(server.handle(.imageErase(slot: 1)) == .empty)
        #expect(server.states.images.count == 1)
        #expect(server.handle(.imageErase(slot: 0)) == .error(.image(.noFreeSlot)))
    }

    @Test func aResetLosesTheUploadInProgressButALinkLossKeepsIt() {
        var server = SMPServer()
        _ = server.handle(Self.first(Self.image[0..<1000]))
        var peripheral = SMPPeripheral(server: server)
        peripheral.linkDropped(central: nil)
        #expect(peripheral.server.upload?.offset == 1000)
        server.boot()
        #expect(server.upload == nil)
        #expect(Self.offset(server.handle(Self.first(Self.image[0..<1000]))) == 1000)
        #expect(server.secondaryBytes.count == 1000)
    }

    @Test func parametersEchoAndUnknownCommands() throws {
        var server = SMPServer(config: SMPServer.Config(bufferSize: 2475, bufferCount: 3))
        #expect(server.handle(.mcumgrParameters) == .mcumgrParameters(SMPParameters(bufferSize: 2475, bufferCount: 3)))
        #expect(server.handle(.echo("hi")) == .echo("hi"))
        let unknown = try SMPFrame(header: SMPHeader(operation: .write, length: 0, group: .shell, sequence: 4, command: 0), body: [:])
        #expect(server.handle(unknown).response == .error(.general(.notSupported)))
        let reset = try SMPRequest.reset().frame(sequence: 9)
        let answer = server.handle(reset)
        #expect(answer.response == .empty && answer.resetRequested)
    }
}

/// The transport side: reassembly, buffers, answers split at the MTU.
@Suite("SMP peripheral model")
struct SMPPeripheralTests {
    /// Writes `frame` as the central does, in MTU − 3 pieces, at `at`.
    static func send(_ request: SMPRequest, seq: UInt8, to model: inout SMPPeripheral, at: Duration, maxWrite: Int = 20) throws -> [PeripheralTimed] {
        var outputs: [PeripheralTimed] = []
        for piece in SMPFraming.segments(try request.frame(sequence: seq).encoded, maxWrite: maxWrite) {
            outputs += model.write(Array(piece), to: SMPService.characteristicUUID, withResponse: false, from: nil, at: at).outputs
        }
        return outputs
    }

    static func answers(_ outputs: [PeripheralTimed]) throws -> [SMPResponse] {
        var reassembler = SMPReassembler()
        var out: [SMPResponse] = []
        for case .notify(_, let bytes) in outputs.map(\.output) {
            #expect(bytes.count <= 244)
            for frame in try reassembler.append(bytes) { out.append(try SMPResponse(decoding: frame)) }
        }
        return out
    }

    @Test func aFrameIsReassembledFromWritesAndAnsweredInMTUSizedNotifications() throws {
        var model = SMPPeripheral(server: SMPServer(config: SMPServer.Config(bufferSize: 2475)))
        model.mtuChanged(247)
        let text = String(repeating: "x", count: 1000)
        let outputs = try Self.send(.echo(text), seq: 1, to: &model, at: .zero)
        #expect(outputs.count == 5)  // 1,000+ bytes of answer in 244-byte notifications
        #expect(try Self.answers(outputs) == [.echo(text)])
    }

    @Test func aFrameOverTheBufferIsDroppedWithItsFragmentsAndTheNextIsTaken() throws {
        var model = SMPPeripheral()  // 384-byte buffers
        let big = try Self.send(.echo(String(repeating: "y", count: 400)), seq: 1, to: &model, at: .zero)
        #expect(big.isEmpty)
        #expect(model.droppedFrames == 1)
        #expect(try Self.answers(try Self.send(.echo("after"), seq: 2, to: &model, at: .zero)) == [.echo("after")])
    }

    @Test func requestsBeyondTheBufferCountAreDroppedUntilAnAnswerFreesOne() throws {
        var model = SMPPeripheral(server: SMPServer(config: SMPServer.Config(bufferCount: 2)), requestTime: .milliseconds(10))
        var answered = 0
        for seq in 0..<3 {
            answered += try Self.answers(try Self.send(.echo("\(seq)"), seq: UInt8(seq), to: &model, at: .zero)).count
        }
        #expect(answered == 2)
        #expect(model.droppedFrames == 1 && model.peakBuffers == 2)
        // Once the first answer went out (10 ms) a buffer is free again.
        #expect(try Self.answers(try Self.send(.echo("late"), seq: 9, to: &model, at: .milliseconds(10))) == [.echo("late")])
    }

    @Test func aResetAnswersThenRebootsAndMCUbootSwapsThePendingImageIn() throws {
        var server = SMPServerTests.uploaded()
        let new = try #require(server.secondary)
        _ = server.handle(.imageStateWrite(hash: new.hash, confirm: false))
        var model = SMPPeripheral(server: server, resetDelay: .milliseconds(30), bootDuration: .milliseconds(200))
        let outputs = try Self.send(.reset(), seq: 3, to: &model, at: .seconds(1))
        #expect(try Self.answers(outputs) == [.empty])
        #expect(outputs.last == PeripheralTimed(at: .milliseconds(1030), .reboot(until: .milliseconds(1230), reason: "the device resets (SMP reset request)", injected: false)))
        #expect(model.availableAt == .milliseconds(1230))
        #expect(model.server.primary == new && !model.server.confirmed)
        #expect(model.activations.map(\.version) == ["2.1.7.3"])
        #expect(model.read(DeviceInformationService.firmwareRevisionUUID) == Array("2.1.7.3".utf8))
    }
}
