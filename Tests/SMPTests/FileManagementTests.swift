import Crypto
import GATT
import OTA
import OTADevice
import OTAWire
@testable import SMP
import Simulator
import Testing

/// fs_mgmt (group 8): the codec against the bytes of Zephyr's doc (smp_group_8.rst) and its
/// servers' encodings, the device model against fs_mgmt.c, and the client over the simulator.
@Suite("SMP file management")
struct FileManagementTests {
    static func header(_ op: SMPOperation, _ command: UInt8, sequence: UInt8 = 0) -> SMPHeader {
        SMPHeader(operation: op, version: .v2, length: 0, group: .fs, sequence: sequence, command: command)
    }

    // MARK: Codec

    /// `{"name": "/lfs/a", "off": 0, "data": h'0102', "len": 2}`, canonical (keys by length).
    @Test func theFirstUploadChunkIsCanonicalCBORWithNameOffDataAndLen() throws {
        let request = SMPRequest.file(.upload(SMPFileUpload(name: "/lfs/a", offset: 0, data: [1, 2], length: 2)))
        let expected = bytes("0a 00 00 1f 00 08 04 00 a4 63 6c 65 6e 02 63 6f 66 66 00 64 64 61 74 61 42 01 02 64 6e 61 6d 65 66 2f 6c 66 73 2f 61")
        #expect(try request.frame(sequence: 4).encoded == expected)
        #expect(try SMPRequest(decoding: SMPFrame(decoding: expected)) == request)
    }

    @Test(arguments: [
        SMPFileRequest.upload(SMPFileUpload(name: "/lfs/cert.pem", offset: 300, data: Array(0..<40))),
        .download(name: "/lfs/cert.pem", offset: 0),
        .download(name: "/lfs/x", offset: 70_000),
        .status(name: "/lfs/x"),
        .hash(name: "/lfs/x", type: .sha256),
        .hash(name: "/lfs/x", type: nil, offset: 4, length: 10),
        .hashTypes,
        .close,
    ])
    func everyRequestRoundTripsThroughItsFrame(request: SMPFileRequest) throws {
        let frame = try SMPRequest.file(request).frame(sequence: 9)
        #expect(frame.header.group == .fs)
        #expect(try SMPRequest(decoding: SMPFrame(decoding: frame.encoded)) == .file(request))
    }

    /// A request in another key order, with indefinite lengths and longer heads than needed, is
    /// the same request (zcbor decodes any order).
    @Test func aRequestInAnyOrderAndEncodingDecodesTheSame() throws {
        // {_ "data": h'(_ 01, 02)', "off": 0x0000 (2-byte head), "len": 2, "name": "/lfs/a"}
        let body = bytes("bf 64 64 61 74 61 5f 41 01 41 02 ff 63 6f 66 66 19 00 00 63 6c 65 6e 02 64 6e 61 6d 65 66 2f 6c 66 73 2f 61 ff")
        let frame = try SMPFrame(header: SMPHeader(operation: .write, version: .v1, length: UInt16(body.count), group: .fs, sequence: 1, command: 0), payload: body)
        #expect(try SMPRequest(decoding: frame) == .file(.upload(SMPFileUpload(name: "/lfs/a", offset: 0, data: [1, 2], length: 2))))
    }

