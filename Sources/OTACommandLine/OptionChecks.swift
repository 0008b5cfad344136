import ArgumentParser
import Foundation
import GATT
import OTA

/// A number an option accepts: whole numbers and fractions print as a person would write them.
public protocol OptionNumber: Comparable, Sendable {
    var optionText: String { get }
}

extension Int: OptionNumber { public var optionText: String { String(self) } }
extension UInt64: OptionNumber { public var optionText: String { String(self) } }
extension Double: OptionNumber {
    public var optionText: String {
        isFinite && self == rounded() && Swift.abs(self) < 1e15 ? String(Int64(self)) : "\(self)"
    }
}

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

/// A numeric option's documented range: stated in its help text and checked in `validate()`, so
/// that no value (negative, huge, `inf`, `nan`) reaches code that could trap on it.
public struct Bounds<Value: OptionNumber>: Sendable {
    public let option: String
    public let range: ClosedRange<Value>
    /// The unit after the numbers, e.g. " seconds" (with its leading space), or "".
    public let unit: String

    public init(_ option: String, _ range: ClosedRange<Value>, unit: String = "") {
        self.option = option
        self.range = range
        self.unit = unit
    }

    /// "23–517", or "0.001–86400 seconds".
    public var text: String { "\(range.lowerBound.optionText)–\(range.upperBound.optionText)\(unit)" }

    /// Help text ending with the range, e.g. "Negotiated ATT MTU (23–517).".
    public func help(_ what: String, valueName: String? = nil) -> ArgumentHelp {
        ArgumentHelp("\(what) (\(text)).", valueName: valueName)
    }

    public func check(_ value: Value) throws(ValidationError) {
        guard range.contains(value) else {
            throw ValidationError("\(option) must be between \(range.lowerBound.optionText) and \(range.upperBound.optionText)\(unit), got \(value.optionText)")
        }
    }

    public func check(_ value: Value?) throws(ValidationError) {
        if let value { try check(value) }
    }

    public func check(_ values: [Value]) throws(ValidationError) {
        for value in values { try check(value) }
    }
}

extension Bounds where Value == Double {
    /// The option's value as a duration: the one conversion every seconds (or milliseconds) option
    /// goes through. The value is clamped into the range first, so even an unchecked `inf` or
    /// `nan` cannot trap here; `validate()` has refused those with a line that names the range.
    public func duration(_ value: Double) -> Duration {
        let clamped = value.isNaN ? range.lowerBound : Swift.min(Swift.max(value, range.lowerBound), range.upperBound)
        let scale = unit == " ms" ? 1e3 : 1e6
        return .microseconds(Int64((clamped * scale).rounded()))
    }
}

/// Every numeric option's range, in one place: the help texts, `validate()` and the parse-error
/// lines all read them from here.
public enum Ranges {
    public static let day = 86_400.0
    public static func timeout(_ option: String) -> Bounds<Double> { Bounds(option, 0.001...day, unit: " seconds") }

