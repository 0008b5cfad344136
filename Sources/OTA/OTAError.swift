import GATT
import OTAWire

/// A failed update: a code that decides the exit code, what failed and what to do next in one
/// line, and the error it came from.
///
/// Shaped like swift-nio's `FileSystemError`: the code is a struct wrapping a private enum, so a
/// new code can be added without breaking anyone's `switch` (match codes with `==` or `case .x:`
/// plus a `default`).
public struct OTAError: Error, Sendable, Hashable, CustomStringConvertible {
    /// A failure class. Each has its own documented exit code (README, "Exit codes").
    public struct Code: Hashable, Sendable, CustomStringConvertible, CaseIterable {
        private enum Wrapped: String, Hashable, Sendable, CaseIterable {
            case image, imageTooLarge, deviceNotFound, connection, incompatibleDevice, verifyFailed
            case protocolError, timeout, bluetoothUnavailable, permission, pairingFailed, interrupted, internalError
            case bondLeft
            case ledgerFailed
            case checkFailed
            case heldElsewhere
            case notConfirmed
        }

        private let wrapped: Wrapped

        private init(_ wrapped: Wrapped) { self.wrapped = wrapped }

        /// The image file cannot be used.
        public static var image: Self { Self(.image) }
        /// The image does not fit the device's slot.
        public static var imageTooLarge: Self { Self(.imageTooLarge) }
        public static var deviceNotFound: Self { Self(.deviceNotFound) }
        /// Connecting failed, or the link was lost and not recovered. The transfer can resume.
        public static var connection: Self { Self(.connection) }
        /// The device lacks the OTA service, a characteristic or a property the protocol needs.
        public static var incompatibleDevice: Self { Self(.incompatibleDevice) }
        /// The device's whole-image CRC did not match at VERIFY. Nothing was activated.
        public static var verifyFailed: Self { Self(.verifyFailed) }
        /// The device refused a command or broke the protocol.
        public static var protocolError: Self { Self(.protocolError) }
        /// A reply, a phase or a connection attempt took longer than its limit.
        public static var timeout: Self { Self(.timeout) }
        /// bluetoothd not running, no adapter, adapter off.
        public static var bluetoothUnavailable: Self { Self(.bluetoothUnavailable) }
        /// D-Bus permission denied, or the device wants pairing.
        public static var permission: Self { Self(.permission) }
        /// Pairing was refused: a wrong passkey, an unconfirmed comparison, a device that rejects it.
        public static var pairingFailed: Self { Self(.pairingFailed) }
        /// SIGINT/SIGTERM; the transfer can resume.
        public static var interrupted: Self { Self(.interrupted) }
        /// The update went through, but a bond otaflash was to remove (`--unpair-after`, or one
        /// the stack made by itself without `--pair`) could not be removed.
        public static var bondLeft: Self { Self(.bondLeft) }
        public static var internalError: Self { Self(.internalError) }
        /// The device's record could not be written where the run keeps its records; nothing was sent.
        public static var ledgerFailed: Self { Self(.ledgerFailed) }
        /// The new image booted but failed the check before its confirm (SMP `--confirm
        /// after-check`): it was left unconfirmed, for the bootloader to revert at the next reset.
        public static var checkFailed: Self { Self(.checkFailed) }
        /// Another station holds the device's claim in the shared ledger and flashes it; nothing was sent.
        public static var heldElsewhere: Self { Self(.heldElsewhere) }

        /// The image was sent and the command that activates it went out and was carried out (the
        /// device reset, as it does to activate), but its answer was lost and the device's next
        /// state could not be read to confirm the activation: sent and executed, not confirmed.
        public static var notConfirmed: Self { Self(.notConfirmed) }

        /// Every code this version knows; later versions may add more.
        public static var allCases: [Self] { Wrapped.allCases.map(Self.init) }

        /// The code's name, e.g. `verifyFailed`.
        public var description: String { wrapped.rawValue }
    }

    public var code: Code
    /// What failed.
    public var message: String
    /// What to do next, when there is something better than reading the message.
    public var hint: String?
    /// True when running the same command again continues where this one stopped.
    public var resumable: Bool
    /// The error this one came from, when there is one: the transport's `GATTError`, an errno, an
    /// undecodable value's error. For logs and programs; the message already says it for people.
    public var cause: (any Error)?

    public init(_ code: Code, _ message: String, hint: String? = nil, resumable: Bool = false, cause: (any Error)? = nil) {
        self.code = code
        self.message = message
        self.hint = hint
        self.resumable = resumable
        self.cause = cause
    }

