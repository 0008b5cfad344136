import Testing
@testable import SMP

/// Frames as smp 4.2.0 encodes the same requests (and, for the image commands, as
/// ../shared/notes/protocols-nordic-smp.md §3.2/§3.3 records them from smpclient).
@Suite struct SMPRequestBytesTests {
    static let sha = [UInt8](0..<32)

    @Test(arguments: [
        (SMPRequest.mcumgrParameters, UInt8(0), "08 00 00 01 00 00 00 06 a0"),
        (.imageStateRead, 5, "08 00 00 01 00 01 05 00 a0"),
        (.imageStateWrite(hash: nil, confirm: true), 7, "0a 00 00 0a 00 01 07 00 a1 67 63 6f 6e 66 69 72 6d f5"),
        (.reset(), 8, "0a 00 00 01 00 00 08 05 a0"),
        (.reset(force: true), 8, "0a 00 00 08 00 00 08 05 a1 65 66 6f 72 63 65 01"),
        (.echo("hi"), 3, "0a 00 00 06 00 00 03 00 a1 61 64 62 68 69"),
        (.imageErase(slot: 1), 9, "0a 00 00 07 00 01 09 05 a1 64 73 6c 6f 74 01"),
        (.imageErase(slot: nil), 9, "0a 00 00 01 00 01 09 05 a0"),
    ])
    func requestsEncodeToSmpclientsBytes(request: SMPRequest, sequence: UInt8, hex: String) throws {
        let frame = try request.frame(sequence: sequence)
        #expect(frame.encoded == bytes(hex))
        #expect(try SMPRequest(decoding: SMPFrame(decoding: bytes(hex))) == request)
    }

    @Test func testingAnImageSendsItsHashAndConfirmFalse() throws {
        let expected = bytes("0a 00 00 31 00 01 06 00 a2 64 68 61 73 68 58 20") + Self.sha + bytes("67 63 6f 6e 66 69 72 6d f4")
        let request = SMPRequest.imageStateWrite(hash: Self.sha, confirm: false)
        #expect(try request.frame(sequence: 6).encoded == expected)
        #expect(try SMPRequest(decoding: SMPFrame(decoding: expected)) == request)
    }

    /// §3.2: `0a 00 00 59 00 01 01 01 | a6 63 "len" 19 c5e7 | 63 "off" 00 | 63 "sha" 58 20 <32 B> |
    /// 64 "data" 50 <16 B> | 65 "image" 00 | 67 "upgrade" f4`.
    @Test func theFirstUploadChunkMatchesTheNoteByteForByte() throws {
        var expected = bytes("0a 00 00 59 00 01 01 01 a6 63 6c 65 6e 19 c5 e7 63 6f 66 66 00 63 73 68 61 58 20") + Self.sha
        expected += bytes("64 64 61 74 61 50") + [UInt8](0..<16)
        expected += bytes("65 69 6d 61 67 65 00 67 75 70 67 72 61 64 65 f4")
        let upload = SMPImageUpload.first(length: 50663, sha: Self.sha, data: Array(0..<16))
        #expect(try SMPRequest.imageUpload(upload).frame(sequence: 1).encoded == expected)
        #expect(try SMPRequest(decoding: SMPFrame(decoding: expected)) == .imageUpload(upload))
    }

    /// §3.2: `0a 00 00 16 00 01 02 01 | a2 63 "off" 19 0958 | 64 "data" 48 <8 B>`.
    @Test func aLaterUploadChunkCarriesOnlyOffsetAndData() throws {
        let expected = bytes("0a 00 00 16 00 01 02 01 a2 63 6f 66 66 19 09 58 64 64 61 74 61 48 00 00 00 00 00 00 00 00")
        let upload = SMPImageUpload(offset: 0x958, data: Array(repeating: 0, count: 8))
        #expect(try SMPRequest.imageUpload(upload).frame(sequence: 2).encoded == expected)
        #expect(try SMPRequest(decoding: SMPFrame(decoding: expected)) == .imageUpload(upload))
    }

