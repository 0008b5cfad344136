import Foundation
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// The docs a newcomer reads first hold what the code does: every command README shows runs and
/// exits as README says, and ARCHITECTURE.md lists the modules Package.swift declares.
@Suite("docs against the code")
struct DocsTests {
    /// One `otaflash` command from one of README's shell code blocks.
    struct ReadmeCommand: CustomTestStringConvertible {
        /// README's line number (of the command's first line when it continues with `\`).
        let line: Int
        /// The words after `otaflash`, up to a redirect or the end of its part of the shell line.
        let arguments: [String]
        /// The comment after it, if any: `needs a device` and `exits N` are read.
        let comment: String

        var needsDevice: Bool { comment.contains("needs a device") }

        /// The exit code README gives (`# exits 14`), or 0.
        var expectedExit: Int32 {
            (comment.firstMatch(of: /exits (\d+)/)?.output.1).flatMap { Int32($0) } ?? 0
        }

        var testDescription: String { "README.md:\(line): otaflash \(arguments.joined(separator: " "))" }

        /// The commands that reach a device (or the simulator, with `--simulator`).
        static let deviceCommands: Set<String> = ["flash", "scan", "info", "pair", "unpair", "image", "reset", "echo", "files", "simulate", "station"]
        static let deviceFreeOptions: Set<String> = ["--version", "--help", "-h", "--generate-completion-script"]

        /// Whether the command reaches a device: a device command, or flash (the default command)
        /// given by its options.
        var reachesDevice: Bool {
            guard let first = arguments.first else { return false }
            if Self.deviceCommands.contains(first) { return true }
            return first.hasPrefix("-") && !Self.deviceFreeOptions.contains(first)
        }

        /// What the test runs: a command marked `# needs a device` on the simulator instead (its
        /// `--device` and `--devices-file` addresses become simulated devices). A flash runs on
        /// virtual time and, as a real device's would, records to the default ledger (under
        /// `stateHome`), which a simulated device's run does only when named.
        func runArguments(stateHome: String) -> [String] {
            guard needsDevice else { return arguments }
            let flashes = arguments.first.map { $0 == "flash" || $0 == "station" || $0.hasPrefix("-") } ?? false
            guard flashes else { return arguments + ["--simulator"] }
            let ledger = arguments.contains("--ledger") || arguments.contains("--no-ledger")
                ? [] : ["--ledger", stateHome + "/otaflash/ledger.sqlite"]
            return arguments + ["--simulator", "--sim-time", "virtual"] + ledger
        }
    }

    static let readmePath = repositoryRoot.appendingPathComponent("README.md")

    /// Every `otaflash` command in README's ```sh blocks, in order.
    static func readmeCommands() throws -> [ReadmeCommand] {
        let text = try String(contentsOf: readmePath, encoding: .utf8)
        var commands: [ReadmeCommand] = []
        var inShellBlock = false
        var pending: (line: Int, text: String)?
        for (index, raw) in text.split(separator: "\n", omittingEmptySubsequences: false).enumerated() {
            let line = String(raw)
            if line.hasPrefix("```") {
                inShellBlock = !inShellBlock && ["```sh", "```bash", "```shell"].contains(line.trimmingCharacters(in: .whitespaces))
                pending = nil
                continue
            }
            guard inShellBlock else { continue }
            let start = pending?.line ?? index + 1
            let joined = (pending?.text ?? "") + line
            if joined.hasSuffix("\\") {
                pending = (start, String(joined.dropLast()) + " ")
                continue
            }
            pending = nil
            let (words, comment) = shellWords(joined)
            commands += otaflashInvocations(words).map { ReadmeCommand(line: start, arguments: $0, comment: comment) }
        }
        return commands
    }

