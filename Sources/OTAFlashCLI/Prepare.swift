import GATT
import OTA
import Synchronization

/// What the first connection to a device showed, and where the sessions go.
struct DevicePreparation: Sendable {
    /// Why the protocol was chosen, with what the device exposes when that could be read.
    let reason: String
    /// Set when the profile moved the device into its update mode first (buttonless entry).
    let entry: UpdateModeEntry?
    /// The first connection, up and discovered, for the first session to go on with; nil after
    /// an entry (the link is gone) and when the first connection failed.
    let connection: (any GATTConnection)?
}

extension FlashPlan {
    /// Connects to a single device before its sessions: checks the protocol against the services
    /// the device exposes (`ProtocolRegistry.resolve`) and lets the profile move the device into
    /// its update mode (Nordic buttonless entry, `OTAProfile.enterUpdateMode`).
    ///
    /// A first connection that fails in a way the session's supervisor retries (a failed connect,
    /// a timeout) is left to the first session; the protocol then goes unchecked against the
    /// services, as before any connection.
    ///
    /// - Throws: `OTAError`: the device was not found (or Bluetooth is unavailable), exposes
    ///   services of another protocol than the image's, or could not be moved into its update mode.
    func prepare(protocol name: String, central: any GATTCentral, address: DeviceAddress, timeouts: SessionTimeouts,
                 limits: UpdateModeLimits) async throws(OTAError) -> DevicePreparation {
        let unread = DevicePreparation(reason: reason, entry: nil, connection: nil)
        let connection: any GATTConnection
        do {
            connection = try await central.connect(to: address, timeout: timeouts.connect)
        } catch {
            // What the session's supervisor would retry is left to it; the rest ends the run here.
            let failure = OTAError.from(error, device: address.description)
            if Task.isCancelled { throw interrupted(address) }
            guard failure.resumable, failure.code == .connection || failure.code == .timeout else { throw failure }
            return unread
        }
        let services: [GATTService]
        do {
            services = try await withTimeout(timeouts.discovery, clock: connection.clock, "discovering services") { () async throws(GATTError) in
                try await connection.discoverServices()
            }
        } catch {
            await connection.disconnect()
            return unread
        }
        do throws(OTAError) {
            let resolution = try ProtocolRegistry.cli.resolve(name, format: format, services: Set(services.map(\.uuid)))
            let entry = try await profile.enterUpdateMode(on: connection, services: services, device: address, limits: limits)
            if entry != nil { await connection.disconnect() }
            return DevicePreparation(reason: resolution.reason + contents, entry: entry, connection: entry == nil ? connection : nil)
        } catch {
            await connection.disconnect()
            if Task.isCancelled { throw interrupted(address) }
            throw OTAError(error.code, error.message.hasPrefix("\(address)") ? error.message : "\(address): \(error.message)",
                           hint: error.hint, resumable: error.resumable, cause: error.cause)
        }
    }
}

private func interrupted(_ address: DeviceAddress) -> OTAError {
    OTAError(.interrupted, "interrupted before anything was sent to \(address)", hint: "run the same command again")
}

/// A value handed between tasks: the connection `prepare` made, taken by the first session that
/// connects; the bootloader's address, read after the run.
final class Slot<Value: Sendable>: Sendable {
    private let value: Mutex<Value?>

    init(_ value: Value? = nil) {
        self.value = Mutex(value)
    }

    var current: Value? {
        get { value.withLock { $0 } }
        set { value.withLock { $0 = newValue } }
    }

    /// The value, leaving the slot empty.
    func take() -> Value? {
        value.withLock { v in
            defer { v = nil }
            return v
        }
    }
}
