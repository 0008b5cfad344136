import Crypto
import GATT
import OTA
import OTAWire

/// How `SMPClient.verifyFile` checked an uploaded file against the device.
public struct SMPFileCheck: Sendable, Hashable {
    /// `sha256` or `crc32` (the device's hash of the file), or `length` when it has neither.
    public var method: String
    /// The device's digest in hex; nil for `length`.
    public var digest: String?
}

/// fs_mgmt (group 8) file transfers over one SMP client, one request in flight, each frame at
/// most the device's `buf_size` (MCUmgr parameters; one ATT write when the device does not say),
/// as smpclient's `upload_file` and `download_file` send them. A request with no answer within
/// the timeout is sent again (three times at most): a download reads at any offset, and an
/// upload chunk the device already took is refused with OFFSET_NOT_VALID, after which the upload
/// goes on from the file's end on the device (file status).
extension SMPClient {
    /// Requests sent again after a timeout before the transfer fails.
    static let fileRetries = 3
    /// Offset refusals an upload goes on from before it fails.
    static let fileResumes = 8

    /// The largest request frame: the device's `buf_size`, or one ATT write (MTU − 3) for a
    /// server without the MCUmgr parameters read (smpclient's fallback).
    public func frameLimit(timeout: Duration) async throws(OTAError) -> Int {
        var sequence: UInt8 = 0
        if case .mcumgrParameters(let p) = try await retried(.mcumgrParameters, sequence: &sequence, timeout: timeout), p.bufferSize > 0 {
            return Int(p.bufferSize)
        }
        do {
            return ATTWriteLimit.value(mtu: try await connection.mtu())
        } catch {
            throw OTAError.from(error, device: device)
        }
    }

    /// Writes `bytes` to `path` on the device, reporting the device's offset after each chunk.
    ///
    /// - Throws: `OTAError`: the device's refusal (`fileRefusal`), `.timeout` after the retries,
    ///   `.connection` when the link drops, `.protocolError` for an answer that makes no sense.
    public func putFile(_ bytes: [UInt8], to path: String, timeout: Duration,
                        progress: (Int) -> Void = { _ in }) async throws(OTAError) {
        let limit = try await frameLimit(timeout: timeout)
        var offset = 0
        var restarts = 0
        var stalls = 0
        var sequence: UInt8 = 1
        while true {
            var chunk = SMPFileUpload(name: path, offset: UInt64(offset), data: [], length: offset == 0 ? UInt64(bytes.count) : nil)
            let capacity = chunk.maxDataSize(frameLimit: limit)
            guard capacity > 0 || bytes.isEmpty else {
                throw OTAError(.incompatibleDevice, "the path \(path) (\(path.utf8.count) bytes) leaves no room for data in \(device)'s \(limit)-byte SMP buffer",
                               hint: "use a shorter path, or raise CONFIG_MCUMGR_TRANSPORT_NETBUF_SIZE on the device")
            }
            chunk.data = Array(bytes[offset..<min(bytes.count, offset + capacity)])
            let answer: SMPResponse
            if offset == 0 {
                answer = try await firstChunk(chunk, sequence: &sequence, timeout: timeout)
            } else {
                answer = try await fileCall(.upload(chunk), path: path, sequence: &sequence, timeout: timeout)
            }
            switch answer {
            case .file(.uploaded(let off)):
                guard off <= UInt64(bytes.count), off >= UInt64(offset) || offset == 0 else {
                    throw OTAError(.protocolError, "\(device) answered the upload of \(path) at \(offset) with offset \(off), outside the \(bytes.count)-byte file")
                }
                stalls = Int(off) == offset && !chunk.data.isEmpty ? stalls + 1 : 0
                guard stalls < Self.fileRetries else {
                    throw OTAError(.protocolError, "\(device) takes no data of \(path) at offset \(offset)", resumable: true)
                }
                offset = Int(off)
                progress(offset)
                if offset == bytes.count { return }
            case .error(let e) where e.fileError == .offsetNotValid && restarts < Self.fileResumes:
                // The device's file is not where this upload stands (a chunk it took whose
                // answer was lost, or another writer) and it dropped the upload: go on from the
                // file's end on the device when that is within this file (the hash check at the
                // end catches another writer), else start over.
                restarts += 1
                let end = try await fileStatus(path, timeout: timeout)
                offset = end <= bytes.count ? end : 0
                progress(offset)
            case .error(let e):
                throw fileRefusal(e, path: path, request: "the upload of \(path)")
            default:
                throw OTAError(.protocolError, "\(device) answered the upload of \(path) with \(answer)")
            }
        }
    }

