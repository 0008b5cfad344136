import OTA

// MCUmgr's file management group (group 8, fs_mgmt): Zephyr's `smp_group_8.rst` and
// `subsys/mgmt/mcumgr/grp/fs_mgmt/src/fs_mgmt.c`; smp's `file_management.py` on the client side.

extension SMPCommand {
    /// fs 0: write a chunk of a file (upload) or read one (download).
    public static let fileTransfer = SMPCommand(group: .fs, id: 0)
    /// fs 1: a file's length (`CONFIG_MCUMGR_GRP_FS_FILE_STATUS`).
    public static let fileStatus = SMPCommand(group: .fs, id: 1)
    /// fs 2: a hash or checksum of a file, or of a range of it (`CONFIG_MCUMGR_GRP_FS_CHECKSUM_HASH`).
    public static let fileHash = SMPCommand(group: .fs, id: 2)
    /// fs 3: the hash and checksum types the device has (`..._CHECKSUM_HASH_SUPPORTED_CMD`).
    public static let fileHashTypes = SMPCommand(group: .fs, id: 3)
    /// fs 4: close the file an upload or download left open.
    public static let fileClose = SMPCommand(group: .fs, id: 4)
}

/// fs_mgmt's result codes (SMP v2 `err.rc` in group 8; Zephyr's `enum fs_mgmt_err_code_t`).
///
/// `description` is one line: what the device said and what to do.
public struct FileManagementError: Error, RawRepresentable, Hashable, Sendable, CustomStringConvertible {
    public let rawValue: Int64
    public init(rawValue: Int64) { self.rawValue = rawValue }

    public static let ok = Self(rawValue: 0)
    public static let unknown = Self(rawValue: 1)
    public static let invalidName = Self(rawValue: 2)
    public static let notFound = Self(rawValue: 3)
    public static let isDirectory = Self(rawValue: 4)
    public static let openFailed = Self(rawValue: 5)
    public static let seekFailed = Self(rawValue: 6)
    public static let readFailed = Self(rawValue: 7)
    public static let truncateFailed = Self(rawValue: 8)
    public static let deleteFailed = Self(rawValue: 9)
    public static let writeFailed = Self(rawValue: 10)
    /// An upload chunk not at the file's current end; the answer also carries `len`, that end.
    public static let offsetNotValid = Self(rawValue: 11)
    public static let offsetLargerThanFile = Self(rawValue: 12)
    public static let hashNotFound = Self(rawValue: 13)
    public static let mountPointNotFound = Self(rawValue: 14)
    public static let readOnly = Self(rawValue: 15)
    public static let fileEmpty = Self(rawValue: 16)
    public static let closeFailed = Self(rawValue: 17)

    public var description: String {
        switch self {
        case .ok: "no error (0)"
        case .unknown: "unknown error (1): the file system failed without saying why (a directory, or a flash error); check the path"
        case .invalidName: "invalid name (2): the file system refuses that path; give an absolute path such as /lfs/cert.pem"
        case .notFound: "file not found (3): no such file on the device; `otaflash files stat` checks a path"
        case .isDirectory: "is a directory (4): the path names a directory, not a file"
        case .openFailed: "open failed (5): the device could not open the file; retry"
        case .seekFailed: "seek failed (6): the device could not seek in the file; run the transfer again"
        case .readFailed: "read failed (7): the device could not read the file; retry"
        case .truncateFailed: "truncate failed (8): the device could not empty the existing file; retry"
        case .deleteFailed: "delete failed (9): the device could not replace the existing file; retry"
        case .writeFailed: "write failed (10): the device could not write the file: its file system is full, or the file larger than it takes; free space on the device or send a smaller file"
        case .offsetNotValid: "offset not valid (11): the file on the device changed during the upload; run it again"
        case .offsetLargerThanFile: "offset larger than the file (12): the range starts past the file's end"
        case .hashNotFound: "hash type not found (13): the device's firmware lacks that hash or checksum (CONFIG_MCUMGR_GRP_FS_HASH_SHA256, CONFIG_MCUMGR_GRP_FS_CHECKSUM_IEEE_CRC32); ask for another with --type"
        case .mountPointNotFound: "mount point not found (14): no file system is mounted where the path points; the path must start with a mount point such as /lfs"
        case .readOnly: "read-only file system (15): the device's file system at that path takes no writes"
        case .fileEmpty: "file empty (16): the file has no contents to hash"
        case .closeFailed: "close failed (17): the device could not close the file; retry"
        default: "unknown file management error \(rawValue)"
        }
    }

