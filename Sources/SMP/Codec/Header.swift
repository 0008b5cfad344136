/// The operation in an SMP header's low three bits (MCUmgr `MGMT_OP_*`).
public enum SMPOperation: UInt8, Hashable, Sendable, CaseIterable, CustomStringConvertible {
    case read = 0
    case readResponse = 1
    case write = 2
    case writeResponse = 3

    public var isResponse: Bool { self == .readResponse || self == .writeResponse }

    /// The operation a server answers this request with (`read` → `readResponse`).
    public var response: SMPOperation { self == .read ? .readResponse : self == .write ? .writeResponse : self }

    public var description: String {
        switch self {
        case .read: "read"
        case .readResponse: "read response"
        case .write: "write"
        case .writeResponse: "write response"
        }
    }
}

/// SMP's version, bits 4..3 of the header's first byte.
public enum SMPVersion: UInt8, Hashable, Sendable, CaseIterable {
    /// Errors as `{"rc": n, "rsn"?: text}` with MCUmgr's general codes.
    case v1 = 0
    /// Errors as `{"err": {"group": g, "rc": n}}` with each group's own codes. Requests are built as v2.
    case v2 = 1
}

/// An SMP management group (MCUmgr `MGMT_GROUP_ID_*`). An open set: any group decodes and prints.
public struct SMPGroup: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
    public let rawValue: UInt16
    public init(rawValue: UInt16) { self.rawValue = rawValue }

    public static let os = SMPGroup(rawValue: 0)
    public static let image = SMPGroup(rawValue: 1)
    public static let stat = SMPGroup(rawValue: 2)
    public static let settings = SMPGroup(rawValue: 3)
    public static let log = SMPGroup(rawValue: 4)
    public static let crash = SMPGroup(rawValue: 5)
    public static let split = SMPGroup(rawValue: 6)
    public static let run = SMPGroup(rawValue: 7)
    public static let fs = SMPGroup(rawValue: 8)
    public static let shell = SMPGroup(rawValue: 9)
    public static let enumeration = SMPGroup(rawValue: 10)
    public static let zephyr = SMPGroup(rawValue: 63)

    public var description: String {
        switch self {
        case .os: "OS group (0)"
        case .image: "image group (1)"
        case .fs: "file system group (8)"
        case .shell: "shell group (9)"
        default: "group \(rawValue)"
        }
    }
}

/// The 8-byte header in front of every SMP frame, big-endian (smp `header.py`, `!BBHHBB`):
///
/// ```
/// byte 0     bits 7..5 reserved (0), bits 4..3 version, bits 2..0 operation
/// byte 1     flags
/// bytes 2-3  length of the CBOR payload that follows
/// bytes 4-5  group
/// byte 6     sequence number, echoed by the response
/// byte 7     command id within the group
/// ```
public struct SMPHeader: Hashable, Sendable, CustomStringConvertible {
    public static let size = 8

    public var operation: SMPOperation
    public var version: SMPVersion
    public var flags: UInt8
    /// CBOR payload bytes after the header.
    public var length: UInt16
    public var group: SMPGroup
    public var sequence: UInt8
    public var command: UInt8

    public init(operation: SMPOperation, version: SMPVersion = .v2, flags: UInt8 = 0, length: UInt16,
                group: SMPGroup, sequence: UInt8, command: UInt8) {
        self.operation = operation
        self.version = version
        self.flags = flags
        self.length = length
        self.group = group
        self.sequence = sequence
        self.command = command
    }

    /// The header of the answer to this request: same version, group, sequence and command.
    public func response(length: UInt16) -> SMPHeader {
        SMPHeader(operation: operation.response, version: version, length: length, group: group, sequence: sequence, command: command)
    }

    public var encoded: [UInt8] {
        [version.rawValue << 3 | operation.rawValue, flags,
         UInt8(length >> 8), UInt8(truncatingIfNeeded: length),
         UInt8(group.rawValue >> 8), UInt8(truncatingIfNeeded: group.rawValue),
         sequence, command]
    }

