import Dispatch
import Synchronization

/// Monotonic time as a transport sees it: real time for BlueZ, the link model's virtual time for
/// the simulator. The engine's driver reads time only through this, so timeouts, rates and
/// backoff are deterministic on the simulator.
///
/// `now` counts from an arbitrary origin (the clock's creation).
public protocol MonotonicClock: Sendable {
    var now: Duration { get }
    /// Returns once `now >= deadline`. Throws `CancellationError` when the task is cancelled.
    func sleep(until deadline: Duration) async throws
}

extension MonotonicClock {
    public func sleep(for duration: Duration) async throws {
        try await sleep(until: now + duration)
    }
}

/// Real time, from `ContinuousClock`.
public struct SystemClock: MonotonicClock {
    private let origin: ContinuousClock.Instant

    public init() { origin = ContinuousClock.now }

    public var now: Duration { ContinuousClock.now - origin }

    public func sleep(until deadline: Duration) async throws {
        try await Task.sleep(until: origin + deadline, clock: .continuous)
    }
}

/// Time that passes only when someone waits: `sleep(until:)` jumps straight to the deadline.
///
/// Correct when one logical flow of work uses it (one device session and its link), which is how
/// the simulator runs on it: whenever that flow waits, nothing else can happen before the deadline.
public final class VirtualClock: MonotonicClock {
    private let current = Mutex<Duration>(.zero)

    public init() {}

    public var now: Duration { current.withLock { $0 } }

    public func sleep(until deadline: Duration) async throws {
        try Task.checkCancellation()
        advance(to: deadline)
    }

    /// Moves time forward to `instant` (never backward).
    public func advance(to instant: Duration) {
        current.withLock { if instant > $0 { $0 = instant } }
    }
}

extension Duration {
    /// Seconds as a Double, for rates and printing.
    public var seconds: Double {
        let (s, atto) = components
        return Double(s) + Double(atto) / 1e18
    }

    /// "20 s", "18.4 s": whole seconds as they are, else to a tenth (a line for people).
    public var secondsText: String {
        let s = seconds
        return s == s.rounded() ? "\(Int(s)) s" : "\((s * 10).rounded() / 10) s"
    }

    /// The same span for a dispatch timer; `.never` past about 68 years.
    public var dispatchInterval: DispatchTimeInterval {
        let (s, atto) = components
        let nanos = s.multipliedReportingOverflow(by: 1_000_000_000)
        if nanos.overflow || s > Int64(Int32.max) { return .never }
        return .nanoseconds(Int(clamping: nanos.partialValue + atto / 1_000_000_000))
    }
}
