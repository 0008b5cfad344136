import Crypto

/// The firmware type an init packet announces (dfu-cc.proto `FwType`).
public struct DFUFirmwareType: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
    public let rawValue: UInt32
    public init(rawValue: UInt32) { self.rawValue = rawValue }

    public static let application = DFUFirmwareType(rawValue: 0)
    public static let softDevice = DFUFirmwareType(rawValue: 1)
    public static let bootloader = DFUFirmwareType(rawValue: 2)
    public static let softDeviceBootloader = DFUFirmwareType(rawValue: 3)
    public static let externalApplication = DFUFirmwareType(rawValue: 4)

    public var description: String {
        switch self {
        case .application: "APPLICATION"
        case .softDevice: "SOFTDEVICE"
        case .bootloader: "BOOTLOADER"
        case .softDeviceBootloader: "SOFTDEVICE_BOOTLOADER"
        case .externalApplication: "EXTERNAL_APPLICATION"
        default: "firmware type \(rawValue)"
        }
    }
}

/// dfu-cc.proto `HashType`.
public struct DFUHashType: RawRepresentable, Hashable, Sendable {
    public let rawValue: UInt32
    public init(rawValue: UInt32) { self.rawValue = rawValue }
    public static let none = DFUHashType(rawValue: 0)
    public static let crc = DFUHashType(rawValue: 1)
    public static let sha128 = DFUHashType(rawValue: 2)
    public static let sha256 = DFUHashType(rawValue: 3)
    public static let sha512 = DFUHashType(rawValue: 4)
}

/// The `InitCommand` of an init packet: what the bootloader checks before it takes the firmware.
public struct DFUInitCommand: Hashable, Sendable {
    public var firmwareVersion: UInt32?
    public var hardwareVersion: UInt32?
    /// FWIDs of the SoftDevices the image runs on; 0xFFFE means "any, or none".
    public var softDeviceRequirements: [UInt32] = []
    public var type: DFUFirmwareType?
    public var softDeviceSize: UInt32?
    public var bootloaderSize: UInt32?
    public var applicationSize: UInt32?
    public var hashType: DFUHashType?
    /// As stored: for SHA-256, the digest byte-reversed (little-endian).
    public var hash: [UInt8]?
    public var isDebug = false
    /// `(ValidationType, bytes)` pairs, as stored.
    public var bootValidation: [BootValidation] = []

    public struct BootValidation: Hashable, Sendable {
        public var type: UInt32
        public var bytes: [UInt8]
        public init(type: UInt32, bytes: [UInt8]) {
            self.type = type
            self.bytes = bytes
        }
    }

    public init() {}

    /// An application's init command as `nrfutil pkg generate --application` makes it.
    public static func application(firmware: [UInt8], version: UInt32, hardwareVersion: UInt32 = 52,
                                   softDeviceRequirements: [UInt32] = [0xFFFE], isDebug: Bool = false) -> DFUInitCommand {
        var c = DFUInitCommand()
        c.firmwareVersion = version
        c.hardwareVersion = hardwareVersion
        c.softDeviceRequirements = softDeviceRequirements
        c.type = .application
        c.softDeviceSize = 0
        c.bootloaderSize = 0
        c.applicationSize = UInt32(clamping: firmware.count)
        c.hashType = .sha256
        c.hash = hashField(for: firmware)
        c.isDebug = isDebug
        c.bootValidation = [BootValidation(type: 1, bytes: [])]
        return c
    }

    /// The `hash` field for firmware: its SHA-256, byte-reversed as nrfutil stores it.
    public static func hashField(for firmware: [UInt8]) -> [UInt8] {
        Array(SHA256.hash(data: firmware)).reversed()
    }

    /// The image size the command announces: `sd_size + bl_size + app_size`.
    public var totalSize: UInt64 {
        UInt64(softDeviceSize ?? 0) + UInt64(bootloaderSize ?? 0) + UInt64(applicationSize ?? 0)
    }