    /// The failure class a user acts on.
    public var otaCode: OTAError.Code {
        switch self {
        case .hashNotFound: .incompatibleDevice
        case .writeFailed: .imageTooLarge
        case .readOnly: .permission
        default: .protocolError
        }
    }

    /// Zephyr's translation for an SMP v1 request (`fs_mgmt_translate_error_code`).
    public var legacyCode: MCUmgrError {
        switch self {
        case .ok: .ok
        case .invalidName, .hashNotFound: .invalidValue
        case .notFound, .mountPointNotFound: .noEntry
        default: .unknown
        }
    }
}

extension SMPDeviceError {
    /// A v2 file management group error.
    public static func file(_ code: FileManagementError) -> SMPDeviceError {
        SMPDeviceError(group: .fs, rc: code.rawValue)
    }

    /// The file management group's code, when this is a v2 error of group 8.
    public var fileError: FileManagementError? { group == .fs ? FileManagementError(rawValue: rc) : nil }
}

/// A hash or checksum fs_mgmt computes, by its name on the wire (`type`).
public struct SMPFileHashType: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
    public var rawValue: String
    public init(rawValue: String) { self.rawValue = rawValue }

    /// IEEE CRC32, answered as an unsigned integer.
    public static let crc32 = Self(rawValue: "crc32")
    /// SHA-256, answered as 32 bytes.
    public static let sha256 = Self(rawValue: "sha256")

    public var description: String { rawValue }
}

/// One chunk of a file upload (fs 0 write): `name`, `off`, `data`, and `len` (the whole file's
/// size) on the first chunk.
public struct SMPFileUpload: Hashable, Sendable {
    public var name: String
    public var offset: UInt64
    public var data: [UInt8]
    /// `len`: required at offset 0, left out after.
    public var length: UInt64?

    public init(name: String, offset: UInt64, data: [UInt8], length: UInt64? = nil) {
        self.name = name
        self.offset = offset
        self.data = data
        self.length = length
    }

    public var body: CBOR {
        var m: [CBOR: CBOR] = ["name": .text(name), "off": .unsigned(offset), "data": .bytes(data)]
        if let length { m["len"] = .unsigned(length) }
        return .map(m)
    }

    public init(body: CBOR) throws(SMPWireError) {
        let f = try Fields(body, .fileTransfer)
        self.init(name: try f.required(f.text("name"), "name"), offset: try f.required(f.uint64("off"), "off"),
                  data: try f.required(f.bytes("data"), "data"), length: try f.uint64("len"))
    }

    /// The most data bytes this chunk can carry in a frame of at most `frameLimit` bytes, as
    /// `SMPImageUpload.maxDataSize` sizes an image chunk.
    public func maxDataSize(frameLimit: Int) -> Int {
        var empty = self
        empty.data = []
        return SMPFraming.dataCapacity(emptyBody: empty.body, frameLimit: frameLimit)
    }
}

/// A file management request (group 8).
public enum SMPFileRequest: Hashable, Sendable, CustomStringConvertible {
    /// fs 0 write.
    case upload(SMPFileUpload)
    /// fs 0 read: `{"name", "off"}`; the device picks the chunk's size.
    case download(name: String, offset: UInt64)
    /// fs 1 read: `{"name"}`.
    case status(name: String)
    /// fs 2 read: `{"name", "type"?, "off"?, "len"?}`; without `type` the device's default
    /// (crc32 when it has it), without `off` and `len` the whole file.
    case hash(name: String, type: SMPFileHashType?, offset: UInt64? = nil, length: UInt64? = nil)
    /// fs 3 read: `{}`.
    case hashTypes
    /// fs 4 write: `{}`.
    case close

    public var command: SMPCommand {
        switch self {
        case .upload, .download: .fileTransfer
        case .status: .fileStatus
        case .hash: .fileHash
        case .hashTypes: .fileHashTypes
        case .close: .fileClose
        }
    }

    public var operation: SMPOperation {
        switch self {
        case .upload, .close: .write
        default: .read
        }
    }