    @Test(arguments: [
        // Zephyr's download answer: {_ "off": 0, "data": h'6869', "len": 2}
        ("bf 63 6f 66 66 00 64 64 61 74 61 42 68 69 63 6c 65 6e 02 ff", UInt8(0), SMPOperation.readResponse,
         SMPFileResponse.chunk(offset: 0, data: Array("hi".utf8), length: 2)),
        // mcumgr's, rc 0 first and definite: {"rc": 0, "data": h'', "off": 2}
        ("a3 62 72 63 00 64 64 61 74 61 40 63 6f 66 66 02", 0, .readResponse, .chunk(offset: 2, data: [], length: nil)),
        ("bf 63 6f 66 66 19 01 00 ff", 0, .writeResponse, .uploaded(offset: 256)),
        ("bf 63 6c 65 6e 1a 00 01 00 00 ff", 1, .readResponse, .status(length: 65536)),
        // crc32 as a number, then sha256 as bytes with an offset.
        ("bf 64 74 79 70 65 65 63 72 63 33 32 63 6c 65 6e 02 66 6f 75 74 70 75 74 1a de ad be ef ff", 2, .readResponse,
         .hash(SMPFileHash(type: .crc32, length: 2, output: .number(0xdeadbeef)))),
        ("a4 64 74 79 70 65 66 73 68 61 32 35 36 63 6f 66 66 01 63 6c 65 6e 01 66 6f 75 74 70 75 74 42 ab cd", 2, .readResponse,
         .hash(SMPFileHash(type: .sha256, offset: 1, length: 1, output: .bytes([0xab, 0xcd])))),
        ("bf 65 74 79 70 65 73 bf 65 63 72 63 33 32 bf 66 66 6f 72 6d 61 74 00 64 73 69 7a 65 04 ff ff ff", 3, .readResponse,
         .hashTypes([.crc32: (0, 4)])),
        ("a0", 4, .writeResponse, .closed),
    ])
    func answersDecodeInAnyServersEncoding(hex: String, command: UInt8, op: SMPOperation, expected: SMPFileResponse) throws {
        let body = bytes(hex)
        let frame = try SMPFrame(header: SMPHeader(operation: op, version: .v2, length: UInt16(body.count), group: .fs, sequence: 0, command: command), payload: body)
        #expect(try SMPResponse(decoding: frame) == .file(expected))
    }

    @Test func groupErrorsOfBothVersionsAreRefusalsNamingTheFileCode() throws {
        // v2 {"err": {"group": 8, "rc": 3}}, and the offset refusal with its len.
        let notFound = try SMPFrame(header: Self.header(.readResponse, 0), body: ["err": ["group": 8, "rc": 3]])
        guard case .error(let e) = try SMPResponse(decoding: notFound) else { Issue.record("not an error"); return }
        #expect(e.fileError == .notFound && e.description.contains("file not found"))
        let mismatch = try SMPFrame(header: Self.header(.writeResponse, 0), body: SMPFileResponse.offsetMismatch(length: 7).body)
        guard case .error(let m) = try SMPResponse(decoding: mismatch) else { Issue.record("not an error"); return }
        #expect(m.fileError == .offsetNotValid)
        // v1 {"rc": 5}: ENOENT, a general code.
        let v1 = try SMPFrame(header: Self.header(.readResponse, 1), body: ["rc": 5])
        #expect(try SMPResponse(decoding: v1) == .error(.general(.noEntry)))
        #expect(FileManagementError.writeFailed.otaCode == .imageTooLarge && FileManagementError.hashNotFound.otaCode == .incompatibleDevice)
    }

    @Test func malformedAnswersAreRefusedNamingTheField() throws {
        let noOff = try SMPFrame(header: Self.header(.readResponse, 0), body: ["data": .bytes([1])])
        #expect(throws: SMPWireError.self) { try SMPResponse(decoding: noOff) }
        let textOutput = try SMPFrame(header: Self.header(.readResponse, 2), body: ["type": "crc32", "len": 1, "output": "x"])
        #expect(throws: SMPWireError.self) { try SMPResponse(decoding: textOutput) }
        let unknown = try SMPFrame(header: Self.header(.read, 9), body: [:])
        #expect(throws: SMPWireError.self) { try SMPRequest(decoding: unknown) }
    }

    /// An upload chunk fills the frame exactly: the frame of the largest chunk is the limit, one
    /// more byte would not fit.
    @Test(arguments: [64, 100, 384, 2475])
    func anUploadChunkFillsItsFrameToTheLimit(limit: Int) throws {
        var chunk = SMPFileUpload(name: "/lfs/cert.pem", offset: 0, data: [], length: 100_000)
        let size = chunk.maxDataSize(frameLimit: limit)
        #expect(size > 0)
        chunk.data = Array(repeating: 0, count: size)
        #expect(try SMPRequest.file(.upload(chunk)).frame(sequence: 0).encoded.count <= limit)
        chunk.data.append(0)
        #expect(try SMPRequest.file(.upload(chunk)).frame(sequence: 0).encoded.count > limit)
    }

