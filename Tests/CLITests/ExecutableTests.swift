import Foundation
import Testing

/// The built `otaflash` binary run as a subprocess: real exit statuses, and no trap on bad input.
@Suite("otaflash executable")
struct ExecutableTests {
    /// Next to the test bundle (`.build/<triple>/debug`), or found from this file's path.
    static var executable: URL? {
        var candidates = [Bundle.main.bundleURL.appendingPathComponent("otaflash"),
                          Bundle.main.bundleURL.deletingLastPathComponent().appendingPathComponent("otaflash")]
        let build = repositoryRoot.appendingPathComponent(".build")
        candidates.append(build.appendingPathComponent("debug/otaflash"))
        if let triples = try? FileManager.default.contentsOfDirectory(atPath: build.path) {
            candidates += triples.map { build.appendingPathComponent($0).appendingPathComponent("debug/otaflash") }
        }
        return candidates.first { FileManager.default.isExecutableFile(atPath: $0.path) }
    }

    struct Outcome {
        let status: Int32
        let signalled: Bool
        let stdout: String
        let stderr: String
    }

    func run(_ arguments: [String]) throws -> Outcome {
        let binary = try #require(Self.executable, "the otaflash executable is not built next to the tests; run `swift build` first")
        let process = Process()
        process.executableURL = binary
        process.arguments = arguments
        let out = Pipe(), err = Pipe()
        process.standardOutput = out
        process.standardError = err
        try process.run()
        let stdout = out.fileHandleForReading.readDataToEndOfFile()
        let stderr = err.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        return Outcome(status: process.terminationStatus, signalled: process.terminationReason == .uncaughtSignal,
                       stdout: String(decoding: stdout, as: UTF8.self), stderr: String(decoding: stderr, as: UTF8.self))
    }

    @Test func successfulRunExitsZero() throws {
        let outcome = try run(simulator + ["--quiet", samplePath("seeded-4k.bin")])
        #expect(!outcome.signalled)
        #expect(outcome.status == 0, "\(outcome.stderr)")
        #expect(outcome.stdout.isEmpty)
    }

    static let badInputs: [(arguments: [String], status: Int32)] = [
        (simulator + ["/nonexistent/image.bin"], 3),
        (simulator + ["--device", "not-an-address", "x.bin"], 2),
        (simulator + ["--sim-slot-size", "-5", "x.bin"], 2),
        (simulator + ["--sim-mtu", "99999999999999999999", "x.bin"], 2),
        ([], 2),
        (simulator + ["--sim-flash-bitflip-at", "7", samplePath("seeded-4k.bin")], 8),
    ]

    @Test(arguments: badInputs)
    func badInputExitsWithItsCodeWithoutTrapping(arguments: [String], status: Int32) throws {
        let outcome = try run(arguments)
        #expect(!outcome.signalled, "otaflash died of a signal: \(outcome.stderr)")
        #expect(outcome.status == status, "\(outcome.stderr)")
        #expect(outcome.stderr.split(separator: "\n").filter { $0.hasPrefix("otaflash: error:") }.count == 1, "\(outcome.stderr)")
    }
}
