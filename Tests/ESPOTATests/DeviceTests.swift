import GATT
import OTA
import OTADevice
import Simulator
import Testing
@testable import ESPOTA

/// The device model alone, written to as a central would.
@Suite struct DeviceTests {
    static let image = ESPAppImage.build(body: Array(repeating: 0x5A, count: 5000))

    func packets(_ image: [UInt8], data: Int = 200) -> [[UInt8]] {
        var out: [[UInt8]] = []
        for sector in 0..<((image.count + 4095) / 4096) {
            let bytes = Array(image[(sector * 4096)..<min(image.count, sector * 4096 + 4096)])
            var position = 0
            var seq: UInt8 = 0
            while position < bytes.count {
                let count = min(data, bytes.count - position)
                let last = position + count == bytes.count
                var packet = ESPSectorPacket(sector: UInt16(sector), sequence: last ? 0xFF : seq, payload: Array(bytes[position..<(position + count)]))
                if last { packet.payload.appendLE(CRC16.checksum(bytes)) }
                out.append(packet.encoded)
                position += count
                seq += 1
            }
        }
        return out
    }

    func send(_ model: inout ESPOTAPeripheral, _ bytes: [UInt8], to uuid: BluetoothUUID, at now: Duration = .zero) -> [PeripheralTimed] {
        model.write(bytes, to: uuid, withResponse: uuid == ESPOTAService.commandUUID, from: nil, at: now).outputs
    }

    @Test func nimbleFlagsAndAdvertising() {
        let model = ESPOTAPeripheral(config: .init(host: .nimble))
        let ota = model.services.first { $0.uuid == ESPOTAService.serviceUUID }
        #expect(ota?.characteristics.first { $0.uuid == ESPOTAService.receiveFirmwareUUID }?.properties == [.write, .indicate])
        #expect(model.advertisedServices == [BluetoothUUID(uint16: 0x1811)])
        #expect(model.services.count == 1)
        let bluedroid = ESPOTAPeripheral(config: .init(host: .bluedroid))
        #expect(bluedroid.advertisedServices == [ESPOTAService.serviceUUID])
        #expect(bluedroid.services.count == 2)
    }

    @Test func aWrongSectorPacketGetsANACKNamingTheSectorWanted() throws {
        var model = ESPOTAPeripheral()
        _ = send(&model, ESPCommand.start(length: UInt32(Self.image.count)).encoded, to: ESPOTAService.commandUUID)
        let out = send(&model, ESPSectorPacket(sector: 3, sequence: 0, payload: [1, 2, 3]).encoded, to: ESPOTAService.receiveFirmwareUUID)
        guard case .notify(_, let value)? = out.first?.output else {
            Issue.record("no NACK")
            return
        }
        #expect(try ESPSectorAck(decoding: value) == ESPSectorAck(sector: 3, status: .sectorIndexError, expected: 0))
    }

    @Test func aSecondStartOnOneBootWedgesTheNimbleDeviceAndBluedroidRefusesIt() throws {
        var nimble = ESPOTAPeripheral(config: .init(host: .nimble))
        for _ in 0..<2 { _ = send(&nimble, ESPCommand.start(length: UInt32(Self.image.count)).encoded, to: ESPOTAService.commandUUID) }
        for p in packets(Self.image) { _ = send(&nimble, p, to: ESPOTAService.receiveFirmwareUUID) }
        #expect(nimble.secondStarts == 1)
        #expect(nimble.activations.isEmpty)
        #expect(nimble.refusals.first?.contains("second START") == true)

        var bluedroid = ESPOTAPeripheral(config: .init(host: .bluedroid))
        _ = send(&bluedroid, ESPCommand.start(length: 100).encoded, to: ESPOTAService.commandUUID)
        let second = send(&bluedroid, ESPCommand.start(length: 100).encoded, to: ESPOTAService.commandUUID)
        guard case .notify(_, let value)? = second.first?.output else {
            Issue.record("no answer")
            return
        }
        #expect(try ESPCommandAck(decoding: value).accepted == false)
    }

