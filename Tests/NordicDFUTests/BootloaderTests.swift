import Foundation
import OTAWire
import Testing
@testable import NordicDFU

@Suite struct BootloaderModelTests {
    static let fw = firmwareBytes(4096 + 1000)

    /// A bootloader holding a valid init packet for `fw`.
    func ready() -> NordicDFUBootloader {
        var device = NordicDFUBootloader()
        let dat = DFUInitPacket(command: .application(firmware: Self.fw, version: 2, softDeviceRequirements: [0xAF]), signature: placeholderSignature).bytes
        _ = device.handle(.create(.command, size: UInt32(dat.count)))
        _ = device.handlePacket(dat)
        #expect(device.handle(.execute).result == .success)
        return device
    }

    @Test func selectReportsTheSDKsObjectSizes() {
        var device = NordicDFUBootloader()
        #expect(device.handleControl([0x06, 0x01]) == [0x60, 0x06, 0x01, 0x00, 0x01, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0])
        #expect(device.handleControl([0x06, 0x02]) == [0x60, 0x06, 0x01, 0x00, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0])
    }

    @Test func createRulesFollowTheSDK() {
        var fresh = NordicDFUBootloader()
        #expect(fresh.handle(.create(.data, size: 4096)).result == .operationNotPermitted)  // no init packet
        #expect(fresh.handle(.create(.command, size: 257)).result == .insufficientResources)
        #expect(fresh.handle(.create(.command, size: 0)).result == .invalidParameter)
        var device = ready()
        #expect(device.handle(.create(.data, size: 0)).result == .invalidParameter)
        #expect(device.handle(.create(.data, size: 8192)).result == .insufficientResources)
        #expect(device.handle(.create(.data, size: 1000)).result == .invalidParameter)  // not a page, not the last object
        #expect(device.handle(.create(.data, size: 4096)).result == .success)
        #expect(device.handle(.create(DFUObjectType(rawValue: 9), size: 1)).result == .unsupportedType)
    }

    @Test func executeNeedsTheWholeObjectAndAcceptsAnExecutedOneAgain() {
        var device = ready()
        _ = device.handle(.create(.data, size: 4096))
        _ = device.handlePacket(Array(Self.fw[0..<2000]))
        #expect(device.handle(.execute).result == .operationNotPermitted)
        _ = device.handlePacket(Array(Self.fw[2000..<4096]) + [1, 2, 3])  // past the object's end: dropped
        #expect(device.handle(.calculateChecksum).payload == .checksum(offset: 4096, crc: CRC32.checksum(Self.fw[0..<4096])))
        #expect(device.handle(.execute).result == .success)
        #expect(device.handle(.execute).result == .success)  // 0 of 0 bytes: SDK answers success
        // The next object may not run past the image.
        #expect(device.handle(.create(.data, size: 4096)).result == .operationNotPermitted)
        #expect(device.handle(.create(.data, size: 1000)).result == .success)
        _ = device.handlePacket(Array(Self.fw[4096...]))
        #expect(device.handle(.execute).result == .success)
        #expect(device.activations.count == 1)
        #expect(device.resetPending)
    }

    @Test func receiptsComeEveryPRNPacketsAndRestartAtCreate() {
        var device = ready()
        #expect(device.handleControl([0x02, 0x02, 0x00]) == [0x60, 0x02, 0x01])
        _ = device.handle(.create(.data, size: 4096))
        #expect(device.handlePacket(Array(Self.fw[0..<100])) == nil)
        let receipt = device.handlePacket(Array(Self.fw[100..<200]))
        #expect(receipt == DFUResponse.checksum(offset: 200, crc: CRC32.checksum(Self.fw[0..<200])).encoded)
        #expect(device.handlePacket(Array(Self.fw[200..<300])) == nil)
        _ = device.handle(.create(.data, size: 4096))  // counter restarts
        #expect(device.handlePacket(Array(Self.fw[0..<100])) == nil)
        #expect(device.handlePacket(Array(Self.fw[100..<200])) != nil)
    }