    public static let connectTimeout = timeout("--connect-timeout")
    public static let replyTimeout = timeout("--reply-timeout")
    public static let verifyTimeout = timeout("--verify-timeout")
    public static let activateTimeout = timeout("--activate-timeout")
    public static let reconnectWindow = Bounds("--reconnect-window", 0...day, unit: " seconds")
    public static let stallTimeout = timeout("--stall-timeout")
    public static let scanWindow = timeout("--scan-window")
    public static let scanTimeout = timeout("--timeout")
    public static let probeTimeout = Bounds("--probe-timeout", 0.001...120, unit: " seconds")
    public static let ledgerLimit = Bounds("--limit", 1...100_000_000)
    public static let checkpointInterval = Bounds("--checkpoint-interval", 256...(16 << 20), unit: " bytes")
    /// Bluetooth Core 5.x, Vol 4, Part E, 7.7.65.2: an advertising report's RSSI is -127 to +20 dBm.
    public static let minRSSI = Bounds("--min-rssi", -127...20, unit: " dBm")
    public static let count = Bounds("--count", 1...1000)
    public static let parallel = Bounds("--parallel", 1...1000)
    public static let perAdapter = Bounds("--per-adapter", 1...64)
    public static let retries = Bounds("--retries", 0...100)
    public static let simDevice = Bounds("--sim-device-fault N", 1...1000)
    /// MCUmgr image slots: 0 and 1 per image, up to four images (Zephyr's img_mgmt).
    public static let smpSlot = Bounds("--slot", 0...7)
    /// SMP requests kept in flight, at most (the device's buffer count bounds it too).
    public static let smpWindow = Bounds("--smp-window", 1...32)
    /// Zephyr's MCUmgr netbuf: 64 bytes at the least, 65,535 + 8 the most the SMP header can say.
    public static let smpBufferSize = Bounds("--sim-smp-buf-size", 64...65543)
    public static let smpBufferCount = Bounds("--sim-smp-buf-count", 1...32)
    /// The image management group's error codes (Zephyr's `IMG_MGMT_ERR_*`, 1 to 33).
    public static let smpRefuseUpload = Bounds("--sim-smp-refuse-upload", 1...33)
    public static let smpBusyAbove = Bounds("--sim-smp-busy-above", 1...32)
    /// The simulated SMP server's slot erase at a new upload: up to ten minutes.
    public static let smpEraseSeconds = Bounds("--sim-smp-erase-seconds", 0...600.0, unit: " seconds")
    /// Bluetooth Core 5.x, Vol 3, Part F, 3.2.8: ATT_MTU of LE is at least 23; 517 holds the longest attribute value.
    public static let mtu = Bounds("--sim-mtu", 23...517)
    /// Bluetooth Core 5.x, Vol 6, Part B, 4.5.1: a connection interval is 7.5 ms to 4 s.
    public static let interval = Bounds("--sim-interval-ms", 7.5...4000, unit: " ms")
    public static let packetsPerEvent = Bounds("--sim-packets-per-event", 1...1000)
    /// The device reports its slot as a 32-bit size.
    public static let simSlotSize = Bounds("--sim-slot-size", 1...Int(UInt32.max), unit: " bytes")
    public static let slotSize = Bounds("--slot-size", 1...Int(UInt32.max), unit: " bytes")
    /// The native device's OTA protocol version (docs/PROTOCOL.md): 1, or 2 with its flash declaration.
    public static let simDeviceVersion = Bounds("--sim-device-version", 1...2)
    public static let deviceVersion = Bounds("--device-version", simDeviceVersion.range)
    /// An SMP frame is its 8-byte header and at most 65,535 bytes of CBOR; below 64 bytes no upload
    /// request with data fits.
    public static let bufSize = Bounds("--buf-size", smpBufferSize.range, unit: " bytes")
    /// Zephyr's CONFIG_MCUMGR_TRANSPORT_NETBUF_COUNT, as --sim-smp-buf-count.
    public static let bufCount = Bounds("--buf-count", smpBufferCount.range)
    public static let seed = Bounds("--sim-seed", 0...UInt64.max)
    public static func rate(_ option: String) -> Bounds<Double> { Bounds(option, 0...1) }
    public static let dropRate = rate("--sim-drop-rate")
    public static let corruptRate = rate("--sim-corrupt-rate")
    public static let gattErrorRate = rate("--sim-gatt-error-rate")
    public static let lostNotificationRate = rate("--sim-lost-notification-rate")
    public static let slowFlash = Bounds("--sim-slow-flash-ms", 0...1e9, unit: " ms")
    /// Offsets past the largest image otaflash sends would never fire.
    public static func offset(_ option: String) -> Bounds<Int> { Bounds(option, 0...FirmwareImage.maximumSize) }
    public static let disconnectAt = offset("--sim-disconnect-at")
    public static let rebootAt = offset("--sim-reboot-at")
    public static let corruptAt = offset("--sim-corrupt-at")
    public static let flashBitflipAt = offset("--sim-flash-bitflip-at")
    public static let stopAnsweringAt = offset("--sim-stop-answering-at")
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
    /// The Security Manager's passkey is six decimal digits (Core Spec Vol 3, Part H, 2.3.5.3).
    public static let passkey = Bounds("--passkey", 0...Int(PairingCredentials.maxPasskey))
    public static let simPasskey = Bounds("--sim-passkey", passkey.range)
    public static let pairTimeout = timeout("--pair-timeout")
    /// How long `--check-command` may run: at least a second, at most an hour.
    public static let checkTimeout = Bounds("--check-timeout", 1.0...3600.0, unit: " seconds")