    @Test func resetAcceptsForceAsABooleanToo() throws {
        let frame = try SMPFrame(header: SMPHeader(operation: .write, length: 0, group: .os, sequence: 0, command: 5), body: ["force": true])
        #expect(try SMPRequest(decoding: frame) == .reset(force: true))
        let zero = try SMPFrame(header: frame.header, body: ["force": 0])
        #expect(try SMPRequest(decoding: zero) == .reset(force: false))
        let two = try SMPFrame(header: frame.header, body: ["force": 2])
        #expect(throws: SMPWireError.self) { try SMPRequest(decoding: two) }
    }
}

@Suite struct SMPRequestDecodingTests {
    static func frame(_ op: SMPOperation, _ command: SMPCommand, _ body: CBOR) -> SMPFrame {
        try! SMPFrame(header: SMPHeader(operation: op, length: 0, group: command.group, sequence: 0, command: command.id), body: body)
    }

    @Test(arguments: [
        (frame(.write, .imageUpload, ["data": .bytes([])]), SMPWireError.Kind.missingField("off")),
        (frame(.write, .imageUpload, ["off": 0]), .missingField("data")),
        (frame(.write, .imageUpload, ["off": -1, "data": .bytes([])]), .badField("off")),
        (frame(.write, .imageUpload, ["off": "0", "data": .bytes([])]), .badField("off")),
        (frame(.write, .imageUpload, ["off": 0, "data": "text"]), .badField("data")),
        (frame(.write, .imageUpload, ["off": 0, "data": .bytes([]), "image": .unsigned(1 << 32)]), .badField("image")),
        (frame(.write, .imageUpload, ["off": 0, "data": .bytes([]), "upgrade": 1]), .badField("upgrade")),
        (frame(.write, .imageUpload, ["off": 0, "data": .bytes([]), "sha": "x"]), .badField("sha")),
        (frame(.write, .imageUpload, [1, 2]), .notAMap),
        (frame(.write, .echo, [:]), .missingField("d")),
        (frame(.write, .echo, ["d": .bytes([1])]), .badField("d")),
        (frame(.write, .imageState, ["confirm": nil]), .badField("confirm")),
        (frame(.write, .imageState, ["hash": 5, "confirm": false]), .badField("hash")),
        (frame(.write, .imageErase, ["slot": -3]), .badField("slot")),
        (frame(.read, .mcumgrParameters, nil), .notAMap),
        (frame(.read, .imageState, 0), .notAMap),
        (frame(.write, .reset, "force"), .notAMap),
        (frame(.read, .imageUpload, [:]), .unsupportedCommand),
        (frame(.write, SMPCommand(group: .shell, id: 0), [:]), .unsupportedCommand),
        (frame(.readResponse, .mcumgrParameters, [:]), .wrongDirection),
        (frame(.writeResponse, .echo, ["r": "x"]), .wrongDirection),
    ])
    func malformedRequestsNameTheirProblem(frame: SMPFrame, kind: SMPWireError.Kind) {
        do {
            let request = try SMPRequest(decoding: frame)
            Issue.record("decoded \(request)")
        } catch {
            #expect(error.kind == kind, "\(error)")
            #expect(!error.description.isEmpty)
            #expect(error.serverAnswer == (kind == .unsupportedCommand ? .notSupported : .invalidValue))
        }
    }

    @Test func unknownFieldsAreIgnoredForLaterServers() throws {
        let frame = Self.frame(.write, .imageErase, ["slot": 1, "future": [1, 2]])
        #expect(try SMPRequest(decoding: frame) == .imageErase(slot: 1))
    }

