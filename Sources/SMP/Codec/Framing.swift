/// Splitting SMP frames into GATT writes.
///
/// A frame (header and CBOR, at most the server's `buf_size`) goes out as consecutive writes
/// without response of at most ATT MTU - 3 bytes; the server reassembles them by the header's
/// length (Zephyr `CONFIG_MCUMGR_TRANSPORT_BT_REASSEMBLY`; smpclient `transport/ble.py`).
public enum SMPFraming {
    /// The frame's bytes in order, in pieces of at most `maxWrite` bytes (a `maxWrite` below 1 is
    /// taken as 1). An empty frame gives no pieces.
    public static func segments(_ frame: [UInt8], maxWrite: Int) -> [ArraySlice<UInt8>] {
        let size = max(1, maxWrite)
        return stride(from: 0, to: frame.count, by: size).map { frame[$0..<min($0 + size, frame.count)] }
    }

    /// The most data bytes an upload request can carry so that its whole frame (header and
    /// CBOR) is at most `frameLimit` bytes, given its body with `data` empty: the empty byte
    /// string's head (0x40) is counted there, and a longer string's head grows by 0, 1, 2 or 4
    /// bytes with its length (smpclient's request sizing, exact at the boundaries). 0 when even
    /// an empty chunk does not fit.
    public static func dataCapacity(emptyBody: CBOR, frameLimit: Int) -> Int {
        let overhead = SMPHeader.size + emptyBody.encoded.count
        let limit = min(frameLimit, SMPHeader.size + Int(UInt16.max))
        let available = limit - overhead
        guard available > 0 else { return 0 }
        var size = available
        while size > 0, size + CBOREncoder.headExtraBytes(UInt64(size)) > available { size -= 1 }
        return size
    }

    /// How many writes a frame of `frameSize` bytes takes.
    public static func writeCount(frameSize: Int, maxWrite: Int) -> Int {
        let size = max(1, maxWrite)
        return (max(0, frameSize) + size - 1) / size
    }
}

/// Rebuilds SMP frames from notifications (central) or writes (server).
///
/// Fragments are appended in order; every frame they complete comes out, by the length in its
/// header. Several frames may arrive in one fragment and one frame may span several. The buffer
/// never holds more than one incomplete frame, bounded by `maxFrameSize`. A header that is bad
/// (reserved bits, unknown version or operation, a length over the bound) throws as soon as its
/// bytes arrive, rather than leaving the reader waiting for bytes that make no frame; the buffer
/// is then cleared, since nothing after it can be trusted to start on a frame boundary.
public struct SMPReassembler: Sendable {
    /// The largest frame taken, header included.
    public let maxFrameSize: Int
    private var buffer: [UInt8] = []

    /// - Parameter maxFrameSize: the bound on one frame, header included, at most
    ///   8 + 65,535 (the header's length field). A server passes its `buf_size`.
    public init(maxFrameSize: Int = SMPHeader.size + Int(UInt16.max)) {
        self.maxFrameSize = min(max(maxFrameSize, SMPHeader.size), SMPHeader.size + Int(UInt16.max))
    }

    /// Bytes received towards the next frame.
    public var pendingBytes: Int { buffer.count }

    /// Drops a partial frame (after a reconnection, say).
    public mutating func reset() { buffer.removeAll(keepingCapacity: true) }

    /// Takes one fragment and returns the frames it completes, in order. When it throws, frames
    /// this fragment completed before the bad header are dropped with the buffer.
    public mutating func append(_ fragment: some Collection<UInt8>) throws(SMPWireError) -> [SMPFrame] {
        buffer.append(contentsOf: fragment)
        var frames: [SMPFrame] = []
        var start = 0
        while start < buffer.count {
            let available = buffer.count - start
            do throws(SMPWireError) {
                guard available >= SMPHeader.size else {
                    try SMPHeader.checkFirstByte(buffer[start])
                    break
                }
                let header = try SMPHeader(decoding: buffer[start..<start + SMPHeader.size])
                let total = SMPHeader.size + Int(header.length)
                guard total <= maxFrameSize else {
                    throw SMPWireError(.frameTooLarge, "SMP frame of \(total) bytes (\(header)) is over the limit of \(maxFrameSize)")
                }
                guard available >= total else { break }
                frames.append(SMPFrame(checked: header, length: header.length, payload: Array(buffer[start + SMPHeader.size..<start + total])))
                start += total
            } catch {
                buffer.removeAll()
                throw error
            }
        }
        buffer.removeFirst(start)
        return frames
    }
}

extension SMPHeader {
    /// Checks the first byte alone (reserved bits, version, operation), so a reader can refuse a
    /// bad frame before the rest of its header arrives.
    static func checkFirstByte(_ byte: UInt8) throws(SMPWireError) {
        _ = try SMPHeader(decoding: [byte, 0, 0, 0, 0, 0, 0, 0])
    }
}
