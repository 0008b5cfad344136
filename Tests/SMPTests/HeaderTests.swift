import Testing
@testable import SMP

@Suite struct SMPHeaderTests {
    @Test func aV2WriteHeaderIsBigEndian() throws {
        let header = SMPHeader(operation: .write, length: 0x0159, group: SMPGroup(rawValue: 0x0102), sequence: 7, command: 1)
        #expect(header.encoded == [0x0A, 0x00, 0x01, 0x59, 0x01, 0x02, 0x07, 0x01])
        #expect(try SMPHeader(decoding: header.encoded) == header)
    }

    @Test(arguments: SMPOperation.allCases, SMPVersion.allCases)
    func everyOperationAndVersionRoundTrips(operation: SMPOperation, version: SMPVersion) throws {
        let header = SMPHeader(operation: operation, version: version, flags: 0xA5, length: 65535, group: .image, sequence: 255, command: 5)
        #expect(header.encoded[0] == version.rawValue << 3 | operation.rawValue)
        #expect(try SMPHeader(decoding: header.encoded) == header)
    }

    @Test func v1ResponsesDecode() throws {
        let header = try SMPHeader(decoding: [0x03, 0x00, 0x00, 0x02, 0x00, 0x01, 0x09, 0x01])
        #expect(header.version == .v1)
        #expect(header.operation == .writeResponse)
        #expect(header.group == .image)
    }

    @Test func decodingReadsOnlyTheFirstEightBytes() throws {
        let header = try SMPHeader(decoding: [0x09, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x06, 0xA0, 0xFF])
        #expect(header.operation == .readResponse)
        #expect(header.length == 1)
    }

    @Test(arguments: [
        ([UInt8](), SMPWireError.Kind.shortHeader),
        ([0x08, 0, 0, 0, 0, 0, 0], .shortHeader),
        ([0x28, 0, 0, 0, 0, 0, 0, 0], .reservedBits),
        ([0x88, 0, 0, 0, 0, 0, 0, 0], .reservedBits),
        ([0x10, 0, 0, 0, 0, 0, 0, 0], .badVersion),
        ([0x18, 0, 0, 0, 0, 0, 0, 0], .badVersion),
        ([0x0C, 0, 0, 0, 0, 0, 0, 0], .badOperation),
        ([0x07, 0, 0, 0, 0, 0, 0, 0], .badOperation),
    ])
    func malformedHeadersAreRefused(bytes: [UInt8], kind: SMPWireError.Kind) {
        do {
            _ = try SMPHeader(decoding: bytes)
            Issue.record("\(bytes) decoded")
        } catch {
            #expect(error.kind == kind)
        }
    }

    @Test func theResponseHeaderEchoesTheRequest() {
        let request = SMPHeader(operation: .read, version: .v1, length: 1, group: .os, sequence: 42, command: 6)
        let response = request.response(length: 20)
        #expect(response == SMPHeader(operation: .readResponse, version: .v1, length: 20, group: .os, sequence: 42, command: 6))
        #expect(SMPOperation.write.response == .writeResponse)
    }
}

@Suite struct SMPFrameTests {
    @Test func aFrameIsItsHeaderAndExactlyItsLengthInPayload() throws {
        let frame = try SMPFrame(decoding: bytes("08 00 00 01 00 00 00 06 a0"))
        #expect(frame.header.length == 1)
        #expect(frame.payload == [0xA0])
        #expect(try frame.body() == [:])
        #expect(frame.encoded == bytes("08 00 00 01 00 00 00 06 a0"))
    }

    @Test(arguments: ["08 00 00 02 00 00 00 06 a0", "08 00 00 00 00 00 00 06 a0", "08 00 00 01 00 00 00 06"])
    func aPayloadOfTheWrongLengthIsRefused(hex: String) {
        do {
            _ = try SMPFrame(decoding: bytes(hex))
            Issue.record("decoded")
        } catch {
            #expect(error.kind == .lengthMismatch)
        }
    }

