import OTAWire

/// A request written to the DFU Control Point (`8EC90001`, write with response).
///
/// Byte layouts from the nRF5 SDK's `nrf_dfu_req_handler` (all integers little-endian); see
/// docs/NORDIC-DFU.md, "Control point".
public enum DFURequest: Hashable, Sendable, CustomStringConvertible {
    /// `01 <type u8> <size u32>`: make room for an object of `size` bytes.
    case create(DFUObjectType, size: UInt32)
    /// `02 <prn u16>`: send a checksum notification every `prn` packets (0 = never).
    case setPRN(UInt16)
    /// `03`: report the offset and CRC32 of everything received.
    case calculateChecksum
    /// `04`: validate and commit the current object.
    case execute
    /// `06 <type u8>`: report the max object size, the offset and the CRC32 for that type.
    case select(DFUObjectType)
    /// `00`
    case protocolVersion
    /// `07`
    case mtuGet
    /// `09 <id u8>`
    case ping(UInt8)
    /// `0A`
    case hardwareVersion
    /// `0B <image u8>`
    case firmwareVersion(image: UInt8)
    /// `0C`: drop the transfer in progress.
    case abort

    public var opcode: DFUOpcode {
        switch self {
        case .create: .create
        case .setPRN: .setPRN
        case .calculateChecksum: .calculateChecksum
        case .execute: .execute
        case .select: .select
        case .protocolVersion: .protocolVersion
        case .mtuGet: .mtuGet
        case .ping: .ping
        case .hardwareVersion: .hardwareVersion
        case .firmwareVersion: .firmwareVersion
        case .abort: .abort
        }
    }

    public var encoded: [UInt8] {
        var out: [UInt8] = [opcode.rawValue]
        switch self {
        case .create(let type, let size):
            out.append(type.rawValue)
            out.appendLE(size)
        case .setPRN(let prn): out.appendLE(prn)
        case .select(let type): out.append(type.rawValue)
        case .ping(let id): out.append(id)
        case .firmwareVersion(let image): out.append(image)
        case .calculateChecksum, .execute, .protocolVersion, .mtuGet, .hardwareVersion, .abort: break
        }
        return out
    }

    /// Parses a control point write. Lengths must be exact; an unknown opcode is an error that
    /// carries it, so a device can answer `60 <op> 02`.
    public init(decoding bytes: [UInt8]) throws(DFUWireError) {
        var r = ByteReader(bytes)
        guard let op = (try? r.u8()).map(DFUOpcode.init(rawValue:)) else { throw DFUWireError("empty control point write") }
        let request: DFURequest?
        do {
            request = try Self.parameters(of: op, from: &r)
        } catch {
            throw DFUWireError("\(op) with \(bytes.count - 1) parameter bytes is too short: \(error)", opcode: op, result: .invalidParameter)
        }
        guard let request else {
            throw DFUWireError("\(op) is not a request this codec knows", opcode: op, result: .opcodeNotSupported)
        }
        guard r.remaining == 0 else {
            throw DFUWireError("\(op) takes \(r.consumed - 1) parameter bytes, got \(bytes.count - 1)", opcode: op, result: .invalidParameter)
        }
        self = request
    }

    /// The request `op` with its parameters read from `r`; nil for an opcode this codec does not know.
    private static func parameters(of op: DFUOpcode, from r: inout ByteReader) throws(ByteReader.ShortRead) -> DFURequest? {
        switch op {
        case .create: .create(DFUObjectType(rawValue: try r.u8()), size: try r.u32())
        case .setPRN: .setPRN(try r.u16())
        case .calculateChecksum: .calculateChecksum
        case .execute: .execute
        case .select: .select(DFUObjectType(rawValue: try r.u8()))
        case .protocolVersion: .protocolVersion
        case .mtuGet: .mtuGet
        case .ping: .ping(try r.u8())
        case .hardwareVersion: .hardwareVersion
        case .firmwareVersion: .firmwareVersion(image: try r.u8())
        case .abort: .abort
        default: nil
        }
    }

    public var description: String {
        switch self {
        case .create(let type, let size): "CREATE \(type) of \(size) bytes"
        case .setPRN(let prn): "SET PRN \(prn)"
        case .select(let type): "SELECT \(type)"
        case .ping(let id): "PING \(id)"
        case .firmwareVersion(let image): "FIRMWARE VERSION of image \(image)"
        default: opcode.description
        }
    }
}