    @Test func aRequestWithBadCBORSaysItIsCBOR() throws {
        // An indefinite-length map that ends after a key, without its value.
        let frame = try SMPFrame(header: SMPHeader(operation: .write, length: 0, group: .os, sequence: 0, command: 0), payload: [0xBF, 0x61, 0x64, 0xFF])
        do {
            _ = try SMPRequest(decoding: frame)
            Issue.record("decoded")
        } catch {
            guard case .cbor(let cbor) = error.kind else { Issue.record("kind \(error.kind)"); return }
            #expect(cbor.kind == .unexpectedBreak)
        }
    }
}

@Suite struct SMPResponseTests {
    static let slots = SMPImageStates(images: [
        SMPImageSlot(slot: 0, version: "1.2.3", hash: Array(repeating: 0, count: 32), bootable: true, confirmed: true, active: true),
        SMPImageSlot(slot: 1, version: "1.3.0", hash: Array(repeating: 0xAB, count: 32), bootable: true, pending: true),
    ])

    /// What a server answers, encoded as cbor2 `canonical=True` writes the same maps.
    @Test func answersEncodeAsCbor2Canonical() {
        #expect(SMPResponse.mcumgrParameters(SMPParameters(bufferSize: 2475, bufferCount: 4)).body().encoded
            == bytes("a2 68 62 75 66 5f 73 69 7a 65 19 09 ab 69 62 75 66 5f 63 6f 75 6e 74 04"))
        #expect(SMPResponse.upload(SMPUploadStatus(offset: 2392, match: true)).body().encoded
            == bytes("a2 63 6f 66 66 19 09 58 65 6d 61 74 63 68 f5"))
        var states = bytes("a1 66 69 6d 61 67 65 73 82 a6 64 68 61 73 68 58 20") + Array(repeating: 0, count: 32)
        states += bytes("64 73 6c 6f 74 00 66 61 63 74 69 76 65 f5 67 76 65 72 73 69 6f 6e 65 31 2e 32 2e 33")
        states += bytes("68 62 6f 6f 74 61 62 6c 65 f5 69 63 6f 6e 66 69 72 6d 65 64 f5 a5 64 68 61 73 68 58 20")
        states += Array(repeating: 0xAB, count: 32)
        states += bytes("64 73 6c 6f 74 01 67 70 65 6e 64 69 6e 67 f5 67 76 65 72 73 69 6f 6e 65 31 2e 33 2e 30")
        states += bytes("68 62 6f 6f 74 61 62 6c 65 f5")
        #expect(SMPResponse.imageStates(Self.slots).body().encoded == states)
        #expect(SMPResponse.error(.image(.noFreeSlot)).body().encoded == bytes("a1 63 65 72 72 a2 62 72 63 09 65 67 72 6f 75 70 01"))
        #expect(SMPResponse.error(.general(.busy, reason: "busy")).body().encoded == bytes("a2 62 72 63 0a 63 72 73 6e 64 62 75 73 79"))
    }

    @Test(arguments: [
        (SMPRequest.mcumgrParameters, SMPResponse.mcumgrParameters(SMPParameters(bufferSize: 384, bufferCount: 4))),
        (.echo("ping"), .echo("ping")),
        (.reset(), .empty),
        (.imageErase(slot: 1), .empty),
        (.imageStateRead, .imageStates(slots)),
        (.imageStateWrite(hash: nil, confirm: true), .imageStates(slots)),
        (.imageStateRead, .imageStates(SMPImageStates(images: [], splitStatus: 0))),
        (.imageUpload(SMPImageUpload(offset: 0, data: [1])), .upload(SMPUploadStatus(offset: 1))),
        (.imageUpload(SMPImageUpload(offset: 0, data: [1])), .upload(SMPUploadStatus(offset: 50663, match: false))),
        (.imageUpload(SMPImageUpload(offset: 0, data: [1])), .error(.image(.noFreeSlot))),
        (.reset(), .error(.general(.busy, reason: "flash busy"))),
        (.echo("x"), .error(SMPDeviceError(group: .os, rc: 2))),
    ])
    func answersRoundTripThroughTheirFrame(request: SMPRequest, response: SMPResponse) throws {
        let requestHeader = try request.frame(sequence: 77).header
        let frame = try response.frame(replyingTo: requestHeader)
        #expect(frame.header.sequence == 77)
        #expect(frame.header.operation == request.operation.response)
        #expect(frame.header.group == request.command.group)
        #expect(frame.header.command == request.command.id)
        let decoded = try SMPResponse(decoding: SMPFrame(decoding: frame.encoded))
        #expect(decoded == response)
    }

    @Test func aV1ResponseCarriesRcZeroOnSuccess() throws {
        // Zephyr's SMP v1 upload answer: {"rc": 0, "off": 2392}.
        let header = SMPHeader(operation: .writeResponse, version: .v1, length: 0, group: .image, sequence: 1, command: 1)
        let frame = try SMPFrame(header: header, body: ["rc": 0, "off": 2392])
        #expect(try SMPResponse(decoding: frame) == .upload(SMPUploadStatus(offset: 2392)))
    }

    @Test func aV1ErrorIsAGeneralCode() throws {
        let header = SMPHeader(operation: .writeResponse, version: .v1, length: 0, group: .image, sequence: 1, command: 1)
        let frame = try SMPFrame(header: header, body: ["rc": 6])
        guard case .error(let e) = try SMPResponse(decoding: frame) else { Issue.record("not an error"); return }
        #expect(e.general == .badState)
        #expect(e.imageError == nil)
        #expect(e.group == nil)
    }

    @Test func aGroupErrorAnsweringAV1RequestIsWrittenAsRc() throws {
        let v1 = SMPHeader(operation: .write, version: .v1, length: 0, group: .image, sequence: 1, command: 1)
        let frame = try SMPResponse.error(.image(.imageTooLarge)).frame(replyingTo: v1)
        #expect(frame.header.version == .v1)
        #expect(try frame.body() == ["rc": 30])
    }

    @Test func zephyrOrderedSlotsWithExplicitFalseFlagsDecode() throws {
        // Zephyr's field order, older servers writing every flag.
        let body: [UInt8] = bytes("a1 66 69 6d 61 67 65 73 81 a8 64 73 6c 6f 74 00 67 76 65 72 73 69 6f 6e 65 31 2e 30 2e 30")
            + bytes("64 68 61 73 68 41 aa 68 62 6f 6f 74 61 62 6c 65 f5 67 70 65 6e 64 69 6e 67 f4")
            + bytes("69 63 6f 6e 66 69 72 6d 65 64 f5 66 61 63 74 69 76 65 f5 69 70 65 72 6d 61 6e 65 6e 74 f4")
        let frame = try SMPFrame(header: SMPHeader(operation: .readResponse, length: 0, group: .image, sequence: 0, command: 0), payload: body)
        let expected = SMPImageSlot(slot: 0, version: "1.0.0", hash: [0xAA], bootable: true, confirmed: true, active: true)
        #expect(try SMPResponse(decoding: frame) == .imageStates(SMPImageStates(images: [expected])))
    }

    static func response(_ op: SMPOperation, _ command: SMPCommand, _ body: CBOR) -> SMPFrame {
        try! SMPFrame(header: SMPHeader(operation: op, length: 0, group: command.group, sequence: 0, command: command.id), body: body)
    }

    @Test(arguments: [
        (response(.readResponse, .mcumgrParameters, ["buf_size": 384]), SMPWireError.Kind.missingField("buf_count")),
        (response(.readResponse, .mcumgrParameters, ["buf_size": -1, "buf_count": 4]), .badField("buf_size")),
        (response(.readResponse, .mcumgrParameters, ["buf_size": .unsigned(1 << 40), "buf_count": 4]), .badField("buf_size")),
        (response(.readResponse, .imageState, [:]), .missingField("images")),
        (response(.readResponse, .imageState, ["images": 1]), .badField("images")),
        (response(.readResponse, .imageState, ["images": [1]]), .notAMap),
        (response(.readResponse, .imageState, ["images": [["slot": 0]]]), .missingField("version")),
        (response(.readResponse, .imageState, ["images": [["version": "1"]]]), .missingField("slot")),
        (response(.readResponse, .imageState, ["images": [["slot": 0, "version": "1", "active": 1]]]), .badField("active")),
        (response(.readResponse, .imageState, ["images": [], "splitStatus": "x"]), .badField("splitStatus")),
        (response(.writeResponse, .imageUpload, ["match": true]), .missingField("off")),
        (response(.writeResponse, .imageUpload, ["off": 1, "match": 1]), .badField("match")),
        (response(.writeResponse, .echo, [:]), .missingField("r")),
        (response(.writeResponse, .reset, []), .notAMap),
        (response(.writeResponse, .imageUpload, ["err": 9]), .badField("err")),
        (response(.writeResponse, .imageUpload, ["err": ["group": 1]]), .badField("err")),
        (response(.writeResponse, .imageUpload, ["err": ["group": 70000, "rc": 1]]), .badField("err")),
        (response(.writeResponse, .imageUpload, ["rc": "nine"]), .badField("rc")),
        (response(.writeResponse, .imageUpload, ["rc": 3, "rsn": 5]), .badField("rsn")),
        (response(.readResponse, .imageUpload, ["off": 0]), .unsupportedCommand),
        (response(.writeResponse, SMPCommand(group: .shell, id: 0), [:]), .unsupportedCommand),
        (response(.write, .imageUpload, ["off": 0]), .wrongDirection),
        (response(.read, .mcumgrParameters, [:]), .wrongDirection),
    ])
    func malformedAnswersNameTheirProblem(frame: SMPFrame, kind: SMPWireError.Kind) {
        do {
            let response = try SMPResponse(decoding: frame)
            Issue.record("decoded \(response)")
        } catch {
            #expect(error.kind == kind, "\(error)")
        }
    }

    @Test func anErrWithRcZeroIsNoError() throws {
        let frame = Self.response(.writeResponse, .imageUpload, ["off": 10, "err": ["group": 1, "rc": 0]])
        #expect(try SMPResponse(decoding: frame) == .upload(SMPUploadStatus(offset: 10)))
    }

    @Test func anErrorWinsOverTheCommandsFields() throws {
        let frame = Self.response(.writeResponse, .imageUpload, ["off": 10, "err": ["group": 1, "rc": 31]])
        #expect(try SMPResponse(decoding: frame) == .error(.image(.dataOverrun)))
    }
}

