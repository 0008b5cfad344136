import ArgumentParser
import Foundation
import OTA
import OTACommandLine

/// `otaflash help simulator` (also `otaflash simulator`): the simulated peripheral's options, by
/// what they set up. `flash --simulator` and `otaflash simulate` take them; `flash --help` leaves
/// them out so that what a person flashing real devices reads fits a screen.
struct SimulatorTopic: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "simulator",
        abstract: "The built-in simulated peripheral: its options, for `otaflash --simulator` (flash) and `otaflash simulate`.",
        usage: "otaflash [flash] --simulator [--sim-... <value>] <image>\notaflash simulate [--protocol <name>] [--sim-... <value>]",
        discussion: "With --simulator, flash sends the image to a simulated device in this process instead of a Bluetooth device: "
            + ProtocolTexts.simulatedDevices(ProtocolCommandLine.all) + " " + """
            `otaflash simulate` serves the same devices through BlueZ, \
            under the same --sim-* names. An option for another protocol's device is refused (exit 2).

            With --count N (flash only), N simulated devices C0:FF:EE:00:00:01 and up are flashed as a batch; \
            --sim-device-fault N:no-ota-service|small-slot|gone makes device N fail.

            Examples:
              otaflash --simulator --sim-time virtual firmware-samples/seeded-256k.bin
              otaflash --simulator --sim-drop-rate 0.01 --sim-disconnect-at 100000 app.hex
              otaflash --simulator --sim-buttonless unbonded app_dfu_package.zip
              otaflash --simulator --sim-smp-buf-size 2475 zephyr.signed.bin
              otaflash --simulator --sim-esp-component raw build/app.bin
            """,
        shouldDisplay: false
    )

    @OptionGroup(title: "Simulated device") var device: SimulatedDeviceOptions
    @OptionGroup(title: "Link and run (flash)") var link: SimulatedLinkOptions
    @OptionGroup(title: "Link security") var security: SimulatedSecurityOptions
    @OptionGroup(title: "Faults") var faults: FaultOptions
    /// Each protocol's simulated device's options, under its own title (its other options are
    /// left out of this topic).
    @OptionGroup var protocols: ProtocolOptions

    func run() throws {
        CLIContext.output.out(Self.simulatorOnly(Otaflash.helpMessage(for: Self.self)) + "\n")
    }

    /// The options this topic lists, which `flash --help` leaves to it.
    static var optionNames: Set<String> {
        Set(HelpText(simulatorOnly(helpMessage())).entries.flatMap(\.names)).subtracting(["--simulator", "-h", "--help"])
    }

    /// `help` without the protocols' options that are not their simulated devices'.
    static func simulatorOnly(_ help: String) -> String {
        HelpText(help).removing { entry in !entry.names.contains { $0.hasPrefix("--sim") || ["-h", "--help", "--version"].contains($0) } }
    }
}

/// ArgumentParser's help text cut into sections and option entries (an entry: its first line,
/// which names the option, and the lines its description wraps onto).
struct HelpText {
    struct Entry {
        var lines: [String]
        /// The option's names: `-q, --quiet <x>` is ["-q", "--quiet"].
        var names: [String] {
            guard let first = lines.first else { return [] }
            let head = first.trimmingCharacters(in: .whitespaces).components(separatedBy: "  ").first ?? ""
            return head.split(separator: " ").map { $0.trimmingCharacters(in: CharacterSet(charactersIn: ",")) }.filter { $0.hasPrefix("-") }
        }
    }

    /// Each line, or an entry where an option's lines start.
    enum Part {
        case line(String)
        case entry(Entry)
    }

    var parts: [Part] = []

    init(_ text: String) {
        for line in text.split(separator: "\n", omittingEmptySubsequences: false).map(String.init) {
            let isEntry = line.hasPrefix("  -") || line.hasPrefix("  <")
            let continues = line.hasPrefix("   ") && !line.trimmingCharacters(in: .whitespaces).isEmpty
            if isEntry {
                parts.append(.entry(Entry(lines: [line])))
            } else if continues, case .entry(var entry)? = parts.last {
                entry.lines.append(line)
                parts[parts.count - 1] = .entry(entry)
            } else {
                parts.append(.line(line))
            }
        }
    }

