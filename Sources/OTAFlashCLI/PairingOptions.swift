import ArgumentParser
import Foundation
import GATT
import OTA
import OTACommandLine

/// How `flash` pairs: `--pair`, the answers the central's agent gives, `--unpair-after`.
public struct PairingOptions: ParsableArguments {
    @Flag(name: .long, help: "Pair with the device before the update when it is not bonded, and once more when it refuses an operation for want of pairing or encryption (Just Works unless --passkey or --confirm-pairing).")
    public var pair = false

    @OptionGroup public var answers: PairingAnswers

    @Flag(name: .customLong("unpair-after"), help: "Remove the bond with the device when its update ends, however it ended (a production line keeps no bonds).")
    public var unpairAfter = false

    public init() {}

    public func validate() throws {
        try answers.validate()
        if !pair, let option = answers.given.first {
            throw ValidationError("\(option) answers the device while pairing; add --pair")
        }
    }

    /// The policy for every device; a passkey file's entries override it per device.
    var policy: PairingPolicy {
        PairingPolicy(pair: pair, credentials: answers.credentials, unpairAfter: unpairAfter, timeout: answers.timeout)
    }
}

/// What the central's pairing agent answers: shared by `flash --pair` and `otaflash pair`.
public struct PairingAnswers: ParsableArguments {
    @Option(name: .long, parsing: .unconditional, help: Ranges.passkey.help("The six-digit passkey the device shows or expects, for passkey entry", valueName: "n"))
    public var passkey: Int?

    @Option(name: .customLong("passkey-file"), help: ArgumentHelp("A file of per-device passkeys, one `ADDRESS PASSKEY` per line (# starts a comment); a device it does not list uses --passkey, else Just Works.", valueName: "file"), completion: .file())
    public var passkeyFile: String?

    @Flag(name: .customLong("confirm-pairing"), help: "Accept a numeric comparison (LE Secure Connections) without anyone comparing the numbers.")
    public var confirmPairing = false

    @Option(name: .customLong("pair-timeout"), parsing: .unconditional, help: Ranges.pairTimeout.help("Seconds one pairing may take", valueName: "seconds"))
    public var pairTimeout: Double = 30

    public init() {}

    public func validate() throws {
        try Ranges.passkey.check(passkey)
        try Ranges.pairTimeout.check(pairTimeout)
    }

    /// The options given that only pairing uses.
    var given: [String] {
        (passkey != nil ? ["--passkey"] : []) + (passkeyFile != nil ? ["--passkey-file"] : []) + (confirmPairing ? ["--confirm-pairing"] : [])
    }

    var credentials: PairingCredentials {
        PairingCredentials(passkey: passkey.map { UInt32($0) }, confirmsComparison: confirmPairing)
    }

    var timeout: Duration { Ranges.pairTimeout.duration(pairTimeout) }

    /// Each device's answers: `--passkey-file`'s entry, else the common ones.
    func credentials(for address: DeviceAddress, file: [DeviceAddress: UInt32]) -> PairingCredentials {
        var answers = credentials
        if let passkey = file[address] { answers.passkey = passkey }
        return answers
    }

    /// Reads `--passkey-file`: empty when none was given.
    ///
    /// - Throws: `CLIFailure` `.usage` naming the file and line of anything that is not
    ///   `ADDRESS PASSKEY`, an unreadable file, or an address listed twice.
    func passkeys() throws(CLIFailure) -> [DeviceAddress: UInt32] {
        guard let path = passkeyFile else { return [:] }
        guard FileManager.default.fileExists(atPath: path) else {
            throw CLIFailure(.usage, "--passkey-file \(path) does not exist; give a file of `ADDRESS PASSKEY` lines")
        }
        let text: String
        do {
            text = try String(contentsOfFile: path, encoding: .utf8)
        } catch {
            throw CLIFailure(.usage, "--passkey-file \(path) cannot be read (\(OutputPaths.reason(error))); give a file of `ADDRESS PASSKEY` lines")
        }
        return try Self.parsePasskeys(text, path: path)
    }

    static func parsePasskeys(_ text: String, path: String) throws(CLIFailure) -> [DeviceAddress: UInt32] {
        var passkeys: [DeviceAddress: UInt32] = [:]
        for (index, raw) in text.split(separator: "\n", omittingEmptySubsequences: false).enumerated() {
            let line = raw.split(separator: "#", maxSplits: 1, omittingEmptySubsequences: false).first ?? ""
            let fields = line.split(whereSeparator: { $0 == " " || $0 == "\t" || $0 == "\r" })
            if fields.isEmpty { continue }
            let at = "--passkey-file \(path) line \(index + 1)"
            guard fields.count == 2, let address = DeviceAddress(String(fields[0])) else {
                throw CLIFailure(.usage, "\(at): expected `ADDRESS PASSKEY` like `AA:BB:CC:DD:EE:FF 123456`, got '\(line.trimmingCharacters(in: .whitespaces))'")
            }
            guard fields[1].allSatisfy(\.isASCII), let passkey = UInt32(fields[1]), passkey <= PairingCredentials.maxPasskey else {
                throw CLIFailure(.usage, "\(at): the passkey must be a whole number \(Ranges.passkey.text), got '\(fields[1])'")
            }
            guard passkeys.updateValue(passkey, forKey: address) == nil else {
                throw CLIFailure(.usage, "\(at): \(address) is listed twice")
            }
        }
        return passkeys
    }
}
