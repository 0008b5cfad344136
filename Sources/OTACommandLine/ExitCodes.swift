import Foundation
import OTA

/// Exit codes: one per failure class, so scripts can branch without parsing text.
/// README.md's "Exit codes" table is checked against this list by the tests.
public enum ExitCode: Int32, CaseIterable, Sendable {
    case success = 0
    case internalError = 1
    case usage = 2
    case imageFile = 3
    case imageTooLarge = 4
    case deviceNotFound = 5
    case connection = 6
    case incompatibleDevice = 7
    case verifyFailed = 8
    case protocolError = 9
    case timeout = 10
    case bluetoothUnavailable = 11
    case permission = 12
    case pairingFailed = 13
    case someFailed = 14
    case allFailed = 15
    case outputFailed = 16
    case bondLeft = 17
    case ledgerFailed = 18
    case checkFailed = 19
    case heldElsewhere = 20
    case notConfirmed = 21
    case ledgerInconsistent = 22
    case interrupted = 130

    /// The code's name in JSON output, e.g. `verify_failed`.
    public var name: String {
        String(describing: self).replacing(/[A-Z]/) { "_" + $0.output.lowercased() }
    }

    /// What the code means with any protocol, as the README states it without the protocols' own
    /// cases (`meaning(_:)`).
    public var meaning: String {
        switch self {
        case .success: "the image was sent, verified by the device and (unless --no-activate) activated"
        case .internalError: "a bug in otaflash; please report it with the output of --verbose"
        case .usage: "invalid command line: unknown option, bad value, malformed device address"
        case .imageFile: "the image file cannot be used: missing, unreadable, not a regular file, empty, over 64 MiB, malformed Intel HEX, not an image (ELF, archive, …), not an image the protocol sends"
        case .imageTooLarge: "the image does not fit the device's slot"
        case .deviceNotFound: "no device with that address was found within the scan timeout"
        case .connection: "connecting failed or the link was lost; run the same command again to resume"
        case .incompatibleDevice: "the device lacks the OTA service, a characteristic, or a property the protocol needs, or refuses the image"
        case .verifyFailed: "the device's whole-image check did not match at verify, and nothing was activated"
        case .protocolError: "the device refused a command (busy, bad state) or broke the protocol"
        case .timeout: "a phase timed out (connect, discovery, a reply, verify, activate)"
        case .bluetoothUnavailable: "bluetoothd is not running, or there is no powered adapter"
        case .permission: "D-Bus permission denied, or the device requires pairing (pass --pair)"
        case .pairingFailed: "pairing was refused: a wrong passkey, a numeric comparison not confirmed (--confirm-pairing), a device that rejects Just Works"
        case .someFailed: "batch: some devices failed, the others succeeded"
        case .allFailed: "batch: every device failed"
        case .outputFailed: "output could not be written (stdout closed early, e.g. piped into head; a full disk; a report file that cannot be written); the run stopped cleanly"
        case .bondLeft: "--unpair-after could not remove the bond, even after one more try once bluetoothd was back; the image may have gone through: remove the bond with otaflash unpair"
        case .ledgerFailed: "the ledger (--ledger) could not be opened or written: locked, read-only, corrupt, a full disk, a newer schema; no device is flashed whose record cannot be written"
        case .checkFailed: "the new image booted but failed the check asked for after activation, and was left unconfirmed"
        case .heldElsewhere: "another station holds the device's claim in the shared ledger (it is flashing it); nothing was sent: leave it to that station, or run again once its lease has ended"
        case .notConfirmed: "sent and executed, not confirmed: the image was sent and the command that activates it carried out (the device reset), but its answer was lost and the device's next state could not be read to confirm it; check the version it runs before sending it again"
        case .ledgerInconsistent: "otaflash ledger --check: the books do not check out (a device with two ok records for one image, a done claim without its record, a claim left held by a station that stopped, counts that do not add up); each finding is one line"
        case .interrupted: "interrupted by SIGINT, SIGTERM or SIGHUP; run the same command again to resume (a protocol that cannot resume says to reset the device first)"
        }
    }

    /// What the code means with `protocols`: its meaning, then what each protocol adds to it
    /// ("; smp: …"), as README's table states it.
    public func meaning(_ protocols: [ProtocolCommandLine]) -> String {
        meaning + protocols.compactMap { registration in registration.texts.exitCodes[self].map { "; \(registration.name): \($0)" } }.joined()
    }

    /// Every code with its name, and its meaning with `protocols` wrapped below it, for `otaflash help flash`.
    public static func helpTable(_ protocols: [ProtocolCommandLine]) -> String {
        allCases.map { code in
            var lines = ["  " + String(code.rawValue).padding(toLength: 5, withPad: " ", startingAt: 0) + code.name]
            var line = ""
            for word in code.meaning(protocols).split(separator: " ") {
                if !line.isEmpty, line.count + word.count >= 70 {
                    lines.append("       " + line)
                    line = ""
                }
                line += (line.isEmpty ? "" : " ") + word
            }
            return (lines + ["       " + line]).joined(separator: "\n")
        }.joined(separator: "\n")
    }

    /// The exit code of an `OTAError` code: one exit code per error code. A code this table does
    /// not know yet is an internal error until it gets its own row (a test checks every code has one).
    public init(_ code: OTAError.Code) {
        switch code {
        case .image: self = .imageFile
        case .imageTooLarge: self = .imageTooLarge
        case .deviceNotFound: self = .deviceNotFound
        case .connection: self = .connection
        case .incompatibleDevice: self = .incompatibleDevice
        case .verifyFailed: self = .verifyFailed
        case .protocolError: self = .protocolError
        case .timeout: self = .timeout
        case .bluetoothUnavailable: self = .bluetoothUnavailable
        case .permission: self = .permission
        case .pairingFailed: self = .pairingFailed
        case .interrupted: self = .interrupted
        case .bondLeft: self = .bondLeft
        case .ledgerFailed: self = .ledgerFailed
        case .checkFailed: self = .checkFailed
        case .heldElsewhere: self = .heldElsewhere
        case .notConfirmed: self = .notConfirmed
        default: self = .internalError
        }
    }
}

/// A command's failure: the exit code and the one line that explains it.
public struct CLIFailure: Error, Sendable {
    public let code: ExitCode
    public let message: String
    /// The command already printed its closing JSON event (`done` or `summary`) for this failure.
    public var reported = false

    public init(_ code: ExitCode, _ message: String) {
        self.code = code
        self.message = message
    }

    public init(_ error: OTAError) {
        self.init(ExitCode(error.code), error.description)
    }

    /// The same failure, marked as already reported in JSON.
    public func markedReported() -> CLIFailure {
        var copy = self
        copy.reported = true
        return copy
    }
}
