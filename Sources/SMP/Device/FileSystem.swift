import Crypto
import OTAWire

/// The file system behind a simulated Zephyr device's fs_mgmt (MCUmgr group 8): files in RAM
/// under mount points (`/lfs`, as LittleFS is mounted in Zephyr's samples), and fs_mgmt's one
/// transfer context, as `subsys/mgmt/mcumgr/grp/fs_mgmt/src/fs_mgmt.c` keeps them.
///
/// What it does, as fs_mgmt does:
/// - a name that is empty or longer than `pathLimit` (`CONFIG_MCUMGR_GRP_FS_PATH_LEN`, 64) is
///   MGMT_ERR_EINVAL (a general code, not the group's), and so is an upload at offset 0
///   without `len`.
/// - one upload or download at a time: a request for another file, or of the other kind, drops
///   the open one. An upload opens its file with create (no mount point there:
///   MOUNT_POINT_NOT_FOUND; a directory: UNKNOWN, as LittleFS's -EISDIR maps); its first chunk
///   with data empties an existing file; a chunk at another offset than the file's end is
///   refused with OFFSET_NOT_VALID and `len` (that end), and the context dropped, so the next
///   chunk starts from the file as it stands. A write past `capacity` (the file system full)
///   is WRITE_FAILED. Zephyr keeps the context's offset when an open upload is sent offset 0
///   again (its next chunk then mismatches once); so does the model.
/// - a download chunk is at most `buf_size` − 47 bytes (`MCUMGR_GRP_FS_DL_CHUNK_SIZE`); the
///   answer at offset 0 carries `len`.
/// - status answers `len`; hash/checksum `crc32` (IEEE, a number) and `sha256` (32 bytes) over
///   `off`..`off + len` (the default type crc32 when the device has it), FILE_EMPTY for an
///   empty file, OFFSET_LARGER_THAN_FILE past its end, HASH_NOT_FOUND for a type it lacks.
/// - a reset loses the context (RAM), never the files (flash).
public struct SMPFileSystem: Sendable, Hashable {
    public struct Config: Sendable, Hashable {
        /// Where file systems are mounted; a path must lie under one.
        public var mountPoints: [String]
        /// The longest path taken (`CONFIG_MCUMGR_GRP_FS_PATH_LEN`).
        public var pathLimit: Int
        /// Bytes all files together may hold (the partition's size, less LittleFS's own blocks).
        public var capacity: Int
        /// The hash and checksum types built in, in fs_mgmt's registration order.
        public var hashTypes: [SMPFileHashType]
        /// Answer file status (`CONFIG_MCUMGR_GRP_FS_FILE_STATUS`); else MGMT_ERR_ENOTSUP.
        public var answersStatus: Bool
        /// Answer the supported types command (`..._CHECKSUM_HASH_SUPPORTED_CMD`).
        public var answersHashTypes: Bool
        /// The files present at power-on, by path.
        public var files: [String: [UInt8]]

        public init(mountPoints: [String] = ["/lfs"], pathLimit: Int = 64, capacity: Int = 64 * 1024,
                    hashTypes: [SMPFileHashType] = [.crc32, .sha256], answersStatus: Bool = true, answersHashTypes: Bool = true,
                    files: [String: [UInt8]] = [:]) {
            self.mountPoints = mountPoints
            self.pathLimit = pathLimit
            self.capacity = capacity
            self.hashTypes = hashTypes
            self.answersStatus = answersStatus
            self.answersHashTypes = answersHashTypes
            self.files = files
        }
    }

    /// fs_mgmt's transfer context.
    enum Transfer: Sendable, Hashable {
        case none
        case upload(path: String, offset: Int, length: Int)
        case download(path: String, offset: Int, length: Int)
    }

    public let config: Config
    public private(set) var files: [String: [UInt8]]
    private(set) var transfer = Transfer.none

    public init(_ config: Config = Config()) {
        self.config = config
        files = config.files
    }

    /// Bytes the files hold together.
    public var used: Int { files.values.reduce(0) { $0 + $1.count } }

    /// The download chunk for a server of `bufferSize`: what is left of its buffer after the
    /// header and the answer's other fields at their longest (fs_mgmt_config.h).
    public static func downloadChunk(bufferSize: Int) -> Int { max(1, bufferSize - 47) }

    /// A reset: the context is lost with the RAM; the files stay.
    public mutating func rebooted() { transfer = .none }

