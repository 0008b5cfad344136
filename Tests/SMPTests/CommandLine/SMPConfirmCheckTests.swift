import Foundation
import Testing

// `otaflash --confirm-after-check [--check-command CMD]`, `--sim-smp-key` and a single device's
// `--retries` with MCUboot images on the simulated Zephyr device.

private func mcuboot(_ name: String) -> String { samplePath("mcuboot/\(name)") }

@Suite("otaflash flash, SMP: confirm after check, MCUboot's key, retries")
struct SMPConfirmCheckTests {
    @Test func confirmAfterCheckConfirmsTheImageOnceItRuns() async throws {
        let run = await otaflash(simulator + ["--confirm-after-check", mcuboot("blinky-ec256-v1.3.0.bin")])
        #expect(run.code == 0, "\(run.stderr)")
        #expect(run.stdout.contains("now runs 1.3.0: slot 0 1.3.0 active confirmed"), "\(run.stdout)")
    }

    @Test func aCrashingTestImageFailsItsCheckWithItsOwnExitCode() async throws {
        let run = await otaflash(simulator + ["--json", "--confirm-after-check", "--sim-smp-crashing-image", mcuboot("blinky-ec256-v1.3.0.bin")])
        #expect(run.code == 19, "\(run.stderr)")
        let done = try #require(run.jsonEvents.last)
        #expect(done["error"] as? String == "check_failed")
        #expect(run.errorLines.first?.contains("failed its check") == true, "\(run.stderr)")
        #expect(run.errorLines.first?.contains("reverts it to 1.0.0") == true, "\(run.stderr)")
    }

    @Test func theCheckCommandDecidesTheConfirm() async throws {
        let image = mcuboot("blinky-ec256-v1.3.0.bin")
        let pass = await otaflash(simulator + ["--confirm-after-check", "--check-command", "test \"$OTAFLASH_VERSION\" = 1.3.0", image])
        #expect(pass.code == 0, "\(pass.stderr)")
        #expect(pass.stderr.contains("--check-command passed: the image is confirmed"), "\(pass.stderr)")

        let fail = await otaflash(simulator + ["--confirm-after-check", "--check-command", "exit 3", image])
        #expect(fail.code == 19, "\(fail.stderr)")
        #expect(fail.errorLines.first?.contains("--check-command 'exit 3' exited 3") == true, "\(fail.stderr)")
        #expect(fail.errorLines.first?.contains("it was not confirmed") == true, "\(fail.stderr)")

        let slow = await otaflash(simulator + ["--confirm-after-check", "--check-command", "sleep 30", "--check-timeout", "1", image])
        #expect(slow.code == 19, "\(slow.stderr)")
        #expect(slow.errorLines.first?.contains("did not finish within 1 s") == true, "\(slow.stderr)")
    }

    @Test(arguments: [
        (["--confirm", "--confirm-after-check"], "give one"),
        (["--confirm-after-check", "--no-reset"], "drop --no-reset"),
        (["--confirm-after-check", "--no-activate"], "drop --no-activate"),
        (["--check-command", "true"], "add --confirm-after-check"),
        (["--confirm-after-check", "--check-command", " "], "--check-command is empty"),
        (["--confirm-after-check", "--check-timeout", "5"], "add --check-command"),
        (["--confirm-after-check", "--check-command", "true", "--check-timeout", "0"], "--check-timeout must be between 1 and 3600 seconds"),
        (["--confirm-after-check", "--check-command", "true", "--count", "2"], "--check-command checks one device"),
    ])
    func refusals(options: [String], says: String) async {
        let run = await otaflash(simulator + options + [mcuboot("blinky-ec256-v1.3.0.bin")])
        #expect(run.code == 2, "\(options): \(run.stderr)")
        #expect(run.stderr.contains(says), "\(options): \(run.stderr)")
    }

