import ArgumentParser
import Foundation
import OTACommandLine

/// A SoftDevice firmware ID as nrfutil writes it (0xAF) or in decimal (175).
public struct FWID: OptionNumber, ExpressibleByArgument, Hashable {
    public let value: UInt32

    public init(_ value: UInt32) { self.value = value }

    public init?(argument: String) {
        let text = argument.trimmingCharacters(in: .whitespaces)
        let hex = text.lowercased().hasPrefix("0x")
        guard let value = hex ? UInt32(text.dropFirst(2), radix: 16) : UInt32(text) else { return nil }
        self.value = value
    }

    public var optionText: String { "0x" + String(format: "%02X", value) }
    public static func < (a: FWID, b: FWID) -> Bool { a.value < b.value }
}

/// SoftDevice FWIDs separated by commas, as nrfutil's `--sd-req` takes them: 0xAF,0xB6.
public struct FWIDList: ExpressibleByArgument, Hashable, Sendable {
    public let values: [FWID]

    public init?(argument: String) {
        let parts = argument.split(separator: ",", omittingEmptySubsequences: false).map { FWID(argument: String($0)) }
        guard !parts.isEmpty, !parts.contains(nil) else { return nil }
        values = parts.compactMap { $0 }
    }
}

/// The ranges of Secure DFU's own numeric options: stated in their help texts, checked in
/// `validate()`, and registered (`ProtocolCommandLine.rangeTexts`) for the line that refuses a
/// value that is not a number at all.
public enum NordicDFURanges {
    /// Secure DFU init packets carry versions as uint32 (dfu-cc.proto `InitCommand`).
    public static func uint32(_ option: String) -> Bounds<Int> { Bounds(option, 0...Int(UInt32.max)) }
    public static let hwVersion = uint32("--hw-version")
    public static let simHWVersion = uint32("--sim-hw-version")
    public static let simAppVersion = uint32("--sim-app-version")
    public static let simBootloaderVersion = uint32("--sim-bootloader-version")
    /// A SoftDevice FWID is 16 bits (nrfutil `--sd-req`, the SoftDevice's info struct).
    public static func fwid(_ option: String) -> Bounds<FWID> { Bounds(option, FWID(0)...FWID(0xFFFF)) }
    public static let sdReq = fwid("--sd-req")
    public static let simSoftDevice = fwid("--sim-softdevice")
    public static let sdAfterUpdate = fwid("--sd-after-update")

    /// Each option's range as text, for the line that reports a value that is not a number at all.
    public static let texts: [String: String] = {
        var texts = Ranges.texts(whole: [hwVersion, simHWVersion, simAppVersion, simBootloaderVersion])
        for b in [simSoftDevice, sdAfterUpdate] { texts[b.option] = "a SoftDevice FWID like 0xAF, " + b.text }
        texts[sdReq.option] = "SoftDevice FWIDs like 0xAF or 0xAF,0xB6, each " + sdReq.text
        return texts
    }()
}