    /// The answer to a file management request.
    public mutating func handle(_ request: SMPFileRequest, bufferSize: Int) -> SMPResponse {
        switch request {
        case .upload(let chunk): return upload(chunk)
        case .download(let name, let offset): return download(name, offset: offset, chunk: Self.downloadChunk(bufferSize: bufferSize))
        case .status(let name):
            guard config.answersStatus else { return .error(.general(.notSupported)) }
            guard valid(name) else { return .error(.general(.invalidValue)) }
            switch length(of: name) {
            case .success(let n): return .file(.status(length: UInt64(n)))
            case .failure(let e): return .error(.file(e))
            }
        case .hash(let name, let type, let offset, let length):
            return hash(name, type: type, offset: offset ?? 0, length: length)
        case .hashTypes:
            guard config.answersHashTypes else { return .error(.general(.notSupported)) }
            var types: [SMPFileHashType: (format: UInt64, size: UInt64)] = [:]
            for t in config.hashTypes { types[t] = t == .sha256 ? (1, 32) : (0, 4) }
            return .file(.hashTypes(types))
        case .close:
            transfer = .none
            return .file(.closed)
        }
    }

    private func valid(_ name: String) -> Bool { !name.isEmpty && name.utf8.count <= config.pathLimit }

    private func mounted(_ path: String) -> Bool {
        config.mountPoints.contains { path.hasPrefix($0 + "/") && path.count > $0.count + 1 }
    }

    private func isDirectory(_ path: String) -> Bool {
        config.mountPoints.contains(path) || path.hasSuffix("/") || files.keys.contains { $0.hasPrefix(path + "/") }
    }

    /// fs_mgmt_filelen: the file's size, or why there is none.
    private func length(of path: String) -> Result<Int, FileManagementError> {
        if isDirectory(path) { return .failure(.isDirectory) }
        guard mounted(path), let bytes = files[path] else { return .failure(.notFound) }
        return .success(bytes.count)
    }

    private mutating func upload(_ chunk: SMPFileUpload) -> SMPResponse {
        guard valid(chunk.name), chunk.offset != 0 || chunk.length != nil,
              let off = Int(exactly: chunk.offset) else { return .error(.general(.invalidValue)) }
        let path = chunk.name
        var (offset, length) = (0, 0)
        if case .upload(path, let o, let l) = transfer {
            (offset, length) = (o, l)
        } else {
            // Open with create (fs_open FS_O_CREATE | FS_O_WRITE).
            if isDirectory(path) { return cleanup(.error(.file(.unknown))) }
            guard mounted(path) else { return cleanup(.error(.file(.mountPointNotFound))) }
            if files[path] == nil { files[path] = [] }
        }
        var existing = 0
        if off == 0 {
            length = Int(clamping: chunk.length ?? 0)
            existing = files[path]?.count ?? 0
        } else if offset == 0 {
            offset = files[path]?.count ?? 0
        }
        if off > 0, off != offset {
            // The client must decide: the file's end goes back with the refusal.
            return cleanup(.file(.offsetMismatch(length: UInt64(offset))))
        }
        if !chunk.data.isEmpty {
            if off == 0, existing != 0 { files[path] = [] }
            guard used + chunk.data.count <= config.capacity else { return cleanup(.error(.file(.writeFailed))) }
            files[path, default: []] += chunk.data
            offset += chunk.data.count
        }
        transfer = length > 0 && offset >= length ? .none : .upload(path: path, offset: offset, length: length)
        return .file(.uploaded(offset: UInt64(offset)))
    }

    private mutating func download(_ path: String, offset: UInt64, chunk: Int) -> SMPResponse {
        guard valid(path) else { return .error(.general(.invalidValue)) }
        var length: Int
        if case .download(path, _, let l) = transfer {
            length = l
        } else {
            transfer = .none
            switch self.length(of: path) {
            case .success(let n): length = n
            case .failure(let e): return .error(.file(e))
            }
        }
        let bytes = files[path] ?? []
        let start = Int(clamping: min(offset, UInt64(bytes.count)))
        let data = Array(bytes[start..<min(bytes.count, start + chunk)])
        let end = start + data.count
        transfer = length > 0 && end >= length ? .none : .download(path: path, offset: end, length: length)
        return .file(.chunk(offset: offset, data: data, length: offset == 0 ? UInt64(length) : nil))
    }

