import Foundation
import OTAFlashCLI
import Testing

/// Every numeric option has a documented range; anything outside it (negative, huge, `inf`, `nan`,
/// not a number) is one usage line that names the option and its range, never a trap.
@Suite("otaflash option ranges")
struct OptionValidationTests {
    static func flash(_ option: String, _ value: String, _ range: String) -> BadValue {
        BadValue(arguments: simulator + [option, value, samplePath("seeded-4k.bin")], says: [option, range])
    }

    static func nordic(_ option: String, _ value: String, _ range: String) -> BadValue {
        BadValue(arguments: simulator + [option, value, samplePath("nordic/blinky-app.zip")], says: [option, range])
    }

    static let timeouts = ["--connect-timeout", "--reply-timeout", "--verify-timeout", "--activate-timeout", "--scan-window"]

    static let badValues: [BadValue] =
        timeouts.flatMap { option in
            ["inf", "1e309", "1e300", "nan", "0", "-1"].map { flash(option, $0, "0.001 and 86400 seconds") }
        }
        + ["inf", "1e300", "nan", "-1"].map { flash("--reconnect-window", $0, "0 and 86400 seconds") }
        + ["inf", "1e300", "nan", "-1"].map { flash("--sim-slow-flash-ms", $0, "0 and 1000000000 ms") }
        + ["inf", "nan", "7", "4001"].map { flash("--sim-interval-ms", $0, "7.5 and 4000 ms") }
        + ["4611686018427387904", "16777217", "255", "-1"].map { flash("--checkpoint-interval", $0, "256 and 16777216 bytes") }
        + ["99999999999999999999", "1e3", "abc"].map { flash("--checkpoint-interval", $0, "256–16777216 bytes") }
        + ["-1", "22", "518"].map { flash("--sim-mtu", $0, "23 and 517") }
        + ["-1", "0", "4294967296"].map { flash("--sim-slot-size", $0, "1 and 4294967295 bytes") }
        + ["-1", "1.5", "18446744073709551616"].map { flash("--sim-seed", $0, "0–18446744073709551615") }
        + ["-1", "1.5", "nan", "inf"].flatMap { value in
            ["--sim-drop-rate", "--sim-corrupt-rate", "--sim-gatt-error-rate", "--sim-lost-notification-rate"].map { flash($0, value, "0 and 1") }
        }
        + ["-5", "67108865"].flatMap { value in
            ["--sim-disconnect-at", "--sim-reboot-at", "--sim-corrupt-at", "--sim-flash-bitflip-at"].map { flash($0, value, "0 and 67108864") }
        }
        + ["0", "-3", "1001"].map { flash("--sim-packets-per-event", $0, "1 and 1000") }
        + ["0", "-1", "1001"].map { flash("--parallel", $0, "1 and 1000") }
        + ["0", "65"].map { flash("--per-adapter", $0, "1 and 64") }
        + ["-1", "101"].map { flash("--retries", $0, "0 and 100") }
        + ["0", "-2", "1001"].map { flash("--count", $0, "1 and 1000") }
        + ["-128", "21"].map { flash("--min-rssi", $0, "-127 and 20 dBm") }
        + ["-1", "4294967296", "abc"].flatMap { value in
            ["--hw-version", "--sim-hw-version", "--sim-app-version", "--sim-bootloader-version"].map { nordic($0, value, "4294967295") }
        }
        + ["0x10000", "65536"].map { nordic("--sim-softdevice", $0, "0x00 and 0xFFFF") }
        + ["0x", "AF", "0xZZ", "-1"].map { nordic("--sim-softdevice", $0, "a SoftDevice FWID like 0xAF, 0x00–0xFFFF") }
        + ["0x10000", "0xAF,0x10000"].map { nordic("--sd-req", $0, "0x00 and 0xFFFF") }
        + ["AF;B6", "0xAF,", ",", ""].map { nordic("--sd-req", $0, "SoftDevice FWIDs like 0xAF or 0xAF,0xB6, each 0x00–0xFFFF") }
        + [
            BadValue(arguments: simulator + ["--count", "2", "--sim-device-fault", "1001:gone", samplePath("seeded-4k.bin")],
                     says: ["--sim-device-fault", "1–1000"]),
            BadValue(arguments: ["scan", "--simulator", "--timeout", "inf"], says: ["--timeout", "0.001 and 86400 seconds"]),
            BadValue(arguments: ["scan", "--simulator", "--min-rssi", "-200"], says: ["--min-rssi", "-127 and 20 dBm"]),
            BadValue(arguments: ["info", "--simulator", "--connect-timeout", "nan"], says: ["--connect-timeout", "0.001 and 86400"]),
            BadValue(arguments: ["info", "--simulator", "--sim-slot-size", "0"], says: ["--sim-slot-size", "1 and 4294967295"]),
            BadValue(arguments: ["simulate", "--slot-size", "-1"], says: ["--slot-size", "1 and 4294967295"]),
            BadValue(arguments: ["simulate", "--sim-slow-flash-ms", "inf"], says: ["--sim-slow-flash-ms", "0 and 1000000000"]),
            BadValue(arguments: ["simulate", "--sim-drop-rate", "nan"], says: ["--sim-drop-rate", "0 and 1"]),
            BadValue(arguments: ["simulate", "--protocol", "smp", "--buf-size", "63"], says: ["--buf-size", "64 and 65543 bytes"]),
            BadValue(arguments: ["simulate", "--protocol", "smp", "--buf-count", "33"], says: ["--buf-count", "1 and 32"]),
            BadValue(arguments: ["simulate", "--protocol", "smp", "--buf-count", "x"], says: ["--buf-count", "a whole number 1–32"]),
            BadValue(arguments: ["simulate", "--buf-size", "2475"], says: ["--buf-size", "add --protocol smp"]),
        ]