    /// A shell line's words (quotes removed) and its trailing comment. Operators (`&&`, `|`, `;`,
    /// redirects) are words of their own.
    static func shellWords(_ line: String) -> (words: [String], comment: String) {
        var words: [String] = []
        var word = ""
        var inWord = false
        var quote: Character?
        var characters = Substring(line)
        func flush() {
            if inWord { words.append(word) }
            word = ""
            inWord = false
        }
        while let c = characters.first {
            characters = characters.dropFirst()
            if let open = quote {
                if c == open { quote = nil } else { word.append(c) }
                continue
            }
            switch c {
            case "'", "\"":
                quote = c
                inWord = true
            case " ", "\t":
                flush()
            case "#" where !inWord:
                flush()
                return (words, String(characters).trimmingCharacters(in: .whitespaces))
            case "|", "&", ";", "<", ">":
                // `2>` is a redirect of its own; a digit before `>` in a word is not.
                if c == ">" || c == "<", word.allSatisfy(\.isNumber) { word = "" ; inWord = false }
                flush()
                var op = String(c)
                while let next = characters.first, "|&>".contains(next) {
                    op.append(next)
                    characters = characters.dropFirst()
                }
                words.append(op)
            default:
                word.append(c)
                inWord = true
            }
        }
        flush()
        return (words, "")
    }

    static let operators: Set<String> = ["|", "||", "&&", ";", "&"]

    /// The arguments of each part of a shell line that runs `otaflash`, without its redirects.
    static func otaflashInvocations(_ words: [String]) -> [[String]] {
        var parts: [[String]] = [[]]
        for word in words {
            if operators.contains(word) { parts.append([]) } else { parts[parts.count - 1].append(word) }
        }
        return parts.compactMap { part in
            guard part.first == "otaflash" else { return nil }
            var arguments: [String] = []
            var skipNext = false
            for word in part.dropFirst() {
                if skipNext { skipNext = false; continue }
                if word.hasPrefix(">") || word.hasPrefix("<") { skipNext = true; continue }
                arguments.append(word)
            }
            return arguments
        }
    }

    /// How a README line becomes the commands the test runs: quotes, comments, `&&`, pipes and
    /// redirects (whose targets are not arguments).
    @Test(arguments: [
        ("otaflash --simulator app.bin   # needs a device; exits 14", [["--simulator", "app.bin"]], "needs a device; exits 14"),
        ("mkdir -p ~/x && otaflash --generate-completion-script bash > ~/x/otaflash", [["--generate-completion-script", "bash"]], ""),
        ("otaflash --json 'a b.bin' 2>/dev/null | head -1", [["--json", "a b.bin"]], ""),
        ("otaflash --name-prefix \"S #1\" x.bin", [["--name-prefix", "S #1", "x.bin"]], ""),
        ("scripts/demo --json | tail -n 1", [], ""),
    ])
    func aShellLineBecomesItsOtaflashCommands(line: String, expected: [[String]], comment: String) {
        let (words, found) = Self.shellWords(line)
        #expect(Self.otaflashInvocations(words) == expected, "\(words)")
        #expect(found == comment)
    }