    /// The first object executed, `partial` bytes of the second (last) one written.
    func oneObjectAndAPart(_ partial: Int) -> NordicDFUBootloader {
        var device = ready()
        _ = device.handle(.create(.data, size: 4096))
        _ = device.handlePacket(Array(Self.fw[0..<4096]))
        _ = device.handle(.execute)
        _ = device.handle(.create(.data, size: 1000))
        _ = device.handlePacket(Array(Self.fw[4096..<(4096 + partial)]))
        return device
    }

    @Test func resetKeepsExecutedObjectsAndDropsThePartialOne() {
        var device = oneObjectAndAPart(404)
        device.reset()
        #expect(device.handle(.select(.data)).payload == .select(maxSize: 4096, offset: 4096, crc: CRC32.checksum(Self.fw[0..<4096])))
        #expect(device.validInit != nil)
    }

    @Test func inactivityResetsLikeAPowerCycle() {
        var device = ready()
        _ = device.handle(.create(.data, size: 4096))
        _ = device.handlePacket(Array(Self.fw[0..<300]))
        device.inactivityExpired()
        #expect(device.handle(.select(.data)).payload == .select(maxSize: 4096, offset: 0, crc: 0))
        #expect(device.validInit != nil)
        #expect(device.config.inactivityTimeout == .seconds(120))
    }

    @Test func snapshotRestoresWhatAResetKeeps() throws {
        var device = oneObjectAndAPart(104)
        let json = try JSONEncoder().encode(device.snapshot)
        let snapshot = try JSONDecoder().decode(NordicDFUBootloader.Snapshot.self, from: json)
        var restored = try #require(NordicDFUBootloader(snapshot: snapshot, bank: Array(device.bank.prefix(device.executedOffset))))
        device.reset()
        #expect(restored.handle(.select(.data)) == device.handle(.select(.data)))
        #expect(restored.handle(.select(.command)) == device.handle(.select(.command)))
        #expect(restored.validInit == device.validInit)
        #expect(NordicDFUBootloader(snapshot: snapshot, bank: [1, 2, 3]) == nil)
    }

    @Test func malformedAndUnknownRequestsGetTheirResult() {
        var device = NordicDFUBootloader()
        #expect(device.handleControl([0x01, 0x02]) == [0x60, 0x01, 0x03])
        #expect(device.handleControl([0x42]) == [0x60, 0x42, 0x02])
        #expect(device.handleControl([0x07]) == [0x60, 0x07, 0x02])
        #expect(device.handleControl([0x09, 0x05]) == [0x60, 0x09, 0x01, 0x05])
    }

    /// The key as nrfutil writes it (76-character lines) and as openssl does (64) reads the same;
    /// anything else is no key.
    @Test func aPublicKeyIsReadFromPEMWhateverItsLineLength() throws {
        let nrfutil = try String(contentsOfFile: nordicSample("test-key-public.pem"), encoding: .utf8)
        let body = nrfutil.split(separator: "\n").filter { !$0.hasPrefix("-----") }.joined()
        let rewrapped = (["-----BEGIN PUBLIC KEY-----"] + stride(from: 0, to: body.count, by: 64).map {
            String(body.dropFirst($0).prefix(64))
        } + ["-----END PUBLIC KEY-----", ""]).joined(separator: "\n")
        let check = try #require(NordicDFUBootloader.SignatureCheck.verify(pem: nrfutil))
        #expect(NordicDFUBootloader.SignatureCheck.verify(pem: rewrapped) == check)
        guard case .verify(let key) = check else { Issue.record("not a verifying check"); return }
        #expect(key.count == 64)
        for bad in ["", "hello", "-----BEGIN PUBLIC KEY-----\nnot base64\n-----END PUBLIC KEY-----",
                    "-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----", String(nrfutil.dropLast(40))] {
            #expect(NordicDFUBootloader.SignatureCheck.verify(pem: bad) == nil, "\(bad)")
        }
    }

    @Test func garbageInitPacketIsAWrongCommandFormat() {
        var device = NordicDFUBootloader()
        _ = device.handle(.create(.command, size: 3))
        _ = device.handlePacket([0xff, 0xff, 0xff])
        #expect(device.handleControl([0x04]) == [0x60, 0x04, 0x0B, 0x02])
    }
}