    @Test(arguments: badValues)
    func anOutOfRangeValueIsOneUsageLineNamingTheRange(input: BadValue) async {
        let run = await otaflash(input.arguments)
        expectOneUsageLine(run, saying: input.says)
        #expect(!run.stdout.contains("\"event\":\"connecting\""))
    }

    /// Values at the edges of each range are accepted.
    @Test(arguments: [
        ["--reply-timeout", "86400", "--verify-timeout", "0.5", "--activate-timeout", "86400", "--connect-timeout", "86400"],
        ["--reconnect-window", "0", "--checkpoint-interval", "16777216"],
        ["--checkpoint-interval", "256", "--sim-mtu", "23"],
        ["--sim-mtu", "517", "--sim-interval-ms", "7.5", "--sim-packets-per-event", "1000"],
        ["--sim-seed", "18446744073709551615", "--sim-drop-rate", "0", "--sim-slow-flash-ms", "0"],
        ["--sim-disconnect-at", "67108864", "--sim-flash-bitflip-at", "67108864", "--sim-slot-size", "4294967295"],
    ])
    func valuesAtTheEdgesOfTheirRangesFlash(extra: [String]) async {
        let run = await otaflash(simulator + ["--quiet"] + extra + [samplePath("seeded-4k.bin")])
        #expect(run.code == 0, "\(run.stderr)")
    }

    /// The Secure DFU options at the edges of their ranges: the debug bootloader skips the version
    /// checks, so any hardware, SoftDevice and installed versions take the unsigned debug sample.
    @Test(arguments: [
        ["--sim-hw-version", "0", "--sim-softdevice", "0x00", "--sim-app-version", "4294967295", "--sim-bootloader-version", "0"],
        ["--sim-hw-version", "4294967295", "--sim-softdevice", "0xFFFF", "--sim-app-version", "0", "--sim-bootloader-version", "4294967295"],
    ])
    func secureDFUValuesAtTheEdgesOfTheirRangesFlash(extra: [String]) async {
        let run = await otaflash(simulator + ["--quiet", "--sim-open-bootloader", "--sim-debug-bootloader"] + extra
                                 + [samplePath("nordic/blinky-app-unsigned-debug.zip")])
        #expect(run.code == 0, "\(run.stderr)")
    }

    /// `--min-rssi -70`, as README writes it: a negative value is a value, not an unknown option.
    @Test func aNegativeRSSIIsAValue() async {
        let run = await otaflash(["scan", "--simulator", "--timeout", "0.01", "--min-rssi", "-70", "--json"])
        #expect(run.code == 0, "\(run.stderr)")
        #expect(run.jsonEvents.contains { $0["event"] as? String == "device" })
    }

    /// Each numeric option's help states its range, so the error line is never the first place a user meets it.
    @Test(arguments: [
        (["flash", "--help"], ["(0.001–86400 seconds)", "(0–86400 seconds)", "(256–16777216 bytes)", "(1–1000)", "(1–64)", "(0–100)",
                               "(-127–20 dBm)", "(0–4294967295)", "each 0x00–0xFFFF"]),
        (["help", "simulator"], ["(23–517)", "(7.5–4000 ms)", "(0–1)", "(0–1000000000 ms)", "(0–67108864)", "(0–18446744073709551615)",
                                 "(1–4294967295 bytes)", "(0–4294967295)", "(0x00–0xFFFF)"]),
        (["scan", "--help"], ["(0.001–86400 seconds)", "(-127–20 dBm)", "(1–4294967295 bytes)"]),
        (["simulate", "--help"], ["(1–4294967295 bytes)", "(0–1)", "(0–67108864)"]),
    ])
    func helpStatesTheRanges(arguments: [String], ranges: [String]) async {
        let run = await otaflash(arguments)
        #expect(run.code == 0)
        let help = run.stdout.replacingOccurrences(of: #"\s+"#, with: " ", options: .regularExpression)
        for range in ranges {
            #expect(help.contains(range), "\(arguments.joined(separator: " ")) does not state \(range)")
        }
    }

    /// The values that used to trap ("Double value cannot be converted to Int64", exit 132), run as
    /// a real process: exit 2, no signal.
    @Test(arguments: [
        ["--reply-timeout", "inf"], ["--verify-timeout", "1e309"], ["--activate-timeout", "1e300"], ["--connect-timeout", "nan"],
        ["--reconnect-window", "1e300"], ["--sim-slow-flash-ms", "1e300"], ["--sim-interval-ms", "1e300"],
        ["--checkpoint-interval", "4611686018427387904"], ["--count", "2", "--scan-window", "inf"],
    ])
    func formerTrapsExit2AsAProcess(extra: [String]) throws {
        let child = try Child(simulator + extra + [samplePath("seeded-4k.bin")])
        let exit = child.exit()
        #expect(!exit.signalled, "\(exit.stderr)")
        #expect(exit.status == 2, "\(exit.stderr)")
        #expect(exit.stderr.split(separator: "\n").filter { $0.hasPrefix("otaflash: error:") }.count == 1, "\(exit.stderr)")
    }
}
