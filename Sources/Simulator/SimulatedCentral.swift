import GATT

/// A central that finds and connects to simulated devices instead of radios.
public final class SimulatedCentral: GATTCentral {
    public let clock: any MonotonicClock
    public let devices: [SimulatedDevice]

    /// - Parameter clock: `VirtualClock()` for tests and benchmarks (time passes only when the
    ///   session waits), `SystemClock()` for a demo that takes the model's real time.
    public init(devices: [SimulatedDevice], clock: any MonotonicClock = VirtualClock()) {
        self.devices = devices
        self.clock = clock
    }

    /// How long a simulated scan listens before it reports (advertising intervals are ~100 ms).
    public static let scanDwell: Duration = .milliseconds(300)

    public func scan(filter: ScanFilter, timeout: Duration) async throws(GATTError) -> [Advertisement] {
        try await sleep(min(timeout, Self.scanDwell))
        let now = clock.now
        return devices.filter { $0.isAdvertising(at: now) }.map(\.advertisement).filter(filter.matches).sorted { ($0.rssi ?? .min) > ($1.rssi ?? .min) }
    }

    public func connect(to address: DeviceAddress, timeout: Duration) async throws(GATTError) -> any GATTConnection {
        let deadline = clock.now + timeout
        guard let device = devices.first(where: { $0.address == address }) else {
            try await sleep(timeout)
            throw GATTError(.deviceNotFound, "device \(address) was not found within \(timeout.secondsText)")
        }
        // A rebooting device does not advertise: the attempt waits for it to come back, and
        // fails as a connection error when that is past the deadline.
        let (availableAt, gone) = device.state.withLock { s in
            (s.model.availableAt, s.model.refusesConnection(after: s.connections))
        }
        if gone || availableAt > deadline {
            try await sleep(until: deadline)
            throw GATTError(.connectFailed, "connecting to \(address) failed: no answer within \(timeout.secondsText)")
        }
        try await sleep(until: max(clock.now, availableAt))
        try await sleep(device.config.link.timed ? device.config.link.connectionInterval * 3 : .zero)
        device.state.withLock { s in
            s.connections += 1
            s.connected = true
            s.model.mtuChanged(device.config.link.mtu)
        }
        return SimulatedConnection(device: device, clock: clock)
    }

    private func sleep(_ d: Duration) async throws(GATTError) {
        try await sleep(until: clock.now + d)
    }

    private func sleep(until t: Duration) async throws(GATTError) {
        do {
            try await clock.sleep(until: t)
        } catch {
            throw GATTError(.failed, "cancelled")
        }
    }
}