    @Test func aCommentSaysWhatACommandNeedsAndHowItExits() {
        let marked = ReadmeCommand(line: 1, arguments: ["--device", "AA:BB:CC:DD:EE:FF", "app.bin"], comment: "needs a device; exits 14")
        #expect(marked.needsDevice && marked.expectedExit == 14 && marked.reachesDevice)
        #expect(marked.runArguments(stateHome: "/s") == ["--device", "AA:BB:CC:DD:EE:FF", "app.bin", "--simulator", "--sim-time", "virtual",
                                                         "--ledger", "/s/otaflash/ledger.sqlite"])
        let info = ReadmeCommand(line: 1, arguments: ["info", "--device", "AA:BB:CC:DD:EE:FF"], comment: "needs a device")
        #expect(info.runArguments(stateHome: "/s") == ["info", "--device", "AA:BB:CC:DD:EE:FF", "--simulator"])
        let plain = ReadmeCommand(line: 1, arguments: ["ledger", "--since", "8h"], comment: "the shift")
        #expect(!plain.needsDevice && plain.expectedExit == 0 && !plain.reachesDevice)
        #expect(!ReadmeCommand(line: 1, arguments: ["--generate-completion-script", "bash"], comment: "").reachesDevice)
    }

    /// README's commands are found: at least one per protocol, the factory line's and the ledger's.
    @Test func readmeShowsACommandPerProtocolAndTheFactoryLine() throws {
        let commands = try Self.readmeCommands()
        let all = commands.map { $0.arguments.joined(separator: " ") }
        for (what, needle) in [("a native image", ".bin"), ("a Nordic package", ".zip"), ("an MCUboot image", "mcuboot/"),
                               ("a devices file", "--devices-file"), ("a report", "--report"), ("the ledger", "ledger ")] {
            #expect(all.contains { $0.contains(needle) }, "README shows no command with \(what) (\(needle)): \(all)")
        }
    }

    /// A command that reaches a device is either on the simulator or marked `# needs a device`
    /// (then the test runs it on the simulator); a marked one is not on the simulator already.
    @Test func readmeMarksEveryCommandThatNeedsADevice() throws {
        for command in try Self.readmeCommands() {
            let onSimulator = command.arguments.contains("--simulator")
            if command.reachesDevice {
                #expect(onSimulator != command.needsDevice,
                        "\(command.testDescription): \(onSimulator ? "runs on the simulator but is marked" : "reaches a device but is not marked") `# needs a device`")
            } else {
                #expect(!command.needsDevice, "\(command.testDescription) reaches no device but is marked `# needs a device`")
            }
            #expect(command.arguments.first != "simulate" || !command.needsDevice,
                    "\(command.testDescription): peripheral mode needs BlueZ; show it in docs/PERIPHERAL.md, not in README")
        }
    }

    /// Runs every command README shows, as a child process of the built binary, in a folder that
    /// holds README's file names (`app.bin`, `line3.txt`, ... and `firmware-samples/`); a command
    /// marked `# needs a device` runs on the simulator. Each exits as README says.
    @Test(.timeLimit(.minutes(2)))
    func everyReadmeCommandExitsAsReadmeSays() throws {
        let binary = try #require(ExecutableTests.executable, "the otaflash executable is not built next to the tests; run `swift build` first")
        let commands = try Self.readmeCommands()
        try #require(!commands.isEmpty, "no otaflash command found in README's shell blocks")
        let scratch = try Scratch()
        let fm = FileManager.default
        try fm.createSymbolicLink(atPath: scratch.url.appendingPathComponent("firmware-samples").path,
                                  withDestinationPath: repositoryRoot.appendingPathComponent("firmware-samples").path)
        // README's placeholders for the user's own files (build/app.bin: what `idf.py build` writes).
        try fm.createDirectory(at: scratch.url.appendingPathComponent("build"), withIntermediateDirectories: true)
        for (name, sample) in [("app.bin", "seeded-256k.bin"), ("app.hex", "seeded-256k.hex"),
                               ("app_dfu_package.zip", "nordic/blinky-app.zip"),
                               ("app.signed.bin", "mcuboot/blinky-ec256-v1.3.0.bin"), ("build/app.bin", "esp32/blink-esp32.bin"),
                               ("app.gbl", "silabs/blinky-efr32-v2.gbl")] {
            try fm.copyItem(atPath: samplePath(sample), toPath: scratch.url.appendingPathComponent(name).path)
        }
        _ = try scratch.file("line3.txt", "# line 3, station A\nC0:FF:EE:00:03:01\nC0:FF:EE:00:03:02\nC0:FF:EE:00:03:03\n")
        for folder in ["logs", "home", "state"] {
            try fm.createDirectory(at: scratch.url.appendingPathComponent(folder), withIntermediateDirectories: true)
        }
        let stateHome = scratch.url.appendingPathComponent("state").path
        var environment = ProcessInfo.processInfo.environment
        environment["HOME"] = scratch.url.appendingPathComponent("home").path
        environment["XDG_STATE_HOME"] = stateHome
        environment["OTAFLASH_DBUS_ADDRESS"] = "unix:path=/nonexistent/no-bus-for-readme-tests"

        for (index, command) in commands.enumerated() {
            let started = Date()
            let outcome = try Self.run(binary, command.runArguments(stateHome: stateHome), in: scratch.url, environment: environment,
                                       outputPrefix: "command-\(index)", timeout: 30)
            let seconds = String(format: "%.1f", Date().timeIntervalSince(started))
            print("\(command.testDescription)\(command.needsDevice ? " [run on the simulator]" : ""): exit \(outcome.status.map(String.init) ?? "none (killed at 30 s)"), \(seconds) s")
            #expect(outcome.status == command.expectedExit,
                    "\(command.testDescription) exited \(outcome.status.map(String.init) ?? "none (killed at 30 s)"), README says \(command.expectedExit): \(outcome.stderrTail)")
        }
    }

    struct Outcome {
        /// The exit status, or nil when the process was killed at its deadline or by a signal.
        let status: Int32?
        let stderrTail: String
    }

    /// Runs `binary` with `arguments` in `directory`, its output in files there (so nothing blocks
    /// on a full pipe), and kills it with SIGKILL after `timeout` seconds.
    static func run(_ binary: URL, _ arguments: [String], in directory: URL, environment: [String: String],
                    outputPrefix: String, timeout: Double) throws -> Outcome {
        let out = directory.appendingPathComponent(outputPrefix + ".out"), err = directory.appendingPathComponent(outputPrefix + ".err")
        _ = FileManager.default.createFile(atPath: out.path, contents: nil)
        _ = FileManager.default.createFile(atPath: err.path, contents: nil)
        let process = Process()
        process.executableURL = binary
        process.arguments = arguments
        process.currentDirectoryURL = directory
        process.environment = environment
        process.standardInput = FileHandle.nullDevice
        process.standardOutput = try FileHandle(forWritingTo: out)
        process.standardError = try FileHandle(forWritingTo: err)
        let exited = DispatchSemaphore(value: 0)
        process.terminationHandler = { _ in exited.signal() }
        try process.run()
        var killed = false
        if exited.wait(timeout: .now() + timeout) == .timedOut {
            kill(process.processIdentifier, SIGKILL)
            killed = true
            exited.wait()
        }
        let stderr = (try? String(contentsOf: err, encoding: .utf8)) ?? ""
        let tail = stderr.split(separator: "\n").suffix(3).joined(separator: " / ")
        return Outcome(status: killed || process.terminationReason != .exit ? nil : process.terminationStatus, stderrTail: tail)
    }

    // MARK: ARCHITECTURE.md and Package.swift

    /// The modules ARCHITECTURE.md's "Modules" table lists: the first cell of each row, in backticks.
    static func architectureModules() throws -> [String] {
        let text = try String(contentsOf: repositoryRoot.appendingPathComponent("docs/ARCHITECTURE.md"), encoding: .utf8)
        let lines = text.split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
        let heading = try #require(lines.firstIndex { $0.hasPrefix("## Modules") }, "docs/ARCHITECTURE.md has no \"## Modules\" section")
        var modules: [String] = []
        for line in lines[(heading + 1)...] {
            if line.hasPrefix("## ") { break }
            guard line.hasPrefix("|"), let cell = line.split(separator: "|").first,
                  let name = cell.firstMatch(of: /^\s*`([A-Za-z0-9_-]+)`/)?.output.1 else { continue }
            modules.append(String(name))
        }
        return modules
    }

    /// The targets Package.swift declares, but the test targets and the test tools under Tests/.
    static func packageTargets() throws -> [String] {
        let text = try String(contentsOf: repositoryRoot.appendingPathComponent("Package.swift"), encoding: .utf8)
        return text.split(separator: "\n").compactMap { line in
            guard let match = line.firstMatch(of: /\.(?:target|executableTarget|systemLibrary|plugin|binaryTarget|macro)\(\s*name:\s*"([^"]+)"/),
                  !line.contains("path: \"Tests/") else { return nil }
            return String(match.output.1)
        }
    }

    @Test func architectureListsExactlyThePackagesModules() throws {
        let documented = try Self.architectureModules()
        let declared = try Self.packageTargets()
        try #require(!declared.isEmpty, "no target found in Package.swift")
        #expect(Set(documented).count == documented.count, "docs/ARCHITECTURE.md lists a module twice: \(documented)")
        let missing = Set(declared).subtracting(documented).sorted(), extra = Set(documented).subtracting(declared).sorted()
        #expect(missing.isEmpty, "docs/ARCHITECTURE.md's \"Modules\" table lacks \(missing), which Package.swift declares")
        #expect(extra.isEmpty, "docs/ARCHITECTURE.md's \"Modules\" table lists \(extra), which Package.swift does not declare")
    }
}
