import GATT

/// Whether and how a device is paired around its update.
///
/// `pair`: pair before the update when the device is not bonded, and once more when it refuses
/// an operation for want of pairing or encryption (a stale bond, a link that needs an
/// authenticated key). `unpairAfter`: remove the bond when the device is done, however it ended,
/// so a line flashing thousands of units keeps none.
public struct PairingPolicy: Sendable, Hashable {
    public var pair: Bool
    public var credentials: PairingCredentials
    public var unpairAfter: Bool
    /// How long one pairing may take (BlueZ's own limit on `Device1.Pair` is longer).
    public var timeout: Duration

    public init(pair: Bool = false, credentials: PairingCredentials = PairingCredentials(), unpairAfter: Bool = false,
                timeout: Duration = .seconds(30)) {
        self.pair = pair
        self.credentials = credentials
        self.unpairAfter = unpairAfter
        self.timeout = timeout
    }

    /// No pairing, no unpairing: the default.
    public static let none = PairingPolicy()

    /// How the central takes part, for notes: "Just Works", "passkey entry".
    public var method: String {
        credentials.passkey != nil ? "passkey entry" : credentials.confirmsComparison ? "numeric comparison" : "Just Works"
    }

    /// Pairs `connection`'s peer unless it is bonded already (`force`: even then, replacing the
    /// bond). Returns true when it paired.
    ///
    /// - Throws: `OTAError` `.pairingFailed` when the device rejected the pairing, `.permission`
    ///   when the transport cannot pair, or the transport's failure.
    public func pairIfNeeded(_ connection: any GATTConnection, device: String, force: Bool = false) async throws(OTAError) -> Bool {
        guard let link = connection as? any GATTPairing else {
            throw OTAError(.permission, "\(device): this transport cannot pair", hint: "pair it with `bluetoothctl pair \(device)`, then retry without --pair")
        }
        do {
            if !force, try await link.isBonded() { return false }
            try await link.pair(credentials, timeout: timeout)
            return true
        } catch {
            throw Self.failure(error, device: device)
        }
    }

    /// Removes the bond with each of `addresses` (a device and where its bootloader answered).
    /// Failures are returned as lines to print, not thrown: the update's own result stands.
    public func unpair(_ central: any GATTCentral, _ addresses: [DeviceAddress]) async -> [String] {
        guard let store = central as? any GATTBondStore else { return ["this transport keeps no bonds to remove"] }
        var failures: [String] = []
        for address in Set(addresses).sorted(by: { $0.description < $1.description }) {
            do {
                try await store.removeBond(address)
            } catch {
                failures.append(error.message)
            }
        }
        return failures
    }

    private static func failure(_ error: GATTError, device: String) -> OTAError {
        error.code == .authenticationFailed ? OTAError(.pairingFailed, error.message, cause: error) : OTAError.from(error, device: device)
    }
}

extension OTAError {
    /// True when the device refused an operation for want of pairing or encryption.
    public var wantsPairing: Bool {
        guard code == .permission else { return false }
        return cause is StackPairing || (cause as? GATTError)?.wantsPairing == true
    }

    /// What the central's stack did by itself when the device refused, when this error says.
    public var stackPairing: StackPairing? { cause as? StackPairing }
}
