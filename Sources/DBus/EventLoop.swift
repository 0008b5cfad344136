internal import CDBus
import Dispatch
import Synchronization

#if canImport(Glibc)
import Glibc
private let closeDescriptor = Glibc.close
#elseif canImport(Musl)
import Musl
private let closeDescriptor = Musl.close
#endif

/// Runs an actor's jobs on one private serial `DispatchQueue`.
///
/// Each ``DBusConnection`` is isolated to its own queue, and the same queue drives libdbus's
/// watches, timeouts and dispatching, so every libdbus call and callback for a connection happens
/// on one serial context and actor-isolated state can be touched from C callbacks with
/// `assumeIsolated`. (`DispatchSerialQueue` is not an executor on Linux, hence this small type.)
final class DBusQueueExecutor: SerialExecutor {
    let queue: DispatchQueue

    init(label: String) {
        queue = DispatchQueue(label: label)
    }

    func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        queue.async {
            job.runSynchronously(on: self.asUnownedSerialExecutor())
        }
    }

    func asUnownedSerialExecutor() -> UnownedSerialExecutor {
        UnownedSerialExecutor(ordinary: self)
    }

    /// Lets `assumeIsolated` succeed inside libdbus callbacks and `DispatchSource` handlers, which
    /// run on the queue without being actor jobs.
    func checkIsolated() {
        dispatchPrecondition(condition: .onQueue(queue))
    }
}

/// The libdbus side of one connection: the `DBusConnection*`, and the glue that lets a
/// `DispatchQueue` act as libdbus's main loop.
///
/// libdbus has no event loop of its own; an application provides one through
/// `dbus_connection_set_watch_functions` (file descriptors to poll), `set_timeout_functions`
/// (timers, e.g. for reply timeouts) and `set_dispatch_status_function` (incoming messages are
/// queued and must be dispatched outside the callback). See the libdbus reference, "DBusConnection"
/// and "DBusWatch". Here each watch becomes a `DispatchSource` on `queue` and each timeout a
/// `DispatchSourceTimer`.
///
/// `@unchecked Sendable`: every mutable field is only touched on `queue` (libdbus invokes these
/// callbacks from calls made on the queue, and the sources target it); the methods assert this.
final class EventLoop: @unchecked Sendable {
    let queue: DispatchQueue
    private(set) var connection: OpaquePointer?
    /// Receives incoming messages and reply notifications; weak so that a dropped connection
    /// object can be released while libdbus still holds this loop.
    weak var owner: DBusConnection?
    private var drainScheduled = false
    /// Its watches' enables and sources.
    let watchCounts = WatchCounts()

    init(queue: DispatchQueue) {
        self.queue = queue
    }

    /// Installs the main-loop glue on a freshly opened private connection.
    func install(_ connection: OpaquePointer, owner: DBusConnection) throws(DBusError) {
        dispatchPrecondition(condition: .onQueue(queue))
        self.connection = connection
        self.owner = owner
        // A private connection must not call _exit() when the peer goes away.
        dbus_connection_set_exit_on_disconnect(connection, 0)
        let ok =
            dbus_connection_set_watch_functions(
                connection, eventLoopAddWatch, eventLoopRemoveWatch, eventLoopToggleWatch,
                retainedSelf(), eventLoopRelease) != 0
            && dbus_connection_set_timeout_functions(
                connection, eventLoopAddTimeout, eventLoopRemoveTimeout, eventLoopToggleTimeout,
                retainedSelf(), eventLoopRelease) != 0
            && dbus_connection_add_filter(connection, eventLoopFilter, retainedSelf(), eventLoopRelease) != 0
        dbus_connection_set_dispatch_status_function(
            connection, eventLoopDispatchStatus, retainedSelf(), eventLoopRelease)
        guard ok else {
            close()
            throw DBusError(name: DBusError.Name.noMemory, message: "could not install the libdbus main loop")
        }
        if dbus_connection_get_dispatch_status(connection) == DBUS_DISPATCH_DATA_REMAINS {
            scheduleDrain()
        }
    }

    private func retainedSelf() -> UnsafeMutableRawPointer {
        Unmanaged.passRetained(self).toOpaque()
    }

    /// Closes and releases the connection (a private connection must be closed before its last
    /// unref, per `dbus_connection_open_private`). libdbus then removes all watches and timeouts.
    func close() {
        dispatchPrecondition(condition: .onQueue(queue))
        guard let connection else { return }
        self.connection = nil
        dbus_connection_close(connection)
        dbus_connection_unref(connection)
    }

