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
        var model = ESPOTAPeripheral(config: .init(flashTimePerSector: .seconds(1)))
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
}
