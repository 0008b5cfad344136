import Dispatch
import Synchronization
#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// The socket `GattCharacteristic1.AcquireWrite` hands out (doc/org.bluez.GattCharacteristic.rst,
/// "AcquireWrite"): a non-blocking `SOCK_SEQPACKET` where each datagram is one ATT Write Command,
/// with no D-Bus round trip per packet. bluetoothd hangs it up when the link goes down.
final class CentralWriteSocket: Sendable {
    enum SendResult: Sendable, Equatable {
        case sent
        /// The socket's queue is full: wait for it to drain.
        case wouldBlock
        /// The peer closed the socket: the link is gone.
        case hungUp(String)
    }

    /// The ATT MTU AcquireWrite reported.
    let mtu: Int
    private let fd: Int32
    private let shared = Shared()

    /// `open` guards the descriptor; the source is only cancelled (thread-safe in Dispatch).
    private final class Shared: Sendable {
        let open = Mutex(true)
        let source = Mutex<SourceHandle?>(nil)
    }

    private struct SourceHandle: @unchecked Sendable {
        let source: any DispatchSourceRead
    }

    /// Takes ownership of `fd`; `onHangup` runs once if bluetoothd closes its end.
    init(fd: Int32, mtu: Int, onHangup: @escaping @Sendable () -> Void) {
        self.fd = fd
        self.mtu = mtu
        let flags = fcntl(fd, F_GETFL)
        if flags >= 0 { _ = fcntl(fd, F_SETFL, flags | O_NONBLOCK) }
        // Nothing is ever sent to us on this socket, so "readable" means end of file (HUP).
        let source = DispatchSource.makeReadSource(fileDescriptor: fd, queue: DispatchQueue.global())
        let shared = self.shared
        source.setEventHandler { [source] in
            var byte: UInt8 = 0
            let count = recv(fd, &byte, 1, Int32(MSG_DONTWAIT | MSG_PEEK))
            if count > 0 {
                _ = recv(fd, &byte, 1, Int32(MSG_DONTWAIT))
                return
            }
            if count < 0 && (errno == EAGAIN || errno == EINTR) { return }
            let wasOpen = shared.open.withLock { o -> Bool in defer { o = false }; return o }
            source.cancel()
            if wasOpen { onHangup() }
        }
        source.setCancelHandler { _ = closeDescriptor(fd) }
        source.resume()
        shared.source.withLock { $0 = SourceHandle(source: source) }
    }

    /// Sends one datagram without waiting.
    func send(_ packet: [UInt8]) -> SendResult {
        // Under the lock, so the descriptor cannot be closed (and its number reused) meanwhile.
        let (count, error) = shared.open.withLock { isOpen -> (Int, Int32) in
            guard isOpen else { return (-1, EPIPE) }
            let count = packet.withUnsafeBytes { socketSend(fd, $0.baseAddress, $0.count, Int32(MSG_DONTWAIT | MSG_NOSIGNAL)) }
            return (count, count < 0 ? errno : 0)
        }
        if count >= 0 { return .sent }
        switch error {
        case EAGAIN, EWOULDBLOCK, ENOBUFS, EINTR: return .wouldBlock
        case EPIPE, ECONNRESET, ENOTCONN: return .hungUp("bluetoothd closed the write socket (\(String(cString: strerror(error))))")
        default: return .hungUp("sending on the write socket failed: \(String(cString: strerror(error)))")
        }
    }

    /// Waits until the socket can take a datagram (POLLOUT), at most `timeout`, on a dispatch
    /// thread so that no task thread blocks.
    func waitWritable(timeout: Duration) async -> WaitResult {
        let fd = self.fd
        let milliseconds = Int32(clamping: Int64(timeout.seconds * 1000))
        return await withCheckedContinuation { continuation in
            DispatchQueue.global().async {
                var pfd = pollfd(fd: fd, events: Int16(POLLOUT), revents: 0)
                var result: Int32
                repeat { result = poll(&pfd, 1, max(milliseconds, 1)) } while result < 0 && errno == EINTR
                if result == 0 {
                    continuation.resume(returning: .timedOut)
                } else if result < 0 || pfd.revents & Int16(POLLHUP | POLLERR | POLLNVAL) != 0 {
                    continuation.resume(returning: .hungUp)
                } else {
                    continuation.resume(returning: .writable)
                }
            }
        }
    }

    enum WaitResult: Sendable { case writable, timedOut, hungUp }

    /// Closes the socket (once).
    func close() {
        let wasOpen = shared.open.withLock { o -> Bool in defer { o = false }; return o }
        if wasOpen { shared.source.withLock { $0?.source.cancel() } }
    }

    deinit { close() }
}

#if canImport(Glibc)
private let socketSend = Glibc.send
#elseif canImport(Musl)
private let socketSend = Musl.send
#endif

#if canImport(Glibc)
/// `close(2)` (a name of its own: the sockets' classes have a `close()` method).
let closeDescriptor = Glibc.close
#elseif canImport(Musl)
let closeDescriptor = Musl.close
#endif