@Suite struct SMPUploadSizingTests {
    static let sha = [UInt8](repeating: 0x5A, count: 32)

    /// The note's measurement with the real smpclient (buf_size 2475, 50663-byte image): 2392 data
    /// bytes in the first chunk, 2451 in later ones; with buf_size 384, 301 then 360.
    @Test(arguments: [(2475, 2392, 2451), (384, 301, 360)])
    func chunksMatchSmpclientsSizes(bufSize: Int, first: Int, later: Int) {
        let firstChunk = SMPImageUpload.first(length: 50663, sha: Self.sha, data: [])
        #expect(firstChunk.maxDataSize(frameLimit: bufSize) == first)
        let laterChunk = SMPImageUpload(offset: UInt64(first), data: [])
        #expect(laterChunk.maxDataSize(frameLimit: bufSize) == later)
    }

    @Test(arguments: [
        (UInt64(0), 10), (23, 10), (24, 10), (255, 10), (256, 10), (65_535, 10), (65_536, 10), (4_000_000_000, 10),
        (5_000_000_000, 10), (0, 40), (0, 41), (0, 42), (0, 100), (0, 300), (0, 302), (0, 303), (0, 384), (0, 65_600),
        (70_000, 39), (70_000, 40), (70_000, 65_000), (300, 2475),
    ])
    func aFilledChunkFitsTheFrameLimitExactlyOrByTheHeadsSlack(offset: UInt64, limit: Int) throws {
        let empty = SMPImageUpload(offset: offset, data: [])
        let size = empty.maxDataSize(frameLimit: limit)
        let effective = min(limit, SMPHeader.size + Int(UInt16.max))
        if size == 0 {
            // Not even one data byte fits.
            var one = empty
            one.data = [0]
            #expect(SMPHeader.size + one.body.encoded.count > effective)
            return
        }
        var filled = empty
        filled.data = Array(repeating: 0xEE, count: size)
        #expect(try SMPRequest.imageUpload(filled).frame(sequence: 0).encoded.count <= effective)
        // One more data byte would not fit (counted without building the frame, which could not say its length).
        filled.data.append(0xEE)
        #expect(SMPHeader.size + filled.body.encoded.count > effective)
    }