    /// Dispatches queued incoming messages on a later turn of the queue.
    ///
    /// libdbus forbids dispatching from inside the dispatch-status callback
    /// (`dbus_connection_set_dispatch_status_function`), so the drain is always deferred.
    func scheduleDrain() {
        dispatchPrecondition(condition: .onQueue(queue))
        guard !drainScheduled else { return }
        drainScheduled = true
        queue.async { self.drain() }
    }

    private func drain() {
        drainScheduled = false
        guard let connection else { return }
        // Dispatch a bounded batch, then yield the queue to actor jobs and come back.
        for _ in 0..<64 {
            if dbus_connection_dispatch(connection) != DBUS_DISPATCH_DATA_REMAINS { return }
            if self.connection == nil { return }
        }
        scheduleDrain()
    }

    fileprivate func filter(_ message: OpaquePointer) -> DBusHandlerResult {
        guard let owner else { return DBUS_HANDLER_RESULT_NOT_YET_HANDLED }
        // The closure runs synchronously on this thread, inside the filter call that lends the
        // message; it never escapes, so no other context can observe it.
        nonisolated(unsafe) let message = message
        return owner.assumeIsolated { $0.handleIncoming(message) }
    }
}

/// One libdbus watch: a read or write `DispatchSource`, made when libdbus first enables the watch,
/// suspended while libdbus has it disabled, and cancelled when libdbus removes it.
///
/// Each source watches its own `dup` of the socket, closed by the source's cancel handler.
/// libdispatch unregisters a cancelled source asynchronously and requires that the descriptor stay
/// open until the cancel handler has run, but libdbus closes the socket right after removing its
/// watches; when the next connection reused the descriptor number, its new source was sometimes
/// never armed and the connection stalled (measured: about one connect in a few hundred).
///
/// A source is made once per watch, not once per enable: libdbus enables its write watch each
/// time a message does not fit the socket at once, and a write source cancelled while
/// libdispatch's epoll backend drains a hang-up of the same connection is used after it was freed
/// (swift-corelibs-libdispatch issues 833 and 949; seen once, a central crashing in
/// `_dispatch_event_loop_drain` as a device reset). Suspending costs nothing: read and write
/// sources are `EV_DISPATCH`, re-armed only after their handler ran, so a suspended one is not
/// armed.
///
/// `@unchecked Sendable`: created, toggled and cancelled in libdbus callbacks on the connection's
/// queue, and its sources deliver events on that same queue.
final class WatchSource: @unchecked Sendable {
    private let watch: OpaquePointer
    private let queue: DispatchQueue
    private var sources: [any DispatchSourceProtocol] = []
    /// Whether the sources run (libdbus has the watch enabled); they are suspended otherwise.
    private var running = false
    private var removed = false

    private let counts: WatchCounts

    init(watch: OpaquePointer, queue: DispatchQueue, counts: WatchCounts) {
        self.watch = watch
        self.queue = queue
        self.counts = counts
        update()
    }

    private func handle(_ flags: UInt32) {
        guard !removed, running else { return }
        dbus_watch_handle(watch, flags)
    }

    /// Follows `dbus_watch_get_enabled`.
    func update() {
        guard !removed else { return }
        let enabled = dbus_watch_get_enabled(watch) != 0
        guard enabled != running else { return }
        running = enabled
        if enabled { counts.state.withLock { $0.enables += 1 } }
        if !enabled {
            for source in sources { source.suspend() }
        } else if !sources.isEmpty {
            for source in sources { source.resume() }
        } else {
            makeSources()
            for source in sources { source.activate() }
        }
    }

    private func makeSources() {
        let fd = dbus_watch_get_unix_fd(watch)
        let flags = dbus_watch_get_flags(watch)
        if flags & DBUS_WATCH_READABLE.rawValue != 0, case let watched = dup(fd), watched >= 0 {
            let source = DispatchSource.makeReadSource(fileDescriptor: watched, queue: queue)
            source.setEventHandler { [weak self] in self?.handle(DBUS_WATCH_READABLE.rawValue) }
            source.setCancelHandler { _ = closeDescriptor(watched) }
            sources.append(source)
        }
        if flags & DBUS_WATCH_WRITABLE.rawValue != 0, case let watched = dup(fd), watched >= 0 {
            let source = DispatchSource.makeWriteSource(fileDescriptor: watched, queue: queue)
            source.setEventHandler { [weak self] in self?.handle(DBUS_WATCH_WRITABLE.rawValue) }
            source.setCancelHandler { _ = closeDescriptor(watched) }
            sources.append(source)
        }
        counts.state.withLock { $0.sources += sources.count }
    }

    private func stopSources() {
        for source in sources {
            source.cancel()
            // A suspended source runs its cancel handler, and may be released, once resumed.
            if !running { source.resume() }
        }
        sources = []
        running = false
    }

