import GATT
import OTAWire

/// A failed update: what failed and what to do next, in one line, plus a kind that decides the
/// exit code.
public struct OTAError: Error, Sendable, Hashable, CustomStringConvertible {
    /// Failure classes. Each has its own documented exit code (README, "Exit codes").
    public enum Kind: String, Sendable, Hashable, CaseIterable {
        /// The image file cannot be used.
        case image
        /// The image does not fit the device's slot.
        case imageTooLarge
        case deviceNotFound
        /// Connecting failed, or the link was lost and not recovered. The transfer can resume.
        case connection
        /// The device lacks the OTA service, a characteristic or a property the protocol needs.
        case incompatibleDevice
        /// The device's whole-image CRC did not match at VERIFY. Nothing was activated.
        case verifyFailed
        /// The device refused a command or broke the protocol.
        case protocolError
        case timeout
        /// bluetoothd not running, no adapter, adapter off.
        case bluetoothUnavailable
        /// D-Bus permission denied, or the device wants pairing.
        case permission
        /// SIGINT/SIGTERM; the transfer can resume.
        case interrupted
        case internalError
    }

    public var kind: Kind
    /// What failed.
    public var message: String
    /// What to do next, when there is something better than reading the message.
    public var hint: String?
    /// True when running the same command again continues where this one stopped.
    public var resumable: Bool

    public init(_ kind: Kind, _ message: String, hint: String? = nil, resumable: Bool = false) {
        self.kind = kind
        self.message = message
        self.hint = hint
        self.resumable = resumable
    }

    /// The one line a person reads: what failed, then what to do.
    public var description: String { hint.map { "\(message); \($0)" } ?? message }

    /// Maps a transport error to the failure class a user acts on.
    public static func from(_ error: GATTError, device: String) -> OTAError {
        switch error.code {
        case .serviceNotFound, .characteristicNotFound, .notPermitted:
            OTAError(.incompatibleDevice, "\(error.message); is \(device) running an OTA-capable firmware?")
        case .notAuthorized:
            OTAError(.permission, "\(device) refused access: \(error.message)",
                     hint: "pair it first (`bluetoothctl pair \(device)`), then retry")
        case .permissionDenied:
            OTAError(.permission, "\(error.message)")
        case .deviceNotFound:
            OTAError(.deviceNotFound, "\(error.message); is it powered, advertising and in range?")
        case .connectFailed:
            OTAError(.connection, error.message, hint: "move it closer or power-cycle it, then retry", resumable: true)
        case .notConnected:
            OTAError(.connection, "link to \(device) lost (\(error.message))", hint: "run the same command again to resume", resumable: true)
        case .timeout:
            OTAError(.timeout, "\(error.message)", resumable: true)
        case .adapterUnavailable, .stackUnavailable:
            OTAError(.bluetoothUnavailable, error.message)
        default:
            OTAError(.protocolError, "\(device): \(error.message)")
        }
    }
}
