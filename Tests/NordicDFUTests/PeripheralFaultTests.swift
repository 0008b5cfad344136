import GATT
import OTA
import OTADevice
import Simulator
import Testing
@testable import NordicDFU

// The simulator's fault options on the Secure DFU bootloader (`NordicDFUPeripheral`), each
// through the shared session: what the device does, and that nothing but the image sent, with
// its hash matched, is ever activated.

@Suite struct NordicDFUPeripheralFaultTests {
    static let firmware = firmwareBytes(4096 * 3 + 500)
    static let initPacket = DFUInitPacket(command: .application(firmware: firmware, version: 2, softDeviceRequirements: [0xAF]),
                                          signature: placeholderSignature).bytes

    func flash(_ faults: FaultPlan, reconnect: ReconnectPolicy = ReconnectPolicy(seed: 3),
               link: LinkModel = .default) async -> (Result<OTAResult, OTAError>, activations: [[UInt8]]) {
        let (result, device) = await attemptNordicFlash(initPacket: Self.initPacket, firmware: FirmwareImage(bytes: Self.firmware),
                                                        faults: faults, link: link, reconnect: reconnect)
        return (result, device.model(as: NordicDFUPeripheral.self)?.bootloader.activations.map(\.image) ?? [])
    }

    /// The bootloader resets only once its answer to the last EXECUTE is on the air, whatever
    /// the connection interval, also when the answer waits for the flash (reading the image back
    /// for its hash) and so for the next connection event: the central sees the image validated
    /// on its one connection.
    @Test(arguments: [7.5, 15, 50])
    func theLastAnswerGoesOutBeforeTheBootloaderResets(intervalMs: Double) async throws {
        let link = LinkModel(mtu: 247, phy: .le2M, connectionInterval: .microseconds(Int64(intervalMs * 1000)))
        let (result, activations) = await flash(FaultPlan(slowFlashPerKiB: .milliseconds(1)), reconnect: .never, link: link)
        #expect(try result.get().stats.connections == 1)
        #expect(activations == [Self.firmware])
    }

    @Test func aCorruptedPacketIsCaughtAtTheObjectsChecksumAndTheObjectSentAgain() async throws {
        let (result, activations) = await flash(FaultPlan(corruptAt: [4096 + 100]))
        let stats = try result.get().stats
        #expect(activations == [Self.firmware])
        #expect(stats.rollbacks == 1)
        #expect(stats.bytesResent >= 4096 - 100 && stats.bytesResent <= 4096)
    }

    @Test func droppedPacketsSpoilTheirObjectWhichIsSentAgain() async throws {
        let (result, activations) = await flash(FaultPlan(seed: 7, dropRate: 0.03))
        let stats = try result.get().stats
        #expect(activations == [Self.firmware])
        #expect(stats.rollbacks > 0)
    }

    @Test func aDeviceThatDropsEveryPacketEndsWithAnErrorAndActivatesNothing() async {
        let (result, activations) = await flash(FaultPlan(dropRate: 1), reconnect: .never)
        guard case .failure(let error) = result else { Issue.record("expected a failure"); return }
        #expect(error.code == .protocolError || error.code == .timeout, "\(error)")
        #expect(activations.isEmpty)
    }

    @Test func aRebootMidObjectLosesOnlyThatObjectAndTheTransferResumes() async throws {
        let (result, activations) = await flash(FaultPlan(rebootAt: [8192 + 1000]))
        let stats = try result.get().stats
        #expect(activations == [Self.firmware])
        #expect(stats.connections == 2)
        // The two executed objects survive the reset; the one in progress is gone.
        #expect(stats.resumedFrom == [0, 8192])
        let resend = try #require(stats.resumeResends.first)
        #expect(resend > 1000 && resend <= 4096)
    }

    @Test func aDeviceThatStopsAnsweringEndsWithATimeoutAndActivatesNothing() async {
        let (result, activations) = await flash(FaultPlan(stopAnsweringAt: 5000), reconnect: .never)
        guard case .failure(let error) = result else { Issue.record("expected a failure"); return }
        #expect(error.code == .timeout, "\(error)")
        #expect(activations.isEmpty)
    }

    @Test func controlPointWritesRefusedWithAnATTErrorAreSentAgain() async throws {
        let (result, activations) = await flash(FaultPlan(seed: 5, gattErrorRate: 0.3))
        #expect(try result.get().stats.commandRetries > 0)
        #expect(activations == [Self.firmware])
    }

    @Test func lostReceiptsAreReplacedByACalculateChecksum() async throws {
        // Seed 2 loses notifications, never the last EXECUTE's answer.
        let (result, activations) = await flash(FaultPlan(seed: 2, lostNotificationRate: 0.3))
        let stats = try result.get().stats
        #expect(activations == [Self.firmware])
        #expect(stats.commandRetries + stats.checkpoints > 4)
    }

    @Test func slowFlashDelaysTheAnswers() async throws {
        let fast = try await flash(.none).0.get()
        let slow = try await flash(FaultPlan(slowFlashPerKiB: .milliseconds(20))).0.get()
        // Each KiB is written once and read back once for the hash (2 × 13 × 20 ms), partly while the link is busy anyway.
        #expect(slow.seconds - fast.seconds >= 0.4, "fast \(fast.seconds) s, slow \(slow.seconds) s")
    }

    @Test func aBankByteThatRotsFailsThePostValidationAndNothingIsActivated() async {
        let (result, activations) = await flash(FaultPlan(flashBitFlipAt: 100))
        guard case .failure(let error) = result else { Issue.record("expected a failure"); return }
        #expect(error.code == .verifyFailed)
        #expect(error.message.contains("nothing was activated"))
        #expect(activations.isEmpty)
    }

    /// `--sim-lose-final-answer`: the bootloader activates and resets, its answer never comes.
    /// The session, with nothing to confirm it at an application address, looks for the
    /// bootloader, which holds no init packet any more (it ran the EXECUTE): not_confirmed, the
    /// image activated once, within the reconnect window of the loss.
    @Test func aLostLastAnswerEndsNotConfirmedWithTheImageActivatedOnce() async throws {
        let (result, activations) = await flash(FaultPlan(loseFinalAnswer: true))
        guard case .failure(let error) = result else { Issue.record("a lost last answer reported success with nothing to confirm it"); return }
        #expect(error.code == .notConfirmed, "\(error)")
        #expect(error.message.contains("last EXECUTE"), "\(error.message)")
        #expect(activations == [Self.firmware])
        // Without reconnecting, the same.
        let (once, activatedOnce) = await flash(FaultPlan(loseFinalAnswer: true), reconnect: .never)
        guard case .failure(let e) = once else { Issue.record("succeeded"); return }
        #expect(e.code == .notConfirmed)
        #expect(activatedOnce == [Self.firmware])
    }

    @Test func aDeviceGoneForGoodRefusesTheReconnection() async {
        let (result, activations) = await flash(FaultPlan(disconnectAt: [5000], refuseConnectionsAfter: 1),
                                                reconnect: ReconnectPolicy(window: .seconds(3), seed: 1))
        guard case .failure(let error) = result else { Issue.record("expected a failure"); return }
        #expect(error.code == .connection || error.code == .deviceNotFound, "\(error)")
        #expect(activations.isEmpty)
    }
}