    init(decoding bytes: ArraySlice<UInt8>) throws(ProtobufError) {
        var r = ProtobufReader(bytes)
        while let f = try r.next() {
            switch f.number {
            case 1: firmwareVersion = try f.uint32()
            case 2: hardwareVersion = try f.uint32()
            case 3:
                // Unpacked in proto2, but a packed encoding is legal for the reader to accept.
                if case .bytes(let packed) = f.value {
                    softDeviceRequirements += try Self.packedVarints(packed)
                } else {
                    softDeviceRequirements.append(try f.uint32())
                }
            case 4: type = DFUFirmwareType(rawValue: try f.uint32())
            case 5: softDeviceSize = try f.uint32()
            case 6: bootloaderSize = try f.uint32()
            case 7: applicationSize = try f.uint32()
            case 8:
                var h = ProtobufReader(try f.message())
                while let hf = try h.next() {
                    switch hf.number {
                    case 1: hashType = DFUHashType(rawValue: try hf.uint32())
                    case 2: hash = Array(try hf.message())
                    default: break
                    }
                }
            case 9: isDebug = try f.bool()
            case 10:
                var v = ProtobufReader(try f.message())
                var entry = BootValidation(type: 0, bytes: [])
                while let vf = try v.next() {
                    switch vf.number {
                    case 1: entry.type = try vf.uint32()
                    case 2: entry.bytes = Array(try vf.message())
                    default: break
                    }
                }
                bootValidation.append(entry)
            default: break  // unknown fields are skipped, as protobuf says
            }
        }
    }

    private static func packedVarints(_ bytes: ArraySlice<UInt8>) throws(ProtobufError) -> [UInt32] {
        // A packed field is a run of bare varints: read each as the value of a field-1 varint.
        var out: [UInt32] = []
        var i = bytes.startIndex
        while i < bytes.endIndex {
            var end = i
            while end < bytes.endIndex, bytes[end] & 0x80 != 0 { end += 1 }
            guard end < bytes.endIndex else { throw ProtobufError("packed sd_req is cut short") }
            let prefixed: [UInt8] = [0x08] + bytes[i...end]
            var r = ProtobufReader(prefixed[...])
            guard let f = try r.next() else { throw ProtobufError("packed sd_req is malformed") }
            out.append(try f.uint32())
            i = end + 1
        }
        return out
    }

    /// The serialized `InitCommand`: what a signature covers.
    public var encoded: [UInt8] {
        var w = ProtobufWriter()
        if let firmwareVersion { w.varint(1, UInt64(firmwareVersion)) }
        if let hardwareVersion { w.varint(2, UInt64(hardwareVersion)) }
        if !softDeviceRequirements.isEmpty {
            // Packed, as nrfutil writes it.
            var packed = ProtobufWriter()
            for sd in softDeviceRequirements { packed.rawVarint(UInt64(sd)) }
            w.bytes(3, packed.bytes)
        }
        if let type { w.varint(4, UInt64(type.rawValue)) }
        if let softDeviceSize { w.varint(5, UInt64(softDeviceSize)) }
        if let bootloaderSize { w.varint(6, UInt64(bootloaderSize)) }
        if let applicationSize { w.varint(7, UInt64(applicationSize)) }
        if hashType != nil || hash != nil {
            var h = ProtobufWriter()
            h.varint(1, UInt64(hashType?.rawValue ?? 0))
            h.bytes(2, hash ?? [])
            w.bytes(8, h.bytes)
        }
        w.varint(9, isDebug ? 1 : 0)
        for v in bootValidation {
            var b = ProtobufWriter()
            b.varint(1, UInt64(v.type))
            b.bytes(2, v.bytes)
            w.bytes(10, b.bytes)
        }
        return w.bytes
    }
}

