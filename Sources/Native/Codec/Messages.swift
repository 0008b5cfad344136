import GATT
import OTAWire

/// Command opcodes written to the control point (docs/PROTOCOL.md, "Commands").
public struct OTAOpcode: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
    public let rawValue: UInt8
    public init(rawValue: UInt8) { self.rawValue = rawValue }

    public static let begin = OTAOpcode(rawValue: 0x01)
    public static let checkpoint = OTAOpcode(rawValue: 0x02)
    public static let status = OTAOpcode(rawValue: 0x03)
    public static let verify = OTAOpcode(rawValue: 0x04)
    public static let activate = OTAOpcode(rawValue: 0x05)
    public static let abort = OTAOpcode(rawValue: 0x06)

    public var description: String {
        switch self {
        case .begin: "BEGIN"
        case .checkpoint: "CHECKPOINT"
        case .status: "STATUS"
        case .verify: "VERIFY"
        case .activate: "ACTIVATE"
        case .abort: "ABORT"
        default: "opcode 0x" + String(rawValue, radix: 16)
        }
    }
}

/// A command the central writes (with response) to the control point.
public enum ControlRequest: Hashable, Sendable {
    /// Start, or resume, the transfer of an image. `restart` discards any partial transfer.
    case begin(Begin)
    /// "I have sent `offset` bytes whose CRC is `crc`." The device commits or reports what it holds.
    case checkpoint(offset: UInt32, crc: UInt32)
    case status
    /// The device computes CRC32 over the whole image it holds and compares it with BEGIN's.
    case verify
    /// Boot the verified image. Refused unless VERIFY succeeded.
    case activate
    /// Discard the transfer.
    case abort

    public struct Begin: Hashable, Sendable {
        public var protocolVersion: UInt8
        public var imageSize: UInt32
        public var imageCRC: UInt32
        public var version: FirmwareVersion
        public var restart: Bool

        public init(protocolVersion: UInt8 = OTAProtocol.version, imageSize: UInt32, imageCRC: UInt32,
                    version: FirmwareVersion, restart: Bool) {
            self.protocolVersion = protocolVersion
            self.imageSize = imageSize
            self.imageCRC = imageCRC
            self.version = version
            self.restart = restart
        }
    }

    public var opcode: OTAOpcode {
        switch self {
        case .begin: .begin
        case .checkpoint: .checkpoint
        case .status: .status
        case .verify: .verify
        case .activate: .activate
        case .abort: .abort
        }
    }

    public var encoded: [UInt8] {
        var b: [UInt8] = [opcode.rawValue]
        switch self {
        case .begin(let p):
            b.append(p.protocolVersion)
            b.appendLE(p.imageSize)
            b.appendLE(p.imageCRC)
            b.appendLE(p.version.packed)
            b.append(p.restart ? 0x01 : 0x00)
        case .checkpoint(let offset, let crc):
            b.appendLE(offset)
            b.appendLE(crc)
        case .status, .verify, .activate, .abort:
            break
        }
        return b
    }

    /// Decodes a control point write. The error carries the status the device should reply with.
    /// Lengths are exact: a command shorter or longer than its fields is `invalidLength`.
    public init(decoding bytes: [UInt8]) throws(RequestDecodingError) {
        var r = ByteReader(bytes)
        guard let op = try? r.u8() else { throw RequestDecodingError(opcode: nil, status: .invalidLength) }
        let opcode = OTAOpcode(rawValue: op)
        let request: ControlRequest?
        do {
            request = try Self.fields(of: opcode, from: &r)
        } catch {
            throw RequestDecodingError(opcode: opcode, status: .invalidLength)
        }
        guard let request else { throw RequestDecodingError(opcode: opcode, status: .unknownOpcode) }
        guard r.remaining == 0 else { throw RequestDecodingError(opcode: opcode, status: .invalidLength) }
        self = request
    }

    /// The command `opcode` with its fields read from `r`; nil for an opcode this version does not define.
    private static func fields(of opcode: OTAOpcode, from r: inout ByteReader) throws(ByteReader.ShortRead) -> ControlRequest? {
        switch opcode {
        case .begin:
            .begin(Begin(protocolVersion: try r.u8(), imageSize: try r.u32(), imageCRC: try r.u32(),
                         version: FirmwareVersion(packed: try r.u32()), restart: try r.u8() & 0x01 != 0))
        case .checkpoint: .checkpoint(offset: try r.u32(), crc: try r.u32())
        case .status: .status
        case .verify: .verify
        case .activate: .activate
        case .abort: .abort
        default: nil
        }
    }
}

/// Why a control point write could not be decoded, and the status to answer with.
public struct RequestDecodingError: Error, Hashable, Sendable {
    public let opcode: OTAOpcode?
    public let status: OTAStatus
}

/// What the device notifies on the control point: a reply to a command, or an unsolicited event.
public enum ControlNotification: Hashable, Sendable {
    case response(ControlResponse)
    case event(DeviceEvent)

    public static let responseCode: UInt8 = 0x80
    public static let eventCode: UInt8 = 0x81

    public var encoded: [UInt8] {
        switch self {
        case .response(let r): r.encoded
        case .event(let e): e.encoded
        }
    }

    public init(decoding bytes: [UInt8]) throws(WireError) {
        switch bytes.first {
        case Self.responseCode: self = .response(try ControlResponse(decoding: bytes))
        case Self.eventCode: self = .event(try DeviceEvent(decoding: bytes))
        default: throw WireError("control point notification starts with an unknown code: \(hexDump(bytes[...]))")
        }
    }
}

/// A reply: `0x80, request opcode, status, payload`. The payload depends on the command.
public struct ControlResponse: Hashable, Sendable {
    public var opcode: OTAOpcode
    public var status: OTAStatus
    public var payload: Payload

