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
        // Sector packets: 17 bytes each at MTU 23, then an empty one, then the last with the sector's CRC16.
        let sector0 = first.filter { $0.sector == 0 }
        let last = try #require(sector0.last)
        let crc = CRC16.checksum(Self.bytes[0..<4096])
        #expect(Array(last.payload.suffix(2)) == [UInt8(crc & 0xFF), UInt8(crc >> 8)])
        #expect(sector0.dropLast(3).allSatisfy { $0.payload.count == 17 })
        #expect(sector0[sector0.count - 2].payload.isEmpty)
        #expect(sector0.map(\.sequence).dropLast() == Array(0..<UInt8(sector0.count - 1))[...])
        #expect(sector0.flatMap(\.payload).dropLast(2) == Self.bytes[0..<4096])
        _ = engine.handle(.notification(.data, ESPSectorAck(sector: 0, status: .success).encoded))
        let second = drain(&engine)
        #expect(second.first?.sector == 1 && second.first?.isLast == true)
        #expect(second.contains { $0.sector == 2 })
    }

    @Test func aNACKStopsTheStreamAndTheWantedSectorGoesOutWholeAloneAfterTheDrain() {
        var engine = started()
        _ = drain(&engine)
        // Sector 0 refused at its last packet (NimBLE, after a sequence error).
        _ = engine.handle(.notification(.data, ESPSectorAck(sector: 0, status: .sectorIndexError, expected: 0).encoded))
        #expect(engine.stats.rewinds == 1)
        #expect(engine.nextStreamStep() == .idle)
        // Sector 1's packets in flight: each a NACK naming sector 1, stale.
        for _ in 0..<5 { _ = engine.handle(.notification(.data, ESPSectorAck(sector: 1, status: .sectorIndexError, expected: 0).encoded)) }
        #expect(engine.stats.rewinds == 1)
        #expect(engine.nextStreamStep() == .idle)
        // The wait from before the NACK ends; then a quiet time of its own.
        #expect(engine.handle(.timeout).isEmpty)
        #expect(engine.nextStreamStep() == .idle)
        #expect(engine.handle(.timeout).isEmpty)
        let resent = drain(&engine)
        #expect(resent.allSatisfy { $0.sector == 0 })
        #expect(resent.first?.sequence == 0 && resent.last?.isLast == true)
        #expect(resent.flatMap(\.payload).dropLast(2) == Self.bytes[0..<4096])
        // No end packet without data: no "flush".
        #expect(!resent.contains { $0.isLast && $0.payload.count <= 2 })
        // A stale NACK of sector 0 from before cannot come after its last packet; its ACK resumes the stream.
        _ = engine.handle(.notification(.data, ESPSectorAck(sector: 0, status: .success).encoded))
        #expect(engine.acked == 4096)
        let next = drain(&engine)
        #expect(next.first?.sector == 1 && next.first?.sequence == 0)
    }

    @Test func aFailedResendIsRecoveredAgainAndStatus3PacketNACKsDoNotEndAnAttempt() {
        var engine = started(window: 1)
        _ = engine.handle(.notification(.control, ESPCommandAck(command: 1, status: 0, sectorWindow: 1).encoded))
        _ = drain(&engine)
        _ = engine.handle(.notification(.data, ESPSectorAck(sector: 0, status: .lengthError, expected: 0).encoded))
        _ = engine.handle(.timeout)
        _ = engine.handle(.timeout)
        _ = drain(&engine)
        // ble_ota_raw NACKs each packet out of sequence and keeps the sector: not the end of the attempt.
        _ = engine.handle(.notification(.data, ESPSectorAck(sector: 0, status: .lengthError, expected: 0).encoded))
        #expect(engine.stats.rewinds == 1)
        // Its CRC error at the last packet is.
        _ = engine.handle(.notification(.data, ESPSectorAck(sector: 0, status: .crcError, expected: 0).encoded))
        #expect(engine.stats.rewinds == 2)
    }

    @Test func aNACKThatWantsALaterSectorCountsTheSectorsBeforeItAsTaken() {
        var engine = started()
        _ = drain(&engine)
        #expect(engine.handle(.timeout).isEmpty)  // sector 0's ACK lost: sector 1's last packet goes out
        _ = drain(&engine)
        // Sector 0 ACK lost and sector 1's last packet lost: the device wants sector 1.
        _ = engine.handle(.notification(.data, ESPSectorAck(sector: 2, status: .sectorIndexError, expected: 1).encoded))
        #expect(engine.acked == 4096)
    }

    @Test func aLostACKIsCoveredByTheNextSectorsACK() {
        var engine = started()
        _ = drain(&engine)
        #expect(engine.handle(.timeout).isEmpty)  // sector 0's ACK lost: sector 1's last packet goes out
        #expect(drain(&engine).first?.isLast == true)
        _ = engine.handle(.notification(.data, ESPSectorAck(sector: 1, status: .success).encoded))
        #expect(engine.acked == 8192)
    }

    @Test(arguments: [1, 3, 8, 64])
    func theWindowTheDeviceAnnouncesIsWhatGoesOutUnACKed(window: Int) {
        var engine = ESPOTAEngine(image: FirmwareImage(bytes: [UInt8](repeating: 7, count: 100 * 4096)), config: EngineConfig())
        _ = engine.handle(.connected(ESPOTALink(host: .bluedroid), mtu: 247))
        _ = engine.handle(.notification(.control, ESPCommandAck(command: 1, status: 0, sectorWindow: UInt8(window)).encoded))
        #expect(engine.effectiveWindow == window)
        #expect(engine.notes.count == 1)
        let packets = drain(&engine)
        #expect(packets.filter(\.isLast).count == window)
        #expect(Set(packets.map(\.sector)).count == window)
    }

    @Test func withoutAWindowInStartsACKTheProfilesWindowHolds() {
        var engine = started(window: 2)
        #expect(engine.effectiveWindow == 2)
        var reference = ESPOTAEngine(image: FirmwareImage(bytes: Self.bytes), config: EngineConfig(), window: 1, honoursDeviceWindow: false)
        _ = reference.handle(.connected(ESPOTALink(host: .nimble), mtu: 23))
        _ = reference.handle(.notification(.control, ESPCommandAck(command: 1, status: 0, sectorWindow: 8).encoded))
        #expect(reference.effectiveWindow == 1)
    }

    @Test func theLinkLostBeforeTheLastACKIsSentAndExecutedNotConfirmed() {
        var engine = started()
        for sector in 0..<2 {
            _ = drain(&engine)
            _ = engine.handle(.notification(.data, ESPSectorAck(sector: UInt16(sector), status: .success).encoded))
        }
        _ = drain(&engine)
        guard case .failed(let error) = engine.handle(.disconnected(.linkLost("supervision timeout"))).first else {
            Issue.record("no result")
            return
        }
        #expect(error.code == .notConfirmed && error.message.hasPrefix("sent and executed, not confirmed"))
        // Before the last sector went out: a plain link loss.
        var early = started()
        _ = drain(&early)
        guard case .failed(let lost) = early.handle(.disconnected(.linkLost("gone"))).first else {
            Issue.record("no result")
            return
        }
        #expect(lost.code == .connection && !lost.message.contains("not confirmed"))
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
