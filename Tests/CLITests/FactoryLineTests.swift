import Foundation
@testable import OTAFlashCLI
import Testing

/// What a production line's files and screens meet: lists saved on Windows, long reasons on a
/// narrow terminal, versions a device does not know.
@Suite("otaflash on a production line")
struct FactoryLineTests {
    /// A list saved by a Windows editor: a UTF-8 byte order mark and CRLF line ends.
    @Test func aDevicesFileWithABOMAndCRLFIsRead() throws {
        let scratch = try Scratch()
        let path = scratch.url.appendingPathComponent("line3.txt").path
        try Data([0xEF, 0xBB, 0xBF] + Array("# line 3\r\nC0:FF:EE:00:00:0A\r\n\r\nc0:ff:ee:00:00:0b  # spare\r\nC0:FF:EE:00:00:0C".utf8))
            .write(to: URL(fileURLWithPath: path))
        let addresses = try readDevicesFile(path)
        #expect(addresses.map(\.description) == ["C0:FF:EE:00:00:0A", "C0:FF:EE:00:00:0B", "C0:FF:EE:00:00:0C"])
    }

    @Test func aBadLineOfACRLFListIsNamedByItsNumber() async throws {
        let scratch = try Scratch()
        let path = scratch.url.appendingPathComponent("line3.txt").path
        try Data(Array("C0:FF:EE:00:00:0A\r\nC0:FF:EE:00:00:0Z\r\n".utf8)).write(to: URL(fileURLWithPath: path))
        let run = await otaflash(simulator + ["--devices-file", path, samplePath("seeded-4k.bin")])
        #expect(run.code == 2)
        #expect(run.errorLines.first?.contains("line3.txt:2: 'C0:FF:EE:00:00:0Z'") == true, "\(run.stderr)")
    }

    /// A batch's simulated devices live for the run: --sim-state is refused, never ignored.
    @Test func simStateWithABatchIsRefusedWithOneLine() async throws {
        let scratch = try Scratch()
        let run = await otaflash(simulator + ["--count", "2", "--sim-state", scratch.url.path, samplePath("seeded-4k.bin")])
        #expect(run.code == 2, "\(run.stderr)")
        #expect(run.errorLines.count == 1 && run.errorLines[0].contains("--sim-state"), "\(run.stderr)")
    }

    /// A reason cut to the terminal's width ends at a word, never inside a number.
    @Test func aLongReasonIsCutAtAWord() {
        let line = "C0:FF:EE:00:00:03  FAILED: the image of 4096 bytes does not fit: the slot holds 1024 bytes"
        let cut = LiveView.cut(line, to: 80)
        #expect(cut.count <= 80)
        #expect(cut.hasSuffix(" …"), "\(cut)")
        let kept = String(cut.dropLast(2))
        #expect(line.hasPrefix(kept + " "), "cut inside a word: \(cut)")
        // Cut at 85 columns, the old way ended in "holds 10".
        #expect(!LiveView.cut(line, to: 85).contains("holds 10"), "\(LiveView.cut(line, to: 85))")
        #expect(LiveView.cut("short", to: 80) == "short")
    }

    /// A device that runs a version it does not know (0 in the native info value) shows it as
    /// unknown, not as 0.0.0: in the batch table and in the done line.
    @Test func anUnknownFirmwareVersionIsNotShownAs000() async {
        let run = await otaflash(simulator + ["--count", "2", "--json", samplePath("seeded-4k.bin")])
        #expect(run.code == 0, "\(run.stderr)")
        let done = run.jsonEvents.filter { $0["event"] as? String == "done" }
        #expect(done.count == 2)
        #expect(done.allSatisfy { $0["firmware_after"] is NSNull }, "\(done.map { $0["firmware_after"] ?? "-" })")
        let human = await otaflash(simulator + ["--count", "2", samplePath("seeded-4k.bin")])
        #expect(!human.stdout.contains("0.0.0") && !human.stdout.contains("Optional("), "\(human.stdout)")
    }
}
