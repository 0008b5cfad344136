import Crypto
import Foundation
import OTAWire

/// A Secure DFU bootloader as a pure state machine: control point and packet writes in,
/// notification bytes out. It follows the nRF5 SDK's rules (`nrf_dfu_req_handler.c`,
/// `nrf_dfu_validation.c`) as docs/NORDIC-DFU.md states them, so the simulator and
/// `otaflash simulate` can serve it and tests can drive the central's engine against it.
///
/// What it keeps across a link loss (`linkLost()`): everything but the receipt interval, as the
/// bootloader stays in DFU mode. Across a reset (`reset()`): the executed init packet and the
/// executed data objects; a partly written object is lost.
public struct NordicDFUBootloader: Sendable {
    /// How the bootloader judges an init packet's signature.
    public enum SignatureCheck: Sendable, Hashable, Codable {
        /// Any signature passes (a bootloader whose key matches the package's).
        case accept
        /// Every signature fails: the package was signed with another key (ext 0x0C).
        case reject
        /// Verify ECDSA P-256 over the `InitCommand` bytes with this public key (64 bytes x ‖ y,
        /// or its PEM text's DER body).
        case verify(publicKey: [UInt8])

        /// `.verify` with the key in a PEM file's text (what `nrfutil keys display --key pk
        /// --format pem KEY.pem` prints); nil when the text is no P-256 public key.
        ///
        /// The base64 body is read whatever its line length: nrfutil writes 76-character lines,
        /// which a strict RFC 7468 reader (64) refuses.
        public static func verify(pem: String) -> SignatureCheck? {
            let lines = pem.split(whereSeparator: \.isNewline).map { $0.trimmingCharacters(in: .whitespaces) }
            guard let begin = lines.firstIndex(of: "-----BEGIN PUBLIC KEY-----"),
                  let end = lines[begin...].firstIndex(of: "-----END PUBLIC KEY-----"),
                  let der = Data(base64Encoded: lines[(begin + 1)..<end].joined()),
                  let key = try? P256.Signing.PublicKey(derRepresentation: der) else { return nil }
            return .verify(publicKey: Array(key.rawRepresentation))
        }
    }

    public struct Config: Sendable, Hashable, Codable {
        /// SELECT's max size for the init packet.
        public var commandMaxSize = 256
        /// SELECT's max size for a data object: one flash page.
        public var dataMaxSize = 4096
        /// The largest image the bank takes.
        public var bankSize = 512 * 1024
        public var hardwareVersion: UInt32 = 52
        /// FWID of the SoftDevice installed.
        public var softDevice: UInt32 = 0xAF
        /// Version of the installed application and bootloader.
        public var applicationVersion: UInt32 = 0
        public var bootloaderVersion: UInt32 = 0
        /// Unsigned init packets are refused (ext 0x08).
        public var requireSignature = true
        public var signatureCheck = SignatureCheck.accept
        /// A debug bootloader takes `is_debug` packets and skips the version checks.
        public var debugBootloader = false
        /// With no control point or packet write for this long the bootloader resets
        /// (`NRF_BL_DFU_INACTIVITY_TIMEOUT_MS`); the transport owns the clock and calls
        /// `inactivityExpired()`.
        public var inactivityTimeout: Duration = .seconds(120)
        public init() {}
    }

    public struct Activation: Sendable, Hashable {
        public let type: DFUFirmwareType
        public let image: [UInt8]
        public let version: UInt32?
    }

    public var config: Config
    public private(set) var prn: UInt16 = 0
    private var prnCounter = 0
    /// Where packets go: the type of the last CREATE or SELECT.
    public private(set) var currentType = DFUObjectType.command

    public private(set) var command: [UInt8] = []
    public private(set) var commandSize = 0
    private var commandCRC = CRC32()
    /// The executed, valid init packet.
    public private(set) var validInit: DFUInitPacket?

    /// The firmware bank; `writeOffset` bytes written, `executedOffset` of them executed.
    public private(set) var bank: [UInt8] = []
    public private(set) var writeOffset = 0
    private var writeCRC = CRC32()
    public private(set) var executedOffset = 0
    private var executedCRC: UInt32 = 0
    /// Size of the data object in progress; 0 after EXECUTE.
    public private(set) var dataObjectSize = 0

