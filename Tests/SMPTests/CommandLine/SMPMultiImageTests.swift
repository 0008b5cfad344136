import Foundation
import Testing

// `otaflash` with several MCUboot images for one device (an nRF5340's application and network
// cores): nRF Connect SDK's dfu_application.zip, or --image N=FILE beside the command's image.

@Suite("otaflash flash, SMP multi-image")
struct SMPMultiImageFlashTests {
    static let package = samplePath("nrf5340/dfu_application.zip")
    static let nrf5340 = simulator + ["--sim-smp-network-core"]

    @Test func aTwoImagePackageFlashesAndBothCoresRunTheirNewVersions() async throws {
        let run = await otaflash(Self.nrf5340 + ["--json", Self.package])
        #expect(run.code == 0, "\(run.stderr)")
        let events = expectDocumentedLines(run.stdoutLines, section: "otaflash flash")
        #expect(events.first?["protocol"] == .string("smp"))
        #expect(events.filter { $0["event"] == .string("activate") }.count == 1)
        let notes = events.filter { $0["event"] == .string("note") }.compactMap { $0["message"].map { "\($0)" } }
        #expect(notes.contains { $0.contains("every image runs its new version: network core (image 1) 1.2.3.4, application core (image 0) 1.3.0") }, "\(notes)")
        let done = try #require(events.last)
        #expect(done["result"] == .string("ok"))
        #expect(done["firmware_after"] == .string("1.3.0"))

        let human = await otaflash(Self.nrf5340 + [Self.package])
        #expect(human.code == 0, "\(human.stderr)")
        #expect(human.stderr.contains("network core (image 1) 1.2.3+4 (net_core_app_update.bin), then application core (image 0) 1.3.0"), "\(human.stderr)")
        #expect(human.stdout.contains("image 1: slot 0 1.2.3.4 active"), "\(human.stdout)")
    }

    @Test func imagesGivenOneByOneGoTheSameWay() async throws {
        let run = await otaflash(Self.nrf5340 + ["--json", samplePath("mcuboot/blinky-ec256-v1.3.0.bin"),
                                                 "--image", "1=" + samplePath("mcuboot/blinky-ed25519-v1.2.3+4.bin")])
        #expect(run.code == 0, "\(run.stderr)")
        #expect(run.jsonEvents.contains { ($0["message"] as? String)?.contains("network core (image 1) 1.2.3.4") == true })
        #expect(run.jsonEvents.last?["firmware_after"] as? String == "1.3.0")
    }

    @Test func aDeviceWithOneImageRefusesTheNetworkCoresImage() async throws {
        let run = await otaflash(simulator + [Self.package])
        #expect(run.code == 7, "\(run.stderr)")
        #expect(run.stderr.contains("it has no network core (image 1)"), "\(run.stderr)")
    }

    /// Refused before any radio time: one line, a documented exit code.
    @Test(arguments: [
        (["--image", "net.bin"], 2, "is not N=FILE"),
        (["--image", "0=app.bin"], 2, "image 0 is the command's own image"),
        (["--image", "9=net.bin"], 2, "outside 0–3"),
        (["--image", "1=a.bin", "--image", "1=b.bin"], 2, "gives image 1 twice"),
        (["--image", "1=/nonexistent/net.bin"], 3, "/nonexistent/net.bin"),
    ])
    func aBadImageListIsRefused(options: [String], code: Int32, says: String) async throws {
        let run = await otaflash(Self.nrf5340 + options + [samplePath("mcuboot/blinky-ec256-v1.3.0.bin")])
        #expect(run.code == code, "\(run.stderr)")
        #expect(run.stderr.contains(says), "\(run.stderr)")
        #expect(run.stderr.split(separator: "\n").first?.hasPrefix("otaflash: error:") == true, "\(run.stderr)")
    }

    @Test func aPackageTakesNoImageList() async throws {
        let run = await otaflash(Self.nrf5340 + ["--image", "1=" + samplePath("mcuboot/blinky-ed25519-v1.2.3+4.bin"), Self.package])
        #expect(run.code == 2, "\(run.stderr)")
        #expect(run.stderr.contains("drop --image"), "\(run.stderr)")
    }

    @Test func simulateTakesTheNetworkCoreOnlyForSMP() async throws {
        let run = await otaflash(["simulate", "--protocol", "native", "--sim-smp-network-core"])
        #expect(run.code == 2, "\(run.stderr)")
        #expect(run.stderr.contains("--sim-smp-network-core"), "\(run.stderr)")
    }
}
