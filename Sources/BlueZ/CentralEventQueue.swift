import Dispatch
import GATT
import Synchronization

/// The one ordered queue of a `BlueZConnection`: notifications, completions of submitted writes
/// and the disconnect, in the order they happened (see `GATTConnection`).
///
/// A waiter is a continuation plus a one-shot timer; nothing polls. After the first
/// `.disconnected` event nothing more is queued, so a consumer sees exactly one.
final class CentralEventQueue: Sendable {
    private struct Waiter {
        let id: UInt64
        let continuation: CheckedContinuation<GATTEvent?, Never>
        let timer: TimerHandle?
    }

    private struct State {
        var events: [GATTEvent] = []
        var head = 0
        var waiters: [Waiter] = []
        var nextID: UInt64 = 0
        var disconnected = false

        mutating func pop() -> GATTEvent? {
            guard head < events.count else { return nil }
            let event = events[head]
            head += 1
            if head > 256, head * 2 > events.count {
                events.removeFirst(head)
                head = 0
            }
            return event
        }
    }

    private let state = Mutex(State())

    /// True once a `.disconnected` event was queued.
    var isDisconnected: Bool { state.withLock { $0.disconnected } }

    /// Queues an event, or hands it to the oldest waiter. Dropped once a disconnect was queued.
    func push(_ event: GATTEvent) {
        let waiter: Waiter? = state.withLock { s in
            guard !s.disconnected else { return nil }
            if case .disconnected = event { s.disconnected = true }
            if !s.waiters.isEmpty { return s.waiters.removeFirst() }
            s.events.append(event)
            return nil
        }
        guard let waiter else { return }
        waiter.timer?.item.cancel()
        waiter.continuation.resume(returning: event)
    }

    func poll() -> GATTEvent? {
        state.withLock { $0.pop() }
    }

    /// The next event, waiting at most `timeout`; nil on timeout or cancellation.
    func next(timeout: Duration) async -> GATTEvent? {
        if let event = poll() { return event }
        guard timeout > .zero else { return nil }
        let id = state.withLock { s -> UInt64 in
            s.nextID += 1
            return s.nextID
        }
        return await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<GATTEvent?, Never>) in
                let timer = TimerHandle(DispatchWorkItem { [weak self] in self?.expire(id) })
                let immediate: GATTEvent?? = state.withLock { s in
                    if let event = s.pop() { return .some(event) }
                    if Task.isCancelled { return .some(nil) }
                    s.waiters.append(Waiter(id: id, continuation: continuation, timer: timer))
                    return .none
                }
                if let immediate {
                    continuation.resume(returning: immediate)
                    return
                }
                DispatchQueue.global().asyncAfter(deadline: .now() + timeout.dispatchInterval, execute: timer.item)
            }
        } onCancel: {
            expire(id)
        }
    }

    /// Ends one waiter with nil (its timer fired or its task was cancelled).
    private func expire(_ id: UInt64) {
        let waiter: Waiter? = state.withLock { s in
            guard let index = s.waiters.firstIndex(where: { $0.id == id }) else { return nil }
            return s.waiters.remove(at: index)
        }
        guard let waiter else { return }
        waiter.timer?.item.cancel()
        waiter.continuation.resume(returning: nil)
    }
}

/// A value that tasks can wait on until it satisfies a condition, with a timeout: the wait is a
/// continuation resumed by the change or by a one-shot timer.
final class Watched<Value: Sendable>: Sendable {
    private struct Waiter {
        let id: UInt64
        let condition: @Sendable (Value) -> Bool
        let continuation: CheckedContinuation<Bool, Never>
        let timer: TimerHandle
    }

    private struct State {
        var value: Value
        var waiters: [Waiter] = []
        var nextID: UInt64 = 0
    }

    private let state: Mutex<State>

    init(_ value: Value) { state = Mutex(State(value: value)) }

    var value: Value { state.withLock { $0.value } }

    /// Changes the value and wakes every waiter whose condition now holds.
    func update(_ change: (inout Value) -> Void) {
        let ready: [Waiter] = state.withLock { s in
            change(&s.value)
            let value = s.value
            var ready: [Waiter] = []
            s.waiters.removeAll { w in
                guard w.condition(value) else { return false }
                ready.append(w)
                return true
            }
            return ready
        }
        for waiter in ready {
            waiter.timer.item.cancel()
            waiter.continuation.resume(returning: true)
        }
    }

    /// Waits until `condition` holds, at most `timeout`; false on timeout or cancellation.
    func wait(timeout: Duration, until condition: @escaping @Sendable (Value) -> Bool) async -> Bool {
        if condition(value) { return true }
        guard timeout > .zero else { return false }
        let id = state.withLock { s -> UInt64 in
            s.nextID += 1
            return s.nextID
        }
        return await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Bool, Never>) in
                let timer = TimerHandle(DispatchWorkItem { [weak self] in self?.expire(id) })
                let immediate: Bool? = state.withLock { s in
                    if condition(s.value) { return true }
                    if Task.isCancelled { return false }
                    s.waiters.append(Waiter(id: id, condition: condition, continuation: continuation, timer: timer))
                    return nil
                }
                if let immediate {
                    continuation.resume(returning: immediate)
                    return
                }
                DispatchQueue.global().asyncAfter(deadline: .now() + timeout.dispatchInterval, execute: timer.item)
            }
        } onCancel: {
            expire(id)
        }
    }

    private func expire(_ id: UInt64) {
        let waiter: Waiter? = state.withLock { s in
            guard let index = s.waiters.firstIndex(where: { $0.id == id }) else { return nil }
            return s.waiters.remove(at: index)
        }
        guard let waiter else { return }
        waiter.timer.item.cancel()
        waiter.continuation.resume(returning: false)
    }
}

/// A one-shot timer's work item. `DispatchWorkItem.cancel()` is thread-safe, which is all that is
/// called on it from other threads.
struct TimerHandle: @unchecked Sendable {
    let item: DispatchWorkItem
    init(_ item: DispatchWorkItem) { self.item = item }
}

/// The first of several offered values, awaited once: a race between tasks that need not wait
/// for the losers (a D-Bus call that ignores cancellation is left to end on its own).
final class FirstOf<Value: Sendable>: Sendable {
    private struct State {
        var value: Value?
        var waiter: CheckedContinuation<Value, Never>?
    }
    private let state = Mutex(State())

    /// Offers a value; only the first counts.
    func offer(_ value: Value) {
        let waiter: CheckedContinuation<Value, Never>? = state.withLock { s in
            guard s.value == nil else { return nil }
            s.value = value
            defer { s.waiter = nil }
            return s.waiter
        }
        waiter?.resume(returning: value)
    }

    /// The first value offered (one caller).
    var value: Value {
        get async {
            await withCheckedContinuation { continuation in
                let ready: Value? = state.withLock { s in
                    if let value = s.value { return value }
                    s.waiter = continuation
                    return nil
                }
                if let ready { continuation.resume(returning: ready) }
            }
        }
    }
}
