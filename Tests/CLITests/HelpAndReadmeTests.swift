import Foundation
import OTAFlashCLI
import TestSupport
import Testing

@Suite("otaflash help and README")
struct HelpAndReadmeTests {
    static let simOptions = ["--sim-seed", "--sim-mtu", "--sim-drop-rate", "--sim-disconnect-at", "--sim-slot-size"]

    /// `otaflash --help` fits a screen; the simulator's options are one command away, in
    /// `otaflash help simulator`.
    @Test func helpExitsZeroAndSimulatorOptionsAreInTheirTopic() async {
        let run = await otaflash(["--help"])
        #expect(run.code == 0)
        #expect(run.stderr.isEmpty)
        #expect(run.stdout.contains("otaflash help simulator"))
        let topic = await otaflash(["help", "simulator"])
        #expect(topic.code == 0)
        for option in Self.simOptions {
            #expect(topic.stdout.contains(option), "otaflash help simulator does not mention \(option)")
        }
    }

    @Test(arguments: [["flash", "--help"], ["help", "flash"]])
    func flashHelpMentionsItsOptions(arguments: [String]) async {
        let run = await otaflash(arguments)
        #expect(run.code == 0)
        for option in ["--simulator", "--json", "--quiet", "--checkpoint-interval", "--protocol", "--device"] {
            #expect(run.stdout.contains(option), "\(arguments.joined(separator: " ")) does not mention \(option)")
        }
    }

