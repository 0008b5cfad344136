import GATT
import OTA
import OTAWire
import Testing
@testable import ESPOTA

/// The engine alone: events in, actions out, no transport and no clock.
@Suite struct EngineTests {
    static let bytes = (0..<10_000).map { UInt8(truncatingIfNeeded: $0 &* 13) }

    func started(mtu: Int = 23, window: Int = 2) -> ESPOTAEngine {
        var engine = ESPOTAEngine(image: FirmwareImage(bytes: Self.bytes), config: EngineConfig(), window: window)
        _ = engine.handle(.connected(ESPOTALink(host: .nimble), mtu: mtu))
        _ = engine.handle(.notification(.control, ESPCommandAck(command: 1, status: 0).encoded))
        return engine
    }

    /// Streams until the engine idles; returns the packets.
    func drain(_ engine: inout ESPOTAEngine) -> [ESPSectorPacket] {
        var out: [ESPSectorPacket] = []
        while true {
            switch engine.nextStreamStep() {
            case .data(let offset, let count):
                out.append(try! ESPSectorPacket(decoding: engine.dataPacket(offset: offset, count: count)))
            case .write(let write) where write.role == .data && !write.withResponse:
                // A sector's last packet: a write step, so that the reply timeout starts there.
                out.append(try! ESPSectorPacket(decoding: write.bytes))
            default:
                return out
            }
        }
    }

    /// bluetoothd 5.66 drops a write command longer than 510 bytes without a word: at the largest
    /// MTU, every packet (header and CRC included) stays within it, and each sector still arrives.
    @Test(arguments: [23, 247, 512, 517]) func everyPacketFitsOneWriteBlueZSends(mtu: Int) {
        var engine = started(mtu: mtu)
        var lengths: [Int] = []
        while true {
            switch engine.nextStreamStep() {
            case .data(let offset, let count): lengths.append(engine.dataPacket(offset: offset, count: count).count)
            case .write(let write) where write.role == .data: lengths.append(write.bytes.count)
            default:
                #expect(!lengths.isEmpty && lengths.allSatisfy { $0 <= min(mtu - 3, ATTWriteLimit.maximumValue) }, "\(lengths.max() ?? 0) bytes at MTU \(mtu)")
                return
            }
        }
    }

    @Test func startCarriesTheLengthAndIsTheOnlyCommand() {
        var engine = ESPOTAEngine(image: FirmwareImage(bytes: Self.bytes), config: EngineConfig())
        let actions = engine.handle(.connected(ESPOTALink(host: .nimble), mtu: 23))
        #expect(actions == [.write(TransferWrite(ESPCommand.start(length: 10_000).encoded, to: .control, withResponse: true))])
        #expect(engine.phase == .beginning)
    }

    @Test func theNextSectorGoesOutBeforeTheACKButItsLastPacketWaits() throws {
        var engine = started()
        let first = drain(&engine)
        // All of sector 0, then sector 1 up to its last packet.
        #expect(first.filter { $0.sector == 0 }.last?.isLast == true)
        #expect(first.contains { $0.sector == 1 })
        #expect(!first.contains { $0.sector == 1 && $0.isLast })
        #expect(!first.contains { $0.sector == 2 })
        // Sector packets: 17 bytes each at MTU 23, the last with the sector's CRC16.
        let last = try #require(first.last { $0.sector == 0 })
        let crc = CRC16.checksum(Self.bytes[0..<4096])
        #expect(Array(last.payload.suffix(2)) == [UInt8(crc & 0xFF), UInt8(crc >> 8)])
        #expect(first.filter { $0.sector == 0 }.dropLast(2).allSatisfy { $0.payload.count == 17 })
        #expect(first.filter { $0.sector == 0 }.map(\.sequence).dropLast() == Array(0..<UInt8(first.filter { $0.sector == 0 }.count - 1))[...])
        _ = engine.handle(.notification(.data, ESPSectorAck(sector: 0, status: .success).encoded))
        let second = drain(&engine)
        #expect(second.first?.sector == 1 && second.first?.isLast == true)
        #expect(second.contains { $0.sector == 2 })
    }

