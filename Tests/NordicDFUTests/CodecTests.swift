import GATT
import Testing
import OTAWire
@testable import NordicDFU

/// The init packet `nrfutil pkg generate --hw-version 52 --sd-req 0x0100 --application app.bin
/// --application-version 1 --key-file key.pem` wrote for a 20000-byte app.bin.
let nrfutilAppDat: [UInt8] = [
    0x12, 0x8a, 0x01, 0x0a, 0x44, 0x08, 0x01, 0x12, 0x40, 0x08, 0x01, 0x10, 0x34, 0x1a, 0x02, 0x80,
    0x02, 0x20, 0x00, 0x28, 0x00, 0x30, 0x00, 0x38, 0xa0, 0x9c, 0x01, 0x42, 0x24, 0x08, 0x03, 0x12,
    0x20, 0xad, 0x8a, 0x67, 0x49, 0xcd, 0xcb, 0xe5, 0xcf, 0x52, 0xe2, 0x72, 0xe0, 0x92, 0xbd, 0x35,
    0x2f, 0x29, 0x8e, 0x72, 0x96, 0x07, 0xec, 0x6c, 0xcc, 0x42, 0xf2, 0x56, 0x53, 0x1d, 0x8e, 0xf4,
    0xf6, 0x48, 0x00, 0x52, 0x04, 0x08, 0x01, 0x12, 0x00, 0x10, 0x00, 0x1a, 0x40, 0x48, 0xa8, 0x5c,
    0xec, 0x6b, 0x99, 0xe4, 0x2d, 0x84, 0xc5, 0x19, 0xdb, 0x3c, 0xfc, 0xa5, 0xe0, 0x34, 0x2e, 0xb7,
    0x97, 0xd6, 0xc5, 0x4a, 0x7c, 0x00, 0x2b, 0xf1, 0x55, 0x3c, 0x63, 0x54, 0xb6, 0x2c, 0xb0, 0xf7,
    0xc0, 0xeb, 0x53, 0x7f, 0xb5, 0x79, 0x25, 0x08, 0x92, 0x66, 0xf1, 0xcb, 0x52, 0xb9, 0x77, 0x26,
    0x10, 0x52, 0xc3, 0x2a, 0x69, 0x61, 0x3e, 0x0d, 0xaf, 0xcd, 0xc6, 0xcc, 0xb0,
]

@Suite struct ControlPointCodecTests {
    @Test(arguments: [
        (DFURequest.setPRN(0), [0x02, 0x00, 0x00] as [UInt8]),
        (.setPRN(0x0102), [0x02, 0x02, 0x01]),
        (.select(.command), [0x06, 0x01]),
        (.select(.data), [0x06, 0x02]),
        (.create(.command, size: 141), [0x01, 0x01, 0x8d, 0x00, 0x00, 0x00]),
        (.create(.data, size: 4096), [0x01, 0x02, 0x00, 0x10, 0x00, 0x00]),
        (.create(.data, size: 0x0e20), [0x01, 0x02, 0x20, 0x0e, 0x00, 0x00]),
        (.calculateChecksum, [0x03]),
        (.execute, [0x04]),
        (.protocolVersion, [0x00]),
        (.ping(7), [0x09, 0x07]),
        (.abort, [0x0C]),
        (.firmwareVersion(image: 1), [0x0B, 0x01]),
    ])
    func requestsEncodeToTheSDKsBytesAndBack(request: DFURequest, bytes: [UInt8]) throws {
        #expect(request.encoded == bytes)
        #expect(try DFURequest(decoding: bytes) == request)
    }

    @Test func malformedRequestsSayWhatToAnswer() {
        #expect(throws: DFUWireError.self) { try DFURequest(decoding: []) }
        do {
            _ = try DFURequest(decoding: [0x01, 0x02, 0x00])
            Issue.record("a short CREATE decoded")
        } catch {
            #expect(error.opcode == .create)
            #expect(error.result == .invalidParameter)
        }
        do {
            _ = try DFURequest(decoding: [0x42])
            Issue.record("an unknown opcode decoded")
        } catch {
            #expect(error.opcode == DFUOpcode(rawValue: 0x42))
            #expect(error.result == .opcodeNotSupported)
        }
    }