    /// Sends an upload's first chunk. Zephyr keeps the offset of an upload still open when it
    /// is sent offset 0 again (fs_mgmt.c resets it only when it opens the file), so the answer to
    /// a first chunk sent twice would place the next one past the file's end: after a timeout,
    /// or an answer that is not the chunk's end, the client closes the file (fs 4) and sends the
    /// first chunk again, at most `fileRetries` times.
    private func firstChunk(_ chunk: SMPFileUpload, sequence: inout UInt8, timeout: Duration) async throws(OTAError) -> SMPResponse {
        var attempt = 0
        while true {
            defer { sequence &+= 1 }
            let answer: SMPResponse
            do {
                answer = try await send(.file(.upload(chunk)), sequence: sequence, timeout: timeout)
            } catch where error.code == .timeout && attempt < Self.fileRetries {
                attempt += 1
                _ = try await retried(.file(.close), sequence: &sequence, timeout: timeout)
                continue
            }
            guard case .file(.uploaded(let off)) = answer, off != UInt64(chunk.data.count), attempt < Self.fileRetries else { return answer }
            attempt += 1
            _ = try await retried(.file(.close), sequence: &sequence, timeout: timeout)
        }
    }

    /// Reads the file at `path` from the device, reporting the bytes received after each chunk.
    /// At most `maxSize` bytes are taken.
    public func getFile(_ path: String, timeout: Duration, maxSize: Int = 64 << 20,
                        progress: (_ received: Int, _ total: Int) -> Void = { _, _ in }) async throws(OTAError) -> [UInt8] {
        var data: [UInt8] = []
        var total: Int?
        var sequence: UInt8 = 1
        while total.map({ data.count < $0 }) ?? true {
            let answer = try await fileCall(.download(name: path, offset: UInt64(data.count)), path: path, sequence: &sequence, timeout: timeout)
            switch answer {
            case .file(.chunk(let offset, let chunk, let length)):
                guard offset == UInt64(data.count) else {
                    throw OTAError(.protocolError, "\(device) answered the download of \(path) at \(data.count) with data at \(offset)")
                }
                if total == nil {
                    guard let length else { throw OTAError(.protocolError, "\(device) answered the download of \(path) without its length (len)") }
                    guard length <= UInt64(maxSize) else {
                        throw OTAError(.imageTooLarge, "\(path) on \(device) is \(length) bytes, over the \(maxSize)-byte limit of a download")
                    }
                    total = Int(length)
                }
                let expected = total ?? 0
                guard !chunk.isEmpty || data.count == expected, data.count + chunk.count <= expected else {
                    throw OTAError(.protocolError, "\(device) sent \(chunk.count) bytes of \(path) at \(data.count) of its \(expected) bytes: the file changed during the download; run it again", resumable: true)
                }
                data += chunk
                progress(data.count, expected)
            case .error(let e):
                throw fileRefusal(e, path: path, request: "the download of \(path)")
            default:
                throw OTAError(.protocolError, "\(device) answered the download of \(path) with \(answer)")
            }
        }
        return data
    }

    /// The device's hash or checksum of the file at `path` (its default type when `type` is nil).
    public func fileHash(_ path: String, type: SMPFileHashType?, timeout: Duration) async throws(OTAError) -> SMPFileHash {
        var sequence: UInt8 = 1
        let answer = try await fileCall(.hash(name: path, type: type), path: path, sequence: &sequence, timeout: timeout)
        switch answer {
        case .file(.hash(let h)): return h
        case .error(let e): throw fileRefusal(e, path: path, request: "the \(type?.rawValue ?? "default") hash of \(path)")
        default: throw OTAError(.protocolError, "\(device) answered the hash of \(path) with \(answer)")
        }
    }

