import GATT
import OTAWire

/// The otaflash native OTA protocol, versions 1 and 2 (docs/PROTOCOL.md is the specification).
public enum OTAProtocol {
    /// Version 1: the first revision's devices, and the codec's default.
    public static let version: UInt8 = 1
    /// Version 2: devices on real flash declare their erase unit, reorder capacity and erase time.
    public static let version2: UInt8 = 2
    /// The versions a central speaks: it speaks the one the device's info value names.
    public static let versions: ClosedRange<UInt8> = 1...2

    public static let serviceUUID: BluetoothUUID = "b0e60001-2f6e-4b2a-9c1f-6f7461666c61"
    /// Write with response + notify: commands in, replies and events out.
    public static let controlPointUUID: BluetoothUUID = "b0e60002-2f6e-4b2a-9c1f-6f7461666c61"
    /// Write without response: data packets.
    public static let dataUUID: BluetoothUUID = "b0e60003-2f6e-4b2a-9c1f-6f7461666c61"
    /// Read: `DeviceInfo`.
    public static let infoUUID: BluetoothUUID = "b0e60004-2f6e-4b2a-9c1f-6f7461666c61"

    /// Bytes of the data packet header (the 32-bit offset).
    public static let dataHeaderSize = 4
    /// ATT header bytes of a write (opcode + handle): a write carries at most `mtu - 3` bytes.
    public static let attWriteOverhead = ATTWriteLimit.overhead
    /// The smallest ATT MTU (Core Spec Vol 3, Part F, 3.2.8).
    public static let minimumMTU = 23

    /// The longest value one write may carry (`ATTWriteLimit`).
    public static let maximumWriteValue = ATTWriteLimit.maximumValue

    /// Image bytes one data packet carries at this ATT MTU: `min(mtu - 3, 510) - 4`.
    public static func chunkSize(mtu: Int) -> Int {
        max(0, ATTWriteLimit.value(mtu: mtu) - dataHeaderSize)
    }
}

/// A reply status (docs/PROTOCOL.md, "Status codes"). Unknown codes still decode and print.
public struct OTAStatus: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
    public let rawValue: UInt8
    public init(rawValue: UInt8) { self.rawValue = rawValue }

    public static let success = OTAStatus(rawValue: 0x00)
    public static let unknownOpcode = OTAStatus(rawValue: 0x01)
    public static let invalidLength = OTAStatus(rawValue: 0x02)
    public static let invalidState = OTAStatus(rawValue: 0x03)
    public static let imageTooLarge = OTAStatus(rawValue: 0x04)
    public static let gap = OTAStatus(rawValue: 0x05)
    public static let crcMismatch = OTAStatus(rawValue: 0x06)
    public static let notVerified = OTAStatus(rawValue: 0x07)
    public static let flashError = OTAStatus(rawValue: 0x08)
    public static let busy = OTAStatus(rawValue: 0x09)
    public static let incomplete = OTAStatus(rawValue: 0x0A)
    public static let unsupportedProtocol = OTAStatus(rawValue: 0x0B)
    public static let invalidImage = OTAStatus(rawValue: 0x0C)

    private static let words: [UInt8: String] = [
        0x00: "success",
        0x01: "unknown opcode",
        0x02: "invalid length",
        0x03: "invalid state for this command",
        0x04: "image too large for the slot",
        0x05: "gap: the device holds less data than the offset",
        0x06: "CRC mismatch",
        0x07: "image not verified",
        0x08: "flash write failed",
        0x09: "busy with another central's transfer",
        0x0A: "incomplete: not every byte has arrived",
        0x0B: "unsupported protocol version",
        0x0C: "invalid image parameters",
    ]

    public var description: String {
        let hex = "0x" + (rawValue < 16 ? "0" : "") + String(rawValue, radix: 16)
        return "\(Self.words[rawValue] ?? "unknown status") (\(hex))"
    }
}

/// The device's transfer state, as the info characteristic and STATUS report it.
public struct DeviceState: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
    public let rawValue: UInt8
    public init(rawValue: UInt8) { self.rawValue = rawValue }

    /// No transfer in progress.
    public static let idle = DeviceState(rawValue: 0)
    /// BEGIN accepted; data arriving.
    public static let receiving = DeviceState(rawValue: 1)
    /// VERIFY succeeded; ACTIVATE allowed.
    public static let verified = DeviceState(rawValue: 2)

    public var description: String {
        switch self {
        case .idle: "idle"
        case .receiving: "receiving"
        case .verified: "verified"
        default: "unknown(\(rawValue))"
        }
    }
}

/// The info characteristic's value: 24 bytes in version 1, 40 in version 2 (a central reads it
/// whole at any MTU; BlueZ uses Read Blob when the MTU is smaller). The first 20 bytes are the
/// original layout; devices that send only those report no running image CRC.
public struct DeviceInfo: Hashable, Sendable {
    public static let encodedSize = 24
    public static let minimumSize = 20
    public static let version2Size = 40