    @Test func theApplicationRestartsIntoAGoodImageAfterTheLastSector() {
        var model = ESPOTAPeripheral()
        _ = send(&model, ESPCommand.start(length: UInt32(Self.image.count)).encoded, to: ESPOTAService.commandUUID)
        var outputs: [PeripheralTimed] = []
        for p in packets(Self.image) { outputs += send(&model, p, to: ESPOTAService.receiveFirmwareUUID) }
        #expect(model.activations == [Self.image])
        #expect(outputs.contains { if case .reboot(_, _, false) = $0.output { true } else { false } })
    }

    @Test func theRingBufferHoldsTheACKsBackWhenTheFlashFallsBehind() throws {
        var model = ESPOTAPeripheral(config: .init(hostBufferPackets: 1000, flashTimePerSector: .seconds(1)))
        let image = ESPAppImage.build(body: Array(repeating: 1, count: 20_000))
        _ = send(&model, ESPCommand.start(length: UInt32(image.count)).encoded, to: ESPOTAService.commandUUID)
        var ackTimes: [Duration] = []
        for p in packets(image) {
            for out in send(&model, p, to: ESPOTAService.receiveFirmwareUUID) {
                if case .notify(ESPOTAService.receiveFirmwareUUID, _) = out.output { ackTimes.append(out.at) }
            }
        }
        // Two sectors fit the ring buffer; the third waits for the first to be flashed.
        #expect(ackTimes.count == 5)
        #expect(ackTimes[0] == .zero && ackTimes[1] == .zero)
        #expect(ackTimes[2] == .seconds(1) && ackTimes[3] == .seconds(2))
    }

    // MARK: The components' error paths, packet by packet

    func started(_ component: ESPOTAComponent, length: Int = 4096 * 3) -> ESPOTAPeripheral {
        var model = ESPOTAPeripheral(config: .init(component: component))
        _ = send(&model, ESPCommand.start(length: UInt32(length)).encoded, to: ESPOTAService.commandUUID)
        return model
    }

    static let sector = (0..<4096).map { UInt8(truncatingIfNeeded: $0 &* 11 &+ 3) }

    func packet(_ sector: UInt16, _ seq: UInt8, _ range: Range<Int>, crc: Bool = false) -> [UInt8] {
        var payload = Array(Self.sector[range])
        if crc { payload.appendLE(CRC16.checksum(Self.sector)) }
        return ESPSectorPacket(sector: sector, sequence: seq, payload: payload).encoded
    }

    /// Sector 0 of `Self.sector` in 200-byte packets (the last one 96 bytes and the CRC).
    func wholeSector(_ sector: UInt16 = 0) -> [[UInt8]] {
        (0..<20).map { packet(sector, UInt8($0), ($0 * 200)..<($0 * 200 + 200)) } + [packet(sector, 0xFF, 4000..<4096, crc: true)]
    }

    func answers(_ outputs: [PeripheralTimed]) -> [ESPSectorAck] {
        outputs.compactMap {
            if case .notify(ESPOTAService.receiveFirmwareUUID, let value) = $0.output { try? ESPSectorAck(decoding: value) } else { nil }
        }
    }

    /// Writes `packets` once START's erase (`ble_ota_raw`) is over.
    func feed(_ model: inout ESPOTAPeripheral, _ packets: [[UInt8]]) -> [ESPSectorAck] {
        packets.flatMap { answers(send(&model, $0, to: ESPOTAService.receiveFirmwareUUID, at: .seconds(10))) }
    }

    @Test func nimbleAPacketIndexErrorResetsTheSectorSilentlyAndItsLastPacketIsNACKed() {
        var model = started(.nimble)
        var packets = wholeSector()
        packets.remove(at: 7)  // lost on the way
        // Packet 8 meets cur_packet 7: reset, silent; every later one (seq != 0) the same; the last: NACK 2, sector 0 wanted.
        #expect(feed(&model, packets) == [ESPSectorAck(sector: 0, status: .sectorIndexError, expected: 0)])
        #expect(model.partition.isEmpty)
        // Sent again whole from packet 0: taken, byte for byte, without the CRC.
        #expect(feed(&model, wholeSector()) == [ESPSectorAck(sector: 0, status: .success)])
        #expect(model.partition == Self.sector)
    }