    private func hash(_ path: String, type: SMPFileHashType?, offset: UInt64, length: UInt64?) -> SMPResponse {
        guard valid(path), length != 0 else { return .error(.general(.invalidValue)) }
        let type = type ?? (config.hashTypes.contains(.crc32) ? .crc32 : config.hashTypes.first ?? .sha256)
        guard config.hashTypes.contains(type) else { return .error(.file(.hashNotFound)) }
        let size: Int
        switch self.length(of: path) {
        case .success(let n): size = n
        case .failure(let e): return .error(.file(e))
        }
        guard UInt64(size) > offset else { return .error(.file(size == 0 ? .fileEmpty : .offsetLargerThanFile)) }
        let start = Int(offset)
        let end = length.map { start + Int(clamping: min($0, UInt64(size - start))) } ?? size
        let range = (files[path] ?? [])[start..<end]
        let output: SMPFileHash.Output = type == .sha256 ? .bytes(Array(SHA256.hash(data: Array(range)))) : .number(UInt64(CRC32.checksum(range)))
        return .file(.hash(SMPFileHash(type: type, offset: offset == 0 ? nil : offset, length: UInt64(range.count), output: output)))
    }

    /// Drops the transfer context (fs_mgmt_cleanup) and answers `response`.
    private mutating func cleanup(_ response: SMPResponse) -> SMPResponse {
        transfer = .none
        return response
    }
}

extension SMPServer {
    /// A file management answer's fields in the order fs_mgmt writes them (mcumgr's with `rc` 0
    /// first); the offset refusal as `err` then `len` (v1 and mcumgr: the general code, then `len`).
    static func fileBody(_ answer: SMPFileResponse, to request: SMPHeader, encoding: SMPReplyEncoding) -> DeviceCBOR {
        let rc: [DeviceCBOR.Entry] = encoding == .tinycbor ? [.init(key: "rc", value: .unsigned(0))] : []
        func entries(_ list: [(String, DeviceCBOR)]) -> DeviceCBOR { .map(rc + list.map { DeviceCBOR.Entry(key: $0.0, value: $0.1) }) }
        switch answer {
        case .uploaded(let offset):
            return entries([("off", .unsigned(offset))])
        case .chunk(let offset, let data, let length):
            return entries([("off", .unsigned(offset)), ("data", .bytes(data))] + (length.map { [("len", DeviceCBOR.unsigned($0))] } ?? []))
        case .status(let length):
            return entries([("len", .unsigned(length))])
        case .hash(let h):
            var list: [(String, DeviceCBOR)] = [("type", .text(h.type.rawValue))]
            if let off = h.offset { list.append(("off", .unsigned(off))) }
            list.append(("len", .unsigned(h.length)))
            switch h.output {
            case .bytes(let b): list.append(("output", .bytes(b)))
            case .number(let n): list.append(("output", .unsigned(n)))
            }
            return entries(list)
        case .hashTypes(let types):
            let order: [SMPFileHashType] = [.crc32, .sha256]
            let names = order.filter { types[$0] != nil } + types.keys.filter { !order.contains($0) }.sorted { $0.rawValue < $1.rawValue }
            return .map([.init(key: "types", value: .map(names.map { name in
                let t = types[name] ?? (0, 0)
                return DeviceCBOR.Entry(key: name.rawValue, value: .map(["format": .unsigned(t.format), "size": .unsigned(t.size)]))
            }))])
        case .closed:
            return .map([])
        case .offsetMismatch(let length):
            let refusal: DeviceCBOR.Entry = encoding == .tinycbor || request.version == .v1
                ? .init(key: "rc", value: .unsigned(UInt64(FileManagementError.offsetNotValid.legacyCode.rawValue)))
                : .init(key: "err", value: .map(["group": .unsigned(UInt64(SMPGroup.fs.rawValue)), "rc": .unsigned(UInt64(FileManagementError.offsetNotValid.rawValue))]))
            return .map([refusal, .init(key: "len", value: .unsigned(length))])
        }
    }
}

extension SMPPeripheral {
    /// Where a file transfer request lies in its file, for fault placement: an upload chunk at
    /// its offset and size, a download request at its offset and the chunk it asks for.
    static func filePosition(_ frame: SMPFrame, bufferSize: Int) -> (offset: Int, count: Int)? {
        switch try? SMPFileRequest(decoding: frame) {
        case .upload(let u)?: Int(exactly: u.offset).map { ($0, u.data.count) }
        case .download(_, let offset)?: Int(exactly: offset).map { ($0, SMPFileSystem.downloadChunk(bufferSize: bufferSize)) }
        default: nil
        }
    }
}
