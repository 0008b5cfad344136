import Crypto
import GATT
import OTA
import OTADevice
import SMP
import Simulator
import Testing

private func hexBytes(_ hex: String) -> [UInt8] {
    hex.split(separator: " ").map { UInt8($0, radix: 16)! }
}

/// The SMP server model's answers as each family of real servers writes them (Zephyr's zcbor,
/// mcumgr's tinycbor, canonical, indefinite in otaflash's order), byte for byte where the
/// reference's source fixes the bytes, and read back by otaflash's decoder in every encoding.
@Suite("SMP server answer encodings")
struct SMPReplyEncodingTests {
    static let image = SMPSlotImage.build(major: 2, minor: 0, revision: 1, body: (0..<5000).map { UInt8(truncatingIfNeeded: $0 &* 7) })

    static func frame(_ request: SMPRequest, sequence: UInt8 = 0, version: SMPVersion = .v2) throws -> SMPFrame {
        var frame = try request.frame(sequence: sequence)
        frame = try SMPFrame(header: SMPHeader(operation: frame.header.operation, version: version, length: frame.header.length,
                                               group: frame.header.group, sequence: sequence, command: frame.header.command),
                             payload: frame.payload)
        return frame
    }

    /// The answer `server` writes to `request`, and the request's header.
    static func answer(_ server: inout SMPServer, _ request: SMPRequest, version: SMPVersion = .v2) throws -> SMPFrame {
        let frame = try frame(request, version: version)
        return server.reply(server.handle(frame).response, to: frame.header)
    }

    @Test func anMcumgrServerAnswersTheParametersReadWithTheIssuesBytes() throws {
        var server = SMPServer(config: SMPServer.Config(encoding: .tinycbor))
        // issue 22: `01 00 00 06 00 00 00 06 | bf 62 72 63 08 ff`, {_ "rc": 8} in a version 0 header.
        #expect(try Self.answer(&server, .mcumgrParameters).encoded == hexBytes("01 00 00 06 00 00 00 06 bf 62 72 63 08 ff"))
    }