    /// Images validated and activated, oldest first.
    public private(set) var activations: [Activation] = []
    /// Set after a successful last EXECUTE: the device resets once the response is out.
    public private(set) var resetPending = false
    /// Objects executed with data whose CRC the central never confirmed cannot be told apart
    /// here; what is counted is what the bank held at each data EXECUTE.
    public private(set) var dataExecutes = 0
    /// Fault hook: a byte of the bank that rots at rest once written (it flips when the last
    /// EXECUTE reads the bank back), so receipts and checksums pass and only the post-validation's
    /// hash can catch it. Fires once.
    public var flashBitFlipAt: Int?

    public init(config: Config = Config()) {
        self.config = config
    }

    // MARK: Persistence

    /// What the bootloader keeps in its settings page, without the bank's bytes: for a device
    /// served across restarts of `otaflash simulate`.
    public struct Snapshot: Sendable, Hashable, Codable {
        public var config: Config
        public var command: [UInt8]
        public var commandSize: Int
        public var initValid: Bool
        public var executedOffset: Int
        public var executedCRC: UInt32
    }

    public var snapshot: Snapshot {
        Snapshot(config: config, command: command, commandSize: commandSize, initValid: validInit != nil,
                 executedOffset: executedOffset, executedCRC: executedCRC)
    }

    /// Restores a bootloader as it comes up after a reset, from its snapshot and the executed part
    /// of its bank. Nil when they do not fit together.
    public init?(snapshot s: Snapshot, bank: [UInt8]) {
        self.init(config: s.config)
        guard s.commandSize >= 0, s.command.count <= s.commandSize, bank.count == s.executedOffset,
              CRC32.checksum(bank) == s.executedCRC else { return nil }
        command = s.command
        commandSize = s.commandSize
        commandCRC.update(command)
        if s.initValid {
            guard s.command.count == s.commandSize, let packet = try? DFUInitPacket(decoding: s.command),
                  UInt64(bank.count) <= packet.command.totalSize else { return nil }
            validInit = packet
            self.bank = bank
            writeOffset = bank.count
            writeCRC = CRC32(value: s.executedCRC)
            executedOffset = bank.count
            executedCRC = s.executedCRC
        } else if !bank.isEmpty {
            return nil
        }
    }

    // MARK: Link events

    /// A new connection after a link loss: the bootloader is still in DFU mode.
    public mutating func linkLost() {
        prn = 0
        prnCounter = 0
    }

    /// A reset: what the settings page holds survives (the executed init packet and objects).
    public mutating func reset() {
        linkLost()
        resetPending = false
        if validInit == nil {
            command = []
            commandSize = 0
            commandCRC = CRC32()
        }
        writeOffset = executedOffset
        writeCRC = CRC32(value: executedCRC)
        if bank.count > executedOffset { bank.removeSubrange(executedOffset...) }
        dataObjectSize = 0
    }

    /// The inactivity timer ran out: the bootloader resets, keeping what `reset()` keeps.
    public mutating func inactivityExpired() {
        reset()
    }

    // MARK: Control point

    /// Handles a control point write; returns the notification to send.
    public mutating func handleControl(_ bytes: [UInt8]) -> [UInt8] {
        let request: DFURequest
        do {
            request = try DFURequest(decoding: bytes)
        } catch {
            return DFUResponse(request: error.opcode ?? DFUOpcode(rawValue: bytes.first ?? 0), result: error.result).encoded
        }
        return handle(request).encoded
    }

    public mutating func handle(_ request: DFURequest) -> DFUResponse {
        let op = request.opcode
        func ok(_ payload: DFUResponse.Payload = .none) -> DFUResponse { DFUResponse(request: op, result: .success, payload: payload) }
        func no(_ result: DFUResultCode) -> DFUResponse { DFUResponse(request: op, result: result) }
        switch request {
        case .protocolVersion:
            return ok(.raw([1]))
        case .ping(let id):
            return ok(.raw([id]))
        case .setPRN(let value):
            prn = value
            prnCounter = 0
            return ok()
        case .abort:
            resetProgress()
            return ok()
        case .select(let type):
            switch type {
            case .command:
                currentType = .command
                return ok(.select(maxSize: UInt32(config.commandMaxSize), offset: UInt32(command.count), crc: commandCRC.value))
            case .data:
                currentType = .data
                return ok(.select(maxSize: UInt32(config.dataMaxSize), offset: UInt32(writeOffset), crc: writeCRC.value))
            default:
                return no(.unsupportedType)
            }
        case .create(let type, let size):
            switch type {
            case .command: return createCommand(size: Int(size), op: op)
            case .data: return createData(size: Int(size), op: op)
            default: return no(.unsupportedType)
            }
        case .calculateChecksum:
            if currentType == .command {
                return ok(.checksum(offset: UInt32(command.count), crc: commandCRC.value))
            }
            return ok(.checksum(offset: UInt32(writeOffset), crc: writeCRC.value))
        case .execute:
            return currentType == .command ? executeCommand(op: op) : executeData(op: op)
        case .mtuGet, .hardwareVersion, .firmwareVersion:
            return no(.opcodeNotSupported)
        }
    }

