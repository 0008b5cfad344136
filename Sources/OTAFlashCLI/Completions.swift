import ArgumentParser
import Foundation

/// Shell completion scripts (`otaflash --generate-completion-script bash|zsh|fish`).
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
        guard let kind = CompletionShell(rawValue: shell) else { return nil }
        let script = Otaflash.completionScript(for: kind)
        return kind == .bash ? bashWithDefaultCommand(script) : script
    }

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