    /// Called when libdbus removes the watch; the watch pointer must not be used afterwards.
    func cancel() {
        removed = true
        stopSources()
    }

    deinit { stopSources() }
}

/// How often a connection's watches were enabled and how many sources they made (the tests
/// check that a watch enabled again and again makes its sources once).
final class WatchCounts: Sendable {
    let state = Mutex((enables: 0, sources: 0))
}

/// One libdbus timeout: a repeating `DispatchSourceTimer`, present only while libdbus has the
/// timeout enabled. Re-enabling restarts the interval, as `dbus_timeout_get_interval` expects.
///
/// `@unchecked Sendable`: confined to the connection's queue like ``WatchSource``.
final class TimeoutSource: @unchecked Sendable {
    private let timeout: OpaquePointer
    private let queue: DispatchQueue
    private var timer: (any DispatchSourceTimer)?
    private var removed = false

    init(timeout: OpaquePointer, queue: DispatchQueue) {
        self.timeout = timeout
        self.queue = queue
        update()
    }

    func update() {
        guard !removed else { return }
        timer?.cancel()
        timer = nil
        guard dbus_timeout_get_enabled(timeout) != 0 else { return }
        let interval = DispatchTimeInterval.milliseconds(Int(max(1, dbus_timeout_get_interval(timeout))))
        let timer = DispatchSource.makeTimerSource(queue: queue)
        timer.setEventHandler { [weak self] in
            guard let self, !self.removed, self.timer != nil else { return }
            dbus_timeout_handle(self.timeout)
        }
        timer.schedule(deadline: .now() + interval, repeating: interval)
        timer.activate()
        self.timer = timer
    }

    /// Called when libdbus removes the timeout; the pointer must not be used afterwards.
    func cancel() {
        removed = true
        timer?.cancel()
        timer = nil
    }

    deinit { timer?.cancel() }
}

// MARK: - C callbacks (all run on the connection's queue)

private func loop(_ data: UnsafeMutableRawPointer?) -> EventLoop? {
    data.map { Unmanaged<EventLoop>.fromOpaque($0).takeUnretainedValue() }
}

private let eventLoopRelease: DBusFreeFunction = { data in
    if let data { Unmanaged<AnyObject>.fromOpaque(data).release() }
}

private let eventLoopAddWatch: DBusAddWatchFunction = { watch, data in
    guard let watch, let loop = loop(data) else { return 0 }
    let source = WatchSource(watch: watch, queue: loop.queue, counts: loop.watchCounts)
    dbus_watch_set_data(watch, Unmanaged.passRetained(source).toOpaque(), eventLoopRelease)
    return 1
}

private let eventLoopRemoveWatch: DBusRemoveWatchFunction = { watch, _ in
    guard let watch, let data = dbus_watch_get_data(watch) else { return }
    Unmanaged<WatchSource>.fromOpaque(data).takeUnretainedValue().cancel()
    dbus_watch_set_data(watch, nil, nil)
}

private let eventLoopToggleWatch: DBusWatchToggledFunction = { watch, _ in
    guard let watch, let data = dbus_watch_get_data(watch) else { return }
    Unmanaged<WatchSource>.fromOpaque(data).takeUnretainedValue().update()
}

private let eventLoopAddTimeout: DBusAddTimeoutFunction = { timeout, data in
    guard let timeout, let loop = loop(data) else { return 0 }
    let source = TimeoutSource(timeout: timeout, queue: loop.queue)
    dbus_timeout_set_data(timeout, Unmanaged.passRetained(source).toOpaque(), eventLoopRelease)
    return 1
}

private let eventLoopRemoveTimeout: DBusRemoveTimeoutFunction = { timeout, _ in
    guard let timeout, let data = dbus_timeout_get_data(timeout) else { return }
    Unmanaged<TimeoutSource>.fromOpaque(data).takeUnretainedValue().cancel()
    dbus_timeout_set_data(timeout, nil, nil)
}

private let eventLoopToggleTimeout: DBusTimeoutToggledFunction = { timeout, _ in
    guard let timeout, let data = dbus_timeout_get_data(timeout) else { return }
    Unmanaged<TimeoutSource>.fromOpaque(data).takeUnretainedValue().update()
}

private let eventLoopDispatchStatus: DBusDispatchStatusFunction = { _, status, data in
    guard status == DBUS_DISPATCH_DATA_REMAINS, let loop = loop(data) else { return }
    loop.scheduleDrain()
}

private let eventLoopFilter: DBusHandleMessageFunction = { _, message, data in
    guard let message, let loop = loop(data) else { return DBUS_HANDLER_RESULT_NOT_YET_HANDLED }
    return loop.filter(message)
}