    // MARK: Device model

    static func serve(_ fs: inout SMPFileSystem, _ request: SMPFileRequest, bufferSize: Int = 384) -> SMPResponse {
        fs.handle(request, bufferSize: bufferSize)
    }

    @Test func anUploadInChunksStoresTheFileAndADownloadReadsItBack() {
        var fs = SMPFileSystem()
        let data = (0..<1000).map { UInt8(truncatingIfNeeded: $0 * 3) }
        #expect(Self.serve(&fs, .upload(SMPFileUpload(name: "/lfs/a.bin", offset: 0, data: Array(data[0..<400]), length: 1000))) == .file(.uploaded(offset: 400)))
        #expect(Self.serve(&fs, .upload(SMPFileUpload(name: "/lfs/a.bin", offset: 400, data: Array(data[400...])))) == .file(.uploaded(offset: 1000)))
        #expect(fs.files["/lfs/a.bin"] == data)
        // Downloads come in buf_size − 47 byte chunks, len on the first.
        #expect(Self.serve(&fs, .download(name: "/lfs/a.bin", offset: 0)) == .file(.chunk(offset: 0, data: Array(data[0..<337]), length: 1000)))
        #expect(Self.serve(&fs, .download(name: "/lfs/a.bin", offset: 674)) == .file(.chunk(offset: 674, data: Array(data[674..<1000]), length: nil)))
        #expect(Self.serve(&fs, .status(name: "/lfs/a.bin")) == .file(.status(length: 1000)))
    }

    @Test func aChunkAtAnotherOffsetIsRefusedWithTheFilesEndAndTheNextStartsFromThere() {
        var fs = SMPFileSystem()
        _ = Self.serve(&fs, .upload(SMPFileUpload(name: "/lfs/a", offset: 0, data: [1, 2, 3], length: 9)))
        #expect(Self.serve(&fs, .upload(SMPFileUpload(name: "/lfs/a", offset: 6, data: [7, 8, 9]))) == .file(.offsetMismatch(length: 3)))
        // The context is gone: the next chunk reopens the file and goes on from its end.
        #expect(Self.serve(&fs, .upload(SMPFileUpload(name: "/lfs/a", offset: 3, data: [4, 5, 6]))) == .file(.uploaded(offset: 6)))
        #expect(fs.files["/lfs/a"] == [1, 2, 3, 4, 5, 6])
    }

    @Test func aNewUploadReplacesAnExistingFile() {
        var fs = SMPFileSystem(SMPFileSystem.Config(files: ["/lfs/a": Array(repeating: 9, count: 50)]))
        #expect(Self.serve(&fs, .upload(SMPFileUpload(name: "/lfs/a", offset: 0, data: [1], length: 1))) == .file(.uploaded(offset: 1)))
        #expect(fs.files["/lfs/a"] == [1])
    }

    @Test func refusalsAreFsMgmtsCodes() {
        var fs = SMPFileSystem(SMPFileSystem.Config(capacity: 10, hashTypes: [.crc32], files: ["/lfs/empty": []]))
        let long = "/lfs/" + String(repeating: "x", count: 60)
        #expect(Self.serve(&fs, .download(name: "/lfs/none", offset: 0)) == .error(.file(.notFound)))
        #expect(Self.serve(&fs, .status(name: long)) == .error(.general(.invalidValue)))
        #expect(Self.serve(&fs, .upload(SMPFileUpload(name: "/lfs/a", offset: 0, data: [1]))) == .error(.general(.invalidValue)), "no len at offset 0")
        #expect(Self.serve(&fs, .upload(SMPFileUpload(name: "/nvs/a", offset: 0, data: [1], length: 1))) == .error(.file(.mountPointNotFound)))
        #expect(Self.serve(&fs, .upload(SMPFileUpload(name: "/lfs/big", offset: 0, data: Array(repeating: 0, count: 11), length: 11))) == .error(.file(.writeFailed)))
        #expect(Self.serve(&fs, .status(name: "/lfs")) == .error(.file(.isDirectory)))
        #expect(Self.serve(&fs, .hash(name: "/lfs/empty", type: nil)) == .error(.file(.fileEmpty)))
        #expect(Self.serve(&fs, .hash(name: "/lfs/empty", type: .sha256)) == .error(.file(.hashNotFound)))
        #expect(Self.serve(&fs, .hash(name: "/lfs/none", type: .crc32)) == .error(.file(.notFound)))
    }