/// A decoded init packet (`.dat`): dfu-cc.proto `Packet`, signed or not.
///
/// Decoded by hand (the schema is ten fields): `Packet { command = 1 | signed_command = 2 }`,
/// `SignedCommand { command = 1, signature_type = 2, signature = 3 }`,
/// `Command { op_code = 1, init = 2, reset = 3 }`. docs/NORDIC-DFU.md, "Packages".
public struct DFUInitPacket: Hashable, Sendable {
    /// The `.dat` bytes, sent as they are as the command object.
    public let bytes: [UInt8]
    public let command: DFUInitCommand
    /// The serialized `InitCommand`, exactly as it appears in `bytes`: what the signature covers.
    public let commandBytes: [UInt8]
    /// `Command.op_code` (1 = INIT).
    public let opCode: UInt32?
    /// Present when the packet is a `SignedCommand`.
    public let signature: Signature?

    public struct Signature: Hashable, Sendable {
        /// 0 = ECDSA P-256 over SHA-256, 1 = Ed25519.
        public let type: UInt32
        /// As stored: for ECDSA, r ‖ s with each 32-byte half byte-reversed.
        public let bytes: [UInt8]

        public init(type: UInt32, bytes: [UInt8]) {
            self.type = type
            self.bytes = bytes
        }
    }

    public var isSigned: Bool { signature != nil }

    /// Decodes `.dat` bytes. Throws a one-line reason on anything that is not a Secure DFU init
    /// packet; never traps, whatever the bytes.
    public init(decoding bytes: [UInt8]) throws(DFUInitPacketError) {
        do throws(ProtobufError) {
            var outer = ProtobufReader(bytes[...])
            var commandMessage: ArraySlice<UInt8>?
            var signedMessage: ArraySlice<UInt8>?
            while let f = try outer.next() {
                switch f.number {
                case 1: commandMessage = try f.message()
                case 2: signedMessage = try f.message()
                default: break
                }
            }
            var signature: Signature?
            if let signedMessage {
                var s = ProtobufReader(signedMessage)
                var type: UInt32?
                var sig: [UInt8]?
                while let f = try s.next() {
                    switch f.number {
                    case 1: commandMessage = try f.message()
                    case 2: type = try f.uint32()
                    case 3: sig = Array(try f.message())
                    default: break
                    }
                }
                guard let type, let sig else { throw ProtobufError("the signed command lacks its signature type or signature") }
                signature = Signature(type: type, bytes: sig)
            }
            guard let commandMessage else { throw ProtobufError("it holds no command") }
            var c = ProtobufReader(commandMessage)
            var opCode: UInt32?
            var initBytes: ArraySlice<UInt8>?
            while let f = try c.next() {
                switch f.number {
                case 1: opCode = try f.uint32()
                case 2: initBytes = try f.message()
                default: break
                }
            }
            guard let initBytes else { throw ProtobufError("its command has no init command (op_code \(opCode.map(String.init) ?? "missing"))") }
            self.command = try DFUInitCommand(decoding: initBytes)
            self.commandBytes = Array(initBytes)
            self.opCode = opCode
            self.signature = signature
            self.bytes = bytes
        } catch {
            throw DFUInitPacketError(error.description)
        }
        guard opCode == 1 else { throw DFUInitPacketError("its op_code is \(opCode.map(String.init) ?? "missing"), not INIT (1)") }
    }

    /// Builds an init packet, unsigned or with a signature over `command.encoded`.
    public init(command: DFUInitCommand, signature: Signature? = nil) {
        let initBytes = command.encoded
        var cmd = ProtobufWriter()
        cmd.varint(1, 1)
        cmd.bytes(2, initBytes)
        var packet = ProtobufWriter()
        if let signature {
            var signed = ProtobufWriter()
            signed.bytes(1, cmd.bytes)
            signed.varint(2, UInt64(signature.type))
            signed.bytes(3, signature.bytes)
            packet.bytes(2, signed.bytes)
        } else {
            packet.bytes(1, cmd.bytes)
        }
        self.bytes = packet.bytes
        self.command = command
        self.commandBytes = initBytes
        self.opCode = 1
        self.signature = signature
    }
}

/// `.dat` bytes that are not a Secure DFU init packet.
public struct DFUInitPacketError: Error, Sendable, Hashable, CustomStringConvertible {
    public let description: String
    public init(_ description: String) { self.description = description }
}