    @Test func theLengthFollowsThePayload() throws {
        let frame = try SMPFrame(header: SMPHeader(operation: .write, length: 999, group: .os, sequence: 0, command: 0), payload: [0xA0])
        #expect(frame.header.length == 1)
    }

    @Test func aPayloadOverWhatTheHeaderCanSayIsRefused() throws {
        let header = SMPHeader(operation: .write, length: 0, group: .os, sequence: 0, command: 0)
        _ = try SMPFrame(header: header, payload: Array(repeating: 0, count: 65_535))
        #expect(throws: SMPWireError.self) { try SMPFrame(header: header, payload: Array(repeating: 0, count: 65_536)) }
        do {
            _ = try SMPRequest.echo(String(repeating: "x", count: 70_000)).frame(sequence: 0)
            Issue.record("a 70,000-byte echo made a frame")
        } catch {
            #expect(error.kind == .frameTooLarge)
        }
    }

    @Test func aPayloadThatIsNotCBORSaysSo() throws {
        let frame = try SMPFrame(header: SMPHeader(operation: .readResponse, length: 0, group: .os, sequence: 0, command: 6), payload: [0xA1, 0x61])
        do {
            _ = try frame.body()
            Issue.record("decoded")
        } catch {
            guard case .cbor(let cbor) = error.kind else { Issue.record("kind \(error.kind)"); return }
            #expect(cbor.kind == .truncated)
        }
    }
}

@Suite struct SMPFramingTests {
    /// The note's measurement: a 384-byte frame over ATT MTU 23 is 19 writes of 20 and one of 4.
    @Test func aFrameSplitsIntoWritesOfAtMostTheLimit() {
        let frame = (0..<384).map { UInt8(truncatingIfNeeded: $0) }
        let pieces = SMPFraming.segments(frame, maxWrite: 20)
        #expect(pieces.count == 20)
        #expect(pieces.dropLast().allSatisfy { $0.count == 20 })
        #expect(pieces.last?.count == 4)
        #expect(Array(pieces.joined()) == frame)
        #expect(SMPFraming.writeCount(frameSize: 384, maxWrite: 20) == 20)
        #expect(SMPFraming.writeCount(frameSize: 2475, maxWrite: 244) == 11)
    }

    @Test(arguments: [1, 7, 8, 9, 243, 244, 245, 10_000])
    func segmentsAtAnyLimitJoinBackToTheFrame(limit: Int) {
        let frame = (0..<2475).map { UInt8(truncatingIfNeeded: $0 &* 31) }
        let pieces = SMPFraming.segments(frame, maxWrite: limit)
        #expect(pieces.allSatisfy { $0.count <= limit && !$0.isEmpty })
        #expect(Array(pieces.joined()) == frame)
        #expect(pieces.count == SMPFraming.writeCount(frameSize: frame.count, maxWrite: limit))
    }

    @Test func degenerateLimitsStillMakeProgress() {
        #expect(SMPFraming.segments([1, 2, 3], maxWrite: 0).count == 3)
        #expect(SMPFraming.segments([], maxWrite: 20).isEmpty)
    }
}

@Suite struct SMPReassemblerTests {
    static let echo = try! SMPRequest.echo("hello world").frame(sequence: 1).encoded
    static let params = try! SMPResponse.mcumgrParameters(SMPParameters(bufferSize: 384, bufferCount: 4))
        .frame(replyingTo: SMPRequest.mcumgrParameters.frame(sequence: 2).header).encoded

    @Test func aWholeFrameInOneNotificationComesOut() throws {
        var r = SMPReassembler()
        let frames = try r.append(Self.params)
        #expect(frames.map(\.encoded) == [Self.params])
        #expect(r.pendingBytes == 0)
    }

    @Test(arguments: [1, 2, 3, 7, 8, 9, 20])
    func aFrameSpreadOverNotificationsComesOutOnItsLastByte(size: Int) throws {
        var r = SMPReassembler()
        var out: [SMPFrame] = []
        for piece in SMPFraming.segments(Self.echo, maxWrite: size) {
            #expect(out.isEmpty)
            out += try r.append(piece)
        }
        #expect(out.map(\.encoded) == [Self.echo])
        #expect(r.pendingBytes == 0)
    }