    @Test func hashesAreSHA256BytesAndIEEECRC32NumbersOverTheRangeAskedFor() {
        let data = Array("123456789".utf8)
        var fs = SMPFileSystem(SMPFileSystem.Config(files: ["/lfs/c": data]))
        // The CRC32 check value of "123456789" is 0xcbf43926.
        #expect(Self.serve(&fs, .hash(name: "/lfs/c", type: nil)) == .file(.hash(SMPFileHash(type: .crc32, length: 9, output: .number(0xcbf43926)))))
        #expect(Self.serve(&fs, .hash(name: "/lfs/c", type: .sha256)) == .file(.hash(SMPFileHash(type: .sha256, length: 9, output: .bytes(Array(SHA256.hash(data: data)))))))
        #expect(Self.serve(&fs, .hash(name: "/lfs/c", type: .crc32, offset: 2, length: 3))
                == .file(.hash(SMPFileHash(type: .crc32, offset: 2, length: 3, output: .number(UInt64(CRC32.checksum(Array("345".utf8))))))))
        #expect(Self.serve(&fs, .hash(name: "/lfs/c", type: .crc32, offset: 9)) == .error(.file(.offsetLargerThanFile)))
    }

    @Test func aResetDropsTheTransferButKeepsTheFiles() {
        var server = SMPServer()
        _ = server.handle(.file(.upload(SMPFileUpload(name: "/lfs/a", offset: 0, data: [1, 2], length: 4))))
        server.boot()
        #expect(server.files.files["/lfs/a"] == [1, 2])
        // Zephyr reopens the file and takes the chunk at its end.
        #expect(server.handle(.file(.upload(SMPFileUpload(name: "/lfs/a", offset: 2, data: [3, 4])))) == .file(.uploaded(offset: 4)))
    }

    @Test(arguments: SMPReplyEncoding.allCases)
    func everyEncodingsAnswersReadBack(encoding: SMPReplyEncoding) throws {
        var config = SMPServer.Config(encoding: encoding)
        config.fileSystem.files = ["/lfs/c": Array("123456789".utf8)]
        var server = SMPServer(config: config)
        for request in [SMPFileRequest.download(name: "/lfs/c", offset: 0), .status(name: "/lfs/c"), .hash(name: "/lfs/c", type: .sha256), .hashTypes, .close] {
            let frame = try SMPRequest.file(request).frame(sequence: 3)
            let expected = server.handle(frame).response
            let answer = try SMPResponse(decoding: SMPFrame(decoding: server.reply(expected, to: frame.header).encoded))
            #expect(answer == expected, "\(encoding) \(request)")
        }
        // A refusal of a v1 request is the general code Zephyr translates it to.
        let v1 = try SMPFrame(header: SMPHeader(operation: .read, version: .v1, length: 0, group: .fs, sequence: 1, command: 0),
                              body: SMPFileRequest.download(name: "/lfs/none", offset: 0).body)
        let refusal = try SMPResponse(decoding: SMPFrame(decoding: server.reply(server.handle(v1).response, to: v1.header).encoded))
        #expect(refusal == .error(.general(.noEntry)))
    }

    // MARK: Client over the simulator

    static func client(_ fs: SMPFileSystem.Config = SMPFileSystem.Config(), bufferSize: Int = 384, mtu: Int = 247,
                       faults: FaultPlan = .none) async throws -> (SMPClient, SimulatedDevice, any GATTConnection) {
        var config = SMPServer.Config(bufferSize: bufferSize, slotSize: 1 << 20)
        config.fileSystem = fs
        let model = SMPPeripheral(config: config, firmwareVersion: FirmwareVersion(major: 1, minor: 0, patch: 0), faults: faults)
        let device = SimulatedDevice(SimulatedDeviceConfig(slotSize: 1 << 20, link: LinkModel(mtu: mtu)), model: model)
        let central = SimulatedCentral(devices: [device])
        let connection = try await central.connect(to: device.config.address, timeout: .seconds(5))
        return (try await SMPClient.attach(to: connection, device: "sim"), device, connection)
    }

    @Test(arguments: [(384, 23), (384, 247), (2475, 247)])
    func putGetAndVerifyRoundTripAFile(bufferSize: Int, mtu: Int) async throws {
        let (client, device, connection) = try await Self.client(bufferSize: bufferSize, mtu: mtu)
        let data = (0..<5000).map { UInt8(truncatingIfNeeded: $0 &* 31) }
        var offsets: [Int] = []
        try await client.putFile(data, to: "/lfs/cert.pem", timeout: .seconds(2)) { offsets.append($0) }
        #expect(offsets.last == data.count)
        #expect(device.model(as: SMPPeripheral.self)?.server.files.files["/lfs/cert.pem"] == data)
        let check = try await client.verifyFile("/lfs/cert.pem", against: data, timeout: .seconds(2))
        #expect(check.method == "sha256" && check.digest == hexString(Array(SHA256.hash(data: data))))
        #expect(try await client.getFile("/lfs/cert.pem", timeout: .seconds(2)) == data)
        await connection.disconnect()
    }

    /// Up to `buf_count` chunks in flight, never more: no frame is dropped for want of a buffer,
    /// the file arrives whole, and sooner than with one in flight (smpclient's way).
    @Test func aWindowedUploadKeepsToTheDevicesBuffersAndIsFasterThanOneInFlight() async throws {
        let data = (0..<8000).map { UInt8(truncatingIfNeeded: $0 &* 5) }
        var seconds: [Int: Double] = [:]
        for window in [1, 4] {
            let (client, device, connection) = try await Self.client(bufferSize: 384, mtu: 247)
            let start = connection.clock.now
            try await client.putFile(data, to: "/lfs/w", timeout: .seconds(2), window: window)
            seconds[window] = (connection.clock.now - start).seconds
            let model = try #require(device.model(as: SMPPeripheral.self))
            #expect(model.server.files.files["/lfs/w"] == data)
            #expect(model.droppedFrames == 0 && model.peakBuffers <= 4)
            await connection.disconnect()
        }
        #expect(try #require(seconds[4]) < #require(seconds[1]) * 0.9, "\(seconds)")
    }

    @Test func aDeviceWithoutSHA256IsCheckedByCRC32AndAChangedFileFailsTheCheck() async throws {
        let (client, _, connection) = try await Self.client(SMPFileSystem.Config(hashTypes: [.crc32], files: ["/lfs/a": [1, 2, 3]]))
        let check = try await client.verifyFile("/lfs/a", against: [1, 2, 3], timeout: .seconds(2))
        #expect(check.method == "crc32" && check.digest == String(format8: CRC32.checksum([1, 2, 3])))
        await #expect(throws: OTAError.self) { try await client.verifyFile("/lfs/a", against: [1, 2, 4], timeout: .seconds(2)) }
        await connection.disconnect()
    }

    @Test func lostAnswersAreAskedAgainAndTheUploadAndDownloadStillArriveWhole() async throws {
        // One answer in four never reaches the central: chunks are sent again, the device refuses
        // the ones it already took (OFFSET_NOT_VALID), and the client goes on from its file's end.
        let faults = FaultPlan(seed: 7, lostNotificationRate: 0.25)
        let (client, device, connection) = try await Self.client(faults: faults)
        let data = (0..<6000).map { UInt8(truncatingIfNeeded: $0 &* 13) }
        try await client.putFile(data, to: "/lfs/b", timeout: .milliseconds(300))
        #expect(device.model(as: SMPPeripheral.self)?.server.files.files["/lfs/b"] == data)
        #expect(try await client.getFile("/lfs/b", timeout: .milliseconds(300)) == data)
        await connection.disconnect()
    }

    @Test func aLinkLostDuringADownloadFailsItAsAConnectionError() async throws {
        var faults = FaultPlan.none
        faults.disconnectAt = [1000]
        let (client, _, _) = try await Self.client(SMPFileSystem.Config(files: ["/lfs/big": Array(repeating: 7, count: 4000)]), faults: faults)
        do {
            _ = try await client.getFile("/lfs/big", timeout: .seconds(2))
            Issue.record("the download went through a lost link")
        } catch {
            #expect(error.code == .connection)
        }
    }
}

