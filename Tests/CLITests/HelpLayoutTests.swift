import Foundation
import OTACommandLine
@testable import OTAFlashCLI
import Testing

/// Help as a new user reads it: the usage line first and short, examples that paste into a shell,
/// and no option listed that the command refuses.
@Suite("help as a person reads it")
struct HelpLayoutTests {
    static let commands = Otaflash.commandPaths()

    @Test func everyCommandIsReached() {
        #expect(Self.commands.contains(["station"]) && Self.commands.contains(["info"]) && Self.commands.count > 12, "\(Self.commands)")
    }

    /// The USAGE lines of every command fit a screen.
    @Test(arguments: commands)
    func usageFitsAScreen(command: [String]) async {
        let run = await otaflash(command + ["--help"])
        #expect(run.code == 0, "\(run.stderr)")
        let lines = run.stdout.split(separator: "\n", omittingEmptySubsequences: false)
        let usage = lines.drop { !$0.hasPrefix("USAGE:") }.prefix { !$0.isEmpty }
        #expect(!usage.isEmpty, "otaflash \(command.joined(separator: " ")) --help has no USAGE")
        for line in usage {
            #expect(line.count <= 80, "otaflash \(command.joined(separator: " ")): a usage line of \(line.count) characters: \(line)")
        }
    }

    /// An example that does not fit on its line goes on with a shell continuation, so that it
    /// pastes: each line of an Examples block starts a command or follows a line ending in `\`.
    @Test(arguments: commands + [[]])
    func examplesPasteIntoAShell(command: [String]) async {
        let run = await otaflash(command.isEmpty ? ["help", "flash"] : ["help"] + command)
        #expect(run.code == 0, "\(run.stderr)")
        let lines = run.stdout.split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
        var inExamples = false
        var continues = false
        for line in lines {
            let text = line.trimmingCharacters(in: .whitespaces)
            if text == "Examples:" || text == "Example:" {
                inExamples = true
                continue
            }
            if text.isEmpty || !line.hasPrefix("  ") { inExamples = false }
            guard inExamples else { continue }
            #expect(continues || text.hasPrefix("otaflash "), "otaflash help \(command.joined(separator: " ")): an example line that does not paste: \(line)")
            continues = text.hasSuffix("\\")
        }
    }

    @Test(arguments: [["help", "flash"], ["flash", "--help"]])
    func flashHelpShowsUsageBeforeTheExitCodes(arguments: [String]) async throws {
        let run = await otaflash(arguments)
        let usage = try #require(run.stdout.range(of: "USAGE:"))
        let codes = try #require(run.stdout.range(of: "EXIT CODES:"))
        let options = try #require(run.stdout.range(of: "OPTIONS:"))
        #expect(usage.lowerBound < options.lowerBound && options.lowerBound < codes.lowerBound)
        #expect(run.stdout.contains("  21   not_confirmed"))
        #expect(run.stdout.ranges(of: "EXIT CODES:").count == 1 && !run.stdout.contains(Flash.exitCodesTitle))
        // The description keeps them, for the man page, which puts the synopsis first.
        #expect(Flash.configuration.discussion.contains(Flash.exitCodesTitle + "\n" + ExitCode.helpTable(ProtocolCommandLine.all)))
    }

    /// `help station` leaves the simulated peripheral's options to `otaflash help simulator`, as
    /// `flash --help` does, and keeps the simulated line's.
    @Test func stationHelpLeavesTheSimulatorsOptionsToTheirTopic() async {
        let help = await otaflash(["help", "station"])
        let names = CommandLineShapeTests.entryNames(help.stdout)
        #expect(names.intersection(SimulatorTopic.optionNames).isEmpty, "\(names.intersection(SimulatorTopic.optionNames).sorted())")
        #expect(names.isSuperset(of: ["--simulator", "--sim-devices", "--sim-arrivals", "--sim-dwell", "--sim-fail", "--ledger"]), "\(names.sorted())")
        #expect(help.stdout.contains("otaflash help simulator"))
    }

    /// `help station` lists none of `flash`'s options a station refuses, and each of those is refused.
    @Test(arguments: Station.refusedOptions.sorted())
    func stationHelpLeavesOutWhatStationRefuses(option: String) async {
        let help = await otaflash(["help", "station"])
        #expect(help.code == 0)
        #expect(!CommandLineShapeTests.entryNames(help.stdout).contains(option), "help station lists \(option)")
        #expect(CommandLineShapeTests.entryNames(help.stdout).contains("--retry-backoff"))
        let values = ["--device": ["AA:BB:CC:DD:EE:FF"], "--devices-file": ["line.txt"], "--count": ["2"], "--sim-device-fault": ["1:gone"],
                      "--sim-state": ["/tmp/otaflash-station-state"]]
        let run = await otaflash(["station", "--simulator", option] + (values[option] ?? []) + [samplePath("seeded-4k.bin")])
        expectOneUsageLine(run, saying: [option])
    }
}
