import DBus
import TestSupport

/// The D-Bus tests' private bus (Tests/TestSupport/PrivateBus.swift).
typealias TestBus = PrivateBus

/// Runs `body` against a fresh private bus, which is killed afterwards even if `body` throws.
func withTestBus(_ body: (TestBus) async throws -> Void) async throws {
    let bus = try TestBus.start(for: .dbus)
    defer { bus.stop() }
    try await body(bus)
}

/// Waits for the next element of a stream, failing after `timeout`.
func next<T: Sendable>(_ stream: AsyncStream<T>, timeout: Duration = .seconds(5)) async throws -> T? {
    try await nextElement(stream, timeout: timeout)
}
