import ArgumentParser
import Foundation
import OTACommandLine

/// Shell completion scripts (`otaflash completions bash|zsh|fish`, also
/// `otaflash --generate-completion-script bash|zsh|fish`).
///
/// ArgumentParser generates them from the command tree, but it does not know that `flash` is the
/// default command: at the top level its bash script offers only the subcommands, so
/// `otaflash --dev<TAB>` and `otaflash --sim-<TAB>` complete nothing. The bash script is patched
/// so that anything that is not a subcommand completes as `otaflash flash ...`.
enum Completions {
    /// The shell asked for by `--generate-completion-script SHELL` (or `=SHELL`), if that is the request.
    static func requestedShell(_ arguments: [String]) -> String? {
        guard let first = arguments.first else { return nil }
        if first == "--generate-completion-script" { return arguments.count > 1 ? arguments[1] : "" }
        if first.hasPrefix("--generate-completion-script=") { return String(first.dropFirst("--generate-completion-script=".count)) }
        return nil
    }

    static func script(for shell: String) -> String? {
        CompletionShell(rawValue: shell).map(script(for:))
    }

    static func script(for shell: CompletionShell) -> String {
        let script = Otaflash.completionScript(for: shell)
        return shell == .bash ? bashWithDefaultCommand(script) : script
    }

    /// One line per shell that installs the completions for the user on a fresh machine: it makes
    /// the folder the shell looks in, then writes the script there.
    static let installLines: [(shell: String, line: String)] = [
        ("bash", #"mkdir -p "${XDG_DATA_HOME:-$HOME/.local/share}/bash-completion/completions" && otaflash completions bash > "${XDG_DATA_HOME:-$HOME/.local/share}/bash-completion/completions/otaflash""#),
        ("zsh", #"mkdir -p ~/.zfunc && otaflash completions zsh > ~/.zfunc/_otaflash && echo 'fpath+=(~/.zfunc); autoload -Uz compinit && compinit' >> ~/.zshrc"#),
        ("fish", #"mkdir -p ~/.config/fish/completions && otaflash completions fish > ~/.config/fish/completions/otaflash.fish"#),
    ]

    /// The generated top-level fallback that offers only the subcommand names.
    static var bashSubcommandFallback: String {
        """
            *)
                # Offer subcommand completions
                COMPREPLY+=($(compgen -W '\(Otaflash.commandNames.joined(separator: " "))' -- "${cur}"))
                ;;
        """
    }

    /// The fallback that completes a default-command line as `flash`'s.
    static var bashDefaultCommand: String {
        """
            *)
                # flash is the default command: complete everything else as `otaflash flash ...`
                COMPREPLY=()
                if [[ "${COMP_CWORD}" -eq 1 && "${cur}" != -* ]]; then
                    COMPREPLY+=($(compgen -W '\(Otaflash.commandNames.joined(separator: " "))' -- "${cur}"))
                fi
                unparsed_words=("${COMP_WORDS[@]:1:${COMP_CWORD}}")
                _otaflash_flash
                ;;
        """
    }

    /// `script` with the default command completed; unchanged if the generator's text moved (the
    /// completion tests then fail).
    static func bashWithDefaultCommand(_ script: String) -> String {
        script.replacingOccurrences(of: bashSubcommandFallback, with: bashDefaultCommand)
    }
}

extension CompletionShell: @retroactive ExpressibleByArgument {}

/// `otaflash completions SHELL [--install]`: the completion script, printed or installed.
struct CompletionsCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "completions",
        abstract: "Print the shell completion script for bash, zsh or fish, or install it.",
        discussion: """
            The Debian package installs the completions. Otherwise install them for your user, on a fresh \
            machine too (the folder is made), then open a new shell:

              otaflash completions bash --install
              otaflash completions zsh --install
              otaflash completions fish --install

            bash reads ~/.local/share/bash-completion/completions through the bash-completion package \
            (installed by default on Debian and Ubuntu); zsh reads ~/.zfunc once ~/.zshrc has \
            fpath+=(~/.zfunc) before compinit. For the current bash session only: source <(otaflash completions bash)
            """
    )

    @Argument(help: ArgumentHelp("The shell.", valueName: "shell"))
    var shell: CompletionShell

    @Flag(help: "Write the script where the shell looks for it, making the folder, instead of printing it.")
    var install = false

    func run() throws {
        let script = Completions.script(for: shell)
        guard install else {
            CLIContext.output.out(script)
            return
        }
        let path = try Completions.install(script, shell: shell, environment: ProcessInfo.processInfo.environment)
        CLIContext.output.out("wrote \(path); open a new shell to use it"
                              + (shell == .zsh ? " (with fpath+=(~/.zfunc) before compinit in ~/.zshrc)" : "") + "\n")
    }
}

extension Completions {
    /// Where `shell` looks for otaflash's completions in the user's home.
    static func installPath(shell: CompletionShell, environment: [String: String]) -> String? {
        guard let home = environment["HOME"], !home.isEmpty else { return nil }
        let data = environment["XDG_DATA_HOME"].flatMap { $0.isEmpty ? nil : $0 } ?? home + "/.local/share"
        let config = environment["XDG_CONFIG_HOME"].flatMap { $0.isEmpty ? nil : $0 } ?? home + "/.config"
        switch shell {
        case .bash: return data + "/bash-completion/completions/otaflash"
        case .zsh: return home + "/.zfunc/_otaflash"
        case .fish: return config + "/fish/completions/otaflash.fish"
        default: return nil
        }
    }

    /// The script for the shell named `name`, written where that shell looks for it.
    static func install(shellNamed name: String, environment: [String: String]) throws(CLIFailure) -> String {
        guard let shell = CompletionShell(rawValue: name) else { throw CLIFailure(.usage, "no completions for \(name): bash, zsh or fish") }
        return try install(script(for: shell), shell: shell, environment: environment)
    }

    /// Writes `script` where `shell` looks for it, making the folder first.
    ///
    /// - Returns: the file written.
    /// - Throws: `CLIFailure` `.outputFailed` when the folder cannot be made or the file written.
    static func install(_ script: String, shell: CompletionShell, environment: [String: String]) throws(CLIFailure) -> String {
        guard let path = installPath(shell: shell, environment: environment) else {
            throw CLIFailure(.usage, "no home folder (HOME is not set) to install the \(shell) completions in; print them with otaflash completions \(shell)")
        }
        do {
            try FileManager.default.createDirectory(atPath: (path as NSString).deletingLastPathComponent, withIntermediateDirectories: true)
            try Data(script.utf8).write(to: URL(fileURLWithPath: path), options: .atomic)
        } catch {
            throw CLIFailure(.outputFailed, "cannot write the \(shell) completions to \(path): \(OutputPaths.reason(error))")
        }
        return path
    }
}
