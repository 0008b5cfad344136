import Foundation
import Testing
@testable import OTAFlashCLI

// Pairing in the flow, on the simulated device: a device that requires an encrypted (or an
// authenticated) link refuses an unpaired central; `--pair` bonds first (Just Works, or passkey
// entry with --passkey), a wrong passkey is its own exit code, `--unpair-after` leaves no bond,
// and in a batch every device pairs on its own.

private let device = "C0:FF:EE:00:00:01"

@Suite("otaflash flash --pair")
struct PairingTests {
    @Test func aDeviceThatRequiresEncryptionRefusesAnUnpairedCentralAndTheLineNamesPair() async {
        let run = await otaflash(simulator + ["--json", "--sim-security", "encrypt", samplePath("seeded-4k.bin")])
        #expect(run.code == 12, "\(run.stderr)")
        #expect(run.errorLines.count == 1, "\(run.stderr)")
        #expect(run.errorLines.first?.contains("the device requires an encrypted link (a bond)") == true, "\(run.stderr)")
        #expect(run.errorLines.first?.contains("pass --pair") == true, "\(run.stderr)")
        let events = expectDocumentedLines(run.stdoutLines, section: "otaflash flash")
        #expect(events.last?["error"] == .string("permission"))
    }

    /// Every protocol, refused for want of pairing: exit 12 within seconds of virtual time, one
    /// line naming --pair (and --passkey when the device asked for one), nothing activated.
    @Test(arguments: [
        ("seeded-4k.bin", "encrypt"), ("nordic/blinky-app.zip", "encrypt"), ("mcuboot/blinky-ec256-v1.2.3+4.bin", "encrypt"),
        ("seeded-4k.bin", "authenticate"), ("nordic/blinky-app.zip", "authenticate"), ("mcuboot/blinky-ec256-v1.2.3+4.bin", "authenticate"),
    ])
    func withoutPairEveryProtocolEndsWithPermissionWithinSeconds(image: String, security: String) async throws {
        let passkey = security == "authenticate" ? ["--sim-passkey", "123456"] : []
        let run = await otaflash(simulator + ["--json", "--sim-security", security] + passkey + [samplePath(image)])
        #expect(run.code == 12, "\(run.stderr)")
        #expect(run.errorLines.count == 1, "\(run.stderr)")
        let line = run.errorLines.first ?? ""
        #expect(line.contains("requires pairing") && line.contains("--pair"), "\(line)")
        #expect(line.contains("--pair --passkey") == (security == "authenticate"), "\(line)")
        let done = try #require(run.jsonEvents.last)
        #expect(done["error"] as? String == "permission")
        let seconds = try #require(done["seconds"] as? Double)
        #expect(seconds < 10, "\(seconds) s of virtual time")
    }

    @Test func aBatchWithoutPairFailsEveryDeviceWithPermission() async {
        let run = await otaflash(simulator + ["--count", "2", "--json", "--sim-security", "encrypt", samplePath("seeded-4k.bin")])
        #expect(run.code == 15, "\(run.stderr)")
        let done = run.jsonEvents.filter { $0["event"] as? String == "done" && $0["device"] != nil }
        #expect(done.count == 2)
        #expect(done.allSatisfy { $0["error"] as? String == "permission" && $0["exit_code"] as? Int == 12 && $0["attempts"] as? Int == 1 })
        #expect(done.allSatisfy { ($0["message"] as? String)?.contains("pass --pair") == true })
    }

    @Test func pairPairsJustWorksThenFlashes() async {
        let run = await otaflash(simulator + ["--json", "--sim-security", "encrypt", "--pair", samplePath("seeded-4k.bin")])
        #expect(run.code == 0, "\(run.stderr)")
        let events = expectDocumentedLines(run.stdoutLines, section: "otaflash flash")
        #expect(events.contains { $0["event"] == .string("note") && $0["message"] == .string("\(device): paired (Just Works)") })
        #expect(events.last?["result"] == .string("ok"))
    }

    @Test(arguments: [
        (["--passkey", "123456"], 0, "verified and activated"),
        (["--passkey", "654321"], 13, "pairing with \(device) failed (AuthenticationFailed): the passkey 654321 was not accepted; check the passkey the device expects"),
        ([], 13, "it asked for a passkey; pass --passkey with the one it shows or expects"),
        (["--confirm-pairing"], 13, "it asked for a passkey"),
    ] as [([String], Int32, String)])
    func anAuthenticatingDeviceTakesOnlyItsPasskey(answers: [String], code: Int32, says: String) async {
        let run = await otaflash(simulator + ["--sim-security", "authenticate", "--sim-passkey", "123456", "--pair"] + answers
                                 + [samplePath("seeded-4k.bin")])
        #expect(run.code == code, "\(run.stderr)")
        if code == 0 {
            #expect(run.stdout.contains(says), "\(run.stdout)")
            #expect(run.stderr.contains("\(device): paired (passkey entry)"), "\(run.stderr)")
        } else {
            #expect(run.errorLines.count == 1, "\(run.stderr)")
            #expect(run.errorLines.first?.contains(says) == true, "\(run.stderr)")
        }
    }

