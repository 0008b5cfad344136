import Crypto
import Foundation
import Testing

// `otaflash files put|get|hash|stat` against the simulated Zephyr device's fs_mgmt.

@Suite("otaflash files")
struct FileCommandTests {
    static let sim = ["--simulator"]

    static func contents(_ count: Int) -> [UInt8] { (0..<count).map { UInt8(truncatingIfNeeded: $0 &* 7 &+ 3) } }

    @Test func putChecksTheUploadBySHA256AndPrintsProgressThenTheFile() async throws {
        let scratch = try Scratch()
        let local = scratch.url.appendingPathComponent("cert.pem").path
        let data = Self.contents(3000)
        try Data(data).write(to: URL(fileURLWithPath: local))
        let run = await otaflash(["files", "put"] + Self.sim + ["--json", local, "/lfs/cert.pem"])
        #expect(run.code == 0, "\(run.stderr)")
        let events = expectDocumentedLines(run.stdoutLines, section: "otaflash files")
        let names = events.compactMap { event -> String? in
            if case .string(let name)? = event["event"] { return name }
            return nil
        }
        #expect(names.first == "progress" && names.suffix(2) == ["file", "done"], "\(names)")
        let file = try #require(run.jsonEvents.first { $0["event"] as? String == "file" })
        #expect(file["check"] as? String == "sha256")
        #expect(file["digest"] as? String == Array(SHA256.hash(data: data)).map { String(format: "%02x", $0) }.joined())
        #expect(file["size"] as? Int == 3000)
        let progress = run.jsonEvents.filter { $0["event"] as? String == "progress" }
        #expect(progress.last?["bytes"] as? Int == 3000 && progress.count <= 21)
    }

    @Test func aDeviceWithoutSHA256IsCheckedByCRC32() async throws {
        let scratch = try Scratch()
        let local = try scratch.file("config.json", "{\"interval\": 30}")
        let run = await otaflash(["files", "put"] + Self.sim + ["--sim-smp-fs-no-sha256", local, "/lfs/config.json"])
        #expect(run.code == 0, "\(run.stderr)")
        #expect(run.stdout.contains("crc32"), "\(run.stdout)")
    }

    @Test func getWritesTheFileAHashAndStatMatchIt() async throws {
        let scratch = try Scratch()
        let source = scratch.url.appendingPathComponent("on-device.bin").path
        let data = Self.contents(2000)
        try Data(data).write(to: URL(fileURLWithPath: source))
        let local = scratch.url.appendingPathComponent("got.bin").path
        let preload = ["--sim-smp-file", "/lfs/data.bin=\(source)"]
        let get = await otaflash(["files", "get"] + Self.sim + preload + ["/lfs/data.bin", local])
        #expect(get.code == 0, "\(get.stderr)")
        #expect(FileManager.default.contents(atPath: local).map(Array.init) == data)
        let hash = await otaflash(["files", "hash"] + Self.sim + preload + ["--json", "--type", "sha256", "/lfs/data.bin"])
        #expect(hash.code == 0, "\(hash.stderr)")
        _ = expectDocumentedLines(hash.stdoutLines, section: "otaflash files")
        #expect(hash.jsonEvents.first?["output"] as? String == Array(SHA256.hash(data: data)).map { String(format: "%02x", $0) }.joined())
        let stat = await otaflash(["files", "stat"] + Self.sim + preload + ["/lfs/data.bin"])
        #expect(stat.code == 0 && stat.stdout.contains("2000 bytes"), "\(stat.stdout)\(stat.stderr)")
        // The file is there now: a second get refuses to overwrite it, --force replaces it.
        let again = await otaflash(["files", "get"] + Self.sim + preload + ["/lfs/data.bin", local])
        expectOneUsageLine(again, saying: ["exists", "--force"])
        let forced = await otaflash(["files", "get"] + Self.sim + preload + ["--force", "/lfs/data.bin", local])
        #expect(forced.code == 0, "\(forced.stderr)")
    }

    @Test func aDownloadThatFailsMidwayLeavesNoPartialFileAndKeepsTheOldOne() async throws {
        let scratch = try Scratch()
        let source = scratch.url.appendingPathComponent("on-device.bin").path
        try Data(Self.contents(4000)).write(to: URL(fileURLWithPath: source))
        let local = scratch.url.appendingPathComponent("kept.bin").path
        try Data("old contents".utf8).write(to: URL(fileURLWithPath: local))
        let run = await otaflash(["files", "get"] + Self.sim + ["--sim-smp-file", "/lfs/data.bin=\(source)", "--sim-smp-fs-disconnect-at", "1500",
                                                                "--force", "/lfs/data.bin", local])
        #expect(run.code == 6, "\(run.stderr)")
        #expect(run.errorLines.count == 1, "\(run.stderr)")
        #expect(FileManager.default.contents(atPath: local) == Data("old contents".utf8))
        let left = try FileManager.default.contentsOfDirectory(atPath: scratch.url.path)
        #expect(Set(left) == ["on-device.bin", "kept.bin"], "\(left)")
    }

    @Test func refusalsAreOneLineWithTheirExitCode() async throws {
        let scratch = try Scratch()
        let local = try scratch.file("a.txt", "hello")
        let empty = try scratch.file("empty.txt", "")
        let big = scratch.url.appendingPathComponent("big.bin").path
        try Data(Self.contents(5000)).write(to: URL(fileURLWithPath: big))
        let cases: [([String], Int32, String)] = [
            (["put", scratch.url.appendingPathComponent("none").path, "/lfs/a"], 3, "does not exist"),
            (["put", empty, "/lfs/a"], 3, "empty"),
            (["put", local, "lfs/a"], 2, "absolute"),
            (["put", local, "/lfs/" + String(repeating: "x", count: 70)], 9, "CONFIG_MCUMGR_GRP_FS_PATH_LEN"),
            (["put", local, "/data/a"], 9, "mount point"),
            (["put", "--sim-smp-fs-size", "4096", big, "/lfs/big.bin"], 4, "write failed"),
            (["get", "/lfs/none", scratch.url.appendingPathComponent("x").path], 9, "file not found"),
            (["hash", "--type", "md5", "/lfs/a"], 2, "md5"),
            (["hash", "--sim-smp-fs-no-sha256", "--type", "sha256", "--sim-smp-file", "/lfs/a=\(local)", "/lfs/a"], 7, "hash type not found"),
            (["stat", "/lfs"], 9, "directory"),
        ]
        for (arguments, code, text) in cases {
            let run = await otaflash(["files", arguments[0]] + Self.sim + Array(arguments.dropFirst()))
            #expect(run.code == code, "\(arguments): \(run.stderr)")
            #expect(run.errorLines.count == 1 && run.errorLines.first?.contains(text) == true, "\(arguments): \(run.stderr)")
        }
    }

    @Test func filesHelpTeachesTheSubcommands() async {
        let run = await otaflash(["files", "--help"])
        #expect(run.code == 0)
        for text in ["put", "get", "hash", "stat", "/lfs/cert.pem", "SHA-256"] {
            #expect(run.stdout.contains(text), "\(text)")
        }
    }
}
