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

/// The range of every numeric option no single protocol owns: the help texts, `validate()` and
/// the parse-error lines all read them from here. A protocol's own options have their ranges in
/// its module, which registers their texts (`ProtocolCommandLine.rangeTexts`).
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
    /// Bluetooth Core 5.x, Vol 4, Part E, 7.7.65.2: an advertising report's RSSI is -127 to +20 dBm.
    public static let minRSSI = Bounds("--min-rssi", -127...20, unit: " dBm")
    public static let count = Bounds("--count", 1...1000)
    public static let parallel = Bounds("--parallel", 1...1000)
    public static let perAdapter = Bounds("--per-adapter", 1...64)
    public static let retries = Bounds("--retries", 0...100)
    public static let simDevice = Bounds("--sim-device-fault N", 1...1000)
    /// Bluetooth Core 5.x, Vol 3, Part F, 3.2.8: ATT_MTU of LE is at least 23; 517 holds the longest attribute value.
    public static let mtu = Bounds("--sim-mtu", 23...517)
    /// Bluetooth Core 5.x, Vol 6, Part B, 4.5.1: a connection interval is 7.5 ms to 4 s.
    public static let interval = Bounds("--sim-interval-ms", 7.5...4000, unit: " ms")
    public static let packetsPerEvent = Bounds("--sim-packets-per-event", 1...1000)
    /// The device reports its slot as a 32-bit size.
    public static let simSlotSize = Bounds("--sim-slot-size", 1...Int(UInt32.max), unit: " bytes")
    public static let slotSize = Bounds("--slot-size", 1...Int(UInt32.max), unit: " bytes")
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
    /// The Security Manager's passkey is six decimal digits (Core Spec Vol 3, Part H, 2.3.5.3).
    public static let passkey = Bounds("--passkey", 0...Int(PairingCredentials.maxPasskey))
    public static let simPasskey = Bounds("--sim-passkey", passkey.range)
    public static let pairTimeout = timeout("--pair-timeout")

    /// Each option's range as text, for the line that reports a value that is not a number at all.
    public static let texts: [String: String] = {
        let ints: [Bounds<Int>] = [ledgerLimit, minRSSI, count, parallel, perAdapter, retries, mtu, packetsPerEvent, simSlotSize, slotSize,
                                   disconnectAt, rebootAt, corruptAt, flashBitflipAt, stopAnsweringAt, passkey, simPasskey]
        let doubles: [Bounds<Double>] = [connectTimeout, replyTimeout, verifyTimeout, activateTimeout, reconnectWindow, stallTimeout,
                                         scanWindow, scanTimeout, probeTimeout, interval, dropRate, corruptRate, gattErrorRate,
                                         lostNotificationRate, slowFlash, pairTimeout]
        var texts = Ranges.texts(whole: ints, numbers: doubles)
        texts[seed.option] = "a whole number " + seed.text
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
