import Foundation
import OTAFlashCLI
import Testing

@Suite("otaflash help and README")
struct HelpAndReadmeTests {
    static let simOptions = ["--sim-seed", "--sim-mtu", "--sim-drop-rate", "--sim-disconnect-at", "--sim-slot-size"]

    /// `otaflash --help` is what a user types first: it must show the simulator's options.
    @Test func helpExitsZeroAndMentionsTheSimulatorOptions() async {
        let run = await otaflash(["--help"])
        #expect(run.code == 0)
        #expect(run.stderr.isEmpty)
        for option in Self.simOptions {
            #expect(run.stdout.contains(option), "otaflash --help does not mention \(option)")
        }
    }

    @Test(arguments: [["flash", "--help"], ["help", "flash"]])
    func flashHelpMentionsTheSimulatorOptions(arguments: [String]) async {
        let run = await otaflash(arguments)
        #expect(run.code == 0)
        for option in Self.simOptions + ["--json", "--quiet", "--checkpoint-interval"] {
            #expect(run.stdout.contains(option), "\(arguments.joined(separator: " ")) does not mention \(option)")
        }
    }

    @Test func versionExitsZero() async {
        let run = await otaflash(["--version"])
        #expect(run.code == 0)
        #expect(!run.stdout.isEmpty)
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
}
