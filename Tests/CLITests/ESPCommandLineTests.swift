import Foundation
@testable import OTAFlashCLI
import Testing
import TestSupport

/// Espressif's BLE OTA through the command line: picked from the image, and `--chip`, its one
/// option, checked before any radio time.
@Suite("ESP32 through the command line")
struct ESPCommandLineTests {
    static let sample = "esp32/blink-esp32.bin"

    @Test func theSampleGoesOverESPOTAAndItsChipIsTakenAsGiven() async {
        for chip in [[], ["--chip", "esp32"], ["--chip", "ESP32"]] {
            let run = await otaflash(simulator + ["--json"] + chip + [samplePath(Self.sample)])
            #expect(run.code == 0, "\(chip): \(run.stderr)")
            #expect(run.stdout.contains("\"protocol\":\"esp-ota\"") && run.stdout.contains("\"result\":\"ok\""), "\(chip)")
        }
    }

    @Test func anImageForAnotherChipIsRefusedBeforeAnyRadioTime() async {
        let run = await otaflash(simulator + ["--json", "--chip", "esp32-s3", samplePath(Self.sample)])
        #expect(run.code == 7, "\(run.stderr)")
        #expect(!run.stdout.contains("\"event\":\"connecting\""))
        #expect(run.errorLines.count == 1 && run.errorLines[0].contains("idf.py set-target esp32s3"), "\(run.stderr)")
    }

    @Test(arguments: [
        (["--chip", "esp99", "esp32/blink-esp32.bin"], "Please provide one of 'esp32', 'esp32s2'"),
        (["--chip", "esp32", "seeded-4k.bin"], "--chip applies to esp-ota only"),
    ]) func aChipThatCannotApplyIsOneUsageLine(arguments: [String], says: String) async {
        let run = await otaflash(simulator + arguments.dropLast() + [samplePath(arguments[arguments.count - 1])])
        #expect(run.code == 2, "\(run.stderr)")
        #expect(run.errorLines.count == 1 && run.errorLines[0].contains(says), "\(run.stderr)")
    }
}
