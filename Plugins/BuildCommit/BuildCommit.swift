import Foundation
import PackagePlugin

/// Writes the commit the package is built from into a Swift file of the target (`buildCommit`), so that
/// `otaflash --version` can name it.
///
/// SwiftPM has no build-time variables; this prebuild command runs git before every build and rewrites
/// the file only when its text changes, so an unchanged commit recompiles nothing. A tree with
/// uncommitted changes gives `<commit>-dirty`; a source tree that is not its own git checkout (an
/// unpacked tarball, or git missing) gives `nil`, never the commit of a repository around it.
@main
struct BuildCommit: BuildToolPlugin {
    func createBuildCommands(context: PluginContext, target: Target) throws -> [Command] {
        let folder = context.pluginWorkDirectoryURL.appending(path: "generated")
        let file = folder.appending(path: "BuildCommit.swift")
        return [.prebuildCommand(
            displayName: "Reading the commit \(target.name) is built from",
            executable: URL(filePath: "/bin/sh"),
            arguments: ["-c", Self.script, "build-commit", context.package.directoryURL.path(percentEncoded: false),
                        folder.path(percentEncoded: false), file.path(percentEncoded: false)],
            outputFilesDirectory: folder
        )]
    }

    /// `$1` the package's folder, `$2` the output folder, `$3` the Swift file.
    static let script = #"""
        root=$(cd "$1" && pwd -P)
        commit=
        top=$(git -C "$root" rev-parse --show-toplevel 2>/dev/null) && [ "$(cd "$top" && pwd -P)" = "$root" ] &&
            commit=$(git -C "$root" rev-parse --short=7 HEAD 2>/dev/null) || commit=
        if [ -n "$commit" ] && ! git -C "$root" diff --quiet HEAD -- 2>/dev/null; then commit="$commit-dirty"; fi
        if [ -n "$commit" ]; then value="\"$commit\""; else value=nil; fi
        text="/// The commit this build is from (\`-dirty\`: with uncommitted changes); nil without git metadata.
        let buildCommit: String? = $value"
        mkdir -p "$2"
        if [ ! -f "$3" ] || [ "$(cat "$3")" != "$text" ]; then printf '%s\n' "$text" > "$3"; fi
        """#
}