    var entries: [Entry] {
        parts.compactMap { if case .entry(let entry) = $0 { entry } else { nil } }
    }

    /// The text without the entries `drop` says to leave out, and without a section left empty.
    func removing(_ drop: (Entry) -> Bool) -> String {
        var kept: [Part] = parts.filter { if case .entry(let entry) = $0 { !drop(entry) } else { true } }
        // A section title ("SIMULATED FAULTS:") followed by no entry goes too, with its blank line.
        var index = 0
        while index < kept.count {
            if case .line(let title) = kept[index], title.hasSuffix(":"), !title.hasPrefix(" "), title == title.uppercased(),
               index + 1 >= kept.count || { if case .line(let next) = kept[index + 1] { next.isEmpty } else { false } }() {
                kept.remove(at: index)
                if index < kept.count, case .line(let blank) = kept[index], blank.isEmpty { kept.remove(at: index) }
                continue
            }
            index += 1
        }
        return kept.flatMap { part -> [String] in
            switch part {
            case .line(let line): [line]
            case .entry(let entry): entry.lines
            }
        }.joined(separator: "\n")
    }
}

extension Flash {
    /// `flash --help` without the simulated peripheral's options (`otaflash help simulator`).
    static func shortened(_ help: String) -> String {
        let simulator = SimulatorTopic.optionNames
        return HelpText(help).removing { entry in entry.names.contains { simulator.contains($0) || $0.hasPrefix("--sim-") } }
    }

    /// The line before the exit codes in `flash`'s description (which its man page shows after
    /// the synopsis).
    static let exitCodesTitle = "Exit codes:"

    /// `flash`'s help with the exit codes moved from its description to after the options, so that
    /// a reader meets the usage line first.
    static func withExitCodes(_ help: String) -> String {
        var lines = help.split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
        guard let start = lines.firstIndex(of: exitCodesTitle),
              let usage = lines[start...].firstIndex(where: { $0.hasPrefix("USAGE:") }) else { return help }
        var table = Array(lines[(start + 1)..<usage])
        lines.removeSubrange(start..<usage)
        while lines.last?.isEmpty == true { lines.removeLast() }
        while table.last?.isEmpty == true { table.removeLast() }
        return (lines + ["", "EXIT CODES:"] + table).joined(separator: "\n")
    }
}

/// `otaflash --help`: what a person flashing devices uses, on one screen. Every option it names is
/// one of `flash`'s (a test holds it to that); the rest is in `otaflash help flash`.
enum RootHelp {
    struct Line {
        let names: String
        let text: String
    }

    static var text: String { text(ProtocolCommandLine.all) }