    private mutating func createCommand(size: Int, op: DFUOpcode) -> DFUResponse {
        guard size > 0 else { return DFUResponse(request: op, result: .invalidParameter) }
        guard size <= config.commandMaxSize else { return DFUResponse(request: op, result: .insufficientResources) }
        // The SDK's command CREATE resets all progress, the firmware's too.
        resetProgress()
        currentType = .command
        commandSize = size
        prnCounter = 0
        return DFUResponse(request: op, result: .success)
    }

    private mutating func createData(size: Int, op: DFUOpcode) -> DFUResponse {
        guard let initPacket = validInit else { return DFUResponse(request: op, result: .operationNotPermitted) }
        guard size > 0 else { return DFUResponse(request: op, result: .invalidParameter) }
        guard size <= config.dataMaxSize else { return DFUResponse(request: op, result: .insufficientResources) }
        let total = Int(initPacket.command.totalSize)
        guard executedOffset + size <= total else { return DFUResponse(request: op, result: .operationNotPermitted) }
        guard size % config.dataMaxSize == 0 || executedOffset + size == total else {
            return DFUResponse(request: op, result: .invalidParameter)
        }
        currentType = .data
        // A new object replaces any partly written one.
        writeOffset = executedOffset
        writeCRC = CRC32(value: executedCRC)
        bank.removeSubrange(executedOffset...)
        dataObjectSize = size
        prnCounter = 0
        return DFUResponse(request: op, result: .success)
    }

    private mutating func executeCommand(op: DFUOpcode) -> DFUResponse {
        guard commandSize > 0, command.count == commandSize else { return DFUResponse(request: op, result: .operationNotPermitted) }
        if let validInit, validInit.bytes == command { return DFUResponse(request: op, result: .success) }
        let packet: DFUInitPacket
        do {
            packet = try DFUInitPacket(decoding: command)
        } catch {
            return .extended(op, .wrongCommandFormat)
        }
        if let error = validate(packet) { return .extended(op, error) }
        validInit = packet
        resetFirmwareProgress()
        return DFUResponse(request: op, result: .success)
    }

    /// The SDK's pre-validation of an init command (`nrf_dfu_validation_prevalidate`).
    private func validate(_ packet: DFUInitPacket) -> DFUExtendedError? {
        let c = packet.command
        if let signature = packet.signature {
            guard signature.type == 0 else { return .wrongSignatureType }
            guard signatureValid(signature.bytes, over: packet.commandBytes) else { return .verificationFailed }
        } else if config.requireSignature {
            return .signatureMissing
        }
        guard let type = c.type, [.application, .softDevice, .bootloader, .softDeviceBootloader].contains(type) else {
            return .initCommandInvalid
        }
        if c.isDebug && !config.debugBootloader { return .initCommandInvalid }
        let checkVersions = !(c.isDebug && config.debugBootloader)
        if checkVersions {
            guard c.hardwareVersion == config.hardwareVersion else { return .hardwareVersionFailure }
            guard c.softDeviceRequirements.contains(config.softDevice) || c.softDeviceRequirements.contains(0xFFFE) else {
                return .softDeviceVersionFailure
            }
            switch type {
            case .application:
                if let v = c.firmwareVersion, v < config.applicationVersion { return .firmwareVersionFailure }
            case .bootloader, .softDeviceBootloader:
                if let v = c.firmwareVersion, v < config.bootloaderVersion { return .firmwareVersionFailure }
            default: break
            }
        }
        let sizesValid: Bool = switch type {
        case .application: (c.applicationSize ?? 0) > 0 && (c.softDeviceSize ?? 0) == 0 && (c.bootloaderSize ?? 0) == 0
        case .softDevice: (c.softDeviceSize ?? 0) > 0 && (c.applicationSize ?? 0) == 0 && (c.bootloaderSize ?? 0) == 0
        case .bootloader: (c.bootloaderSize ?? 0) > 0 && (c.applicationSize ?? 0) == 0 && (c.softDeviceSize ?? 0) == 0
        default: (c.softDeviceSize ?? 0) > 0 && (c.bootloaderSize ?? 0) > 0 && (c.applicationSize ?? 0) == 0
        }
        guard sizesValid else { return .initCommandInvalid }
        guard c.hashType == .sha256, c.hash?.count == 32 else { return .wrongHashType }
        guard c.totalSize <= UInt64(config.bankSize) else { return .insufficientSpace }
        return nil
    }