    public var body: CBOR {
        switch self {
        case .upload(let u): u.body
        case .download(let name, let offset): ["name": .text(name), "off": .unsigned(offset)]
        case .status(let name): ["name": .text(name)]
        case .hash(let name, let type, let offset, let length):
            {
                var m: [CBOR: CBOR] = ["name": .text(name)]
                if let type { m["type"] = .text(type.rawValue) }
                if let offset { m["off"] = .unsigned(offset) }
                if let length { m["len"] = .unsigned(length) }
                return .map(m)
            }()
        case .hashTypes, .close: [:]
        }
    }

    /// What a received group 8 frame asks for; unknown commands throw `.unsupportedCommand`.
    public init(decoding frame: SMPFrame) throws(SMPWireError) {
        let h = frame.header
        let command = SMPCommand(group: h.group, id: h.command)
        switch (command, h.operation) {
        case (.fileTransfer, .write): self = .upload(try SMPFileUpload(body: frame.body()))
        case (.fileTransfer, .read):
            let f = try Fields(frame.body(), command)
            self = .download(name: try f.required(f.text("name"), "name"), offset: try f.required(f.uint64("off"), "off"))
        case (.fileStatus, .read):
            let f = try Fields(frame.body(), command)
            self = .status(name: try f.required(f.text("name"), "name"))
        case (.fileHash, .read):
            let f = try Fields(frame.body(), command)
            self = .hash(name: try f.required(f.text("name"), "name"), type: try f.text("type").map(SMPFileHashType.init(rawValue:)),
                         offset: try f.uint64("off"), length: try f.uint64("len"))
        case (.fileHashTypes, .read):
            _ = try Fields(frame.body(), command)
            self = .hashTypes
        case (.fileClose, .write):
            _ = try Fields(frame.body(), command)
            self = .close
        default:
            throw SMPWireError(.unsupportedCommand, "\(h.operation) of \(command) is not a request this codec knows")
        }
    }

    public var description: String {
        switch self {
        case .upload(let u): "file upload of \(u.data.count) bytes at \(u.offset) of \(u.name)"
        case .download(let name, let offset): "file download of \(name) at \(offset)"
        case .status(let name): "file status of \(name)"
        case .hash(let name, let type, _, _): "\(type?.rawValue ?? "default") hash of \(name)"
        case .hashTypes: "file hash types read"
        case .close: "file close"
        }
    }
}

/// A hash or checksum answer (fs 2): `type`, `off` (when not 0), `len` (bytes hashed), `output`
/// (a byte string for sha256, an unsigned integer for crc32).
public struct SMPFileHash: Hashable, Sendable {
    public enum Output: Hashable, Sendable {
        case bytes([UInt8])
        case number(UInt64)
    }

    public var type: SMPFileHashType
    public var offset: UInt64?
    public var length: UInt64
    public var output: Output

    public init(type: SMPFileHashType, offset: UInt64? = nil, length: UInt64, output: Output) {
        self.type = type
        self.offset = offset
        self.length = length
        self.output = output
    }

    /// The output in hex: a byte string as it is, a number as 8 digits (a CRC32) or more.
    public var hex: String {
        switch output {
        case .bytes(let b): hexString(b)
        case .number(let n): n <= UInt64(UInt32.max) ? String(format8: UInt32(n)) : String(n, radix: 16)
        }
    }

    public var body: CBOR {
        var m: [CBOR: CBOR] = ["type": .text(type.rawValue), "len": .unsigned(length)]
        if let offset { m["off"] = .unsigned(offset) }
        switch output {
        case .bytes(let b): m["output"] = .bytes(b)
        case .number(let n): m["output"] = .unsigned(n)
        }
        return .map(m)
    }

    public init(body: CBOR) throws(SMPWireError) {
        let f = try Fields(body, .fileHash)
        let raw = try f.required(f.map["output"], "output")
        let output: Output
        switch raw {
        case .bytes(let b): output = .bytes(b)
        case .unsigned(let n): output = .number(n)
        default: throw SMPWireError(.badField("output"), "\(SMPCommand.fileHash) field \"output\" is \(raw), expected a byte string or an unsigned integer")
        }
        self.init(type: SMPFileHashType(rawValue: try f.required(f.text("type"), "type")), offset: try f.uint64("off"),
                  length: try f.required(f.uint64("len"), "len"), output: output)
    }
}

