import Dispatch
import Synchronization
#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// The server's end of the socket a GATT application hands bluetoothd in answer to
/// `GattCharacteristic1.AcquireWrite` (doc/org.bluez.GattCharacteristic.rst, "AcquireWrite"):
/// a `SOCK_SEQPACKET` pair where each datagram bluetoothd sends is the value of one write to the
/// characteristic, without a D-Bus call per write.
///
/// Why a server wants it: for a write that reaches it through `WriteValue`, bluetoothd reads the
/// central's address from the ATT socket when it builds the call, and a write command it handles
/// just after the link went down leaves no address there; bluetoothd 5.66 (and later) then makes
/// an invalid D-Bus object path and libdbus aborts the whole daemon (src/gatt-database.c,
/// `append_options`; seen on the 6.12 kernel, scripts/bluez-vm/README.md "Pitfalls"). Writes to an
/// acquired characteristic go to the socket instead, and one that arrives after the link is gone
/// is refused there without a D-Bus call. The price: the writes bluetoothd holds while it waits
/// for the reply reach the socket as copies of the ATT PDU it read last (`pending_write_new`
/// keeps a pointer into its receive buffer), which only a protocol whose writes carry their
/// place can take (the native one: a gap, answered and sent again).
final class PeripheralWriteSocket: Sendable {
    /// The socket's end for bluetoothd; passed in the reply, then closed here (`closePeerEnd`).
    let peerEnd: Int32
    private let fd: Int32
    private let state = Mutex(State())

    private struct State {
        var open = true
        var peerOpen = true
        /// `start`'s handler suspended the source and nobody resumed it yet.
        var suspended = false
        /// A datagram is owed: bluetoothd acquired the socket because a write was pending.
        var firstOwed = true
        var source: SourceHandle?
    }

    private struct SourceHandle: @unchecked Sendable {
        let source: any DispatchSourceRead
    }

    /// A new socket pair, or nil with the reason.
    static func make() -> Result<PeripheralWriteSocket, SocketError> {
        var fds: [Int32] = [-1, -1]
        let type = Int32(SOCK_SEQPACKET.rawValue) | Int32(SOCK_CLOEXEC.rawValue)
        guard socketpair(AF_UNIX, type, 0, &fds) == 0 else {
            return .failure(SocketError(message: "socketpair failed: \(String(cString: strerror(errno)))"))
        }
        return .success(PeripheralWriteSocket(fd: fds[0], peerEnd: fds[1]))
    }

    struct SocketError: Error { let message: String }

    private init(fd: Int32, peerEnd: Int32) {
        self.fd = fd
        self.peerEnd = peerEnd
        let flags = fcntl(fd, F_GETFL)
        if flags >= 0 { _ = fcntl(fd, F_SETFL, flags | O_NONBLOCK) }
    }

    /// Calls `readable` when datagrams wait (or bluetoothd hung up), and not again until `resume`:
    /// the caller reads them in its own order of work, then resumes.
    func start(readable: @escaping @Sendable () -> Void) {
        let source = DispatchSource.makeReadSource(fileDescriptor: fd, queue: DispatchQueue.global())
        source.setEventHandler { [weak self, source] in
            guard let self else { return }
            let suspended = state.withLock { state -> Bool in
                guard state.open, !state.suspended else { return false }
                source.suspend()
                state.suspended = true
                return true
            }
            if suspended { readable() }
        }
        let fd = self.fd
        source.setCancelHandler { _ = closeDescriptor(fd) }
        state.withLock { $0.source = SourceHandle(source: source) }
        source.resume()
    }

    /// Watches for readable data again after `start`'s handler ran.
    func resume() {
        state.withLock { state in
            guard state.open, state.suspended else { return }
            state.suspended = false
            state.source?.source.resume()
        }
    }

    /// The peer end is in the reply (libdbus duplicates it into the message): close ours.
    func closePeerEnd() {
        let wasOpen = state.withLock { s -> Bool in defer { s.peerOpen = false }; return s.peerOpen }
        if wasOpen { _ = closeDescriptor(peerEnd) }
    }

    /// What `read` found.
    struct Reading: Sendable {
        var values: [[UInt8]] = []
        /// bluetoothd closed its end: no more writes come this way.
        var hungUp = false
    }

    /// Every datagram waiting now, without blocking; when bluetoothd acquired the socket for a
    /// pending write and none came yet, first waits for it, at most `firstWait` (bluetoothd sends
    /// the writes it held once it has the reply, while the call that follows them may already be
    /// here), then reads until the socket has been quiet for `settle` (at most `settleLimit`
    /// in all: a central streaming on keeps it busy), so that the writes it held are all read.
    func read(firstWait: Duration = .seconds(1), settle: Duration = .milliseconds(5),
              settleLimit: Duration = .milliseconds(100)) async -> Reading {
        var reading = Reading()
        let owed = state.withLock { state -> Bool in
            defer { state.firstOwed = false }
            return state.firstOwed && state.open
        }
        if owed {
            _ = await waitReadable(timeout: firstWait)
        }
        drain(into: &reading)
        if owed && !reading.values.isEmpty {
            let clock = ContinuousClock()
            let end = clock.now + settleLimit
            while !reading.hungUp, clock.now < end, await waitReadable(timeout: settle) { drain(into: &reading) }
        }
        return reading
    }

    private func drain(into reading: inout Reading) {
        // An ATT value is at most 512 bytes.
        var buffer = [UInt8](repeating: 0, count: 4096)
        while true {
            let (count, error) = state.withLock { state -> (Int, Int32) in
                guard state.open else { return (0, 0) }
                let count = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, Int32(MSG_DONTWAIT)) }
                return (count, count < 0 ? errno : 0)
            }
            if count > 0 {
                reading.values.append(Array(buffer[0..<count]))
            } else if count < 0 && error == EINTR {
                continue
            } else {
                if count == 0 || (error != EAGAIN && error != EWOULDBLOCK) { reading.hungUp = true }
                return
            }
        }
    }

    /// Waits until a datagram waits, at most `timeout`, on a dispatch thread so that no task
    /// thread blocks. True when one does.
    private func waitReadable(timeout: Duration) async -> Bool {
        let fd = self.fd
        let milliseconds = Int32(clamping: Int64(timeout.seconds * 1000))
        guard state.withLock({ $0.open }) else { return false }
        return await withCheckedContinuation { continuation in
            DispatchQueue.global().async {
                var pfd = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
                var result: Int32
                repeat { result = poll(&pfd, 1, max(milliseconds, 1)) } while result < 0 && errno == EINTR
                continuation.resume(returning: result > 0 && pfd.revents & Int16(POLLIN) != 0)
            }
        }
    }

    /// Closes the server's end (once): bluetoothd sees the hang-up and acquires again on the next write.
    func close() {
        closePeerEnd()
        let closeNow = state.withLock { state -> Bool in
            guard state.open else { return false }
            state.open = false
            guard let source = state.source?.source else { return true }
            // The cancel handler closes the descriptor; a suspended source runs it only once resumed.
            source.cancel()
            if state.suspended {
                state.suspended = false
                source.resume()
            }
            return false
        }
        if closeNow { _ = closeDescriptor(fd) }
    }

    deinit { close() }
}