    /// The length of the file at `path` on the device.
    public func fileStatus(_ path: String, timeout: Duration) async throws(OTAError) -> Int {
        var sequence: UInt8 = 1
        let answer = try await fileCall(.status(name: path), path: path, sequence: &sequence, timeout: timeout)
        switch answer {
        case .file(.status(let length)): return Int(clamping: length)
        case .error(let e): throw fileRefusal(e, path: path, request: "the status of \(path)")
        default: throw OTAError(.protocolError, "\(device) answered the status of \(path) with \(answer)")
        }
    }

    /// Checks the file at `path` against `bytes` by the device's SHA-256, else its CRC32 (a
    /// device built without SHA-256), else its length (a device without hash/checksum).
    ///
    /// - Throws: `.verifyFailed` when the device's file differs.
    public func verifyFile(_ path: String, against bytes: [UInt8], timeout: Duration) async throws(OTAError) -> SMPFileCheck {
        var sequence: UInt8 = 1
        if !bytes.isEmpty {
            types: for type in [SMPFileHashType.sha256, .crc32] {
                let answer = try await fileCall(.hash(name: path, type: type), path: path, sequence: &sequence, timeout: timeout)
                switch answer {
                case .file(.hash(let h)):
                    let local = type == .sha256 ? SMPFileHash.Output.bytes(Array(SHA256.hash(data: bytes))) : .number(UInt64(CRC32.checksum(bytes)))
                    guard h.length == UInt64(bytes.count), h.output == local else {
                        throw OTAError(.verifyFailed, "\(path) on \(device) differs from what was sent: its \(type) is \(h.hex) over \(h.length) bytes, the file's \(SMPFileHash(type: type, length: UInt64(bytes.count), output: local).hex) over \(bytes.count); run files put again")
                    }
                    return SMPFileCheck(method: type.rawValue, digest: h.hex)
                case .error(let e) where e.fileError == .hashNotFound:
                    continue types
                case .error(let e) where e.general == .notSupported:
                    break types
                case .error(let e):
                    throw fileRefusal(e, path: path, request: "the \(type) hash of \(path)")
                default:
                    throw OTAError(.protocolError, "\(device) answered the hash of \(path) with \(answer)")
                }
            }
        }
        let length = try await fileStatus(path, timeout: timeout)
        guard length == bytes.count else {
            throw OTAError(.verifyFailed, "\(path) on \(device) is \(length) bytes, not the \(bytes.count) sent; run files put again")
        }
        return SMPFileCheck(method: "length", digest: nil)
    }

    /// Sends a file request, again after a timeout (at most `fileRetries` times), each with a
    /// new sequence number so a late answer to an earlier one is not taken for it.
    private func fileCall(_ request: SMPFileRequest, path: String, sequence: inout UInt8, timeout: Duration) async throws(OTAError) -> SMPResponse {
        try await retried(.file(request), sequence: &sequence, timeout: timeout)
    }

    private func retried(_ request: SMPRequest, sequence: inout UInt8, timeout: Duration) async throws(OTAError) -> SMPResponse {
        var attempt = 0
        while true {
            defer { sequence &+= 1 }
            do {
                return try await send(request, sequence: sequence, timeout: timeout)
            } catch where error.code == .timeout && attempt < Self.fileRetries {
                attempt += 1
            }
        }
    }

    /// A refusal of a file request as the one line the CLI prints, with what the general codes
    /// mean for a file: EINVAL is a path the device does not take, ENOTSUP a device without
    /// fs_mgmt or that command.
    func fileRefusal(_ e: SMPDeviceError, path: String, request: String) -> OTAError {
        switch e.general {
        case .invalidValue?:
            OTAError(.protocolError, "\(device) refused \(request): invalid value (3): the path (\(path.utf8.count) bytes) is longer than the device takes (CONFIG_MCUMGR_GRP_FS_PATH_LEN, 64 bytes by default) or empty; give a shorter absolute path", cause: e)
        case .notSupported?:
            OTAError(.incompatibleDevice, "\(device) refused \(request): not supported (8): its MCUmgr lacks file management or this command (CONFIG_MCUMGR_GRP_FS, CONFIG_MCUMGR_GRP_FS_FILE_STATUS, CONFIG_MCUMGR_GRP_FS_CHECKSUM_HASH)", cause: e)
        default:
            e.otaError(device: device, request: request)
        }
    }
}