    /// Each option's range as text, for the line that reports a value that is not a number at all.
    public static let texts: [String: String] = {
        let ints: [Bounds<Int>] = [ledgerLimit, checkpointInterval, minRSSI, count, parallel, perAdapter, retries, mtu, packetsPerEvent,
                                   simSlotSize, slotSize, bufSize, bufCount, disconnectAt, rebootAt, corruptAt, flashBitflipAt, stopAnsweringAt,
                                   hwVersion, simHWVersion, simAppVersion, simBootloaderVersion, smpSlot, smpWindow, smpBufferSize,
                                   smpBufferCount, smpRefuseUpload, smpBusyAbove, passkey, simPasskey, simDeviceVersion, deviceVersion]
        let doubles: [Bounds<Double>] = [connectTimeout, replyTimeout, verifyTimeout, activateTimeout, reconnectWindow, stallTimeout,
                                         scanWindow, scanTimeout, probeTimeout, interval, dropRate, corruptRate, gattErrorRate,
                                         lostNotificationRate, slowFlash, pairTimeout, checkTimeout, smpEraseSeconds]
        var texts = Ranges.texts(whole: ints, numbers: doubles)
        texts[seed.option] = "a whole number " + seed.text
        for b in [simSoftDevice, sdAfterUpdate] { texts[b.option] = "a SoftDevice FWID like 0xAF, " + b.text }
        texts[sdReq.option] = "SoftDevice FWIDs like 0xAF or 0xAF,0xB6, each " + sdReq.text
        return texts
    }()

    /// The range texts of options a protocol module declares itself, for `explain`.
    public static func texts(whole ints: [Bounds<Int>], numbers doubles: [Bounds<Double>] = []) -> [String: String] {
        var texts: [String: String] = [:]
        for b in ints { texts[b.option] = "a whole number " + b.text }
        for b in doubles { texts[b.option] = "a number " + b.text }
        return texts
    }

    /// ArgumentParser's "The value 'x' is invalid for '--opt <v>'" with the option's range added
    /// (from `texts`, or from `more`: the ranges the protocols register).
    public static func explain(_ line: String, more: [String: String] = [:]) -> String {
        guard line.hasPrefix("The value "),
              let match = line.firstMatch(of: /is invalid for '(-[-A-Za-z0-9]+)/),
              let text = texts[String(match.1)] ?? more[String(match.1)] else { return line }
        return line + ": expected " + text
    }
}

/// Checks of the paths a run writes to, made before any radio time so that a typo costs nothing.
public enum OutputPaths {
    /// A file the run will create or replace: its folder must exist and be writable, and it must
    /// not be a folder itself.
    public static func checkFile(_ path: String, option: String) throws(CLIFailure) {
        var isDirectory: ObjCBool = false
        if FileManager.default.fileExists(atPath: path, isDirectory: &isDirectory) {
            if isDirectory.boolValue { throw CLIFailure(.usage, "\(option) \(path) is a directory; give a file path") }
            guard access(path, W_OK) == 0 else { throw CLIFailure(.usage, "\(option) \(path) is not writable") }
            return
        }
        let parent = (path as NSString).deletingLastPathComponent
        let folder = parent.isEmpty ? "." : parent
        guard FileManager.default.fileExists(atPath: folder, isDirectory: &isDirectory), isDirectory.boolValue else {
            throw CLIFailure(.usage, "\(option) \(path): the folder \(folder) does not exist; create it first")
        }
        guard access(folder, W_OK | X_OK) == 0 else {
            throw CLIFailure(.usage, "\(option) \(path): the folder \(folder) is not writable")
        }
    }