    /// The advice a resumable failure ends with: what a device that keeps its progress wants.
    public static let resumeAdvice = "run the same command again to resume"

    /// This error as a device of a protocol that cannot resume leaves it: the advice to run again
    /// to resume becomes to reset the device first, and the error is no longer resumable.
    public func startingOver(protocolName: String) -> OTAError {
        guard resumable || hint?.contains(Self.resumeAdvice) == true else { return self }
        let reset = "reset the device (power cycle, or its reset button), then run the same command again: the \(protocolName) protocol cannot resume"
        let advice = hint.map { $0.contains(Self.resumeAdvice) ? $0.replacingOccurrences(of: Self.resumeAdvice, with: reset) : "\($0); \(reset)" } ?? reset
        return OTAError(code, message, hint: advice, resumable: false, cause: cause)
    }

    /// The one line a person reads: what failed, then what to do.
    public var description: String { hint.map { "\(message); \($0)" } ?? message }

    /// Two errors are equal when they say the same thing and came from equal-looking causes.
    public static func == (a: OTAError, b: OTAError) -> Bool {
        a.code == b.code && a.message == b.message && a.hint == b.hint && a.resumable == b.resumable
            && a.causeText == b.causeText
    }

    public func hash(into hasher: inout Hasher) {
        hasher.combine(code)
        hasher.combine(message)
        hasher.combine(hint)
        hasher.combine(resumable)
        hasher.combine(causeText)
    }

    private var causeText: String? { cause.map { String(reflecting: $0) } }

    /// The device refused access for want of pairing: `stack` says what the central's stack did
    /// about it by itself (paired Just Works, or asked for a passkey nobody gave), `cause` the
    /// refusal the device answered, when one came back.
    /// - Parameter stillRefused: the device refused (or the link failed) after the stack's own
    ///   Just Works bond: an unauthenticated key is not enough for it.
    public static func pairingRequired(device: String, stack: StackPairing?, cause: GATTError?, stillRefused: Bool = false) -> OTAError {
        var what = [cause?.message, stack?.description].compactMap { $0 }.joined(separator: "; ")
        let authenticated = stack?.asked == .passkey || (stillRefused && stack?.bonded == true && stack?.asked == nil)
        if authenticated, stack?.asked == nil { what += ", and that bond was not enough: it wants an authenticated one" }
        let hint = switch stack?.asked {
        case _ where authenticated: "pass --pair --passkey with the passkey it shows or expects (or --confirm-pairing for a numeric comparison)"
        case .confirmation?: "pass --pair --confirm-pairing to accept its numeric comparison (or --passkey when it shows or expects one)"
        default: "pass --pair to pair with it first (add --passkey when it shows or expects one)"
        }
        return OTAError(.permission, "\(device) requires pairing: \(what.isEmpty ? "it refused access" : what)", hint: hint,
                        cause: stack.map { $0 as any Error } ?? cause)
    }

    /// Maps a transport error to the failure class a user acts on; the transport error is the cause.
    public static func from(_ error: GATTError, device: String) -> OTAError {
        if error.wantsPairing {
            return OTAError(.permission, "\(device) refused access: \(error.message)",
                            hint: "pass --pair to pair with it first (add --passkey when it shows or expects one)", cause: error)
        }
        return switch error.code {
        case .serviceNotFound, .characteristicNotFound, .notPermitted:
            OTAError(.incompatibleDevice, "\(error.message); is \(device) running an OTA-capable firmware?", cause: error)
        case .authenticationFailed:
            OTAError(.pairingFailed, error.message, cause: error)
        case .permissionDenied:
            OTAError(.permission, "\(error.message)", cause: error)
        case .deviceNotFound:
            OTAError(.deviceNotFound, "\(error.message); is it powered, advertising and in range?", cause: error)
        case .connectFailed:
            OTAError(.connection, error.message, hint: "move it closer or power-cycle it, then retry", resumable: true, cause: error)
        case .notConnected:
            OTAError(.connection, "link to \(device) lost (\(error.message))", hint: OTAError.resumeAdvice,
                     resumable: true, cause: error)
        case .timeout:
            OTAError(.timeout, "\(error.message)", resumable: true, cause: error)
        case .adapterUnavailable, .stackUnavailable:
            OTAError(.bluetoothUnavailable, error.message, cause: error)
        default:
            OTAError(.protocolError, "\(device): \(error.message)", cause: error)
        }
    }
}