    @Test func aNumericComparisonIsAcceptedOnlyWithConfirmPairing() async {
        let refused = await otaflash(simulator + ["--sim-security", "authenticate", "--pair", samplePath("seeded-4k.bin")])
        #expect(refused.code == 13, "\(refused.stderr)")
        #expect(refused.errorLines.first?.contains("pass --confirm-pairing to accept it") == true, "\(refused.stderr)")
        let confirmed = await otaflash(simulator + ["--sim-security", "authenticate", "--pair", "--confirm-pairing", samplePath("seeded-4k.bin")])
        #expect(confirmed.code == 0, "\(confirmed.stderr)")
        #expect(confirmed.stderr.contains("paired (numeric comparison)"), "\(confirmed.stderr)")
    }

    @Test func unpairAfterRemovesTheBondWhateverTheResult() async {
        let ok = await otaflash(simulator + ["--sim-security", "encrypt", "--pair", "--unpair-after", samplePath("seeded-4k.bin")])
        #expect(ok.code == 0, "\(ok.stderr)")
        #expect(ok.stderr.contains("\(device): bond removed (--unpair-after)"), "\(ok.stderr)")
        // A failed update (the image does not fit) still removes the bond it made.
        let failed = await otaflash(simulator + ["--sim-security", "encrypt", "--sim-slot-size", "1024", "--pair", "--unpair-after",
                                                 samplePath("seeded-4k.bin")])
        #expect(failed.code == 4, "\(failed.stderr)")
        #expect(failed.stderr.contains("\(device): paired (Just Works)"), "\(failed.stderr)")
        #expect(failed.stderr.contains("\(device): bond removed (--unpair-after)"), "\(failed.stderr)")
    }

    /// A Nordic application with buttonless DFU with bonds (8EC90004) enters its bootloader only
    /// for a bonded central: --pair bonds, and the bootloader keeps the address and the bond.
    @Test func theBondedButtonlessApplicationEntersItsBootloaderOnceBonded() async {
        let zip = repositoryRoot.appendingPathComponent("firmware-samples/nordic/blinky-app.zip").path
        let refused = await otaflash(simulator + ["--reconnect-window", "0", "--sim-buttonless", "bonded", zip])
        #expect(refused.code == 12, "\(refused.stderr)")
        #expect(refused.errorLines.first?.contains("pass --pair to bond with it first") == true, "\(refused.stderr)")
        let bonded = await otaflash(simulator + ["--sim-buttonless", "bonded", "--pair", zip])
        #expect(bonded.code == 0, "\(bonded.stderr)")
        #expect(bonded.stderr.contains("\(device): paired (Just Works)"), "\(bonded.stderr)")
        // The bootloader answers at the application's address, over the same bond.
        #expect(bonded.stdout.contains("\(device) (bootloader \(device)): 236 B verified and activated"), "\(bonded.stdout)")
    }

    /// Each device pairs with its own passkey; the one whose passkey is wrong fails with
    /// pairing_failed, the others are flashed.
    @Test func aBatchPairsEachDeviceOnItsOwnAndAWrongPasskeyFailsOnlyThatDevice() async throws {
        let scratch = try Scratch()
        let file = try scratch.file("passkeys", """
            # address  passkey
            C0:FF:EE:00:00:01 123456
            C0:FF:EE:00:00:02 000001   # wrong
            C0:FF:EE:00:00:03 123456
            """)
        let run = await otaflash(simulator + ["--count", "3", "--json", "--sim-security", "authenticate", "--sim-passkey", "123456",
                                              "--pair", "--passkey-file", file, "--unpair-after", samplePath("seeded-4k.bin")])
        #expect(run.code == 14, "\(run.stderr)")
        let done = Dictionary(uniqueKeysWithValues: run.jsonEvents.filter { $0["event"] as? String == "done" }
            .map { ($0["device"] as? String ?? "", $0) })
        #expect(done["C0:FF:EE:00:00:01"]?["result"] as? String == "ok")
        #expect(done["C0:FF:EE:00:00:03"]?["result"] as? String == "ok")
        #expect(done["C0:FF:EE:00:00:02"]?["error"] as? String == "pairing_failed")
        #expect(done["C0:FF:EE:00:00:02"]?["exit_code"] as? Int == 13)
        #expect((done["C0:FF:EE:00:00:02"]?["message"] as? String)?.contains("the passkey 000001 was not accepted") == true)
        // Tried once: a wrong passkey is not worth a retry.
        #expect(done["C0:FF:EE:00:00:02"]?["attempts"] as? Int == 1)
        let removed = run.jsonEvents.filter { ($0["message"] as? String)?.hasSuffix("bond removed (--unpair-after)") == true }
        #expect(removed.count == 3)
    }

