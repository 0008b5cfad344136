import Foundation
import GATT
import Logging
import OTAWire

/// Runs `body`, failing with a `timeout` GATTError naming `what` when it takes longer than `limit`.
public func withTimeout<T: Sendable>(_ limit: Duration, clock: any MonotonicClock, _ what: String,
                                     _ body: @escaping @Sendable () async throws(GATTError) -> T) async throws(GATTError) -> T {
    // A racing timer would make virtual time jump ahead of the one flow that runs on it; there,
    // every wait is computed by the link model and bounded by it.
    if clock is VirtualClock { return try await body() }
    let result: Result<T, GATTError>? = await withTaskGroup(of: Result<T, GATTError>?.self) { group in
        group.addTask {
            do throws(GATTError) { return .success(try await body()) } catch { return .failure(error) }
        }
        group.addTask {
            try? await clock.sleep(for: limit)
            return nil
        }
        let first = await group.next() ?? nil
        group.cancelAll()
        return first
    }
    guard let result else { throw GATTError(.timeout, "\(what) took longer than \(limit.seconds) s") }
    return try result.get()
}