    @Test func nimbleAPacketOfAnotherSectorIsNACKedEachTimeResetsTheBufferAndIsNotKept() {
        var model = started(.nimble)
        _ = feed(&model, Array(wholeSector().prefix(5)))
        let nacks = feed(&model, [packet(1, 0, 0..<200), packet(1, 1, 200..<400)])
        #expect(nacks == [ESPSectorAck(sector: 1, status: .sectorIndexError, expected: 0), ESPSectorAck(sector: 1, status: .sectorIndexError, expected: 0)])
        // Its bytes are not kept and the buffer is empty: sector 0 again from packet 0 comes out exact.
        #expect(feed(&model, wholeSector()) == [ESPSectorAck(sector: 0, status: .success)])
        #expect(model.partition == Self.sector)
    }

    @Test func nimbleAWrongSectorPacketClearsTheSequenceErrorSoAnEmptyLastPacketHandsAShortSector() {
        var model = started(.nimble)
        _ = feed(&model, [packet(0, 0, 0..<200), packet(0, 2, 400..<600)])  // a sequence error
        _ = feed(&model, [packet(1, 0, 0..<200)])  // clears it
        // An end packet with nothing but a CRC (otaflash's old "flush"): taken as a whole sector of 0 bytes.
        let ack = feed(&model, [ESPSectorPacket(sector: 0, sequence: 0xFF, payload: [0x12, 0x34]).encoded])
        #expect(ack == [ESPSectorAck(sector: 0, status: .success)])
        #expect(model.shortSectors == 1)
        #expect(model.partition.isEmpty)
        // And sector 0 sent again now meets "sector index error": the device is at sector 1.
        #expect(feed(&model, [packet(0, 0, 0..<200)]) == [ESPSectorAck(sector: 0, status: .sectorIndexError, expected: 1)])
    }

    @Test func nimblePacketZeroAfterASequenceErrorRestartsTheSectorCleanly() {
        var model = started(.nimble)
        _ = feed(&model, [packet(0, 0, 0..<200), packet(0, 3, 600..<800), packet(0, 4, 800..<1000)])
        #expect(feed(&model, wholeSector()) == [ESPSectorAck(sector: 0, status: .success)])
        #expect(model.partition == Self.sector)
    }

    @Test func nimbleTakesALastPacketWhateverCameBeforeItAndChecksNoCRC() {
        var model = started(.nimble)
        var packets = wholeSector()
        packets.remove(at: 19)  // the packet just before the last: nothing follows to see the gap
        packets[packets.count - 1][packets[packets.count - 1].count - 1] ^= 0xFF  // and a wrong CRC
        #expect(feed(&model, packets) == [ESPSectorAck(sector: 0, status: .success)])
        #expect(model.partition.count == 3896)
        #expect(model.shortSectors == 1)
    }

    @Test func nimbleRefusesALastPacketWithoutItsCRCAndAWriteShorterThanAHeader() {
        var model = started(.nimble)
        _ = feed(&model, Array(wholeSector().prefix(3)))
        #expect(feed(&model, [ESPSectorPacket(sector: 0, sequence: 0xFF, payload: [1]).encoded, [0, 0]]).isEmpty)
        // The buffer was reset; packet 3 still goes on from the count (cur_packet was not reset).
        #expect(model.received == 0)
        let result = model.write([0, 0], to: ESPOTAService.receiveFirmwareUUID, withResponse: true, from: nil, at: .zero)
        #expect(result.reply == .failure(.unlikelyError, "RECV_FW"))
    }