    @Test func zephyrWritesIndefiniteMapsInItsHandlersOrderWithoutRc() throws {
        var server = SMPServer(config: SMPServer.Config(bufferSize: 2475, encoding: .zcbor))
        // os_mgmt_mcumgr_params: buf_size, then buf_count.
        #expect(try Self.answer(&server, .mcumgrParameters).payload
            == hexBytes("bf 68 62 75 66 5f 73 69 7a 65 19 09 ab 69 62 75 66 5f 63 6f 75 6e 74 04 ff"))
        let sha = Array(SHA256.hash(data: Self.image))
        let first = SMPImageUpload.first(length: UInt64(Self.image.count), sha: sha, data: Array(Self.image[0..<300]))
        // img_mgmt_upload_good_rsp: only "off".
        #expect(try Self.answer(&server, .imageUpload(first)).payload == hexBytes("bf 63 6f 66 66 19 01 2c ff"))
        let rest = SMPImageUpload(offset: 300, data: Array(Self.image[300...]))
        let last = try Self.answer(&server, .imageUpload(rest)).payload
        // ... and "match" after it on the last chunk.
        #expect(last == hexBytes("bf 63 6f 66 66 19") + [UInt8(Self.image.count >> 8), UInt8(Self.image.count & 0xFF)]
            + hexBytes("65 6d 61 74 63 68 f5 ff"))
        // A refusal in the image group: {"err": {"group": 1, "rc": 9}}, both maps indefinite.
        server = SMPServer(config: SMPServer.Config(encoding: .zcbor), leftover: .pending(Self.image))
        #expect(try Self.answer(&server, .imageUpload(first)).payload
            == hexBytes("bf 63 65 72 72 bf 65 67 72 6f 75 70 01 62 72 63 09 ff ff"))
    }

    @Test func zephyrAndMcumgrListEveryFlagAndSplitStatusInTheirOrder() throws {
        for encoding in [SMPReplyEncoding.zcbor, .tinycbor] {
            var server = SMPServer(config: SMPServer.Config(encoding: encoding))
            let payload = try Self.answer(&server, .imageStateRead).payload
            let running = server.primary
            var expected = hexBytes("bf 66 69 6d 61 67 65 73 9f bf 64 73 6c 6f 74 00 67 76 65 72 73 69 6f 6e 65") + Array("1.0.0".utf8)
            expected += hexBytes("64 68 61 73 68 58 20") + running.hash
            expected += hexBytes("68 62 6f 6f 74 61 62 6c 65 f5 67 70 65 6e 64 69 6e 67 f4 69 63 6f 6e 66 69 72 6d 65 64 f5")
            expected += hexBytes("66 61 63 74 69 76 65 f5 69 70 65 72 6d 61 6e 65 6e 74 f4 ff ff")
            expected += hexBytes("6b") + Array("splitStatus".utf8) + hexBytes("00 ff")
            #expect(payload == expected, "\(encoding)")
        }
    }

    @Test func mcumgrSaysRcZeroOnSuccessHasNoMatchAndAnswersInVersionZero() throws {
        var server = SMPServer(config: SMPServer.Config(encoding: .tinycbor))
        let sha = Array(SHA256.hash(data: Self.image))
        let first = try Self.answer(&server, .imageUpload(.first(length: UInt64(Self.image.count), sha: sha, data: Array(Self.image[0..<200]))))
        #expect(first.header.version == .v1)
        #expect(first.payload == hexBytes("bf 62 72 63 00 63 6f 66 66 18 c8 ff"))
        let last = try Self.answer(&server, .imageUpload(SMPImageUpload(offset: 200, data: Array(Self.image[200...]))))
        #expect(!last.payload.contains(0xF5) && !last.payload.contains(0xF4), "no match: \(last.payload)")
        #expect(try Self.answer(&server, .imageErase(slot: nil)).payload == hexBytes("bf 62 72 63 00 ff"))
        #expect(try Self.answer(&server, .reset(force: false)).payload == hexBytes("bf ff"))
    }

    /// img_mgmt at offset 0 with a `len` over the slot: Zephyr's IMG_MGMT_ERR_INVALID_IMAGE_TOO_LARGE
    /// (30) to an SMP v2 request, translated to MGMT_ERR_EUNKNOWN (1) for a v1 one; mcumgr fails
    /// the erase: 1 as well.
    @Test(arguments: [(SMPReplyEncoding.zcbor, SMPVersion.v2, "bf 63 65 72 72 bf 65 67 72 6f 75 70 01 62 72 63 18 1e ff ff"),
                      (.zcbor, .v1, "bf 62 72 63 01 ff"), (.tinycbor, .v2, "bf 62 72 63 01 ff"),
                      (.definite, .v2, "a1 63 65 72 72 a2 62 72 63 18 1e 65 67 72 6f 75 70 01"), (.definite, .v1, "a1 62 72 63 01")])
    func anImageOverTheSlotIsRefusedAsTheReferenceDoes(encoding: SMPReplyEncoding, version: SMPVersion, expected: String) throws {
        var server = SMPServer(config: SMPServer.Config(slotSize: 256 * 1024, encoding: encoding))
        let first = SMPImageUpload.first(length: 300 * 1024, sha: Array(repeating: 7, count: 32), data: Array(Self.image[0..<200]))
        let answer = try Self.answer(&server, .imageUpload(first), version: version)
        #expect(answer.payload == hexBytes(expected))
        #expect(server.upload == nil && server.secondaryBytes.isEmpty)
    }

    /// Every answer of a whole update, in every encoding, reads back as the canonical answer says.
    @Test(arguments: SMPReplyEncoding.allCases)
    func otaflashReadsEveryAnswerOfAnUpdateAlike(encoding: SMPReplyEncoding) throws {
        var server = SMPServer(config: SMPServer.Config(encoding: encoding))
        var canonical = SMPServer(config: SMPServer.Config(encoding: .definite))
        let sha = Array(SHA256.hash(data: Self.image))
        let requests: [SMPRequest] = [
            .mcumgrParameters, .echo("héllo"), .imageStateRead,
            .imageUpload(.first(length: UInt64(Self.image.count), sha: sha, data: Array(Self.image[0..<1000]))),
            .imageUpload(SMPImageUpload(offset: 3000, data: [1])),
            .imageUpload(SMPImageUpload(offset: 1000, data: Array(Self.image[1000...]))),
            .imageStateWrite(hash: SMPSlotImage(Self.image).hash, confirm: false),
            .imageStateWrite(hash: Array(repeating: 1, count: 32), confirm: false),
            .imageErase(slot: nil), .reset(force: false),
        ]
        for request in requests {
            let got = try SMPResponse(decoding: Self.answer(&server, request))
            var want = try SMPResponse(decoding: Self.answer(&canonical, request))
            if encoding == .tinycbor {
                // mcumgr has no parameters read and no match, and every refusal is a general code.
                switch want {
                case .mcumgrParameters: want = .error(.general(.notSupported))
                case .upload(var status):
                    status.match = nil
                    want = .upload(status)
                case .error(let e) where e.imageError == .hashNotFound: want = .error(.general(.invalidValue))
                case .error(let e) where e.imageError == .noFreeSlot: want = .error(.general(.badState))
                default: break
                }
            }
            if case .imageStates(var states) = want, encoding == .zcbor || encoding == .tinycbor {
                states.splitStatus = 0
                want = .imageStates(states)
            }
            #expect(got == want, "\(encoding): \(request)")
        }
    }

    /// The session (image states, upload, test, reset, what runs after) against the model in
    /// each encoding; and an image over an mcumgr device's slot is said not to fit.
    @Test(arguments: SMPReplyEncoding.allCases)
    func aWholeUpdateRunsInEveryEncoding(encoding: SMPReplyEncoding) async throws {
        let rig = SMPDeviceSessionTests.Rig(SMPServer.Config(encoding: encoding))
        let result = try await rig.flash().get()
        #expect(result.bytes == SMPDeviceSessionTests.image.count)
        #expect(rig.model?.activations.map(\.image) == [SMPDeviceSessionTests.image])
        let states = try await rig.states()
        #expect(states.first { $0.active }?.version == "1.4.2")
    }

    @Test(arguments: [SMPReplyEncoding.tinycbor, .zcbor])
    func anImageOverTheSlotSaysItMayNotFitWithoutResetAndRetry(encoding: SMPReplyEncoding) async throws {
        let big = SMPSlotImage.build(major: 1, minor: 5, revision: 0, body: Array(repeating: 0x5A, count: 300 * 1024))
        let rig = SMPDeviceSessionTests.Rig(SMPServer.Config(slotSize: 256 * 1024, encoding: encoding))
        guard case .failure(let error) = await rig.flash(big) else { Issue.record("expected a refusal"); return }
        if encoding == .tinycbor {
            // {"rc": 1}: no reason given; the size is all otaflash has to go on.
            #expect(error.code == .protocolError, "\(error)")
            #expect(error.message.contains("may not fit its slot") && error.message.contains("\(big.count) bytes"), "\(error)")
            #expect(!error.message.contains("reset it and retry"), "\(error)")
        } else {
            #expect(error.code == .imageTooLarge, "\(error)")
        }
        #expect(rig.server?.secondaryBytes.isEmpty == true)
    }

    /// mcumgr does not report its buffer: a request must fit one write, which at MTU 23 holds no
    /// upload request. The refusal names the MTU, not a buffer the device never reported.
    @Test func anMcumgrDeviceAtMTU23SaysTheWriteIsTooSmall() async throws {
        let rig = SMPDeviceSessionTests.Rig(SMPServer.Config(encoding: .tinycbor), link: LinkModel(mtu: 23))
        guard case .failure(let error) = await rig.flash() else { Issue.record("expected a refusal"); return }
        #expect(error.code == .incompatibleDevice, "\(error)")
        #expect(error.message.contains("does not report its SMP buffer") && error.message.contains("ATT MTU 23"), "\(error)")
        #expect(!"\(error)".contains("NETBUF_SIZE"), "\(error)")
    }

    /// A server that reports no buffer gets each request in one write (smpclient's fallback,
    /// and otaflash's): at MTU 517 that is a 514-byte frame, which such a device holds whatever
    /// its `buf_size` (384 here), or no client could update it.
    @Test(arguments: [SMPServer.Config(encoding: .tinycbor), SMPServer.Config(reportsParameters: false)])
    func aServerWithoutParametersTakesOneWholeWritePerRequest(config: SMPServer.Config) async throws {
        let rig = SMPDeviceSessionTests.Rig(config, link: LinkModel(mtu: 517))
        let result = try await rig.flash().get()
        #expect(result.bytes == SMPDeviceSessionTests.image.count)
        #expect(rig.model?.droppedFrames == 0)
        #expect(rig.model?.activations.map(\.image) == [SMPDeviceSessionTests.image])
    }
}