extension FileManagementTests {
    /// A device whose first answer of several notifications stops after `after` of them for
    /// `stall` (its Bluetooth buffers taken while flash is erased, say); its notifications
    /// still leave in the order they were queued, as a real device's do.
    struct StallingDevice<Inner: PeripheralModel>: PeripheralModel {
        var inner: Inner
        var stall: Duration
        var after: Int
        var stalled = false
        var last: Duration = .zero
        var writes = 0

        var services: [PeripheralService] { inner.services }
        var advertisedServices: [BluetoothUUID] { inner.advertisedServices }
        var availableAt: Duration { inner.availableAt }
        func refusesConnection(after connections: Int) -> Bool { inner.refusesConnection(after: connections) }
        func read(_ characteristic: BluetoothUUID) -> [UInt8]? { inner.read(characteristic) }
        mutating func wake(_ token: UInt64, at now: Duration) -> [PeripheralTimed] { ordered(inner.wake(token, at: now)) }
        mutating func linkDropped(central: String?) { inner.linkDropped(central: central) }
        mutating func notificationsChanged(_ enabled: Bool, for characteristic: BluetoothUUID) { inner.notificationsChanged(enabled, for: characteristic) }
        mutating func mtuChanged(_ mtu: Int) { inner.mtuChanged(mtu) }