    @Test(arguments: [
        (["--pair", "--passkey", "1000000"], ["--passkey must be between 0 and 999999, got 1000000"]),
        (["--pair", "--passkey", "-1"], ["--passkey must be between 0 and 999999, got -1"]),
        (["--pair", "--passkey", "12ab"], ["--passkey", "a whole number 0–999999"]),
        (["--passkey", "123456"], ["--passkey answers the device while pairing; add --pair"]),
        (["--confirm-pairing"], ["--confirm-pairing answers the device while pairing; add --pair"]),
        (["--pair", "--pair-timeout", "0"], ["--pair-timeout must be between 0.001 and 86400 seconds"]),
        (["--sim-passkey", "123456"], ["--sim-passkey needs --sim-security authenticate"]),
        (["--sim-security", "tls"], ["'--sim-security <level>'", "Please provide one of 'none', 'encrypt' or 'authenticate'"]),
    ])
    func badPairingOptionsAreOneUsageLine(arguments: [String], says: [String]) async {
        let run = await otaflash(simulator + arguments + [samplePath("seeded-4k.bin")])
        expectOneUsageLine(run, saying: says)
    }

    @Test func aPasskeyFileThatIsMissingOrMalformedIsOneUsageLineNamingTheLine() async throws {
        let scratch = try Scratch()
        let missing = scratch.url.appendingPathComponent("none").path
        expectOneUsageLine(await otaflash(simulator + ["--pair", "--passkey-file", missing, samplePath("seeded-4k.bin")]),
                           saying: ["--passkey-file \(missing) does not exist"])
        for (contents, says) in [("C0:FF:EE:00:00:01 1234567\n", "line 1: the passkey must be a whole number 0–999999, got '1234567'"),
                                 ("\nC0:FF:EE:00:00:01\n", "line 2: expected `ADDRESS PASSKEY`"),
                                 ("C0:FF:EE:00:00:01 1\nC0:FF:EE:00:00:01 2\n", "line 2: C0:FF:EE:00:00:01 is listed twice"),
                                 ("nonsense 123456\n", "line 1: expected `ADDRESS PASSKEY`")] {
            let file = try scratch.file("keys", contents)
            expectOneUsageLine(await otaflash(simulator + ["--pair", "--passkey-file", file, samplePath("seeded-4k.bin")]),
                               saying: [says])
        }
    }

    @Test func passkeyFilesParseCommentsAndLeadingZeros() throws {
        let keys = try PairingAnswers.parsePasskeys("# c\n\nAA:BB:CC:DD:EE:FF\t000042 # x\n11:22:33:44:55:66 999999\n", path: "f")
        #expect(keys.count == 2)
        #expect(keys.first { $0.key.description == "AA:BB:CC:DD:EE:FF" }?.value == 42)
        #expect(keys.first { $0.key.description == "11:22:33:44:55:66" }?.value == 999_999)
    }

    @Test func pairAndUnpairOnTheirOwn() async {
        let ok = await otaflash(["pair", "--simulator", "--sim-security", "authenticate", "--sim-passkey", "42", "--passkey", "42", "--json"])
        #expect(ok.code == 0, "\(ok.stderr)")
        let events = expectDocumentedLines(ok.stdoutLines, section: "otaflash pair and unpair")
        #expect(events.last?["bonded"] == .bool(true))
        let wrong = await otaflash(["pair", "--simulator", "--sim-security", "authenticate", "--sim-passkey", "42", "--passkey", "43"])
        #expect(wrong.code == 13, "\(wrong.stderr)")
        #expect(wrong.errorLines.first?.contains("the passkey 000043 was not accepted") == true, "\(wrong.stderr)")
        let unpaired = await otaflash(["unpair", "--simulator", "--json"])
        #expect(unpaired.code == 0, "\(unpaired.stderr)")
        #expect(expectDocumentedLines(unpaired.stdoutLines, section: "otaflash pair and unpair").last?["bonded"] == .bool(false))
    }
}