    @Test func aLimitBelowTheOverheadGivesZero() {
        #expect(SMPImageUpload(offset: 0, data: []).maxDataSize(frameLimit: 0) == 0)
        #expect(SMPImageUpload(offset: 0, data: []).maxDataSize(frameLimit: 20) == 0)
        #expect(SMPImageUpload.first(length: 1, sha: Self.sha, data: []).maxDataSize(frameLimit: 23) == 0)
    }

    @Test func theDataAlreadyInTheChunkDoesNotCount() {
        let a = SMPImageUpload(offset: 5, data: Array(repeating: 1, count: 500)).maxDataSize(frameLimit: 384)
        let b = SMPImageUpload(offset: 5, data: []).maxDataSize(frameLimit: 384)
        #expect(a == b)
    }
}

/// Answers as real servers encode them: mcumgr with tinycbor and Zephyr's zcbor write
/// indefinite-length maps and arrays, fields in source order, `rc: 0` on success in v1.
@Suite struct SMPServerEncodingTests {
    /// Issue 22: an mcumgr server without the MCUmgr parameters command answers `{_ "rc": 8}`.
    @Test func anIndefiniteRcEightIsNotSupported() throws {
        let frame = try SMPFrame(decoding: bytes("01 00 00 06 00 00 00 06 bf 62 72 63 08 ff"))
        #expect(frame.header.operation == .readResponse)
        #expect(frame.header.version == .v1)
        #expect(try frame.body() == ["rc": 8])
        let response = try SMPResponse(decoding: frame)
        guard case .error(let e) = response else { Issue.record("decoded \(response)"); return }
        #expect(e == .general(.notSupported))
        #expect(e.general == .notSupported)
        #expect(e.otaCode == .incompatibleDevice)
        #expect(e.description.hasPrefix("not supported (8)"))
        // Through the reassembler too, in two notifications.
        var reassembler = SMPReassembler()
        #expect(try reassembler.append(bytes("01 00 00 06 00 00 00 06 bf 62")).isEmpty)
        #expect(try reassembler.append(bytes("72 63 08 ff")) == [frame])
    }

