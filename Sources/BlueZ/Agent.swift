import DBus
import GATT
import Logging
import Synchronization

/// A BlueZ pairing agent (`org.bluez.Agent1`, doc/org.bluez.Agent.rst) exported on one D-Bus
/// connection and registered with `org.bluez.AgentManager1` (doc/org.bluez.AgentManager.rst).
///
/// bluetoothd asks the agent of the client that called `Device1.Pair`, and the default agent for
/// pairings the peer starts; it drops an agent when its connection closes, so a process that dies
/// leaves none behind. The agent answers from `credentials` alone: a factory line has nobody to
/// ask. `register` and `unregister` bracket its life; `withAgent` does both on every exit path.
public final class BlueZAgent: Sendable {
    /// How the agent answers.
    public struct Policy: Sendable, Hashable {
        public var credentials: PairingCredentials
        /// Peripheral mode: accept the pairings a central starts (Just Works confirmations and
        /// service authorizations) and be bluetoothd's default agent.
        public var servesPeripheral: Bool
        /// A central that did not ask for pairing (no --pair): when no other agent is registered
        /// the agent is bluetoothd's default one for the run, so what the pairings bluetoothd's
        /// stack starts by itself ask reaches it; it refuses each and reports what was asked
        /// (`StackPairingReports`). It never takes the default from another agent: bluetoothd sets
        /// every adapter's IO capability from the default agent (src/agent.c, `set_io_cap`).
        public var refusesStackPairing: Bool

        public init(credentials: PairingCredentials = PairingCredentials(), servesPeripheral: Bool = false,
                    refusesStackPairing: Bool = false) {
            self.credentials = credentials
            self.servesPeripheral = servesPeripheral
            self.refusesStackPairing = refusesStackPairing
        }

        /// The IO capability announced to the Security Manager (doc/org.bluez.AgentManager.rst,
        /// "RegisterAgent"): it decides the association model (Core Spec Vol 3, Part H, 2.3.5.1).
        public var capability: String {
            // No input, no output, as bluetoothd without an agent: an IO capability would make
            // the kernel ask for MITM protection (net/bluetooth/smp.c, `smp_conn_security`) and turn
            // a device's Just Works into passkey entry.
            if refusesStackPairing { return "NoInputNoOutput" }
            return switch (credentials.passkey != nil, credentials.confirmsComparison) {
            case (true, true): "KeyboardDisplay"
            case (true, false): "KeyboardOnly"
            case (false, true): "DisplayYesNo"
            case (false, false): "NoInputNoOutput"
            }
        }
    }

    static let interface = "org.bluez.Agent1"
    static let manager = "org.bluez.AgentManager1"
    static let managerPath = "/org/bluez"
    static let rejected = "org.bluez.Error.Rejected"

    public let bus: DBusConnection
    public let path: String
    public let policy: Policy
    let logger: Logger
    /// What the agent was asked, in order, for messages ("asked for a passkey").
    private let asked = Mutex<[String]>([])

    public init(bus: DBusConnection, path: String = "/org/otaflash/agent", policy: Policy, logger: Logger) {
        self.bus = bus
        self.path = path
        self.policy = policy
        self.logger = logger
    }

    /// What bluetoothd asked the agent so far.
    public var requests: [String] { asked.withLock { $0 } }

    /// Exports the agent and registers it (and, in peripheral mode, makes it the default agent).
    public func register() async throws(GATTError) {
        do {
            try await bus.export(path: path, interfaces: [interfaceObject()], ordering: .concurrent)
        } catch {
            throw BlueZErrors.map(error, "exporting the pairing agent at \(path)")
        }
        do {
            _ = try await bus.call(destination: BlueZ.service, path: Self.managerPath, interface: Self.manager, member: "RegisterAgent",
                                   arguments: [.objectPath(path), .string(policy.capability)], timeout: .seconds(10))
            if policy.servesPeripheral {
                _ = try await bus.call(destination: BlueZ.service, path: Self.managerPath, interface: Self.manager,
                                       member: "RequestDefaultAgent", arguments: [.objectPath(path)], timeout: .seconds(10))
            }
        } catch {
            await unregister()
            throw BlueZErrors.map(error, "registering the pairing agent with bluetoothd (AgentManager1.RegisterAgent)", timeout: .seconds(10))
        }
        logger.debug("pairing agent registered", metadata: ["path": "\(path)", "capability": "\(policy.capability)"])
    }

    /// Unregisters and unexports the agent; runs to its end even when the caller is cancelled.
    public func unregister() async {
        let (bus, path, logger) = (bus, path, logger)
        await Task {
            do {
                _ = try await bus.call(destination: BlueZ.service, path: Self.managerPath, interface: Self.manager,
                                       member: "UnregisterAgent", arguments: [.objectPath(path)], timeout: .seconds(5))
            } catch {
                logger.debug("UnregisterAgent failed", metadata: ["error": "\(error)"])
            }
            await bus.unexport(path: path)
        }.value
    }