    public enum Payload: Hashable, Sendable {
        case none
        /// BEGIN and CHECKPOINT: the device's contiguous offset and the CRC of what it holds below it.
        case position(offset: UInt32, crc: UInt32)
        case status(Status)
        /// VERIFY: the CRC the device computed over what it holds.
        case computedCRC(UInt32)
    }

    public struct Status: Hashable, Sendable {
        public var state: DeviceState
        public var offset: UInt32
        public var crc: UInt32
        public var imageSize: UInt32
        public var imageCRC: UInt32

        public init(state: DeviceState, offset: UInt32, crc: UInt32, imageSize: UInt32, imageCRC: UInt32) {
            self.state = state
            self.offset = offset
            self.crc = crc
            self.imageSize = imageSize
            self.imageCRC = imageCRC
        }
    }

    public init(opcode: OTAOpcode, status: OTAStatus, payload: Payload = .none) {
        self.opcode = opcode
        self.status = status
        self.payload = payload
    }

    public var encoded: [UInt8] {
        var b: [UInt8] = [ControlNotification.responseCode, opcode.rawValue, status.rawValue]
        switch payload {
        case .none: break
        case .position(let offset, let crc):
            b.appendLE(offset)
            b.appendLE(crc)
        case .status(let s):
            b.append(s.state.rawValue)
            b.appendLE(s.offset)
            b.appendLE(s.crc)
            b.appendLE(s.imageSize)
            b.appendLE(s.imageCRC)
        case .computedCRC(let crc):
            b.appendLE(crc)
        }
        return b
    }

    public init(decoding bytes: [UInt8]) throws(WireError) {
        var r = ByteReader(bytes)
        guard (try? r.u8()) == ControlNotification.responseCode, let op = try? r.u8(), let st = try? r.u8() else {
            throw WireError("reply too short: \(hexDump(bytes[...]))")
        }
        opcode = OTAOpcode(rawValue: op)
        status = OTAStatus(rawValue: st)
        // A payload shorter than its command's is malformed; a longer one comes from a later minor
        // revision and its extra bytes are ignored (docs/PROTOCOL.md, "Byte order and versions").
        // So are bytes after a status that carries no payload in this version: a later revision
        // may add one there too.
        guard r.remaining > 0, Self.carriesPayload(opcode: opcode, status: status) else {
            payload = .none
            return
        }
        do {
            switch opcode {
            case .begin, .checkpoint:
                payload = .position(offset: try r.u32(), crc: try r.u32())
            case .status:
                payload = .status(Status(state: DeviceState(rawValue: try r.u8()), offset: try r.u32(), crc: try r.u32(),
                                         imageSize: try r.u32(), imageCRC: try r.u32()))
            case .verify:
                payload = .computedCRC(try r.u32())
            default:
                payload = .none
            }
        } catch {
            throw WireError("\(opcode) reply has a malformed payload (\(error)): \(hexDump(bytes[...]))")
        }
    }

    /// The statuses whose reply carries a payload (docs/PROTOCOL.md, "Notifications"); other
    /// statuses, unknown ones included, carry none.
    static func carriesPayload(opcode: OTAOpcode, status: OTAStatus) -> Bool {
        switch opcode {
        case .begin: status == .success
        case .checkpoint: [.success, .gap, .crcMismatch].contains(status)
        case .status: true
        case .verify: [.success, .crcMismatch, .incomplete].contains(status)
        default: false
        }
    }
}

/// An unsolicited event: `0x81, event code, payload`.
public enum DeviceEvent: Hashable, Sendable {
    /// A data packet arrived beyond the contiguous offset and was dropped. Sent once per gap.
    case gap(expectedOffset: UInt32, crc: UInt32)

    public static let gapCode: UInt8 = 0x01

    public var encoded: [UInt8] {
        switch self {
        case .gap(let offset, let crc):
            var b: [UInt8] = [ControlNotification.eventCode, Self.gapCode]
            b.appendLE(offset)
            b.appendLE(crc)
            return b
        }
    }

    public init(decoding bytes: [UInt8]) throws(WireError) {
        var r = ByteReader(bytes)
        guard (try? r.u8()) == ControlNotification.eventCode, let code = try? r.u8() else {
            throw WireError("event too short: \(hexDump(bytes[...]))")
        }
        switch code {
        case Self.gapCode:
            // Longer from a later minor revision: the extra bytes are ignored, as in a reply.
            do {
                self = .gap(expectedOffset: try r.u32(), crc: try r.u32())
            } catch {
                throw WireError("GAP event has a malformed payload (\(error)): \(hexDump(bytes[...]))")
            }
        default:
            throw WireError("unknown event code 0x\(String(code, radix: 16)): \(hexDump(bytes[...]))")
        }
    }
}

/// A data packet: the 32-bit little-endian offset of its first byte, then the bytes.
public enum DataPacket {
    /// Encodes a packet for `image[range]`.
    @inlinable
    public static func encode(offset: UInt32, payload: ArraySlice<UInt8>) -> [UInt8] {
        var b = [UInt8]()
        b.reserveCapacity(OTAProtocol.dataHeaderSize + payload.count)
        b.appendLE(offset)
        b.append(contentsOf: payload)
        return b
    }

    /// Splits a packet into offset and payload; nil when it has no payload byte.
    public static func decode(_ bytes: [UInt8]) -> (offset: UInt32, payload: ArraySlice<UInt8>)? {
        var r = ByteReader(bytes)
        guard let offset = try? r.u32(), r.remaining > 0 else { return nil }
        return (offset, r.rest())
    }
}
