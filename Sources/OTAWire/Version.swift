import GATT

/// The Device Information Service (0x180A) and the characteristics `otaflash info` reads.
public enum DeviceInformationService {
    public static let serviceUUID: BluetoothUUID = "180a"
    public static let manufacturerNameUUID: BluetoothUUID = "2a29"
    public static let modelNumberUUID: BluetoothUUID = "2a24"
    public static let firmwareRevisionUUID: BluetoothUUID = "2a26"
    public static let serialNumberUUID: BluetoothUUID = "2a25"
    public static let hardwareRevisionUUID: BluetoothUUID = "2a27"
}

/// A firmware version `major.minor.patch`, packed in 32 bits as `major << 24 | minor << 16 | patch`.
public struct FirmwareVersion: Hashable, Sendable, Comparable, CustomStringConvertible {
    public var major: UInt8
    public var minor: UInt8
    public var patch: UInt16

    public init(major: UInt8, minor: UInt8, patch: UInt16) {
        self.major = major
        self.minor = minor
        self.patch = patch
    }

    public init(packed: UInt32) {
        self.init(major: UInt8(packed >> 24), minor: UInt8((packed >> 16) & 0xFF), patch: UInt16(packed & 0xFFFF))
    }

    /// Parses `M`, `M.m` or `M.m.p` with M, m ≤ 255 and p ≤ 65535.
    public init?(_ text: String) {
        let parts = text.split(separator: ".", omittingEmptySubsequences: false)
        guard (1...3).contains(parts.count), let major = UInt8(parts[0]) else { return nil }
        let minor = parts.count > 1 ? UInt8(parts[1]) : 0
        let patch = parts.count > 2 ? UInt16(parts[2]) : 0
        guard let minor, let patch else { return nil }
        self.init(major: major, minor: minor, patch: patch)
    }

    public var packed: UInt32 { UInt32(major) << 24 | UInt32(minor) << 16 | UInt32(patch) }
    public var description: String { "\(major).\(minor).\(patch)" }

    public static func < (a: FirmwareVersion, b: FirmwareVersion) -> Bool { a.packed < b.packed }
}