    /// The reads are the length check: every truncation of a request with parameters, and every
    /// request with a byte more, is `invalidParameter` for its opcode.
    @Test(arguments: [
        DFURequest.create(.data, size: 4096), .setPRN(12), .select(.command), .ping(7), .firmwareVersion(image: 1), .execute,
    ])
    func wrongLengthsAreInvalidParameterForTheirOpcode(request: DFURequest) {
        let bytes = request.encoded
        for candidate in (1..<bytes.count).map({ Array(bytes.prefix($0)) }) + [bytes + [0x00]] {
            do {
                _ = try DFURequest(decoding: candidate)
                Issue.record("\(candidate) decoded")
            } catch {
                #expect(error.opcode == request.opcode)
                #expect(error.result == .invalidParameter)
            }
        }
    }

    @Test func shortAnswersSayWhatTheyCarried() {
        let select: [UInt8] = [0x60, 0x06, 0x01, 0x00, 0x02, 0x00, 0x00, 0x10, 0x27, 0x00, 0x00, 0x78, 0x56, 0x34, 0x12]
        for n in 3..<select.count {
            #expect {
                try DFUResponse(decoding: Array(select.prefix(n)))
            } throws: { error in
                "\(error)".contains("carries \(n - 3) bytes after the result, too few")
            }
        }
    }

    @Test func selectResponseCarriesMaxSizeOffsetAndCRC() throws {
        let bytes: [UInt8] = [0x60, 0x06, 0x01, 0x00, 0x02, 0x00, 0x00, 0x10, 0x27, 0x00, 0x00, 0x78, 0x56, 0x34, 0x12]
        let r = try DFUResponse(decoding: bytes)
        #expect(r.request == .select)
        #expect(r.result == .success)
        #expect(r.payload == .select(maxSize: 512, offset: 10000, crc: 0x1234_5678))
        #expect(r.encoded == bytes)
    }

    @Test func checksumResponseAndReceiptShareOneLayout() throws {
        let bytes: [UInt8] = [0x60, 0x03, 0x01, 0x00, 0x10, 0x00, 0x00, 0xef, 0xbe, 0xad, 0xde]
        let r = try DFUResponse(decoding: bytes)
        #expect(r == DFUResponse.checksum(offset: 4096, crc: 0xdead_beef))
        #expect(DFUResponse.checksum(offset: 4096, crc: 0xdead_beef).encoded == bytes)
    }

    @Test func extendedErrorCarriesItsByte() throws {
        let r = try DFUResponse(decoding: [0x60, 0x04, 0x0B, 0x06])
        #expect(r.result == .extendedError)
        #expect(r.payload == .extendedError(.hardwareVersionFailure))
        #expect(r.reason.contains("hardware version mismatch"))
        #expect(r.reason.contains("--hw-version"))
        #expect(DFUResponse.extended(.execute, .softDeviceVersionFailure).encoded == [0x60, 0x04, 0x0B, 0x07])
    }

    @Test func plainRefusalHasNoPayload() throws {
        let r = try DFUResponse(decoding: [0x60, 0x04, 0x08])
        #expect(r.result == .operationNotPermitted)
        #expect(r.payload == .none)
    }

    @Test(arguments: [
        [] as [UInt8], [0x60, 0x06], [0x61, 0x06, 0x01], [0x60, 0x06, 0x01, 0x00],
        [0x60, 0x06, 0x01, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0], [0x60, 0x03, 0x01, 0, 0, 0, 0, 0, 0, 0],
    ])
    func responsesCutShortAreErrors(bytes: [UInt8]) {
        #expect(throws: DFUWireError.self) { try DFUResponse(decoding: bytes) }
    }

    /// Bytes after what a response defines are ignored, as Nordic's Android and iOS libraries
    /// ignore them; before, each of these was dropped and the engine waited for its reply timeout.
    @Test(arguments: [
        ([0x60, 0x06, 0x01, 0x00, 0x10, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x78, 0x56, 0x34, 0x12, 0xAA, 0xBB] as [UInt8],
         DFUResponse(request: .select, result: .success, payload: .select(maxSize: 4096, offset: 512, crc: 0x1234_5678))),
        ([0x60, 0x03, 0x01, 0x00, 0x10, 0x00, 0x00, 0xEF, 0xBE, 0xAD, 0xDE, 0x00],
         DFUResponse.checksum(offset: 4096, crc: 0xDEAD_BEEF)),
        ([0x60, 0x04, 0x0B, 0x05, 0x00, 0x00], DFUResponse.extended(.execute, .firmwareVersionFailure)),
        ([0x60, 0x01, 0x08, 0x00], DFUResponse(request: .create, result: .operationNotPermitted)),
        ([0x60, 0x01, 0x04, 0x01, 0x02, 0x03], DFUResponse(request: .create, result: .insufficientResources)),
    ])
    func bytesBeyondAResponseAreIgnored(bytes: [UInt8], response: DFUResponse) throws {
        #expect(try DFUResponse(decoding: bytes) == response)
    }

    /// No SDK bootloader omits an extended error's byte; one that did still refused the request,
    /// which the central reports instead of waiting for a reply it already has.
    @Test func extendedErrorWithoutItsByteIsStillARefusal() throws {
        let r = try DFUResponse(decoding: [0x60, 0x04, 0x0B])
        #expect(r.result == .extendedError)
        #expect(r.payload == .none)
        #expect(r.reason.contains("without its code byte"))
    }

    @Test func everyKnownCodeHasAnActionableLine() {
        for raw in UInt8(0)...0x0E {
            let e = DFUExtendedError(rawValue: raw).description
            #expect(!e.hasPrefix("unknown extended error"), "ext \(raw)")
            #expect(!e.contains("\n"))
        }
        #expect(DFUExtendedError.firmwareVersionFailure.description.contains("downgrade"))
        #expect(DFUExtendedError.softDeviceVersionFailure.description.contains("--sd-req"))
        #expect(DFUExtendedError.signatureMissing.description.contains("--key-file"))
        #expect(DFUExtendedError(rawValue: 0x99).description == "unknown extended error 0x99")
        for raw: UInt8 in [0, 1, 2, 3, 4, 5, 6, 7, 8, 0x0A, 0x0B] {
            #expect(!DFUResultCode(rawValue: raw).description.hasPrefix("unknown result code"))
        }
    }
}