        mutating func write(_ bytes: [UInt8], to characteristic: BluetoothUUID, withResponse: Bool,
                            from central: String?, at now: Duration) -> PeripheralWriteResult {
            writes += 1
            var result = inner.write(bytes, to: characteristic, withResponse: withResponse, from: central, at: now)
            result.outputs = ordered(result.outputs)
            return result
        }

        private mutating func ordered(_ outputs: [PeripheralTimed]) -> [PeripheralTimed] {
            let notifications = outputs.filter { if case .notify = $0.output { true } else { false } }.count
            let stallHere = !stalled && notifications > 1
            var seen = 0
            return outputs.map { timed in
                guard case .notify = timed.output else { return timed }
                var timed = timed
                seen += 1
                if stallHere, seen > after { timed.at += stall }
                timed.at = max(timed.at, last + .microseconds(1))
                last = timed.at
                if stallHere { stalled = true }
                return timed
            }
        }
    }

    /// The rest of an answer that comes after its request timed out completes that answer, which
    /// is dropped as a late one; it is never read as the start of the answer to the request sent
    /// again (a loaded host once took the tail for a header: "header byte 0x15 gives version 2").
    @Test(arguments: [1, 2, 3, 7])
    func theTailOfAnAnswerThatCameLateIsNotReadAsTheNextAnswer(after: Int) async throws {
        let data = (0..<2000).map { UInt8(truncatingIfNeeded: $0 &* 7 &+ 3) }
        var config = SMPServer.Config(bufferSize: 384, slotSize: 1 << 20)
        config.fileSystem = SMPFileSystem.Config(files: ["/lfs/data.bin": data])
        let smp = SMPPeripheral(config: config, firmwareVersion: FirmwareVersion(major: 1, minor: 0, patch: 0))
        let model = StallingDevice(inner: smp, stall: .milliseconds(500), after: after)
        let device = SimulatedDevice(SimulatedDeviceConfig(slotSize: 1 << 20, link: LinkModel(mtu: 23)), model: model)
        let connection = try await SimulatedCentral(devices: [device]).connect(to: device.config.address, timeout: .seconds(5))
        let client = try await SMPClient.attach(to: connection, device: "sim")
        #expect(try await client.getFile("/lfs/data.bin", timeout: .milliseconds(400)) == data)
        let stalled = try #require(device.model(as: StallingDevice<SMPPeripheral>.self))
        // Each of the six chunks' requests is two writes at this MTU; the one sent again, two more.
        #expect(stalled.stalled && stalled.writes == 14, "\(stalled.writes) writes")
        await connection.disconnect()
    }
}