extension String {
    /// A 32-bit value as 8 lower-case hex digits.
    init(format8 value: UInt32) {
        let digits = String(value, radix: 16)
        self = String(repeating: "0", count: 8 - digits.count) + digits
    }
}

/// An answer to a file management request.
public enum SMPFileResponse: Hashable, Sendable {
    /// Upload: `{"off"}`, the file's length on the device now (the next offset it takes).
    case uploaded(offset: UInt64)
    /// Download: `{"off", "data", "len"?}`; `len` (the whole file's) on the answer at offset 0.
    case chunk(offset: UInt64, data: [UInt8], length: UInt64?)
    /// Status: `{"len"}`.
    case status(length: UInt64)
    case hash(SMPFileHash)
    /// Supported types: `{"types": {name: {"format": 0 number | 1 bytes, "size": n}}}`.
    case hashTypes([SMPFileHashType: (format: UInt64, size: UInt64)])
    /// Close: `{}`.
    case closed
    /// A server's refusal of an upload chunk that is not at the file's end (OFFSET_NOT_VALID),
    /// with `len`, that end: `{"err": {"group": 8, "rc": 11}, "len": n}`. A central reads it as
    /// `SMPResponse.error`, as every refusal.
    case offsetMismatch(length: UInt64)

    public static func == (a: SMPFileResponse, b: SMPFileResponse) -> Bool { a.body == b.body }
    public func hash(into hasher: inout Hasher) { hasher.combine(body) }

    public var body: CBOR {
        switch self {
        case .uploaded(let offset): ["off": .unsigned(offset)]
        case .chunk(let offset, let data, let length):
            length.map { ["off": .unsigned(offset), "data": .bytes(data), "len": .unsigned($0)] } ?? ["off": .unsigned(offset), "data": .bytes(data)]
        case .status(let length): ["len": .unsigned(length)]
        case .hash(let h): h.body
        case .hashTypes(let types):
            .map(["types": .map(Dictionary(uniqueKeysWithValues: types.map { name, t in
                (CBOR.text(name.rawValue), CBOR.map(["format": .unsigned(t.format), "size": .unsigned(t.size)]))
            }))])
        case .closed: [:]
        case .offsetMismatch(let length):
            ["err": ["group": .unsigned(UInt64(SMPGroup.fs.rawValue)), "rc": .int(FileManagementError.offsetNotValid.rawValue)], "len": .unsigned(length)]
        }
    }

    /// Reads a successful answer (errors are read before, by `SMPResponse`): any field order and
    /// encoding, unknown fields ignored, a v1 `rc` of 0 taken as no error.
    public init(body: CBOR, command: SMPCommand, operation: SMPOperation) throws(SMPWireError) {
        let f = try Fields(body, command)
        switch (command, operation) {
        case (.fileTransfer, .writeResponse): self = .uploaded(offset: try f.required(f.uint64("off"), "off"))
        case (.fileTransfer, .readResponse):
            self = .chunk(offset: try f.required(f.uint64("off"), "off"), data: try f.required(f.bytes("data"), "data"), length: try f.uint64("len"))
        case (.fileStatus, .readResponse): self = .status(length: try f.required(f.uint64("len"), "len"))
        case (.fileHash, .readResponse): self = .hash(try SMPFileHash(body: body))
        case (.fileHashTypes, .readResponse):
            guard let types = try f.required(f.map["types"], "types").map else {
                throw SMPWireError(.badField("types"), "\(command) field \"types\" is not a map")
            }
            var out: [SMPFileHashType: (format: UInt64, size: UInt64)] = [:]
            for (key, value) in types {
                guard let name = key.text else { throw SMPWireError(.badField("types"), "\(command) names a type with \(key), not text") }
                let t = try Fields(value, command)
                out[SMPFileHashType(rawValue: name)] = (try t.required(t.uint64("format"), "format"), try t.required(t.uint64("size"), "size"))
            }
            self = .hashTypes(out)
        case (.fileClose, .writeResponse): self = .closed
        default:
            throw SMPWireError(.unsupportedCommand, "\(operation) of \(command) is not a response this codec knows")
        }
    }
}
