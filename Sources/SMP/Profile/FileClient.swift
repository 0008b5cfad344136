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
    /// Setbacks in a row (offset refusals, timeouts) an upload goes on from before it fails.
    static let fileResumes = 8

    /// The largest request frame and the requests kept in flight: the device's `buf_size` and
    /// `buf_count`, or one ATT write (MTU − 3) and one request for a server without the MCUmgr
    /// parameters read (smpclient's fallback).
    public func uploadLimits(timeout: Duration) async throws(OTAError) -> (frame: Int, window: Int) {
        var sequence: UInt8 = 0
        if case .mcumgrParameters(let p) = try await retried(.mcumgrParameters, sequence: &sequence, timeout: timeout), p.bufferSize > 0 {
            return (Int(p.bufferSize), max(1, Int(p.bufferCount)))
        }
        do {
            return (ATTWriteLimit.value(mtu: try await connection.mtu()), 1)
        } catch {
            throw OTAError.from(error, device: device)
        }
    }

    /// Writes `bytes` to `path` on the device, reporting the device's offset after each chunk.
    ///
    /// The first chunk goes alone (it opens and empties the file); then up to `window` chunks
    /// are in flight (at most the device's `buf_count`: Zephyr handles them in order, each at
    /// the file's end), as the image upload keeps its window; `window` 1 is smpclient's
    /// `upload_file`. An answer that is not the chunk's end, an OFFSET_NOT_VALID refusal or a
    /// timeout drains the window, reads the file's length on the device (fs 1) and goes on from
    /// there.
    ///
    /// - Throws: `OTAError`: the device's refusal (`fileRefusal`), `.timeout` after the retries,
    ///   `.connection` when the link drops, `.protocolError` for an answer that makes no sense.
    public func putFile(_ bytes: [UInt8], to path: String, timeout: Duration, window: Int = .max,
                        progress: (Int) -> Void = { _ in }) async throws(OTAError) {
        let limits = try await uploadLimits(timeout: timeout)
        let window = max(1, min(window, limits.window))
        var sequence: UInt8 = 1
        var offset = 0
        var setbacks = 0
        func chunk(at offset: Int) throws(OTAError) -> SMPFileUpload {
            var chunk = SMPFileUpload(name: path, offset: UInt64(offset), data: [], length: offset == 0 ? UInt64(bytes.count) : nil)
            let capacity = chunk.maxDataSize(frameLimit: limits.frame)
            guard capacity > 0 || bytes.isEmpty else {
                throw OTAError(.incompatibleDevice, "the path \(path) (\(path.utf8.count) bytes) leaves no room for data in \(device)'s \(limits.frame)-byte SMP buffer",
                               hint: "use a shorter path, or raise CONFIG_MCUMGR_TRANSPORT_NETBUF_SIZE on the device")
            }
            chunk.data = Array(bytes[offset..<min(bytes.count, offset + capacity)])
            return chunk
        }
        /// After a setback: the file's end on the device, where the upload goes on (from 0 when
        /// it is past this file's end).
        func resume() async throws(OTAError) -> Int {
            setbacks += 1
            guard setbacks <= Self.fileResumes else {
                throw OTAError(.protocolError, "\(device) keeps refusing the upload of \(path) at \(offset) (\(setbacks - 1) times)", resumable: true)
            }
            let end = try await fileStatus(path, timeout: timeout)
            return end <= bytes.count ? end : 0
        }

        while offset < bytes.count || offset == 0 {
            if offset == 0 {
                let first = try chunk(at: 0)
                switch try await firstChunk(first, sequence: &sequence, timeout: timeout) {
                case .file(.uploaded(let off)) where off == UInt64(first.data.count):
                    offset = Int(off)
                    setbacks = 0
                    progress(offset)
                    if bytes.count == offset { return }
                case .error(let e) where e.fileError == .offsetNotValid:
                    offset = try await resume()
                case .error(let e):
                    throw fileRefusal(e, path: path, request: "the upload of \(path)")
                case let answer:
                    throw OTAError(.protocolError, "\(device) answered the first chunk of \(path) with \(answer)")
                }
                continue
            }
            // The window: requests by sequence number, oldest first, with where each ends.
            var pending: [UInt8: SMPRequest] = [:]
            var order: [(sequence: UInt8, end: Int)] = []
            var next = offset
            var setback = false
            while offset < bytes.count {
                while !setback, order.count < window, next < bytes.count {
                    let c = try chunk(at: next)
                    try await write(.file(.upload(c)), sequence: sequence)
                    pending[sequence] = .file(.upload(c))
                    order.append((sequence, next + c.data.count))
                    next += c.data.count
                    sequence &+= 1
                }
                guard !order.isEmpty else { break }
                guard let (answered, answer) = try await self.answer(to: pending, until: connection.clock.now + timeout) else {
                    // Lost requests or answers: what is in flight may or may not be written.
                    setback = true
                    break
                }
                pending[answered] = nil
                let expected = order.first { $0.sequence == answered }?.end
                order.removeAll { $0.sequence == answered }
                switch answer {
                case .file(.uploaded(let off)) where !setback && Int(off) == expected:
                    offset = Int(off)
                    setbacks = 0
                    progress(offset)
                case .file(.uploaded):
                    setback = true
                case .error(let e) where e.fileError == .offsetNotValid:
                    setback = true
                case .error(let e):
                    throw fileRefusal(e, path: path, request: "the upload of \(path)")
                default:
                    throw OTAError(.protocolError, "\(device) answered the upload of \(path) with \(answer)")
                }
                if setback, order.isEmpty { break }
            }
            if setback {
                // Drain what is still in flight, then go on from the device's file end.
                while !order.isEmpty, let (answered, _) = try await self.answer(to: pending, until: connection.clock.now + timeout) {
                    pending[answered] = nil
                    order.removeAll { $0.sequence == answered }
                }
                offset = try await resume()
                progress(offset)
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