    @Test func aNACKRewindsToTheSectorTheDeviceWantsOnceForThePacketsInFlight() {
        var engine = started()
        _ = drain(&engine)
        _ = engine.handle(.notification(.data, ESPSectorAck(sector: 0, status: .crcError, expected: 0).encoded))
        #expect(engine.stats.rewinds == 1)
        // Wrong-sector NACKs of sector 1's packets in flight ask for sector 0 again: no new rewind.
        _ = engine.handle(.notification(.data, ESPSectorAck(sector: 1, status: .sectorIndexError, expected: 0).encoded))
        #expect(engine.stats.rewinds == 1)
        // First a last packet whose CRC cannot match what the device collected, so it empties its buffer.
        guard case .write(let flush) = engine.nextStreamStep() else {
            Issue.record("no flush packet")
            return
        }
        #expect(!flush.withResponse && flush.bytes.count == 5 && flush.bytes[2] == 0xFF)
        // Its CRC error is expected: no new rewind.
        _ = engine.handle(.notification(.data, ESPSectorAck(sector: 0, status: .crcError, expected: 0).encoded))
        #expect(engine.stats.rewinds == 1)
        #expect(drain(&engine).first?.sector == 0)
    }

    @Test func aLostACKIsCoveredByTheNextSectorsACK() {
        var engine = started()
        _ = drain(&engine)
        #expect(engine.handle(.timeout).isEmpty)  // sector 0's ACK lost: sector 1's last packet goes out
        #expect(drain(&engine).first?.isLast == true)
        _ = engine.handle(.notification(.data, ESPSectorAck(sector: 1, status: .success).encoded))
        #expect(engine.acked == 8192)
    }

    @Test func successIsTheLinkDroppingAfterTheLastACK() {
        var engine = started()
        for sector in 0..<3 {
            _ = drain(&engine)
            _ = engine.handle(.notification(.data, ESPSectorAck(sector: UInt16(sector), status: .success).encoded))
        }
        #expect(engine.phase == .verifying)
        #expect(engine.handle(.disconnected(.linkLost("supervision timeout"))) == [.finished])
    }

    @Test func noRestartAfterTheLastACKIsARefusal() {
        var engine = started()
        for sector in 0..<3 {
            _ = drain(&engine)
            _ = engine.handle(.notification(.data, ESPSectorAck(sector: UInt16(sector), status: .success).encoded))
        }
        // The first timeout is the last packet's reply timeout: the restart gets verifyTimeout from there.
        #expect(engine.handle(.timeout).isEmpty)
        #expect(engine.currentTimeout == EngineConfig().verifyTimeout)
        guard case .failed(let error) = engine.handle(.timeout).first else {
            Issue.record("no failure")
            return
        }
        #expect(error.code == .verifyFailed)
    }

    @Test func aSecondConnectionNeverStartsAgain() {
        var engine = started()
        _ = drain(&engine)
        let lost = engine.handle(.disconnected(.linkLost("gone")))
        guard case .failed(let error) = lost.first else {
            Issue.record("no failure")
            return
        }
        #expect(!error.resumable)
        let again = engine.handle(.connected(ESPOTALink(host: .nimble), mtu: 23))
        #expect(!again.contains { if case .write = $0 { true } else { false } })
    }

    @Test func aRejectedStartEndsTheRun() {
        var engine = ESPOTAEngine(image: FirmwareImage(bytes: Self.bytes), config: EngineConfig())
        _ = engine.handle(.connected(ESPOTALink(host: .bluedroid), mtu: 23))
        guard case .failed(let error) = engine.handle(.notification(.control, ESPCommandAck(command: 1, status: 1).encoded)).first else {
            Issue.record("no failure")
            return
        }
        #expect(error.code == .protocolError)
        #expect(error.hint?.contains("reset") == true)
    }
}