    @Test func framesBackToBackAndAFragmentSpanningTwoFrames() throws {
        var r = SMPReassembler()
        let stream = Self.echo + Self.params + Self.echo
        // The first notification holds all of the first frame and the start of the second's header.
        let cut1 = Self.echo.count + 3
        let cut2 = Self.echo.count + Self.params.count + 10
        var frames = try r.append(stream[..<cut1])
        #expect(frames.map(\.encoded) == [Self.echo])
        #expect(r.pendingBytes == 3)
        frames = try r.append(stream[cut1..<cut2])
        #expect(frames.map(\.encoded) == [Self.params])
        frames = try r.append(stream[cut2...])
        #expect(frames.map(\.encoded) == [Self.echo])
        #expect(r.pendingBytes == 0)
        #expect(try r.append(stream).count == 3)
    }

    @Test func anEmptyPayloadFrameAndAnEmptyNotification() throws {
        var r = SMPReassembler()
        #expect(try r.append([]).isEmpty)
        let frames = try r.append([0x0B, 0, 0, 0, 0, 0, 3, 5])
        #expect(frames.count == 1)
        #expect(frames[0].payload.isEmpty)
    }

    @Test func aBadFirstByteFailsAtOnceAndClearsTheBuffer() throws {
        var r = SMPReassembler()
        _ = try r.append(Self.echo.prefix(5))
        #expect(r.pendingBytes == 5)
        // The next frame's first byte sets reserved bits: refused before its header is complete.
        _ = try r.append(Self.echo.dropFirst(5))
        do {
            _ = try r.append([0xE0])
            Issue.record("accepted a reserved first byte")
        } catch {
            #expect(error.kind == .reservedBits)
        }
        #expect(r.pendingBytes == 0)
        // Afterwards a good frame goes through.
        #expect(try r.append(Self.echo).count == 1)
    }

    @Test func aFrameLongerThanTheBoundIsRefusedFromItsHeader() throws {
        var r = SMPReassembler(maxFrameSize: 384)
        let header = SMPHeader(operation: .write, length: 377, group: .image, sequence: 0, command: 1).encoded
        do {
            _ = try r.append(header)
            Issue.record("accepted a 385-byte frame under a bound of 384")
        } catch {
            #expect(error.kind == .frameTooLarge)
        }
        #expect(r.pendingBytes == 0)
        let fits = try SMPFrame(header: SMPHeader(operation: .write, length: 0, group: .image, sequence: 0, command: 1),
                            payload: Array(repeating: 0, count: 376))
        #expect(try r.append(fits.encoded).count == 1)
    }

    @Test func theBufferNeverHoldsMoreThanOnePartialFrame() throws {
        var r = SMPReassembler(maxFrameSize: 64)
        let frame = try SMPFrame(header: SMPHeader(operation: .writeResponse, length: 0, group: .os, sequence: 0, command: 0),
                             payload: Array(repeating: 0xA0, count: 56))
        var delivered = 0
        for _ in 0..<100 {
            for piece in SMPFraming.segments(frame.encoded, maxWrite: 5) {
                delivered += try r.append(piece).count
                #expect(r.pendingBytes < 64)
            }
        }
        #expect(delivered == 100)
    }

    @Test func theBoundIsClampedToWhatAHeaderCanSay() {
        #expect(SMPReassembler(maxFrameSize: 1).maxFrameSize == 8)
        #expect(SMPReassembler(maxFrameSize: 1 << 20).maxFrameSize == 8 + 65535)
    }

    @Test func resetDropsAPartialFrame() throws {
        var r = SMPReassembler()
        _ = try r.append(Self.echo.prefix(10))
        r.reset()
        #expect(r.pendingBytes == 0)
        #expect(try r.append(Self.params).count == 1)
    }
}
