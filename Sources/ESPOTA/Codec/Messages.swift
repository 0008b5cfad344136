import OTAWire

/// A command on COMMAND: 20 bytes, the command id (LE u16), its payload in bytes 2–17, and the
/// CRC16 of bytes 0–17 at 18–19 (`ble_ota.c`, `nimble_ota.c`). Neither host checks the CRC; otaflash
/// sends it all the same.
public enum ESPCommand: Sendable, Hashable {
    /// 0x0001: an update of `length` bytes begins (LE u32 at bytes 2–5).
    case start(length: UInt32)
    /// 0x0002: clears the component's state (the update itself ends without it).
    case stop
    /// Any other id, with its payload.
    case other(id: UInt16, payload: [UInt8])

    public static let size = 20

    public var id: UInt16 {
        switch self {
        case .start: 0x0001
        case .stop: 0x0002
        case .other(let id, _): id
        }
    }

    public var encoded: [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(Self.size)
        out.appendLE(id)
        switch self {
        case .start(let length): out.appendLE(length)
        case .stop: break
        case .other(_, let payload): out += payload.prefix(16)
        }
        out += [UInt8](repeating: 0, count: 18 - out.count)
        out.appendLE(CRC16.checksum(out))
        return out
    }

    /// Reads a command as a device does: the id and START's length from the first six bytes;
    /// the rest and the CRC are not looked at (Espressif's component checks neither).
    public init(decoding value: [UInt8]) throws(ByteReader.ShortRead) {
        var reader = ByteReader(value)
        let id = try reader.u16()
        switch id {
        case 0x0001: self = .start(length: try reader.u32())
        case 0x0002: self = .stop
        default: self = .other(id: id, payload: Array(reader.rest().prefix(16)))
        }
    }
}

/// The device's answer to a command, on COMMAND: 0x0003, the command it answers (LE u16), and
/// its status (LE u16: 0 accepted, 1 rejected), CRC16 at 18–19. `ble_ota_raw` 0.2.0 puts in byte 6
/// of an accepted START's answer the sectors a central may send un-ACKed (its ring buffer, 1…64);
/// `ble_ota` leaves it 0.
public struct ESPCommandAck: Sendable, Hashable {
    public static let id: UInt16 = 0x0003
    public var command: UInt16
    public var status: UInt16
    /// Byte 6, when not 0: the sector send window.
    public var sectorWindow: UInt8?

    public init(command: UInt16, status: UInt16, sectorWindow: UInt8? = nil) {
        self.command = command
        self.status = status
        self.sectorWindow = sectorWindow
    }

    public var accepted: Bool { status == 0 }

    public var encoded: [UInt8] {
        var out: [UInt8] = []
        out.appendLE(Self.id)
        out.appendLE(command)
        out.appendLE(status)
        out.append(sectorWindow ?? 0)
        out += [UInt8](repeating: 0, count: 11)
        out.appendLE(CRC16.checksum(out))
        return out
    }

    /// Liberal: six bytes are enough (a shorter CRC-less answer, or extra bytes, are read alike);
    /// the CRC is not checked. Throws for a value that is not an ACK (id other than 0x0003).
    public init(decoding value: [UInt8]) throws(WireError) {
        var reader = ByteReader(value)
        do {
            let id = try reader.u16()
            guard id == Self.id else { throw WireError("a command answer starts with 0x0003, not 0x\(String(id, radix: 16)) (\(hexDump(value[...])))") }
            command = try reader.u16()
            status = try reader.u16()
            let window = reader.remaining >= 1 ? try reader.u8() : 0
            sectorWindow = window == 0 ? nil : window
        } catch let error as ByteReader.ShortRead {
            throw WireError("a command answer of \(value.count) bytes: \(error)")
        } catch let error as WireError {
            throw error
        } catch {
            throw WireError("\(error)")
        }
    }
}