/// A control point notification: `60 <request opcode> <result> [payload]`.
public struct DFUResponse: Hashable, Sendable, CustomStringConvertible {
    /// What follows the result byte.
    public enum Payload: Hashable, Sendable {
        case none
        /// SELECT's answer.
        case select(maxSize: UInt32, offset: UInt32, crc: UInt32)
        /// CALCULATE CHECKSUM's answer, and every packet receipt notification.
        case checksum(offset: UInt32, crc: UInt32)
        /// Result `0x0B`: the extended error byte.
        case extendedError(DFUExtendedError)
        /// The answer to a request this codec does not interpret (protocol version, MTU, ...).
        case raw([UInt8])
    }

    public var request: DFUOpcode
    public var result: DFUResultCode
    public var payload: Payload

    public init(request: DFUOpcode, result: DFUResultCode, payload: Payload = .none) {
        self.request = request
        self.result = result
        self.payload = payload
    }

    /// A success response with an offset and a CRC (CALCULATE CHECKSUM and packet receipts).
    public static func checksum(offset: UInt32, crc: UInt32) -> DFUResponse {
        DFUResponse(request: .calculateChecksum, result: .success, payload: .checksum(offset: offset, crc: crc))
    }

    /// A refusal with an extended error.
    public static func extended(_ request: DFUOpcode, _ error: DFUExtendedError) -> DFUResponse {
        DFUResponse(request: request, result: .extendedError, payload: .extendedError(error))
    }

    public var encoded: [UInt8] {
        var out: [UInt8] = [DFUOpcode.response.rawValue, request.rawValue, result.rawValue]
        switch payload {
        case .none: break
        case .select(let maxSize, let offset, let crc):
            out.appendLE(maxSize)
            out.appendLE(offset)
            out.appendLE(crc)
        case .checksum(let offset, let crc):
            out.appendLE(offset)
            out.appendLE(crc)
        case .extendedError(let e): out.append(e.rawValue)
        case .raw(let bytes): out += bytes
        }
        return out
    }

    /// Parses a notification. Success answers to SELECT (12 bytes) and CALCULATE CHECKSUM (8) must
    /// carry at least their fields; an extended error carries its byte; other successes keep their
    /// bytes raw. Bytes beyond what a response defines are ignored, as Nordic's Android and iOS
    /// DFU libraries ignore them (`SecureDfuImpl.java`, `SecureDFUControlPoint.swift`), and so is
    /// the absence of an extended error's byte, which no SDK bootloader omits.
    public init(decoding bytes: [UInt8]) throws(DFUWireError) {
        guard bytes.count >= 3 else { throw DFUWireError("notification of \(bytes.count) bytes is shorter than a response (3)") }
        guard bytes[0] == DFUOpcode.response.rawValue else {
            throw DFUWireError("notification starts with 0x\(hex2(bytes[0])), not the response code 0x60")
        }
        let request = DFUOpcode(rawValue: bytes[1])
        let result = DFUResultCode(rawValue: bytes[2])
        var r = ByteReader(bytes[3...])
        let payload: Payload
        do {
            switch (result, request) {
            case (.success, .select):
                payload = .select(maxSize: try r.u32(), offset: try r.u32(), crc: try r.u32())
            case (.success, .calculateChecksum):
                payload = .checksum(offset: try r.u32(), crc: try r.u32())
            case (.success, _):
                payload = r.remaining == 0 ? .none : .raw(Array(r.rest()))
            case (.extendedError, _):
                payload = (try? r.u8()).map { .extendedError(DFUExtendedError(rawValue: $0)) } ?? .none
            default:
                payload = .none
            }
        } catch {
            throw DFUWireError("\(request) response carries \(bytes.count - 3) bytes after the result, too few: \(error)")
        }
        self.init(request: request, result: result, payload: payload)
    }

    /// The refusal in one line (result, or extended error when the result is 0x0B).
    public var reason: String {
        if case .extendedError(let e) = payload { return e.description }
        if result == .extendedError { return "extended error (0x0B) without its code byte: the bootloader did not say what it refused" }
        return result.description
    }

    public var description: String {
        switch payload {
        case .none: "\(request): \(result)"
        case .select(let m, let o, let c): "\(request): max \(m), offset \(o), crc \(hex32(c))"
        case .checksum(let o, let c): "\(request): offset \(o), crc \(hex32(c))"
        case .extendedError(let e): "\(request): \(e)"
        case .raw(let b): "\(request): \(result), \(b.count) bytes"
        }
    }
}

/// Bytes that do not parse as the Secure DFU protocol says. For a malformed request, `opcode` and
/// `result` tell a device what to answer.
public struct DFUWireError: Error, Sendable, Hashable, CustomStringConvertible {
    public let description: String
    public let opcode: DFUOpcode?
    public let result: DFUResultCode

    public init(_ description: String, opcode: DFUOpcode? = nil, result: DFUResultCode = .invalid) {
        self.description = description
        self.opcode = opcode
        self.result = result
    }
}