    /// `otaflash --version` names the release and the commit; scripts/package reads the release from it.
    @Test func versionNamesTheReleaseAndTheCommit() async throws {
        let run = await otaflash(["--version"])
        #expect(run.code == 0)
        #expect(run.stdout == OtaflashVersion.line + "\n")
        let parts = OtaflashVersion.number.split(separator: ".", omittingEmptySubsequences: false)
        #expect(parts.count == 3 && parts.allSatisfy { !$0.isEmpty && $0.allSatisfy(\.isASCII) && $0.allSatisfy(\.isNumber) },
                "the version \(OtaflashVersion.number) is not major.minor.patch")
        #expect(run.stdout.hasPrefix("otaflash \(OtaflashVersion.number) (commit "))
        if let commit = OtaflashVersion.commit {
            #expect(commit.range(of: "^[0-9a-f]{7}(-dirty)?$", options: .regularExpression) != nil, "commit \(commit)")
        }
        // Built in a git checkout, it names a commit of that checkout (HEAD when it was built; the
        // tests may run after later commits, so not necessarily HEAD now).
        let root = repositoryRoot.path
        if FileManager.default.fileExists(atPath: root + "/.git"), let git = findExecutable("git"),
           runToCompletion([git, "-C", root, "rev-parse", "HEAD"]) == 0 {
            let commit = try #require(OtaflashVersion.commit, "built in a git checkout but names no commit")
            let hash = String(commit.prefix { $0 != "-" })
            #expect(runToCompletion([git, "-C", root, "cat-file", "-e", hash + "^{commit}"]) == 0,
                    "\(hash) is not a commit of \(root)")
        }
    }

    /// README.md's "Exit codes" table lists exactly the codes otaflash can exit with.
    @Test func readmeExitCodesTableListsExactlyTheExitCodes() throws {
        let path = repositoryRoot.appendingPathComponent("README.md").path
        let readme = try #require(FileManager.default.contents(atPath: path).map { String(decoding: $0, as: UTF8.self) },
                                  "README.md not found at \(path)")
        let lines = readme.split(separator: "\n", omittingEmptySubsequences: false).map { $0.trimmingCharacters(in: .whitespaces) }
        let heading = try #require(lines.firstIndex { $0.hasPrefix("#") && $0.lowercased().contains("exit codes") },
                                   "README.md has no \"Exit codes\" section")
        let header = try #require(lines[heading...].firstIndex { $0.hasPrefix("|") && $0.lowercased().contains("| code |") },
                                  "README.md's \"Exit codes\" section has no table with a `| code |` column")
        let columns = lines[header].split(separator: "|").map { $0.trimmingCharacters(in: .whitespaces).lowercased() }
        let codeColumn = try #require(columns.firstIndex(of: "code"))
        var documented: [Int32: String] = [:]
        for row in lines[(header + 2)...] {
            guard row.hasPrefix("|") else { break }
            let cells = row.split(separator: "|").map { $0.trimmingCharacters(in: .whitespaces) }
            let code = try #require(Int32(cells[codeColumn]), "not a code: \(row)")
            #expect(documented[code] == nil, "code \(code) is listed twice")
            documented[code] = row
        }
        let expected = Set(ExitCode.allCases.map(\.rawValue))
        #expect(Set(documented.keys) == expected,
                "README lists \(documented.keys.sorted()), otaflash has \(expected.sorted())")
        for code in ExitCode.allCases {
            #expect(documented[code.rawValue]?.contains(code.name) == true, "README's row for \(code.rawValue) does not name \(code.name)")
        }
    }

    /// `otaflash --help` sends readers to `otaflash help flash` for the exit codes: they are there,
    /// every one of them, generated from the code's own list.
    @Test(arguments: [["help", "flash"], ["flash", "--help"]])
    func flashHelpListsEveryExitCode(arguments: [String]) async {
        let run = await otaflash(arguments)
        #expect(run.code == 0)
        let lines = run.stdout.split(separator: "\n").map { $0.trimmingCharacters(in: .whitespaces) }
        for code in ExitCode.allCases {
            #expect(lines.contains("\(code.rawValue)".padding(toLength: 5, withPad: " ", startingAt: 0) + code.name),
                    "\(arguments.joined(separator: " ")) does not list exit code \(code.rawValue) \(code.name)")
        }
    }

    @Test(arguments: ["bogus", "flahs"])
    func helpForAnUnknownCommandIsAUsageError(name: String) async {
        let run = await otaflash(["help", name])
        #expect(run.code == 2)
        #expect(run.errorLines == ["otaflash: error: unknown command '\(name)': the commands are flash, scan, info, simulate, pair, unpair, image, reset, echo, files, ledger, station, dashboard, completions, help (and the topic simulator)"])
        #expect(run.stdout.isEmpty)
    }

    /// `scan` and `info` show the simulator switch and what the simulated device reports, not the
    /// link model and fault options that only a transfer uses.
    @Test(arguments: ["scan", "info"])
    func scanAndInfoHelpListOnlyTheSimulatorOptionsThatApply(command: String) async {
        let run = await otaflash([command, "--help"])
        #expect(run.code == 0)
        let simOptions = Set(run.stdout.matches(of: /--sim[-a-z]*/).map { String($0.output) })
        #expect(simOptions == ["--simulator", "--sim-slot-size", "--sim-firmware-version", "--sim-no-ota-service", "--sim-advertise-no-uuid", "--sim-device-version"], "\(simOptions.sorted())")
        for option in ["--checkpoint-interval", "--write-path", "--parallel"] {
            #expect(!run.stdout.contains(option), "\(command) --help lists \(option)")
        }
    }

    @Test func infoReadsTheSimulatedDevice() async throws {
        let run = await otaflash(["info", "--simulator", "--sim-firmware-version", "3.1.4", "--json"])
        #expect(run.code == 0, "\(run.stderr)")
        let info = try #require(run.jsonEvents.first { $0["event"] as? String == "info" })
        #expect(info["ota_firmware_version"] as? String == "3.1.4")
    }

    /// Completes `line` (the cursor at its end) with the bash script otaflash generates, in a real bash.
    static func bashCompletions(_ line: String, in directory: URL) async throws -> [String] {
        let scratch = try Scratch()
        let script = scratch.url.appendingPathComponent("otaflash.bash")
        let output = CapturedOutput()
        let code = await runOtaflash(["--generate-completion-script", "bash"], output: output)
        try #require(code == 0)
        try output.stdout.write(to: script, atomically: true, encoding: .utf8)
        let bash = Process()
        bash.executableURL = URL(fileURLWithPath: "/bin/bash")
        bash.currentDirectoryURL = directory
        bash.environment = ["PATH": "/usr/bin:/bin", "LINE": line]
        bash.arguments = ["-c", """
            source "\(script.path)"
            read -r -a COMP_WORDS <<<"$LINE"
            [[ "$LINE" == *" " ]] && COMP_WORDS+=("")
            COMP_CWORD=$((${#COMP_WORDS[@]} - 1)); COMP_LINE="$LINE"; COMP_POINT=${#LINE}
            _otaflash otaflash "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD - 1]}"
            printf '%s\\n' "${COMPREPLY[@]}"
            """]
        let out = Pipe()
        bash.standardOutput = out
        try bash.run()
        let data = out.fileHandleForReading.readDataToEndOfFile()
        bash.waitUntilExit()
        try #require(bash.terminationStatus == 0)
        return String(decoding: data, as: UTF8.self).split(separator: "\n").map(String.init)
    }

    /// Bash completion works for the form README uses (flash is the default command) and offers
    /// images for the image argument.
    @Test(arguments: [
        ("otaflash --dev", ["--device", "--devices-file"]),
        ("otaflash --simulator --sim-mt", ["--sim-mtu"]),
        ("otaflash --simulator --sim-time virtual --sim-fl", ["--sim-flash-bitflip-at"]),
        ("otaflash flash --dev", ["--device", "--devices-file"]),
        ("otaflash sc", ["scan"]),
        ("otaflash ", ["flash", "scan", "info", "simulate", "pair", "unpair", "image", "reset", "echo", "files", "ledger", "station", "dashboard", "completions", "help", "app.bin", "app.hex", "images"]),
        ("otaflash --simulator ", ["app.bin", "app.hex", "images"]),
        ("otaflash --write-path ", ["acquire-write", "write-value"]),
        ("otaflash --simulator --sim-time ", ["real", "virtual", "unlimited"]),
        ("otaflash --simulator --sim-state ", ["images"]),
        ("otaflash scan --sim", ["--simulator", "--sim-slot-size", "--sim-firmware-version", "--sim-no-ota-service", "--sim-advertise-no-uuid", "--sim-device-version"]),
    ])
    func bashCompletesTheDefaultCommand(line: String, expected: [String]) async throws {
        let scratch = try Scratch()
        for name in ["app.bin", "app.hex", "notes.txt"] { _ = try scratch.file(name, "") }
        try FileManager.default.createDirectory(at: scratch.url.appendingPathComponent("images"), withIntermediateDirectories: true)
        let offered = try await Self.bashCompletions(line, in: scratch.url)
        #expect(offered.sorted() == expected.sorted(), "\(line)<TAB>")
    }

    @Test(arguments: ["zsh", "fish"])
    func otherShellsGetAScript(shell: String) async {
        let run = await otaflash(["--generate-completion-script", shell])
        #expect(run.code == 0)
        #expect(run.stdout.contains("sim-mtu"))
    }

    @Test func anUnknownShellIsAUsageError() async {
        let run = await otaflash(["--generate-completion-script", "tcsh"])
        #expect(run.code == 2)
        #expect(run.errorLines.first?.contains("bash, zsh or fish") == true)
    }

    @Test func readmeSaysHowToInstallCompletions() throws {
        let readme = try String(contentsOf: repositoryRoot.appendingPathComponent("README.md"), encoding: .utf8)
        for shell in ["bash", "zsh", "fish"] {
            #expect(readme.contains("otaflash completions \(shell)") || readme.contains("otaflash --generate-completion-script \(shell)"),
                    "README does not say how to install \(shell) completions")
        }
    }
}