    /// The simulated MCUboot given a key boots only what that key signed.
    @Test func simulatedMCUbootChecksSignaturesWithTheGivenKey() async throws {
        let image = mcuboot("blinky-ed25519-v1.3.0.bin")
        let good = await otaflash(simulator + ["--sim-smp-key", mcuboot("ed25519-public.pem"), image])
        #expect(good.code == 0, "\(good.stderr)")
        #expect(good.stdout.contains("now runs 1.3.0"), "\(good.stdout)")

        let other = await otaflash(simulator + ["--sim-smp-key", mcuboot("ec256-public.pem"), image])
        #expect(other.code == 8, "\(other.stderr)")
        #expect(other.errorLines.first?.contains("MCUboot refused the image at boot") == true, "\(other.stderr)")

        let notAKey = await otaflash(simulator + ["--sim-smp-key", image, image])
        #expect(notAKey.code == 2, "\(notAKey.stderr)")
        #expect(notAKey.errorLines.first?.contains("is not an ECDSA P-256 or Ed25519 key in PEM form") == true, "\(notAKey.stderr)")
        let missing = await otaflash(simulator + ["--sim-smp-key", "/nonexistent/key.pem", image])
        #expect(missing.code == 2, "\(missing.stderr)")
        #expect(missing.errorLines.first?.contains("cannot be read") == true, "\(missing.stderr)")
    }

    /// `--upgrade-only` sets the upload's `upgrade` flag: a Zephyr device (one without a downgrade
    /// check of its own) then refuses an image not newer than the running one.
    @Test func upgradeOnlyHasTheDeviceRefuseAnImageNotNewer() async throws {
        let image = mcuboot("blinky-ec256-v1.3.0.bin")
        let older = await otaflash(simulator + ["--upgrade-only", "--sim-firmware-version", "2.0.0", image])
        #expect(older.code == 7, "\(older.stderr)")
        #expect(older.errorLines.first?.contains("current version is newer (27): it runs 2.0.0") == true, "\(older.stderr)")
        let without = await otaflash(simulator + ["--sim-firmware-version", "2.0.0", image])
        #expect(without.code == 0, "the same device takes it without the flag: \(without.stderr)")
        let newer = await otaflash(simulator + ["--upgrade-only", image])
        #expect(newer.code == 0, "\(newer.stderr)")
    }

    /// `image slots`: img_mgmt's slot info, each slot's size and the one an upload goes to; an
    /// mcumgr server, which has no such command, is told apart with exit 7.
    @Test func imageSlotsShowsTheSlotsAndWhereAnUploadGoes() async throws {
        let run = await otaflash(["image", "slots", "--json", "--simulator", "--sim-slot-size", "262144"])
        #expect(run.code == 0, "\(run.stderr)")
        let slots = run.jsonEvents.filter { $0["event"] as? String == "slot_info" }
        #expect(slots.count == 2)
        #expect(slots.allSatisfy { $0["size"] as? Int == 262_144 }, "\(slots)")
        #expect(slots.first { $0["slot"] as? Int == 1 }?["upload_image_id"] as? Int == 0)
        #expect(slots.first { $0["slot"] as? Int == 0 }?["upload_image_id"] is NSNull)
        let human = await otaflash(["image", "slots", "--simulator"])
        #expect(human.code == 0 && human.stdout.contains("image 0"), "\(human.stdout)")

        let mcumgr = await otaflash(["image", "slots", "--simulator", "--sim-smp-cbor", "tinycbor"])
        #expect(mcumgr.code == 7, "\(mcumgr.stderr)")
        #expect(mcumgr.errorLines.first?.contains("does not answer the image slot info") == true, "\(mcumgr.stderr)")
    }

    /// Corrupted on both uploads of a run (exit 8 alone); `--retries 1` on one device runs a second
    /// session, which uploads the file anew and succeeds.
    @Test func aSingleDeviceTakesRetries() async throws {
        let options = ["--sim-corrupt-at", "300", "--sim-corrupt-at", "300", mcuboot("blinky-ed25519-v1.3.0.bin")]
        let alone = await otaflash(simulator + options)
        #expect(alone.code == 8, "\(alone.stderr)")

        let run = await otaflash(simulator + ["--json", "--retries", "1"] + options)
        #expect(run.code == 0, "\(run.stderr)")
        let events = run.jsonEvents
        #expect(events.contains { ($0["message"] as? String)?.hasPrefix("attempt 1 failed:") == true }, "\(run.stdout)")
        #expect(events.last?["result"] as? String == "ok")
        #expect(events.last?["firmware_after"] as? String == "1.3.0")
    }
}