    public var protocolVersion: UInt8
    public var state: DeviceState
    public var maxImageSize: UInt32
    public var firmwareVersion: FirmwareVersion
    /// Contiguous bytes held of the pending transfer (0 when idle).
    public var received: UInt32
    /// Size of the pending transfer's image (0 when idle).
    public var pendingImageSize: UInt32
    /// CRC32 of the image the device runs since its last activation (0 or nil when unknown). Lets
    /// a central that lost ACTIVATE's reply learn, after reconnecting, that the update took effect.
    public var activeImageCRC: UInt32?
    /// Version 2's flash fields; nil for a version 1 device.
    public var flash: Flash?

    /// What a version 2 device declares about its flash (docs/PROTOCOL.md, "Info characteristic").
    public struct Flash: Hashable, Sendable {
        /// Bytes per erase unit, a power of two; committed checkpoints fall on its multiples.
        public var eraseUnit: UInt32
        /// Bytes beyond `received` the device keeps when they arrive early.
        public var reorderCapacity: UInt32
        /// Separate ranges beyond a hole it can hold.
        public var reorderRanges: UInt8
        /// Worst-case erase time of one unit, in milliseconds.
        public var eraseTimeMs: UInt16
        /// The device erases units before data reaches them: no packet waits for an erase.
        public var erasesAhead: Bool
        /// The committed offset of the pending transfer: where a reboot resumes.
        public var committed: UInt32

        public init(eraseUnit: UInt32, reorderCapacity: UInt32, reorderRanges: UInt8, eraseTimeMs: UInt16,
                    erasesAhead: Bool = false, committed: UInt32 = 0) {
            self.eraseUnit = eraseUnit
            self.reorderCapacity = reorderCapacity
            self.reorderRanges = reorderRanges
            self.eraseTimeMs = eraseTimeMs
            self.erasesAhead = erasesAhead
            self.committed = committed
        }
    }

    public init(protocolVersion: UInt8 = OTAProtocol.version, state: DeviceState, maxImageSize: UInt32,
                firmwareVersion: FirmwareVersion, received: UInt32, pendingImageSize: UInt32, activeImageCRC: UInt32? = nil,
                flash: Flash? = nil) {
        self.protocolVersion = protocolVersion
        self.state = state
        self.maxImageSize = maxImageSize
        self.firmwareVersion = firmwareVersion
        self.received = received
        self.pendingImageSize = pendingImageSize
        self.activeImageCRC = activeImageCRC
        self.flash = flash
    }

    public var encoded: [UInt8] {
        var b: [UInt8] = [protocolVersion, state.rawValue]
        b.append(flash?.erasesAhead == true ? 0x01 : 0x00)
        b.append(flash?.reorderRanges ?? 0)
        b.appendLE(maxImageSize)
        b.appendLE(firmwareVersion.packed)
        b.appendLE(received)
        b.appendLE(pendingImageSize)
        b.appendLE(activeImageCRC ?? 0)
        if let flash {
            b.appendLE(flash.eraseUnit)
            b.appendLE(flash.reorderCapacity)
            b.appendLE(flash.eraseTimeMs)
            b.appendLE(UInt16(0))
            b.appendLE(flash.committed)
        }
        return b
    }

    /// Decodes the value; longer values are accepted (later minor versions may append fields).
    /// A version 2 value must carry the flash fields.
    public init(decoding bytes: [UInt8]) throws(WireError) {
        var r = ByteReader(bytes)
        let v: UInt8, s: UInt8, flags: UInt8, ranges: UInt8, max: UInt32, fw: UInt32, rx: UInt32, pending: UInt32
        do {
            (v, s, flags, ranges) = (try r.u8(), try r.u8(), try r.u8(), try r.u8())
            (max, fw, rx, pending) = (try r.u32(), try r.u32(), try r.u32(), try r.u32())
        } catch {
            throw WireError("info value has \(bytes.count) bytes, expected at least \(Self.minimumSize): \(hexDump(bytes[...]))")
        }
        let active = (try? r.u32()).flatMap { $0 == 0 ? nil : $0 }
        var flash: Flash?
        if v >= OTAProtocol.version2 {
            let unit: UInt32, capacity: UInt32, erase: UInt16, committed: UInt32
            do {
                (unit, capacity, erase) = (try r.u32(), try r.u32(), try r.u16())
                _ = try r.u16()  // reserved
                committed = try r.u32()
            } catch {
                throw WireError("a version \(v) info value has \(bytes.count) bytes, expected at least \(Self.version2Size): \(hexDump(bytes[...]))")
            }
            guard unit > 0, unit & (unit - 1) == 0 else {
                throw WireError("the device declares an erase unit of \(unit) bytes, which is not a power of two")
            }
            flash = Flash(eraseUnit: unit, reorderCapacity: capacity, reorderRanges: ranges, eraseTimeMs: erase,
                          erasesAhead: flags & 0x01 != 0, committed: committed)
        }
        self.init(protocolVersion: v, state: DeviceState(rawValue: s), maxImageSize: max,
                  firmwareVersion: FirmwareVersion(packed: fw), received: rx, pendingImageSize: pending, activeImageCRC: active,
                  flash: flash)
    }
}