    static func frame(_ op: SMPOperation, _ command: SMPCommand, version: SMPVersion = .v2, _ hex: String) throws -> SMPFrame {
        try SMPFrame(header: SMPHeader(operation: op, version: version, length: 0, group: command.group, sequence: 3, command: command.id),
                     payload: bytes(hex))
    }

    @Test func zephyrsImageStateListDecodes() throws {
        // {_ "images": [_ {_ "slot": 0, "version": "1.2.3", "hash": h'aa..', "bootable": true, "pending": false,
        //   "confirmed": true, "active": true, "permanent": false}], "splitStatus": 0}
        let hash = " 58 20" + String(repeating: " aa", count: 32)
        let slot = "bf 64 73 6c 6f 74 00 67 76 65 72 73 69 6f 6e 65 31 2e 32 2e 33 64 68 61 73 68" + hash
            + " 68 62 6f 6f 74 61 62 6c 65 f5 67 70 65 6e 64 69 6e 67 f4 69 63 6f 6e 66 69 72 6d 65 64 f5"
            + " 66 61 63 74 69 76 65 f5 69 70 65 72 6d 61 6e 65 6e 74 f4 ff"
        let body = "bf 66 69 6d 61 67 65 73 9f " + slot + " ff 6b 73 70 6c 69 74 53 74 61 74 75 73 00 ff"
        let response = try SMPResponse(decoding: Self.frame(.readResponse, .imageState, body))
        let expected = SMPImageSlot(slot: 0, version: "1.2.3", hash: Array(repeating: 0xAA, count: 32), bootable: true, confirmed: true, active: true)
        #expect(response == .imageStates(SMPImageStates(images: [expected], splitStatus: 0)))
    }

