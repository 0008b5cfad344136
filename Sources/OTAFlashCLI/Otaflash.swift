import ArgumentParser
import Foundation
import OTACommandLine

/// The `otaflash` command: flashing is the default subcommand.
public struct Otaflash: AsyncParsableCommand {
    public static let configuration = CommandConfiguration(
        commandName: "otaflash",
        abstract: "Update the firmware of Bluetooth LE devices over GATT, through BlueZ or a built-in simulated peripheral.",
        discussion: """
            Flashing is the default command: `otaflash --device AA:BB:CC:DD:EE:FF image.bin` is the same as \
            `otaflash flash --device AA:BB:CC:DD:EE:FF image.bin`. Try it without hardware: \
            `otaflash --simulator firmware-samples/seeded-256k.bin`.

            Every failure prints one line on stderr and exits with its own code (see `otaflash help flash` and README.md).

            Shell completion: `otaflash completions --help` says how to install it.
            """,
        version: OtaflashVersion.line,
        subcommands: [Flash.self, Scan.self, Info.self, Simulate.self, Pair.self, Unpair.self]
            // Each protocol's own device commands (SMP's image, reset and echo).
            + ProtocolCommandLine.all.flatMap { $0.commands(DeviceCommandOptions.self) }
            + [LedgerCommand.self, Station.self, DashboardCommand.self, CompletionsCommand.self, SimulatorTopic.self],
        defaultSubcommand: Flash.self
    )

    public init() {}
}

/// Runs `otaflash` with `arguments` (without the program name) and returns the exit code.
/// Never traps on bad input: every error becomes one line on stderr and a documented code.
public func runOtaflash(_ arguments: [String], output: any OutputSink = StandardOutput()) async -> Int32 {
    let code = await CLIContext.$output.withValue(output) { await runCommand(arguments, output: output) }
    // Output that could not be written stops the run, whatever the command made of that.
    if let failure = output.failure {
        output.err("otaflash: error: \(failure); stopped (exit \(ExitCode.outputFailed.rawValue))\n")
        return ExitCode.outputFailed.rawValue
    }
    return code
}

private func runCommand(_ arguments: [String], output: any OutputSink) async -> Int32 {
    // Flashing is the default command, so the root help shows its options too.
    if arguments.isEmpty {
        output.err("otaflash: error: no firmware image given: try `otaflash --simulator firmware.bin`, or see `otaflash --help`\n")
        return ExitCode.usage.rawValue
    }
    if arguments == ["--help"] || arguments == ["-h"] || arguments == ["help"] {
        output.out(RootHelp.text + "\n")
        return ExitCode.success.rawValue
    }
    if arguments.first == "help", let name = arguments.dropFirst().first, !Otaflash.helpTopics.contains(name) {
        output.err("otaflash: error: unknown command '\(name)': the commands are \(Otaflash.commandNames.joined(separator: ", "))"
                   + " (and the topic simulator)\n"
                   + "See 'otaflash --help'.\n")
        return ExitCode.usage.rawValue
    }
    if let shell = Completions.requestedShell(arguments) {
        guard let script = Completions.script(for: shell) else {
            output.err("otaflash: error: --generate-completion-script takes bash, zsh or fish, got '\(shell)'\n")
            return ExitCode.usage.rawValue
        }
        output.out(script)
        return ExitCode.success.rawValue
    }
    do {
        var command = try Otaflash.parseAsRoot(arguments)
        if var asyncCommand = command as? any AsyncParsableCommand {
            try await asyncCommand.run()
        } else {
            try command.run()
        }
        return ExitCode.success.rawValue
    } catch let failure as CLIFailure {
        // The command has already reported it in its own mode; this is the closing line (unless
        // output failed: that failure is the line, and the reason the command stopped).
        if output.failure == nil { output.err("otaflash: error: \(failure.message)\n") }
        return failure.code.rawValue
    } catch {
        let code = Otaflash.exitCode(for: error)
        let message = Otaflash.fullMessage(for: error)
        if code == .success {
            // --help, --version; flash's help leaves the simulator's options to `otaflash help simulator`.
            let isFlash = Otaflash.commandPath(arguments) == ["flash"] && !arguments.contains("--version")
            let isFlashHelp = isFlash && !arguments.contains("--help-hidden")
            let path = Otaflash.commandPath(arguments)
            let help = isFlashHelp ? Flash.shortened(message)
                : path == [SimulatorTopic._commandName] ? SimulatorTopic.simulatorOnly(message)
                : path == [Station._commandName] && !arguments.contains("--help-hidden") ? Station.shortened(message) : message
            output.out((isFlash ? Flash.withExitCodes(help) : help) + "\n")
            return ExitCode.success.rawValue
        }
        let lines = message.split(separator: "\n").map(String.init)
        var line = lines.first ?? "invalid arguments"
        if line.hasPrefix("Error: ") { line.removeFirst("Error: ".count) }
        if line.hasSuffix("one of the following:") {
            // ArgumentParser lists six values or more one a line ("  - value"): kept on the one line.
            let values = lines.dropFirst().map { $0.trimmingCharacters(in: .whitespaces) }.prefix { $0.hasPrefix("- ") }.map { "'\($0.dropFirst(2))'" }
            if !values.isEmpty { line = String(line.dropLast("the following:".count)) + values.joined(separator: ", ") + "." }
        }
        line = Ranges.explain(line, more: ProtocolCommandLine.all.reduce(into: Otaflash.choiceTexts) { $0.merge($1.rangeTexts) { a, _ in a } })
        // A script that asked for JSON gets its failure as JSON too.
        if arguments.prefix(while: { $0 != "--" }).contains("--json") {
            output.out(UsageErrorEvent(message: line).line + "\n")
        }
        output.err("otaflash: error: \(line)\n"
                   + "See '\(Otaflash.helpPointer(arguments, line: line))'.\n")
        return ExitCode.usage.rawValue
    }
}

extension Otaflash {
    /// What the refusal line of an option whose values have a shape (not a list) says is expected.
    static let choiceTexts = ["--skip-if-version": SkipVersion.expected, "--sim-device-fault": SimulatedDeviceFault.expected]

    /// The subcommands' names, as `otaflash help <name>` takes them.
    static var commandNames: [String] {
        configuration.subcommands.filter { $0.configuration.shouldDisplay }.map { $0._commandName } + ["help"]
    }

    /// Every command's path below `command`, a command before its subcommands: ["image"], ["image", "list"]…
    static func commandPaths(below command: any ParsableCommand.Type = Otaflash.self, _ prefix: [String] = []) -> [[String]] {
        command.configuration.subcommands.flatMap { sub in
            [prefix + [sub._commandName]] + commandPaths(below: sub, prefix + [sub._commandName])
        }
    }

    /// What `otaflash help <name>` takes: the commands and the simulator topic.
    static var helpTopics: [String] {
        commandNames + [SimulatorTopic._commandName]
    }
}
