/// Secure DFU control point opcodes (nRF5 SDK `nrf_dfu_op_t`, `nrf_dfu_req_handler.h`).
///
/// An open set: an opcode this version does not know still decodes and prints.
public struct DFUOpcode: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
    public let rawValue: UInt8
    public init(rawValue: UInt8) { self.rawValue = rawValue }

    public static let protocolVersion = DFUOpcode(rawValue: 0x00)
    public static let create = DFUOpcode(rawValue: 0x01)
    public static let setPRN = DFUOpcode(rawValue: 0x02)
    public static let calculateChecksum = DFUOpcode(rawValue: 0x03)
    public static let execute = DFUOpcode(rawValue: 0x04)
    public static let select = DFUOpcode(rawValue: 0x06)
    public static let mtuGet = DFUOpcode(rawValue: 0x07)
    public static let objectWrite = DFUOpcode(rawValue: 0x08)
    public static let ping = DFUOpcode(rawValue: 0x09)
    public static let hardwareVersion = DFUOpcode(rawValue: 0x0A)
    public static let firmwareVersion = DFUOpcode(rawValue: 0x0B)
    public static let abort = DFUOpcode(rawValue: 0x0C)
    /// The first byte of every control point notification.
    public static let response = DFUOpcode(rawValue: 0x60)

    private static let names: [UInt8: String] = [
        0x00: "PROTOCOL VERSION", 0x01: "CREATE", 0x02: "SET PRN", 0x03: "CALCULATE CHECKSUM", 0x04: "EXECUTE",
        0x06: "SELECT", 0x07: "MTU GET", 0x08: "OBJECT WRITE", 0x09: "PING", 0x0A: "HARDWARE VERSION",
        0x0B: "FIRMWARE VERSION", 0x0C: "ABORT", 0x60: "RESPONSE",
    ]

    public var description: String { Self.names[rawValue] ?? "opcode 0x\(hex2(rawValue))" }
}

/// The kind of object CREATE and SELECT address.
public struct DFUObjectType: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
    public let rawValue: UInt8
    public init(rawValue: UInt8) { self.rawValue = rawValue }

    /// The init packet (`.dat`).
    public static let command = DFUObjectType(rawValue: 0x01)
    /// Firmware (`.bin`).
    public static let data = DFUObjectType(rawValue: 0x02)

    public var description: String {
        switch self {
        case .command: "command object"
        case .data: "data object"
        default: "object type 0x\(hex2(rawValue))"
        }
    }
}

/// The result byte of a control point response (SDK `nrf_dfu_result_t`).
///
/// `description` is one line: what the device said and what to do about it.
public struct DFUResultCode: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
    public let rawValue: UInt8
    public init(rawValue: UInt8) { self.rawValue = rawValue }

    public static let invalid = DFUResultCode(rawValue: 0x00)
    public static let success = DFUResultCode(rawValue: 0x01)
    public static let opcodeNotSupported = DFUResultCode(rawValue: 0x02)
    public static let invalidParameter = DFUResultCode(rawValue: 0x03)
    public static let insufficientResources = DFUResultCode(rawValue: 0x04)
    public static let invalidObject = DFUResultCode(rawValue: 0x05)
    /// SDK 12 only; later SDKs report a missing signature as extended error 0x08.
    public static let signatureMissing = DFUResultCode(rawValue: 0x06)
    public static let unsupportedType = DFUResultCode(rawValue: 0x07)
    public static let operationNotPermitted = DFUResultCode(rawValue: 0x08)
    public static let operationFailed = DFUResultCode(rawValue: 0x0A)
    /// The response carries one more byte: a `DFUExtendedError`.
    public static let extendedError = DFUResultCode(rawValue: 0x0B)

    public var description: String {
        switch self {
        case .invalid: "invalid opcode (0x00): the bootloader did not understand the request; it may not be a Secure DFU bootloader"
        case .success: "success (0x01)"
        case .opcodeNotSupported: "opcode not supported (0x02): this bootloader lacks the request; update the bootloader or use a matching flasher"
        case .invalidParameter: "invalid parameter (0x03): the request's size or type was refused (object size not page-aligned, or zero)"
        case .insufficientResources: "insufficient resources (0x04): the object is larger than the bootloader accepts; the package does not fit this device"
        case .invalidObject: "invalid object (0x05): the bootloader rejected the object's contents; regenerate the package with nrfutil"
        case .signatureMissing: "signature missing (0x06): this bootloader needs a signed package; sign it with the key the bootloader trusts (nrfutil pkg generate --key-file)"
        case .unsupportedType: "unsupported object type (0x07): the bootloader does not know this object type"
        case .operationNotPermitted: "operation not permitted (0x08): the request came in the wrong state (no valid init packet, object incomplete, or size beyond the image)"
        case .operationFailed: "operation failed (0x0A): the bootloader could not complete the request (flash or internal error); power-cycle the device and retry"
        case .extendedError: "extended error (0x0B)"
        default: "unknown result code 0x\(hex2(rawValue))"
        }
    }
}