    /// The help with `protocols` as the protocols registered.
    static func text(_ protocols: [ProtocolCommandLine]) -> String {
        let defaults = try? Flash.parse(["image.bin"])
        func value<T>(_ get: (Flash) -> T) -> String { defaults.map { "\(get($0))" } ?? "?" }
        let sections: [(String, [Line])] = [
            ("DEVICES", [
                Line(names: "--device <address>", text: "A device, e.g. AA:BB:CC:DD:EE:FF; repeat for several"),
                Line(names: "--devices-file <file>", text: "A file of device addresses, one per line"),
                Line(names: "--scan", text: "Every device advertising an update service"),
                Line(names: "--adapter <hciN>", text: "Bluetooth adapter (default: the first powered one)"),
                Line(names: "--simulator", text: "A simulated device instead (otaflash help simulator)"),
            ]),
            ("PROTOCOL", [
                Line(names: "--protocol <name>", text: "auto (the default), " + protocols.map(\.name).joined(separator: ", ")),
            ] + protocols.flatMap { registration in
                registration.texts.mainOptions.map { Line(names: $0.names, text: "\(registration.name): \($0.text)") }
            }),
            ("TUNING", [
                Line(names: "--connect-timeout <s>", text: "Seconds to find and connect (default \(value { $0.target.connectTimeout.optionText }))"),
                Line(names: "--reconnect-window <s>", text: "Seconds to reconnect after link loss (default \(value { $0.reconnectWindow.optionText }))"),
                Line(names: "--parallel <n>", text: "Devices flashed at once (default \(value { $0.batch.parallel }); --per-adapter)"),
                Line(names: "--retries <n>", text: "Whole-session retries per device (default \(value { $0.batch.retries }))"),
                Line(names: "--skip-if-version <v>", text: "Leave devices that run this version alone"),
                Line(names: "--pair", text: "Pair when the device requires it (--passkey)"),
            ]),
            ("OUTPUT", [
                Line(names: "--json", text: "JSON Lines events on stdout"),
                Line(names: "-q, --quiet", text: "Print nothing but errors"),
                Line(names: "-v, --verbose", text: "Log the link (debug level) to stderr"),
                Line(names: "--report <file>", text: "A CSV row per device as it ends"),
                Line(names: "--log-dir <dir>", text: "One JSON Lines log per device"),
            ]),
        ]
        let width = sections.flatMap(\.1).map(\.names.count).max() ?? 0
        var out = wrap("OVERVIEW: \(Otaflash.configuration.abstract)", indent: "") + [
            "",
            "USAGE: otaflash [flash] [<options>] <image>     (flash is the default command)",
            "       otaflash <command> [<options>]",
            "",
            "IMAGE:",
        ]
        out += wrap("  " + ProtocolTexts.rootImage(protocols), indent: "  ")
        for (title, lines) in sections {
            out += ["", "\(title):"]
            let indent = String(repeating: " ", count: width + 4)
            for line in lines {
                out += wrap("  " + line.names.padding(toLength: width + 2, withPad: " ", startingAt: 0) + line.text, indent: indent)
            }
        }
        out += ["", "COMMANDS:"]
        out += wrap("  " + Otaflash.commandNames.filter { $0 != "help" }.map { $0 == "flash" ? "flash (default)" : $0 }.joined(separator: ", "), indent: "  ")
        out += [
            "",
            "Every failure prints one line and exits with its own code (`otaflash help flash`",
            "lists them); `otaflash help simulator`, `otaflash help <command>` tell more.",
        ]
        return out.joined(separator: "\n")
    }

    /// The screen's width.
    static let columns = 80

    /// `line` cut at spaces into lines of at most `columns`, each after the first starting with `indent`.
    static func wrap(_ line: String, indent: String) -> [String] {
        var lines: [String] = []
        var current: String?
        for word in line.split(separator: " ", omittingEmptySubsequences: false) {
            guard let so = current else {
                current = String(word)
                continue
            }
            if so.count + 1 + word.count > columns, !so.trimmingCharacters(in: .whitespaces).isEmpty {
                lines.append(so)
                current = indent + word
            } else {
                current = so + " " + word
            }
        }
        return lines + [current ?? ""]
    }

    /// The options `text` names, for the test that holds them to `flash`'s.
    static var optionNames: [String] {
        text.matches(of: /--[a-z][a-z-]*/).map { String($0.output) }
    }
}

extension Otaflash {
    /// The command `arguments` run, as its help is asked for: "otaflash image list", or
    /// "otaflash flash" (the default command).
    static func commandPath(_ arguments: [String]) -> [String] {
        var command: any ParsableCommand.Type = Otaflash.self
        var path: [String] = []
        for argument in arguments.drop(while: { $0 == "help" }) {
            guard let sub = command.configuration.subcommands.first(where: { $0._commandName == argument }) else { break }
            path.append(argument)
            command = sub
        }
        return path.isEmpty ? ["flash"] : path
    }

    /// Where a usage error on `arguments` sends the reader: that command's own help (the simulator
    /// topic for a --sim-* option of flash's).
    static func helpPointer(_ arguments: [String], line: String) -> String {
        let path = commandPath(arguments)
        if path == ["flash"], line.contains("--sim-") { return "otaflash help simulator" }
        return "otaflash \(path.joined(separator: " ")) --help"
    }
}
