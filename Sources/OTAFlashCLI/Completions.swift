import ArgumentParser
import Foundation

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

/// `otaflash completions SHELL`: the completion script, and how to install it.
struct CompletionsCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "completions",
        abstract: "Print the shell completion script for bash, zsh or fish.",
        discussion: """
            The Debian package installs the completions. Otherwise install them for your user with one line \
            (it makes the folder the shell looks in), then open a new shell:

            \(Completions.installLines.map { "  \($0.shell): \($0.line)" }.joined(separator: "\n"))

            For the current bash session only: source <(otaflash completions bash)
            (bash reads the folder above through the bash-completion package, installed by default on Debian and Ubuntu desktops.)
            """
    )

    @Argument(help: ArgumentHelp("The shell.", valueName: "shell"))
    var shell: CompletionShell

    func run() throws {
        CLIContext.output.out(Completions.script(for: shell))
    }
}