/// The extra byte of a `0x0B` response (SDK `nrf_dfu_ext_error_code_t`).
///
/// `description` is one line: what the device refused and what to do about it.
public struct DFUExtendedError: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
    public let rawValue: UInt8
    public init(rawValue: UInt8) { self.rawValue = rawValue }

    public static let noError = DFUExtendedError(rawValue: 0x00)
    public static let invalidErrorCode = DFUExtendedError(rawValue: 0x01)
    public static let wrongCommandFormat = DFUExtendedError(rawValue: 0x02)
    public static let unknownCommand = DFUExtendedError(rawValue: 0x03)
    public static let initCommandInvalid = DFUExtendedError(rawValue: 0x04)
    /// The package's firmware version is lower than the installed one.
    public static let firmwareVersionFailure = DFUExtendedError(rawValue: 0x05)
    public static let hardwareVersionFailure = DFUExtendedError(rawValue: 0x06)
    /// `sd_req` does not list the SoftDevice the device runs.
    public static let softDeviceVersionFailure = DFUExtendedError(rawValue: 0x07)
    public static let signatureMissing = DFUExtendedError(rawValue: 0x08)
    public static let wrongHashType = DFUExtendedError(rawValue: 0x09)
    public static let hashFailed = DFUExtendedError(rawValue: 0x0A)
    public static let wrongSignatureType = DFUExtendedError(rawValue: 0x0B)
    /// The received firmware's hash does not match the init packet's.
    public static let verificationFailed = DFUExtendedError(rawValue: 0x0C)
    public static let insufficientSpace = DFUExtendedError(rawValue: 0x0D)
    public static let firmwareAlreadyPresent = DFUExtendedError(rawValue: 0x0E)

    public var description: String {
        switch self {
        case .noError: "no error (ext 0x00)"
        case .invalidErrorCode: "invalid error code (ext 0x01): the bootloader reported an error it could not name; power-cycle the device and retry"
        case .wrongCommandFormat: "wrong command format (ext 0x02): the init packet is malformed; regenerate the package with nrfutil pkg generate"
        case .unknownCommand: "unknown command (ext 0x03): the init packet's command is not INIT; regenerate the package with nrfutil pkg generate"
        case .initCommandInvalid: "init command invalid (ext 0x04): the bootloader refused the init packet's fields (image type or sizes); build the package for this device's bootloader"
        case .firmwareVersionFailure: "firmware version too low (ext 0x05): the device refuses a downgrade; raise --application-version/--bootloader-version when generating the package"
        case .hardwareVersionFailure: "hardware version mismatch (ext 0x06): the package was built for other hardware; regenerate it with this device's --hw-version"
        case .softDeviceVersionFailure: "SoftDevice mismatch (ext 0x07): the package's sd_req does not list the SoftDevice this device runs; regenerate it with that SoftDevice's FWID in --sd-req"
        case .signatureMissing: "signature missing (ext 0x08): this bootloader accepts signed packages only; sign it with the bootloader's key (nrfutil pkg generate --key-file)"
        case .wrongHashType: "wrong hash type (ext 0x09): the bootloader does not support the init packet's hash type; regenerate the package with nrfutil"
        case .hashFailed: "hash failed (ext 0x0A): the bootloader could not compute the firmware hash; power-cycle the device and retry"
        case .wrongSignatureType: "wrong signature type (ext 0x0B): the bootloader does not support the package's signature type; sign with ECDSA P-256"
        case .verificationFailed: "verification failed (ext 0x0C): the signature does not match the bootloader's key, or the received firmware's hash does not match the package; sign with the right key, or resend the package"
        case .insufficientSpace: "insufficient space (ext 0x0D): the firmware does not fit the device's free flash; build a smaller image"
        case .firmwareAlreadyPresent: "firmware already present (ext 0x0E): the device already holds this firmware; nothing to do"
        default: "unknown extended error 0x\(hex2(rawValue))"
        }
    }

    /// The line for a refusal of the init packet (EXECUTE of the command object), where some
    /// codes narrow down: 0x0C can only be the signature there (the firmware's hash is checked at
    /// the last EXECUTE), and 0x04 for a debug init packet means a release bootloader.
    public func initPacketDescription(debugPacket: Bool) -> String {
        switch self {
        case .verificationFailed: "signature does not verify (ext 0x0C): the package was signed with a key other than the one this bootloader trusts; sign it with that key (nrfutil pkg generate --key-file)"
        case .initCommandInvalid where debugPacket: "init command invalid (ext 0x04): a debug package (is_debug) needs a debug bootloader; regenerate the package without --debug-mode"
        default: description
        }
    }
}

/// Upper-case hex with at least two digits: 0F, AF, 101.
func hex2(_ value: some BinaryInteger) -> String {
    let s = String(value, radix: 16, uppercase: true)
    return s.count == 1 ? "0" + s : s
}
