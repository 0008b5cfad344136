import GATT
import OTA
import OTAWire

/// A write to OTA Control: one byte. What each does depends on who receives it and in which state
/// (`sl_bt_app_ota_dfu.c`, `sl_bt_in_place_ota_dfu.c`, AN1086 for the AppLoader); docs/SILABS.md
/// has the table.
public enum SilabsControl: Sendable, Hashable {
    /// 0x00: an update begins. The application OTA DFU component takes it only while READY (its
    /// slot erased) and answers success even when it does not take it; the AppLoader starts over
    /// at the image's first byte; an application with the in-place component reboots into its
    /// AppLoader (any value does).
    case begin
    /// 0x03: the upload is complete. The AppLoader checks the GBL before it answers (an ATT error
    /// is its refusal); the application OTA DFU component only notes it and checks the slot once
    /// the link is closed.
    case end
    /// 0x04: the AppLoader closes the link itself. The application OTA DFU component takes it as
    /// its DISCONNECT state, which replaces DOWNLOAD_END: a 0x04 after 0x03 cancels the check
    /// (otaflash never sends it; it closes the link itself, as the host example does).
    case close
    case other(UInt8)

    public var value: UInt8 {
        switch self {
        case .begin: 0x00
        case .end: 0x03
        case .close: 0x04
        case .other(let v): v
        }
    }

    public var encoded: [UInt8] { [value] }

    /// The first byte, as the components read it (`value.data[0]`); nil for an empty write.
    public init?(decoding bytes: [UInt8]) {
        guard let first = bytes.first else { return nil }
        switch first {
        case 0x00: self = .begin
        case 0x03: self = .end
        case 0x04: self = .close
        default: self = .other(first)
        }
    }
}

/// Who answers on the OTA service: the application OTA DFU component, or the AppLoader. The ATT
/// errors they answer with mean different things.
public enum SilabsOTAMode: String, Sendable, Hashable, CaseIterable {
    /// An application with the application OTA DFU component: the image goes into a bootloader
    /// storage slot while it runs, and is checked once the link closes.
    case application
    /// The AppLoader: the image is written in place of the application, and checked at 0x03.
    case appLoader
}

/// The ATT application errors (0x80–0x9F) the OTA service answers writes with, and what each means
/// to the device that sent it.
public struct SilabsRefusal: Sendable, Hashable, CustomStringConvertible {
    public let code: UInt8
    public let mode: SilabsOTAMode?

    public init(code: UInt8, mode: SilabsOTAMode?) {
        self.code = code
        self.mode = mode
    }

    /// `sl_bt_app_ota_dfu.c`'s four, and the in-place component's refusal of OTA entry.
    static let application: [UInt8: String] = [
        0x80: "the write request was rejected (the in-place component refuses OTA entry without the security it requires, e.g. a bond)",
        0x81: "it is not ready for data: no 0x00 was taken (its slot was still being erased, or it is in its error state after an earlier failure)",
        0x82: "its storage slot is full: the GBL is larger than the slot",
        0x83: "writing the storage slot failed (bootloader_writeStorage: a write that is not a whole number of 32-bit words, or a flash error)",
    ]

    /// The AppLoader's (AN1086; EFR Connect's table of them).
    static let appLoader: [UInt8: String] = [
        0x80: "the GBL's CRC or its signature did not check out",
        0x81: "no update was started (0x00) before data or 0x03",
        0x82: "it ran out of buffer space (data came faster than it writes flash)",
        0x83: "the image is too large for the flash, or overlaps the AppLoader",
        0x84: "the GBL could not be parsed (not a GBL, or a partial update across SDK versions)",
        0x85: "the bootloader could not erase or write flash as the AppLoader asked",
        0x86: "the bootloader is of the wrong type (e.g. a UART bootloader, not one with the AppLoader)",
        0x87: "the new application would overlap the AppLoader",
    ]

    /// What the code means for `mode`; both meanings when the mode is unknown.
    public var meaning: String {
        switch mode {
        case .application?: Self.application[code] ?? "an error the application OTA DFU component does not send"
        case .appLoader?: Self.appLoader[code] ?? "an error the AppLoader does not document"
        case nil:
            [Self.application[code].map { "from an application OTA DFU device, \($0)" }, Self.appLoader[code].map { "from the AppLoader, \($0)" }]
                .compactMap { $0 }.joined(separator: "; ").nonEmpty ?? "an application error neither documents"
        }
    }

    /// The failure class: a refused check is a verify failure, a too large image its own.
    public var failureCode: OTAError.Code {
        switch (mode, code) {
        case (.appLoader?, 0x80), (.appLoader?, 0x84): .verifyFailed
        case (.appLoader?, 0x83), (.appLoader?, 0x87), (.application?, 0x82): .imageTooLarge
        case (.appLoader?, 0x86): .incompatibleDevice
        case (.application?, 0x80): .permission
        default: .protocolError
        }
    }

    public var description: String {
        "ATT error 0x" + String(code, radix: 16) + " (\(meaning))"
    }
}

extension String {
    var nonEmpty: String? { isEmpty ? nil : self }
}

/// The AppLoader's version characteristics, read liberally: a value of another length is
/// ignored, as the host example ignores it.
public struct SilabsVersions: Sendable, Hashable {
    public var otaVersion: UInt8?
    /// major, minor, patch, build (the Bluetooth stack's before OTA version 3).
    public var apploader: [UInt16]?
    public var bootloader: UInt32?
    public var application: UInt32?

    public init(otaVersion: UInt8? = nil, apploader: [UInt16]? = nil, bootloader: UInt32? = nil, application: UInt32? = nil) {
        self.otaVersion = otaVersion
        self.apploader = apploader
        self.bootloader = bootloader
        self.application = application
    }

    /// The OTA version characteristic's value: one byte.
    public static func otaVersion(_ value: [UInt8]) -> UInt8? { value.count == 1 ? value[0] : nil }

    /// The AppLoader version: eight bytes, four LE u16.
    public static func apploader(_ value: [UInt8]) -> [UInt16]? {
        guard value.count == 8 else { return nil }
        var reader = ByteReader(value)
        return (0..<4).compactMap { _ in try? reader.u16() }
    }

    /// The bootloader or application version: four bytes, LE u32.
    public static func word(_ value: [UInt8]) -> UInt32? {
        guard value.count == 4 else { return nil }
        var reader = ByteReader(value)
        return try? reader.u32()
    }

    public static func encode(word: UInt32) -> [UInt8] {
        var out: [UInt8] = []
        out.appendLE(word)
        return out
    }

    public static func encode(apploader: [UInt16]) -> [UInt8] {
        var out: [UInt8] = []
        for part in apploader.prefix(4) { out.appendLE(part) }
        return out + [UInt8](repeating: 0, count: 8 - out.count)
    }

    /// An application version (a u32 in its application properties) as `--skip-if-version` and
    /// the ledger compare it: major.minor.patch from its top byte, the next, and the low 16 bits.
    public static func firmwareVersion(_ word: UInt32) -> FirmwareVersion { FirmwareVersion(packed: word) }

    /// "OTA version 3, AppLoader 2.13.0.1, bootloader 0x01020000, application 0x00010000".
    public var text: String {
        [otaVersion.map { "OTA version \($0)" },
         apploader.map { "AppLoader " + $0.map(String.init).joined(separator: ".") },
         bootloader.map { "bootloader 0x" + hex32($0) },
         application.map { "application 0x" + hex32($0) }].compactMap { $0 }.joined(separator: ", ")
    }
}
