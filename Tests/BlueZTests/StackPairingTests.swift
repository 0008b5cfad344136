import BlueZ
import Foundation
import GATT
import Ledger
import Native
import Testing

/// What the central's own stack does about a device that wants a bonded link, and the bonds
/// otaflash removes, against the fake `org.bluez`: the stack pairing by itself is seen (Paired
/// turning true, the passkey request otaflash's agent refuses) and ends the run with exit 12 and
/// no bond; a bond `--unpair-after` cannot remove is tried once more when bluetoothd is back, and
/// otherwise ends the run with exit 17 (bond_left).
extension ProcessBusSuites {
@Suite(.serialized)
struct StackPairingTests {
    static let device = CentralTests.device

    static func flash(_ fake: FakeBlueZ, _ extra: [String] = []) async -> (code: Int32, out: String, err: String, seconds: Double) {
        let started = ContinuousClock.now
        let (code, out, err) = await CentralTests.otaflash(CentralTests.flashArguments(fake, image: CentralTests.sample4k, ["--json"] + extra))
        return (code, out, err, (ContinuousClock.now - started) / .seconds(1))
    }

    static func errorLines(_ err: String) -> [Substring] { err.split(separator: "\n").filter { $0.hasPrefix("otaflash: error") } }

    @Test func aBondTheStackMadeByItselfEndsTheRunWithPermissionAndIsRemoved() async throws {
        try await withFake(["--stack-pairs", "justworks"]) { fake in
            let run = await Self.flash(fake)
            #expect(run.code == 12, "\(run.err)\n\(fake.log)")
            let lines = Self.errorLines(run.err)
            #expect(lines.count == 1, "\(run.err)")
            #expect(lines.first?.contains("paired with it by itself") == true, "\(run.err)")
            #expect(lines.first?.contains("pass --pair") == true, "\(run.err)")
            #expect(run.out.contains("the Bluetooth stack bonded with it by itself (no --pair); bond removed"), "\(run.out)")
            #expect(fake.log.contains("RemoveDevice done"), "\(fake.log)")
            #expect(fake.activatedImage == nil)
        }
    }

    @Test func aPasskeyTheStackAsksForIsRefusedByOurAgentAndTheLineNamesPasskey() async throws {
        try await withFake(["--stack-pairs", "passkey"]) { fake in
            let run = await Self.flash(fake)
            #expect(run.code == 12, "\(run.err)\n\(fake.log)")
            let line = Self.errorLines(run.err).first ?? ""
            #expect(line.contains("asked for a passkey") && line.contains("--pair --passkey"), "\(run.err)")
            #expect(fake.log.contains("agent RequestPasskey -> org.bluez.Error.Rejected"), "\(fake.log)")
            #expect(fake.log.contains("RegisterAgent /org/otaflash/refusing_agent/dev_C0_FF_EE_00_00_01 NoInputNoOutput"), "\(fake.log)")
            // Ended by the refusal, not by the held call failing (the fake holds it 20 s).
            #expect(run.seconds < 10, "took \(run.seconds) s")
            #expect(fake.log.contains("RemoveDevice done"), "\(fake.log)")
        }
    }

    @Test func withPairTheRefusingAgentIsNotRegistered() async throws {
        try await withFake { fake in
            _ = await Self.flash(fake, ["--pair"])
            #expect(!fake.log.contains("refusing_agent"), "\(fake.log)")
        }
    }

    @Test func aFailedRemovalIsTriedAgainOnceBluetoothdIsBack() async throws {
        try await withFake(["--remove-device-fails", "1", "--restart-on-remove-failure"]) { fake in
            try await BlueZCentral(busAddress: fake.address).removeBond(CentralTests.address)
            let log = fake.log
            let back = log.range(of: "bluetoothd back"), done = log.range(of: "RemoveDevice done")
            #expect(back != nil && done != nil && back!.lowerBound < done!.lowerBound, "\(log)")
        }
    }

    @Test func aBondUnpairAfterCannotRemoveEndsTheRunWithBondLeft() async throws {
        try await withFake(["--remove-device-fails", "2", "--restart-on-remove-failure"]) { fake in
            let run = await Self.flash(fake, ["--unpair-after"])
            #expect(run.code == 17, "\(run.err)\n\(fake.log)")
            #expect(fake.activatedImage == CentralTests.contents(CentralTests.sample4k))
            let done = run.out.split(separator: "\n").last { $0.contains(#""event":"done""#) } ?? ""
            #expect(done.contains(#""error":"bond_left""#) && done.contains(#""exit_code":17"#), "\(done)")
            #expect(Self.errorLines(run.err).first?.contains("tried again once bluetoothd was back") == true, "\(run.err)")
            // The ledger keeps it as a result of its own, with its exit code.
            let rows = try await SQLiteLedger(path: "\(fake.directory)/ledger.sqlite").records(LedgerQuery())
            #expect(rows.map(\.result) == [.bondLeft] && rows.first?.exitCode == 17 && rows.first?.errorCode == "bond_left", "\(rows)")
        }
    }
}
}