    private func signatureValid(_ signature: [UInt8], over message: [UInt8]) -> Bool {
        switch config.signatureCheck {
        case .accept: return true
        case .reject: return false
        case .verify(let keyBytes):
            guard signature.count == 64 else { return false }
            // Stored as r ‖ s with each half byte-reversed (nrfutil `signing.py`).
            let raw = Array(signature[0..<32].reversed()) + Array(signature[32..<64].reversed())
            guard let sig = try? P256.Signing.ECDSASignature(rawRepresentation: raw) else { return false }
            let key = keyBytes.count == 64
                ? try? P256.Signing.PublicKey(rawRepresentation: keyBytes)
                : try? P256.Signing.PublicKey(derRepresentation: keyBytes)
            guard let key else { return false }
            return key.isValidSignature(sig, for: SHA256.hash(data: message))
        }
    }

    private mutating func executeData(op: DFUOpcode) -> DFUResponse {
        guard let initPacket = validInit else { return DFUResponse(request: op, result: .operationNotPermitted) }
        guard writeOffset - executedOffset == dataObjectSize else { return DFUResponse(request: op, result: .operationNotPermitted) }
        executedOffset = writeOffset
        executedCRC = writeCRC.value
        dataObjectSize = 0
        dataExecutes += 1
        guard writeOffset == Int(initPacket.command.totalSize) else { return DFUResponse(request: op, result: .success) }
        if let flip = flashBitFlipAt, flip < bank.count {
            bank[flip] ^= 0x01
            flashBitFlipAt = nil
        }
        // Post-validation: the whole image's SHA-256 against the init packet's (stored reversed).
        let digest = Array(SHA256.hash(data: bank))
        guard let stored = initPacket.command.hash, Array(stored.reversed()) == digest else {
            resetProgress()
            return .extended(op, .verificationFailed)
        }
        let type = initPacket.command.type ?? .application
        activations.append(Activation(type: type, image: bank, version: initPacket.command.firmwareVersion))
        switch type {
        case .application: config.applicationVersion = initPacket.command.firmwareVersion ?? config.applicationVersion
        case .bootloader, .softDeviceBootloader: config.bootloaderVersion = initPacket.command.firmwareVersion ?? config.bootloaderVersion
        default: break
        }
        resetProgress()
        resetPending = true
        return DFUResponse(request: op, result: .success)
    }

    private mutating func resetProgress() {
        command = []
        commandSize = 0
        commandCRC = CRC32()
        validInit = nil
        resetFirmwareProgress()
    }

    private mutating func resetFirmwareProgress() {
        bank = []
        writeOffset = 0
        writeCRC = CRC32()
        executedOffset = 0
        executedCRC = 0
        dataObjectSize = 0
    }

    // MARK: Packet characteristic

    /// Handles a packet write; returns a receipt notification when one is due.
    public mutating func handlePacket(_ bytes: [UInt8]) -> [UInt8]? {
        guard !bytes.isEmpty else { return nil }
        if currentType == .command {
            guard commandSize > 0 else { return nil }
            let take = min(bytes.count, commandSize - command.count)
            guard take > 0 else { return nil }
            command += bytes[0..<take]
            commandCRC.update(bytes[0..<take])
            return receipt(offset: command.count, crc: commandCRC.value)
        }
        guard dataObjectSize > 0 else { return nil }
        // Bytes past the object's end are dropped; only the CRC shows it.
        let take = min(bytes.count, executedOffset + dataObjectSize - writeOffset)
        guard take > 0 else { return nil }
        bank += bytes[0..<take]
        writeCRC.update(bytes[0..<take])
        writeOffset += take
        return receipt(offset: writeOffset, crc: writeCRC.value)
    }

    private mutating func receipt(offset: Int, crc: UInt32) -> [UInt8]? {
        guard prn > 0 else { return nil }
        prnCounter += 1
        guard prnCounter >= Int(prn) else { return nil }
        prnCounter = 0
        return DFUResponse.checksum(offset: UInt32(offset), crc: crc).encoded
    }
}