    /// Parses the first 8 bytes of `bytes` (more may follow). Refuses reserved bits, version 2 and
    /// 3 (not defined) and operations 4 to 7.
    public init(decoding bytes: some Collection<UInt8>) throws(SMPWireError) {
        let b = Array(bytes.prefix(Self.size))
        guard b.count == Self.size else {
            throw SMPWireError(.shortHeader, "SMP header of \(b.count) bytes, expected \(Self.size)")
        }
        guard b[0] & 0xE0 == 0 else {
            throw SMPWireError(.reservedBits, "SMP header byte 0x\(hex(b[0])) sets reserved bits 7..5")
        }
        guard let version = SMPVersion(rawValue: (b[0] >> 3) & 0x03) else {
            throw SMPWireError(.badVersion, "SMP header byte 0x\(hex(b[0])) gives version \((b[0] >> 3) & 0x03); only 0 (v1) and 1 (v2) exist")
        }
        guard let operation = SMPOperation(rawValue: b[0] & 0x07) else {
            throw SMPWireError(.badOperation, "SMP header byte 0x\(hex(b[0])) gives operation \(b[0] & 0x07); only 0 to 3 exist")
        }
        self.init(operation: operation, version: version, flags: b[1], length: UInt16(b[2]) << 8 | UInt16(b[3]),
                  group: SMPGroup(rawValue: UInt16(b[4]) << 8 | UInt16(b[5])), sequence: b[6], command: b[7])
    }

    public var description: String {
        "SMP \(version) \(operation) \(group) command \(command), sequence \(sequence), \(length) bytes"
    }
}

/// One SMP frame: a header and exactly `header.length` bytes of CBOR.
public struct SMPFrame: Hashable, Sendable {
    public var header: SMPHeader
    public var payload: [UInt8]

    /// A frame around `payload`; the header's length is set from it. Throws `.frameTooLarge` for
    /// a payload over 65,535 bytes, which the header's length cannot say (an echo of a long text,
    /// say; uploads sized by `SMPImageUpload.maxDataSize` always fit).
    public init(header: SMPHeader, payload: [UInt8]) throws(SMPWireError) {
        guard let length = UInt16(exactly: payload.count) else {
            throw SMPWireError(.frameTooLarge, "an SMP payload of \(payload.count) bytes is over the 65,535 the header can say")
        }
        self.init(checked: header, length: length, payload: payload)
    }

    /// A frame carrying `body` as canonical CBOR.
    public init(header: SMPHeader, body: CBOR) throws(SMPWireError) {
        try self.init(header: header, payload: body.encoded)
    }

    /// A frame whose payload is known to fit the header's length.
    init(checked header: SMPHeader, length: UInt16, payload: [UInt8]) {
        var header = header
        header.length = length
        self.header = header
        self.payload = payload
    }

    /// Parses a whole frame: the header, then exactly its length in payload bytes.
    public init(decoding bytes: some Collection<UInt8>) throws(SMPWireError) {
        let header = try SMPHeader(decoding: bytes)
        let payload = Array(bytes.dropFirst(SMPHeader.size))
        guard payload.count == Int(header.length) else {
            throw SMPWireError(.lengthMismatch, "SMP header gives \(header.length) payload bytes, the frame carries \(payload.count)")
        }
        self.header = header
        self.payload = payload
    }

    public var encoded: [UInt8] { header.encoded + payload }

    /// The payload as CBOR.
    public func body(limits: CBORDecoder.Limits = .smp) throws(SMPWireError) -> CBOR {
        do {
            return try CBORDecoder.decode(payload, limits: limits)
        } catch {
            throw SMPWireError(.cbor(error), "\(header.group) command \(header.command): \(error)")
        }
    }
}

/// Bytes that do not parse as SMP says, or a message without the fields its command needs.
public struct SMPWireError: Error, Sendable, Hashable, CustomStringConvertible {
    public enum Kind: Sendable, Hashable {
        case shortHeader
        case reservedBits
        case badVersion
        case badOperation
        /// A frame whose payload is not the header's length.
        case lengthMismatch
        /// A frame longer than the receiver's bound.
        case frameTooLarge
        case cbor(CBORError)
        /// A body that is not a map.
        case notAMap
        /// A field the message needs is absent.
        case missingField(String)
        /// A field of the wrong CBOR type, or out of range.
        case badField(String)
        /// A group, command and operation this codec does not know (a server answers ENOTSUP).
        case unsupportedCommand
        /// A request where a response belongs, or the other way round.
        case wrongDirection
    }

    public let kind: Kind
    public let description: String

    public init(_ kind: Kind, _ description: String) {
        self.kind = kind
        self.description = description
    }
}
