/// An error from a GATT transport: a code callers can match on and a message a person can act on.
///
/// The code is an open set (a struct with static members), so a transport can add codes without
/// breaking anyone's `switch`.
public struct GATTError: Error, Sendable, Hashable, CustomStringConvertible {
    public struct Code: Hashable, Sendable, CustomStringConvertible {
        public let name: String
        public init(_ name: String) { self.name = name }
        public var description: String { name }

        /// The characteristic lacks the property the operation needs (BlueZ `NotPermitted`).
        public static let notPermitted = Code("not-permitted")
        /// The peer wants pairing or encryption first (BlueZ `NotAuthorized`).
        public static let notAuthorized = Code("not-authorized")
        public static let serviceNotFound = Code("service-not-found")
        public static let characteristicNotFound = Code("characteristic-not-found")
        public static let deviceNotFound = Code("device-not-found")
        public static let connectFailed = Code("connect-failed")
        public static let notConnected = Code("not-connected")
        /// The peer answered with an ATT error (see `attError`).
        public static let attError = Code("att-error")
        public static let timeout = Code("timeout")
        /// Another request is still in flight (BlueZ `InProgress`).
        public static let inProgress = Code("in-progress")
        public static let invalidArgument = Code("invalid-argument")
        /// No adapter, adapter powered off, stack not running.
        public static let adapterUnavailable = Code("adapter-unavailable")
        public static let stackUnavailable = Code("stack-unavailable")
        public static let permissionDenied = Code("permission-denied")
        /// Any other transport failure.
        public static let failed = Code("failed")
    }

    public var code: Code
    public var message: String
    /// Set when `code` is `.attError`.
    public var attError: ATTError?

    public init(_ code: Code, _ message: String, attError: ATTError? = nil) {
        self.code = code
        self.message = message
        self.attError = attError
    }

    public static func att(_ error: ATTError, _ context: String) -> GATTError {
        GATTError(.attError, "\(context): ATT error \(error)", attError: error)
    }

    public var description: String { message }
}

/// An ATT error code (Core Spec Vol 3, Part F, 3.4.1.1). Unknown codes still decode and print.
public struct ATTError: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
    public let rawValue: UInt8
    public init(rawValue: UInt8) { self.rawValue = rawValue }

    public static let invalidHandle = ATTError(rawValue: 0x01)
    public static let readNotPermitted = ATTError(rawValue: 0x02)
    public static let writeNotPermitted = ATTError(rawValue: 0x03)
    public static let invalidPDU = ATTError(rawValue: 0x04)
    public static let insufficientAuthentication = ATTError(rawValue: 0x05)
    public static let requestNotSupported = ATTError(rawValue: 0x06)
    public static let invalidOffset = ATTError(rawValue: 0x07)
    public static let insufficientAuthorization = ATTError(rawValue: 0x08)
    public static let attributeNotFound = ATTError(rawValue: 0x0A)
    public static let invalidAttributeValueLength = ATTError(rawValue: 0x0D)
    public static let unlikelyError = ATTError(rawValue: 0x0E)
    public static let insufficientEncryption = ATTError(rawValue: 0x0F)
    public static let insufficientResources = ATTError(rawValue: 0x11)

    private static let names: [UInt8: String] = [
        0x01: "invalid handle", 0x02: "read not permitted", 0x03: "write not permitted", 0x04: "invalid PDU",
        0x05: "insufficient authentication", 0x06: "request not supported", 0x07: "invalid offset",
        0x08: "insufficient authorization", 0x09: "prepare queue full", 0x0A: "attribute not found",
        0x0B: "attribute not long", 0x0C: "insufficient encryption key size",
        0x0D: "invalid attribute value length", 0x0E: "unlikely error", 0x0F: "insufficient encryption",
        0x10: "unsupported group type", 0x11: "insufficient resources",
    ]

    public var description: String {
        let hex = "0x" + (rawValue < 16 ? "0" : "") + String(rawValue, radix: 16)
        if let name = Self.names[rawValue] { return "\(hex) (\(name))" }
        if (0x80...0x9F).contains(rawValue) { return "\(hex) (application error)" }
        return "\(hex) (reserved)"
    }
}