    @Test(arguments: [
        // v2 group error, indefinite outer and inner maps, rc before group.
        ("bf 63 65 72 72 bf 62 72 63 09 65 67 72 6f 75 70 01 ff ff", SMPResponse.error(.image(.noFreeSlot))),
        // tinycbor's v1 upload answer: {_ "rc": 0, "off": 2392}, and with match.
        ("bf 62 72 63 00 63 6f 66 66 19 09 58 ff", .upload(SMPUploadStatus(offset: 2392))),
        ("bf 63 6f 66 66 1a 00 00 09 58 65 6d 61 74 63 68 f5 62 72 63 00 ff", .upload(SMPUploadStatus(offset: 2392, match: true))),
        // A v1 error with its reason, chunked.
        ("bf 62 72 63 0a 63 72 73 6e 7f 62 62 75 62 73 79 ff ff", .error(.general(.busy, reason: "busy"))),
        // Fields a later server adds are ignored, whatever their type.
        ("bf 63 6f 66 66 00 65 6c 61 74 65 72 f9 3c 00 64 6e 65 78 74 f7 ff", .upload(SMPUploadStatus(offset: 0))),
    ])
    func uploadAnswersDecodeInServerEncodings(hex: String, response: SMPResponse) throws {
        #expect(try SMPResponse(decoding: Self.frame(.writeResponse, .imageUpload, hex)) == response)
    }

    @Test func parametersAndEchoDecodeInServerEncodings() throws {
        let parameters = "bf 69 62 75 66 5f 63 6f 75 6e 74 04 68 62 75 66 5f 73 69 7a 65 19 09 ab 62 72 63 00 ff"
        #expect(try SMPResponse(decoding: Self.frame(.readResponse, .mcumgrParameters, version: .v1, parameters))
            == .mcumgrParameters(SMPParameters(bufferSize: 2475, bufferCount: 4)))
        #expect(try SMPResponse(decoding: Self.frame(.writeResponse, .echo, "bf 61 72 7f 61 68 61 69 ff ff")) == .echo("hi"))
        #expect(try SMPResponse(decoding: Self.frame(.writeResponse, .reset, "bf 62 72 63 00 ff")) == .empty)
    }

    /// A test or confirm answered without the state list (`{}` or `{"rc": 0}`) is a success with
    /// nothing to show (the engine's `marked(nil)`).
    @Test(arguments: ["a0", "bf ff", "a1 62 72 63 00"])
    func aStateWriteAnsweredWithoutTheListIsEmpty(hex: String) throws {
        #expect(try SMPResponse(decoding: Self.frame(.writeResponse, .imageState, hex)) == .empty)
        // A read still needs the list.
        #expect(throws: SMPWireError.self) { try SMPResponse(decoding: Self.frame(.readResponse, .imageState, hex)) }
    }

    @Test func aV1RcCountsWhenTheV2ErrSaysZero() throws {
        let frame = try Self.frame(.writeResponse, .imageUpload, "a2 63 65 72 72 a2 65 67 72 6f 75 70 01 62 72 63 00 62 72 63 06")
        #expect(try SMPResponse(decoding: frame) == .error(.general(.badState)))
    }
}