@Suite struct InitPacketTests {
    @Test func decodesNrfutilsSignedApplicationPacket() throws {
        let p = try DFUInitPacket(decoding: nrfutilAppDat)
        let c = p.command
        #expect(c.firmwareVersion == 1)
        #expect(c.hardwareVersion == 52)
        #expect(c.softDeviceRequirements == [256])
        #expect(c.type == .application)
        #expect(c.softDeviceSize == 0)
        #expect(c.bootloaderSize == 0)
        #expect(c.applicationSize == 20000)
        #expect(c.hashType == .sha256)
        #expect(c.hash?.prefix(4) == [0xad, 0x8a, 0x67, 0x49])
        #expect(c.isDebug == false)
        #expect(c.bootValidation == [.init(type: 1, bytes: [])])
        #expect(p.signature?.type == 0)
        #expect(p.signature?.bytes.count == 64)
        // The signed bytes: the InitCommand, verbatim at offset 9.
        #expect(p.commandBytes == Array(nrfutilAppDat[9..<73]))
        #expect(c.encoded == p.commandBytes)
    }

    @Test func unsignedPacketRoundTrips() throws {
        let c = DFUInitCommand.application(firmware: [1, 2, 3], version: 7, softDeviceRequirements: [0xAF, 0x100])
        let p = DFUInitPacket(command: c)
        let back = try DFUInitPacket(decoding: p.bytes)
        #expect(back.command == c)
        #expect(!back.isSigned)
        #expect(back.bytes.first == 0x0A)  // Packet.command, field 1
    }

    @Test func unpackedSoftDeviceListAlsoDecodes() throws {
        // sd_req as two separate varint fields (proto2's unpacked form).
        var w = ProtobufWriter()
        w.varint(3, 0xAF)
        w.varint(3, 0xB6)
        w.varint(4, 0)
        let c = try DFUInitCommand(decoding: w.bytes[...])
        #expect(c.softDeviceRequirements == [0xAF, 0xB6])
    }