    @Test func bleOTARawAnnouncesItsWindowAfterEraseAndChecksItsCommands() throws {
        var model = ESPOTAPeripheral(config: .init(component: .raw, partitionSize: 1 << 20))
        let start = send(&model, ESPCommand.start(length: 200_000).encoded, to: ESPOTAService.commandUUID)
        guard case .notify(_, let value)? = start.first?.output else {
            Issue.record("no answer")
            return
        }
        let ack = try ESPCommandAck(decoding: value)
        #expect(ack.accepted && ack.sectorWindow == 3)
        #expect(start.first?.at == .milliseconds(150) * 4)  // esp_ota_begin erased 4 × 64 KiB first
        func status(_ bytes: [UInt8], _ model: inout ESPOTAPeripheral) throws -> UInt16 {
            guard case .notify(_, let v)? = send(&model, bytes, to: ESPOTAService.commandUUID).first?.output else { return 0xFFFF }
            return try ESPCommandAck(decoding: v).status
        }
        #expect(try status(ESPCommand.start(length: 1000).encoded, &model) == 1)  // while running
        var fresh = ESPOTAPeripheral(config: .init(component: .raw, partitionSize: 1 << 20))
        #expect(try status(ESPCommand.start(length: 0).encoded, &fresh) == 1)
        #expect(try status(ESPCommand.start(length: 2 << 20).encoded, &fresh) == 1)  // larger than the partition
        var badCRC = ESPCommand.start(length: 1000).encoded
        badCRC[19] ^= 1
        #expect(try status(badCRC, &fresh) == 1)
        #expect(try status(Array(ESPCommand.start(length: 1000).encoded.prefix(19)), &fresh) == 1)
        #expect(try status(ESPCommand.start(length: 1000).encoded, &fresh) == 0)
    }

    @Test func bleOTARawNACKsOutOfOrderPacketsWithoutResetAndChecksTheSectorCRC() {
        var model = started(.raw)
        let packets = wholeSector()
        _ = feed(&model, Array(packets.prefix(5)))
        // Another sector: NACK 2, nothing reset. A packet out of sequence: NACK 3, dropped, nothing reset.
        #expect(feed(&model, [packet(1, 0, 0..<200)]) == [ESPSectorAck(sector: 1, status: .sectorIndexError, expected: 0)])
        #expect(feed(&model, [packets[7]]) == [ESPSectorAck(sector: 0, status: .lengthError, expected: 0)])
        // So the sector goes on from packet 5; its ACK names the next sector.
        #expect(feed(&model, Array(packets[5...])) == [ESPSectorAck(sector: 0, status: .success, expected: 1)])
        #expect(model.partition == Self.sector)
        // A wrong CRC: NACK 1 and the sector starts over.
        var second = wholeSector(1)
        second[second.count - 1][second[second.count - 1].count - 1] ^= 0xFF
        #expect(feed(&model, second) == [ESPSectorAck(sector: 1, status: .crcError, expected: 1)])
        #expect(feed(&model, wholeSector(1)) == [ESPSectorAck(sector: 1, status: .success, expected: 2)])
    }

    @Test func bluedroidKeepsWhatComesAndHandsFourKiBAtTheLastPacket() {
        var model = started(.bluedroid)
        var packets = wholeSector()
        packets.remove(at: 3)
        #expect(feed(&model, packets) == [ESPSectorAck(sector: 0, status: .success, expected: 1)])
        #expect(model.partition.count == 4096)
        #expect(model.partition != Self.sector)
    }

    @Test func theHostDropsWriteCommandsItHasNoBufferFor() {
        var model = ESPOTAPeripheral(config: .init(component: .nimble, hostBufferPackets: 2, flashTimePerSector: .seconds(1)))
        _ = send(&model, ESPCommand.start(length: 4096 * 4).encoded, to: ESPOTAService.commandUUID)
        // Three sectors: the third waits for the ring buffer (two sectors) and blocks the host task.
        for s in 0..<3 { _ = feed(&model, wholeSector(UInt16(s))) }
        #expect(model.droppedWrites == 0)
        // Meanwhile two packets wait in the host's buffers; the third is dropped.
        _ = feed(&model, Array(wholeSector(3).prefix(3)))
        #expect(model.droppedWrites == 1)
    }
}