    /// A directory the run will write into: made when missing, as `mkdir` makes one (its parent
    /// must exist: a typo in the path is refused, not made into a tree of directories); it must be
    /// a writable directory. Each refusal is one sentence naming the part of the path at fault.
    public static func prepareDirectory(_ path: String, option: String) throws(CLIFailure) {
        var isDirectory: ObjCBool = false
        if FileManager.default.fileExists(atPath: path, isDirectory: &isDirectory) {
            guard isDirectory.boolValue else { throw CLIFailure(.usage, "\(option) \(path) is a file, not a directory") }
        } else {
            let trimmed = path.count > 1 && path.hasSuffix("/") ? String(path.dropLast()) : path
            let parent = (trimmed as NSString).deletingLastPathComponent
            let folder = parent.isEmpty ? "." : parent
            if !FileManager.default.fileExists(atPath: folder, isDirectory: &isDirectory) {
                // The first part of the path that exists says why: a file where a folder belongs, or a missing folder.
                var ancestor = folder
                while !ancestor.isEmpty, ancestor != "/", !FileManager.default.fileExists(atPath: ancestor, isDirectory: &isDirectory) {
                    ancestor = (ancestor as NSString).deletingLastPathComponent
                }
                if !ancestor.isEmpty, FileManager.default.fileExists(atPath: ancestor, isDirectory: &isDirectory), !isDirectory.boolValue {
                    throw CLIFailure(.usage, "\(option) \(path): \(ancestor) is a file, not a directory")
                }
                throw CLIFailure(.usage, "\(option) \(path): the directory \(folder) does not exist; create it first (\(option) makes only its last directory)")
            }
            guard isDirectory.boolValue else { throw CLIFailure(.usage, "\(option) \(path): \(folder) is a file, not a directory") }
            if mkdir(path, 0o755) != 0, errno != EEXIST {
                throw CLIFailure(.usage, "cannot create the \(option) directory \(path): \(String(cString: strerror(errno)))")
            }
        }
        guard access(path, W_OK | X_OK) == 0 else { throw CLIFailure(.usage, "the \(option) directory \(path) is not writable") }
    }

    /// Why `path` may not be replaced by a file the run writes (a device node, a FIFO, a socket, a
    /// directory: renaming a file over it would put a regular file in its place), as one line
    /// naming `what` is written; nil for a regular file (or a link to one), or nothing yet.
    public static func notARegularFile(_ path: String, for what: String) -> String? {
        var info = stat()
        guard stat(path, &info) == 0 else { return nil }
        let kind: String
        switch info.st_mode & S_IFMT {
        case S_IFREG: return nil
        case S_IFCHR: kind = "a character device"
        case S_IFBLK: kind = "a block device"
        case S_IFIFO: kind = "a FIFO"
        case S_IFSOCK: kind = "a socket"
        case S_IFDIR: kind = "a directory"
        default: kind = "not a regular file"
        }
        return "\(path) is \(kind); \(what) is written only to a regular file or a new one: give a file path"
    }

    /// The POSIX reason of a Foundation file error ("Permission denied"), else its description.
    public static func reason(_ error: any Error) -> String {
        let ns = error as NSError
        if let underlying = ns.userInfo[NSUnderlyingErrorKey] as? NSError, underlying.domain == NSPOSIXErrorDomain {
            return String(cString: strerror(Int32(underlying.code)))
        }
        return ns.localizedDescription
    }
}

/// ArgumentParser's refusal of a value outside `Choice`'s, for an option taken as text (a hidden
/// former name: ArgumentParser names the values of a hidden option's type in no refusal).
public func checkChoice<Choice: ExpressibleByArgument>(_ text: String?, _: Choice.Type, option: String) throws {
    guard let text, Choice(argument: text) == nil else { return }
    let values = Choice.allValueStrings.map { "'\($0)'" }
    throw ValidationError("The value '\(text)' is invalid for '\(option)'. Please provide one of "
                          + values.dropLast().joined(separator: ", ") + " or " + (values.last ?? "") + ".")
}