    /// What another protobuf encoder may write: every message's fields in reverse order, unknown
    /// fields of each wire type (varint, 64-bit, length-delimited, 32-bit) at every level, and
    /// `is_debug` as a varint other than 1 (protobuf and nanopb read any non-zero value as true;
    /// before, 2 was refused).
    @Test func fieldsInAnyOrderUnknownFieldsAndAnyTrueDecode() throws {
        func unknowns(_ w: inout ProtobufWriter) {
            w.varint(15, 7)
            w.rawVarint(16 << 3 | 1); w.rawVarint(0); w.rawVarint(0); w.rawVarint(0); w.rawVarint(0)
            w.rawVarint(0); w.rawVarint(0); w.rawVarint(0); w.rawVarint(0)
            w.bytes(17, [1, 2, 3])
            w.rawVarint(18 << 3 | 5); w.rawVarint(0); w.rawVarint(0); w.rawVarint(0); w.rawVarint(0)
        }
        let fw: [UInt8] = [9, 8, 7, 6]
        var hash = ProtobufWriter()
        unknowns(&hash)
        hash.bytes(2, DFUInitCommand.hashField(for: fw))
        hash.varint(1, 3)
        var validation = ProtobufWriter()
        validation.bytes(2, [])
        unknowns(&validation)
        validation.varint(1, 1)
        var initCommand = ProtobufWriter()
        initCommand.bytes(10, validation.bytes)
        initCommand.varint(9, 2)
        unknowns(&initCommand)
        initCommand.bytes(8, hash.bytes)
        initCommand.varint(7, UInt64(fw.count))
        initCommand.varint(6, 0)
        initCommand.varint(5, 0)
        initCommand.varint(4, 0)
        initCommand.varint(3, 0xAF)
        initCommand.varint(2, 52)
        initCommand.varint(1, 4)
        var command = ProtobufWriter()
        command.bytes(2, initCommand.bytes)
        unknowns(&command)
        command.varint(1, 1)
        var signed = ProtobufWriter()
        signed.bytes(3, [UInt8](repeating: 0x5A, count: 64))
        unknowns(&signed)
        signed.varint(2, 0)
        signed.bytes(1, command.bytes)
        var packet = ProtobufWriter()
        unknowns(&packet)
        packet.bytes(2, signed.bytes)

        let p = try DFUInitPacket(decoding: packet.bytes)
        var expected = DFUInitCommand.application(firmware: fw, version: 4, softDeviceRequirements: [0xAF], isDebug: true)
        expected.bootValidation = [.init(type: 1, bytes: [])]
        #expect(p.command == expected)
        #expect(p.commandBytes == initCommand.bytes)
        #expect(p.signature == .init(type: 0, bytes: [UInt8](repeating: 0x5A, count: 64)))
        #expect(p.opCode == 1)
    }

    @Test(arguments: [
        ([] as [UInt8], "holds no command"),
        ([0x12, 0x8a, 0x01, 0x0a], "claims"),                      // signed_command longer than the bytes
        ([0x0a, 0x02, 0x08, 0x00], "no init command"),             // op_code RESET, no init
        ([0x0a, 0x04, 0x08, 0x00, 0x12, 0x00], "not INIT"),          // op_code 0 with an empty init
        ([0x0a, 0x03, 0x08, 0xff, 0xff], "varint"),                  // varint runs past the end
        ([0x0b, 0x00], "wire type"),                                 // group start
        ([0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f], "overflows"),
        ([0x52, 0x00, 0x01, 0x02, 0x03, 0x04, 0xff, 0xfe, 0xff, 0xff, 0xff, 0xff, 0xcc, 0x16], "out of range"),  // legacy .dat
    ])
    func badBytesAreOneLineErrors(bytes: [UInt8], says: String) {
        do {
            _ = try DFUInitPacket(decoding: bytes)
            Issue.record("decoded \(bytes)")
        } catch {
            #expect(error.description.contains(says), "\(error)")
        }
    }

    @Test func randomAndMutatedBytesNeverTrap() {
        var rng = SeededGenerator(seed: 11)
        var decoded = 0
        for i in 0..<20_000 {
            var bytes: [UInt8]
            if i % 2 == 0 {
                bytes = (0..<Int(rng.next() % 64)).map { _ in UInt8(truncatingIfNeeded: rng.next()) }
            } else {
                bytes = nrfutilAppDat
                for _ in 0..<(1 + Int(rng.next() % 4)) {
                    bytes[Int(rng.next() % UInt64(bytes.count))] = UInt8(truncatingIfNeeded: rng.next())
                }
                if rng.next() % 3 == 0 { bytes.removeLast(Int(rng.next() % UInt64(bytes.count))) }
            }
            if (try? DFUInitPacket(decoding: bytes)) != nil { decoded += 1 }
            _ = try? DFURequest(decoding: bytes)
            _ = try? DFUResponse(decoding: bytes)
            _ = try? ButtonlessRequest(decoding: bytes)
        }
        // Some single-byte mutations (inside the hash or signature) still decode.
        #expect(decoded > 0)
    }
}