/// One packet of a sector on RECV_FW: the sector's index (LE u16), the packet's sequence number
/// (0, 1, 2… and 0xFF for a sector's last packet), then image bytes; the last packet ends with the
/// CRC16 of the sector's image bytes (LE).
public struct ESPSectorPacket: Sendable, Hashable {
    public static let headerSize = 3
    public static let lastSequence: UInt8 = 0xFF
    public var sector: UInt16
    public var sequence: UInt8
    /// What follows the header (on the last packet, image bytes and the CRC16).
    public var payload: [UInt8]

    public init(sector: UInt16, sequence: UInt8, payload: [UInt8]) {
        self.sector = sector
        self.sequence = sequence
        self.payload = payload
    }

    public var isLast: Bool { sequence == Self.lastSequence }

    public var encoded: [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(Self.headerSize + payload.count)
        out.appendLE(sector)
        out.append(sequence)
        out += payload
        return out
    }

    /// Writes a packet straight into `out` (the engine's data path).
    public static func encode(sector: UInt16, sequence: UInt8, data: ArraySlice<UInt8>, crc: UInt16?, into out: inout [UInt8]) {
        out.reserveCapacity(headerSize + data.count + 2)
        out.appendLE(sector)
        out.append(sequence)
        out += data
        if let crc { out.appendLE(crc) }
    }

    public init(decoding value: [UInt8]) throws(ByteReader.ShortRead) {
        var reader = ByteReader(value)
        sector = try reader.u16()
        sequence = try reader.u8()
        payload = Array(reader.rest())
    }
}

/// The device's answer to a sector, on RECV_FW: the sector it answers (LE u16), a status, and on
/// a refusal the sector it wants next at bytes 4–5, CRC16 at 18–19.
///
/// The components differ: Bluedroid's and `ble_ota_raw` always fill bytes 4–5 with the sector they
/// expect (after an ACK, the next one); NimBLE's fills them only on a refusal.
public struct ESPSectorAck: Sendable, Hashable {
    public struct Status: RawRepresentable, Sendable, Hashable, CustomStringConvertible {
        public let rawValue: UInt16
        public init(rawValue: UInt16) { self.rawValue = rawValue }
        public static let success = Status(rawValue: 0)
        /// The sector's CRC16 did not match: the device wants it again.
        public static let crcError = Status(rawValue: 1)
        /// A packet of another sector than the one the device collects.
        public static let sectorIndexError = Status(rawValue: 2)
        /// `ble_ota_raw`: a packet out of sequence (dropped, nothing reset), a last packet without
        /// its CRC, or more than a sector; `ble_ota` never sends it.
        public static let lengthError = Status(rawValue: 3)
        public var description: String {
            switch self {
            case .success: "success"
            case .crcError: "CRC error"
            case .sectorIndexError: "sector index error"
            case .lengthError: "payload length error"
            default: "status \(rawValue)"
            }
        }
    }

    public var sector: UInt16
    public var status: Status
    /// The sector the device wants next, when the answer says (a refusal; always on Bluedroid).
    public var expected: UInt16?

    public init(sector: UInt16, status: Status, expected: UInt16? = nil) {
        self.sector = sector
        self.status = status
        self.expected = expected
    }

    /// As NimBLE writes it (a status byte, the expected sector only on a refusal).
    public var encoded: [UInt8] {
        var out: [UInt8] = []
        out.appendLE(sector)
        out.appendLE(status.rawValue)
        out.appendLE(expected ?? 0)
        out += [UInt8](repeating: 0, count: 12)
        out.appendLE(CRC16.checksum(out))
        return out
    }

    /// Liberal: four bytes are enough (then no expected sector), extra bytes are ignored, the CRC
    /// is not checked. NimBLE's zero at bytes 4–5 of a success is read as no expected sector.
    public init(decoding value: [UInt8]) throws(ByteReader.ShortRead) {
        var reader = ByteReader(value)
        sector = try reader.u16()
        status = Status(rawValue: try reader.u16())
        if reader.remaining >= 2 {
            let wanted = try reader.u16()
            expected = status == .success && wanted == 0 ? nil : wanted
        }
    }
}