    /// Runs `body` with the agent registered, and unregisters it however `body` ends.
    public func withAgent<R: Sendable>(_ body: () async throws(GATTError) -> R) async throws(GATTError) -> R {
        try await register()
        do {
            let result = try await body()
            await unregister()
            return result
        } catch {
            await unregister()
            throw error
        }
    }

    private func note(_ request: String) {
        asked.withLock { $0.append(request) }
        logger.debug("pairing agent asked", metadata: ["request": "\(request)"])
    }

    /// The `org.bluez.Agent1` methods. A question the policy cannot answer is `Rejected`, which
    /// bluetoothd turns into a failed pairing.
    func interfaceObject() -> DBusInterface {
        if policy.refusesStackPairing { return refusingInterface() }
        let policy = policy
        let reject = { @Sendable (what: String) in DBusError(name: Self.rejected, message: "otaflash has no \(what) to give") }
        let methods: [String: DBusMethodHandler] = [
            "Release": { [self] _ in note("release"); return [] },
            "Cancel": { [self] _ in note("cancel"); return [] },
            "RequestPinCode": { [self] _ in
                note("pin code")
                // A legacy PIN is the passkey's digits (BR/EDR only; LE asks for a passkey).
                guard let passkey = policy.credentials.passkey else { throw reject("PIN code (pass --passkey)") }
                return [.string(PairingCredentials.text(passkey))]
            },
            "DisplayPinCode": { [self] _ in note("display pin code"); return [] },
            "RequestPasskey": { [self] _ in
                note("passkey")
                guard let passkey = policy.credentials.passkey else { throw reject("passkey (pass --passkey)") }
                return [.uint32(passkey)]
            },
            "DisplayPasskey": { [self] _ in note("display passkey"); return [] },
            "RequestConfirmation": { [self] _ in
                note("confirmation")
                // Numeric comparison: accepted only when asked to, or by a peripheral serving a
                // factory central that has nobody to compare the numbers either.
                guard policy.credentials.confirmsComparison || policy.servesPeripheral else {
                    throw reject("confirmation of a numeric comparison (pass --confirm-pairing)")
                }
                return []
            },
            "RequestAuthorization": { [self] _ in
                note("authorization")
                // Just Works pairing a central started (doc/org.bluez.Agent.rst, "RequestAuthorization").
                guard policy.servesPeripheral else { throw reject("authorization") }
                return []
            },
            "AuthorizeService": { [self] _ in note("service authorization"); return [] },
        ]
        return DBusInterface(name: Self.interface, methods: methods)
    }

    /// Refuses every request and reports it for the device it names (its first argument).
    private func refusingInterface() -> DBusInterface {
        func refuse(_ question: StackPairing.Question?, _ what: String) -> DBusMethodHandler {
            { [self] call in
                note(what)
                if let question, let device = call.arguments.first?.objectPath { StackPairingReports.report(device, question) }
                throw DBusError(name: Self.rejected, message: "otaflash was not asked to pair (pass --pair)")
            }
        }
        let methods: [String: DBusMethodHandler] = [
            "Release": { [self] _ in note("release"); return [] },
            "Cancel": { [self] _ in note("cancel"); return [] },
            "RequestPinCode": refuse(.passkey, "pin code"),
            "DisplayPinCode": refuse(.passkey, "display pin code"),
            "RequestPasskey": refuse(.passkey, "passkey"),
            "DisplayPasskey": refuse(.passkey, "display passkey"),
            "RequestConfirmation": refuse(.confirmation, "confirmation"),
            "RequestAuthorization": refuse(.authorization, "authorization"),
            "AuthorizeService": refuse(nil, "service authorization"),
        ]
        return DBusInterface(name: Self.interface, methods: methods)
    }
}

/// Where a refusing agent (`BlueZAgent.Policy.refusesStackPairing`) reports what bluetoothd
/// asked about a device: to that device's link in this process, whichever link's agent bluetoothd
/// asked (it asks the default agent, the one registered last).
enum StackPairingReports {
    private static let links = Mutex<[String: @Sendable (StackPairing.Question) -> Void]>([:])

    static func watch(_ devicePath: String, _ report: @escaping @Sendable (StackPairing.Question) -> Void) {
        links.withLock { $0[devicePath] = report }
    }

    static func unwatch(_ devicePath: String) {
        _ = links.withLock { $0.removeValue(forKey: devicePath) }
    }

    static func report(_ devicePath: String, _ question: StackPairing.Question) {
        links.withLock { $0[devicePath] }?(question)
    }
}