@Suite struct ButtonlessCodecTests {
    @Test func enterBootloaderAndNameBytes() throws {
        #expect(ButtonlessRequest.enterBootloader.encoded == [0x01])
        #expect(ButtonlessRequest.setAdvertisingName("DfuTarg").encoded == [0x02, 0x07] + Array("DfuTarg".utf8))
        #expect(try ButtonlessRequest(decoding: [0x02, 0x03, 0x41, 0x42, 0x43]) == .setAdvertisingName("ABC"))
        #expect(try ButtonlessResponse(decoding: [0x20, 0x01, 0x01]) == ButtonlessResponse(opcode: 1, result: .success))
        // Longer indications are taken as Nordic's DFU libraries take them: the extra bytes ignored.
        #expect(try ButtonlessResponse(decoding: [0x20, 0x01, 0x01, 0x00, 0x07]) == ButtonlessResponse(opcode: 1, result: .success))
        #expect(throws: DFUWireError.self) { try ButtonlessResponse(decoding: [0x20, 0x01]) }
        #expect(throws: DFUWireError.self) { try ButtonlessResponse(decoding: [0x21, 0x01, 0x01]) }
        #expect(throws: ButtonlessError.self) { try ButtonlessRequest(decoding: [0x02, 0x05, 0x41]) }
        #expect(throws: ButtonlessError.self) { try ButtonlessRequest(decoding: [0x02, 0x00]) }
        #expect(throws: ButtonlessError.self) { try ButtonlessRequest(decoding: [0x03]) }
    }

    @Test(arguments: [
        ("AA:BB:CC:DD:EE:FF", "AA:BB:CC:DD:EE:00"),  // wraps without carry
        ("aa:bb:cc:dd:ee:0f", "AA:BB:CC:DD:EE:10"),
        ("12:34:56:78:9A:BC", "12:34:56:78:9A:BD"),
    ])
    func bootloaderAddressIsLeastSignificantOctetPlusOne(app: String, bootloader: String) {
        #expect(SecureDFUService.bootloaderAddress(for: app) == bootloader)
    }

    @Test func badAddressesHaveNoBootloaderAddress() {
        #expect(SecureDFUService.bootloaderAddress(for: "AA:BB:CC:DD:EE") == nil)
        #expect(SecureDFUService.bootloaderAddress(for: "AA:BB:CC:DD:EE:GG") == nil)
    }
}

@Suite struct ButtonlessAppTests {
    @Test func enterBootloaderNeedsIndicationsThenMovesTheAddress() {
        var app = NordicButtonlessApp(address: "C0:FF:EE:00:11:FF")
        #expect(app.handleWrite([0x01]) == .refuse(NordicButtonlessApp.cccdImproperlyConfigured))
        #expect(!app.enteringBootloader)
        app.setIndications(true)
        #expect(app.handleWrite(ButtonlessRequest.setAdvertisingName("DfuTarg").encoded) == .indicate([0x20, 0x02, 0x01]))
        #expect(app.advertisingName == "DfuTarg")
        #expect(app.handleWrite([0x01]) == .indicate([0x20, 0x01, 0x01]))
        #expect(app.enteringBootloader)
        #expect(app.bootloaderAddress == "C0:FF:EE:00:11:00")
        #expect(app.handleWrite([0x01]) == .indicate([0x20, 0x01, 0x06]))  // busy
    }

    @Test func badRequestsAreIndicatedWithTheirResult() {
        var app = NordicButtonlessApp(address: "C0:FF:EE:00:11:22")
        app.setIndications(true)
        #expect(app.handleWrite([0x07]) == .indicate([0x20, 0x07, 0x02]))
        #expect(app.handleWrite([0x02, 0x09, 0x41]) == .indicate([0x20, 0x02, 0x05]))
        #expect(!app.enteringBootloader)
    }

    @Test func bondedVariantNeedsAnEncryptedLinkAndKeepsItsAddress() {
        var app = NordicButtonlessApp(address: "C0:FF:EE:00:11:22", requiresBond: true)
        app.setIndications(true)
        #expect(app.handleWrite([0x01]) == .refuse(.insufficientAuthentication))
        #expect(app.handleWrite([0x01], encrypted: true) == .indicate([0x20, 0x01, 0x01]))
        #expect(app.bootloaderAddress == "C0:FF:EE:00:11:22")
    }
}
