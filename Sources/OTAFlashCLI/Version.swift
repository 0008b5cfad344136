/// otaflash's own version: the one place it is written.
///
/// `otaflash --version`, the `start` event, the batch report and the Debian package (scripts/package
/// reads it from the built binary) all take it from here; the commit comes from the build
/// (Plugins/BuildCommit).
public enum OtaflashVersion {
    /// The release, `major.minor.patch`.
    public static let number = "0.1.0"

    /// The commit the binary was built from (7 hex digits, `-dirty` when the tree had uncommitted
    /// changes); nil for a build without git metadata, such as one from an unpacked source tarball.
    public static let commit: String? = buildCommit

    /// What `otaflash --version` prints: `otaflash 0.1.0 (commit abc1234)`.
    public static var line: String {
        "otaflash \(number) (commit \(commit ?? "unknown: built without git metadata"))"
    }
}
