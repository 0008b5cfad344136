import Foundation
import Testing
@testable import SilabsOTA

/// A GBL through `otaflash --simulator`: picked from the file (auto), both kinds of device, and
/// the options checked before any radio time.
@Suite("silabs-ota through the command line")
struct SilabsCommandLineTests {
    static let simulator = ["--simulator", "--sim-time", "virtual", "--json"]

    @Test(arguments: ["app", "apploader"])
    func aGBLIsDetectedAndFlashedOnEachKind(kind: String) async throws {
        let path = try temporaryFile("app.gbl", TestGBL.bytes(version: 0x0200_0000, body: TestGBL.body(12_000)))
        let run = await otaflash(Self.simulator + ["--sim-silabs-kind", kind, path])
        #expect(run.code == 0, "\(run.stderr)")
        #expect(run.stdout.contains("\"protocol\":\"silabs-ota\"") && run.stdout.contains("\"result\":\"ok\""), "\(run.stdout)")
        if kind == "apploader" { #expect(run.stdout.contains("AppLoader"), "\(run.stdout)") }
    }

    @Test func aDamagedGBLIsRefusedBeforeAnyRadioTimeAndOneTheAppLoaderRefusesIsExit8() async throws {
        var bytes = TestGBL.bytes(body: TestGBL.body(4000))
        bytes[200] ^= 0x10
        let corrupt = try temporaryFile("corrupt.gbl", bytes)
        let damaged = await otaflash(Self.simulator + ["--sim-silabs-kind", "apploader", corrupt])
        #expect(damaged.code == 3, "\(damaged.stderr)")
        #expect(damaged.stderr.contains("CRC-32") && !damaged.stdout.contains("\"event\":\"connecting\""), "\(damaged.stderr)")
        let good = try temporaryFile("good.gbl", TestGBL.bytes(body: TestGBL.body(4000)))
        let refused = await otaflash(Self.simulator + ["--sim-silabs-kind", "apploader", "--sim-silabs-refuse", good])
        #expect(refused.code == 8, "\(refused.stderr)")
        #expect(refused.stderr.contains("ATT error 0x80"), "\(refused.stderr)")
    }

    @Test func aStorageErrorIsExit9() async throws {
        let good = try temporaryFile("good.gbl", TestGBL.bytes(body: TestGBL.body(4000)))
        let failing = await otaflash(Self.simulator + ["--sim-silabs-storage-error", "3", good])
        #expect(failing.code == 9, "\(failing.stderr)")
        #expect(failing.stderr.contains("ATT error 0x83"), "\(failing.stderr)")
    }

    @Test func itsOptionsAreCheckedBeforeAnyRadioTime() async throws {
        let gbl = try temporaryFile("app.gbl", TestGBL.bytes())
        let range = await otaflash(Self.simulator + ["--silabs-settle", "99", gbl])
        #expect(range.code == 2 && range.stderr.contains("--silabs-settle must be between 0 and 60 seconds"), "\(range.stderr)")
        let key = await otaflash(Self.simulator + ["--gbl-key", NSTemporaryDirectory() + "otaflash-silabs-no-such-key.pem", gbl])
        #expect(key.code == 2 && key.stderr.contains("--gbl-key"), "\(key.stderr)")
        #expect(!key.stdout.contains("\"event\":\"connecting\""))
        let other = try temporaryFile("raw.bin", [UInt8](repeating: 7, count: 4096))
        let elsewhere = await otaflash(Self.simulator + ["--sim-silabs-kind", "app", other])
        #expect(elsewhere.code == 2 && elsewhere.stderr.contains("--sim-silabs-kind applies to silabs-ota only"), "\(elsewhere.stderr)")
    }
}
