import Crypto
import GATT
import Native
import OTA
import OTADevice
import OTAWire
import SMP
import Simulator
import Testing

/// The real central (`OTASession` with `SMPProfile`) against the SMP server model in the
/// simulator: the upload, MCUboot's test, revert and confirm across resets, resume, buffers.
@Suite("SMP device through the session")
struct SMPDeviceSessionTests {
    static let image = SMPSlotImage.build(major: 1, minor: 4, revision: 2, body: (0..<40_000).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ 5) })

    /// A simulated SMP device and a central on one virtual clock.
    struct Rig {
        let device: SimulatedDevice
        let central: SimulatedCentral
        var model: SMPPeripheral? { device.model(as: SMPPeripheral.self) }
        var server: SMPServer? { model?.server }

        init(_ server: SMPServer.Config = SMPServer.Config(), faults: FaultPlan = .none, link: LinkModel = .default) {
            let config = SimulatedDeviceConfig(link: link)
            device = SimulatedDevice(config, model: SMPPeripheral(server: SMPServer(config: server), faults: faults, resetDelay: config.bootDelay))
            central = SimulatedCentral(devices: [device], clock: VirtualClock())
        }

        func flash(_ image: [UInt8] = SMPDeviceSessionTests.image, confirm: Bool = false, reset: Bool = true,
                   reconnect: ReconnectPolicy = .never) async -> Result<OTAResult, OTAError> {
            let settings = SMPUploadSettings(fileSHA256: Array(SHA256.hash(data: image)), imageHash: SMPSlotImage(image).hash,
                                             confirm: confirm, reset: reset)
            let session = OTASession(central: central, address: device.config.address, image: FirmwareImage(bytes: image),
                                     profile: SMPProfile(settings: settings), reconnect: reconnect)
            do throws(OTAError) {
                return .success(try await session.run())
            } catch {
                return .failure(error)
            }
        }

        /// One request on a new connection (waiting for the device to come back from a reset).
        func call(_ request: SMPRequest) async throws -> SMPResponse {
            let connection = try await central.connect(to: device.config.address, timeout: .seconds(10))
            let response: SMPResponse
            do {
                let client = try await SMPClient.attach(to: connection, device: "sim")
                response = try await client.call(request, timeout: .seconds(5))
            } catch {
                await connection.disconnect()
                throw error
            }
            await connection.disconnect()
            return response
        }

        func states() async throws -> [SMPImageSlot] {
            guard case .imageStates(let states) = try await call(.imageStateRead) else { throw OTAError(.protocolError, "no states") }
            return states.images
        }
    }

    @Test func anUploadWithoutResetLeavesTheFileByteIdenticalInSlotOnePending() async throws {
        let rig = Rig()
        let result = try await rig.flash(reset: false).get()
        #expect(result.bytes == Self.image.count)
        let server = try #require(rig.server)
        #expect(server.secondaryBytes == Self.image)
        #expect(server.pending && !server.permanent)
        #expect(server.boots == 0)
        let states = try await rig.states()
        #expect(states.map(\.pending) == [false, true])
        #expect(states[1].hash == SMPSlotImage(Self.image).hash)
    }

    @Test func testResetRunsTheNewVersionUnconfirmedAndConfirmKeepsIt() async throws {
        let rig = Rig()
        _ = try await rig.flash().get()
        #expect(rig.model?.activations.map(\.image) == [Self.image])
        var states = try await rig.states()
        #expect(states[0].version == "1.4.2" && states[0].active && !states[0].confirmed)
        #expect(states[1].version == "1.0.0" && states[1].confirmed)
        guard case .imageStates = try await rig.call(.imageStateWrite(hash: nil, confirm: true)) else { Issue.record("confirm not answered with states"); return }
        #expect(try await rig.call(.reset()) == .empty)
        states = try await rig.states()
        #expect(states[0].version == "1.4.2" && states[0].active && states[0].confirmed)
        #expect(rig.server?.primary.bytes == Self.image)
        #expect(rig.server?.boots == 2)
    }

    @Test func aResetWithoutConfirmRevertsToTheOldImage() async throws {
        let rig = Rig()
        _ = try await rig.flash().get()
        #expect(try await rig.call(.reset()) == .empty)
        let states = try await rig.states()
        #expect(states[0].version == "1.0.0" && states[0].active && states[0].confirmed)
        #expect(states[1].version == "1.4.2" && !states[1].pending && !states[1].confirmed)
        #expect(rig.server?.lastBoot == .reverted)
    }

    @Test func confirmAtOnceRunsTheNewImageConfirmed() async throws {
        let rig = Rig()
        _ = try await rig.flash(confirm: true).get()
        let states = try await rig.states()
        #expect(states[0].version == "1.4.2" && states[0].confirmed)
    }

    @Test func aLinkLossMidUploadResumesAtTheServersOffset() async throws {
        let rig = Rig(faults: FaultPlan(disconnectAt: [20_000]))
        let result = try await rig.flash(reset: false, reconnect: ReconnectPolicy(seed: 3)).get()
        #expect(result.stats.connections == 2)
        let resumed = try #require(result.stats.resumedFrom.last)
        #expect(resumed > 15_000 && resumed <= 20_000)
        #expect(rig.server?.secondaryBytes == Self.image)
        #expect(rig.server?.pending == true)
    }

    /// A reboot loses the upload's RAM state: the same file starts over, and arrives whole.
    @Test func aRebootMidUploadStartsTheUploadOver() async throws {
        let rig = Rig(faults: FaultPlan(rebootAt: [25_000]))
        let result = try await rig.flash(reset: false, reconnect: ReconnectPolicy(seed: 3)).get()
        #expect(result.stats.connections == 2)
        #expect(result.stats.resumedFrom.last == 0)
        #expect(result.stats.bytesResent >= 24_000)
        #expect(rig.server?.boots == 1)
        #expect(rig.server?.secondaryBytes == Self.image)
    }

    /// Dropped requests: the server answers the next ones with the offset it holds, and the
    /// engine goes on from there.
    @Test func droppedRequestsAreSentAgainFromTheServersOffset() async throws {
        let rig = Rig(faults: FaultPlan(seed: 11, dropRate: 0.05))
        let result = try await rig.flash(reset: false, reconnect: ReconnectPolicy(seed: 3)).get()
        #expect(result.stats.rewinds + result.stats.commandRetries > 0)
        #expect(rig.server?.secondaryBytes == Self.image)
        #expect(rig.server?.pending == true)
    }

    /// The first upload request may wait longer than the whole stall budget (the server erases
    /// its slot first): a device that keeps the link and never answers it ends on the engine's own
    /// chain (one re-ask, the erase allowance), not on the budget, without a reconnect, under a minute.
    @Test func aFirstRequestThatIsNeverAnsweredEndsOnItsOwnTimeoutWithinAMinute() async throws {
        let rig = Rig(faults: FaultPlan(stopAnsweringAt: 0))
        let started = rig.central.clock.now
        let result = await rig.flash(reset: false)
        guard case .failure(let error) = result else { Issue.record("the upload went through a device that drops everything"); return }
        #expect(error.code == .timeout)
        #expect(error.message.contains("did not answer the first upload request in 50 s"), "\(error.message)")
        let elapsed = rig.central.clock.now - started
        #expect(elapsed >= EngineConfig().replyTimeout + SMPEngine.firstRequestTimeout)
        #expect(elapsed <= .seconds(60))
    }

    /// On a link where whole writes are not the fastest frames (2475-byte buffers, MTU 517, 2M,
    /// 7.5 ms), the probe finds a faster frame size: the same upload takes less (virtual) time
    /// than with frames of whole writes, the file lands intact and nothing goes twice.
    @Test func theFrameProbeBeatsWholeWritesWhereTheyAreNotTheFastest() async throws {
        let image = SMPSlotImage.build(major: 1, minor: 4, revision: 2, body: (0..<200_000).map { UInt8(truncatingIfNeeded: $0 &* 7 &+ 1) })
        let link = LinkModel(mtu: 517, phy: .le2M, connectionInterval: .microseconds(7500))
        var seconds: [Bool: Double] = [:]
        for probe in [false, true] {
            let config = SimulatedDeviceConfig(link: link)
            let device = SimulatedDevice(config, model: SMPPeripheral(server: SMPServer(config: SMPServer.Config(bufferSize: 2475, bufferCount: 4))))
            let central = SimulatedCentral(devices: [device], clock: VirtualClock())
            let settings = SMPUploadSettings(fileSHA256: Array(SHA256.hash(data: image)), imageHash: SMPSlotImage(image).hash,
                                             reset: false, probeFrames: probe)
            let session = OTASession(central: central, address: device.config.address, image: FirmwareImage(bytes: image),
                                     profile: SMPProfile(settings: settings))
            let result = try await session.run()
            #expect(result.stats.bytesResent == 0)
            #expect(device.model(as: SMPPeripheral.self)?.server.secondaryBytes == image)
            seconds[probe] = result.transferSeconds
        }
        let probed = try #require(seconds[true]), whole = try #require(seconds[false])
        #expect(probed < whole * 0.97, "probe \(probed) s, whole writes \(whole) s")
    }

    /// The engine keeps the device's buffer count of requests in flight: every buffer is used,
    /// none overflows (a dropped request would cost a timeout).
    @Test(arguments: [(384, 4), (2475, 4), (2475, 2)])
    func theWindowFillsTheDevicesBuffersWithoutOverflowingThem(size: Int, count: Int) async throws {
        let link = LinkModel(mtu: 247, phy: .le2M, connectionInterval: .microseconds(7_500))
        let rig = Rig(SMPServer.Config(bufferSize: size, bufferCount: count), faults: FaultPlan(slowFlashPerKiB: .milliseconds(50)), link: link)
        let result = try await rig.flash(reset: false).get()
        let model = try #require(rig.model)
        #expect(model.peakBuffers == count)
        #expect(model.droppedFrames == 0)
        #expect(result.stats.rewinds == 0 && result.stats.commandRetries == 0)
        #expect(model.server.secondaryBytes == Self.image)
    }

    @Test func aNewUploadWhileATestImageRunsUnconfirmedIsRefusedWithNoFreeSlot() async throws {
        let rig = Rig()
        _ = try await rig.flash().get()
        let other = SMPSlotImage.build(major: 1, minor: 5, revision: 0, body: Array(repeating: 0x42, count: 5000))
        guard case .failure(let error) = await rig.flash(other) else { Issue.record("expected a refusal"); return }
        #expect(error.message.contains("no free slot (9)"), "\(error)")
        #expect(rig.server?.primary.bytes == Self.image)
        #expect(rig.server?.secondary?.versionText == "1.0.0")
    }

    @Test func aPendingImageAlsoBlocksAnotherUpload() async throws {
        let rig = Rig()
        _ = try await rig.flash(reset: false).get()
        let other = SMPSlotImage.build(major: 1, minor: 5, revision: 0, body: Array(repeating: 0x42, count: 5000))
        guard case .failure(let error) = await rig.flash(other) else { Issue.record("expected a refusal"); return }
        #expect(error.message.contains("no free slot"), "\(error)")
        #expect(rig.server?.secondaryBytes == Self.image)
    }

    /// A corrupted chunk: the server's SHA-256 of the file differs, the engine uploads it again
    /// from 0 on its own, and only the intact image is marked and swapped in.
    @Test func aCorruptedChunkIsUploadedAgainAndOnlyTheIntactImageMarked() async throws {
        let rig = Rig(faults: FaultPlan(corruptAt: [12_345]))
        let result = try await rig.flash().get()
        #expect(result.stats.restarts == 1)
        #expect(rig.server?.marks.map(\.bytes) == [Self.image])
        #expect(rig.model?.activations.map(\.image) == [Self.image])
    }

    /// A bit flipped in slot 1's flash: the server's SHA-256 of the file differs, nothing is
    /// marked; the upload goes again from 0 (the flash fault fired once) and the intact image is.
    @Test func aFlashBitFlipIsUploadedAgainAndOnlyTheIntactImageMarked() async throws {
        let rig = Rig(faults: FaultPlan(flashBitFlipAt: 9_999))
        let result = try await rig.flash(reset: false).get()
        #expect(result.stats.restarts == 1)
        let server = try #require(rig.server)
        #expect(server.secondaryBytes == Self.image)
        #expect(server.marks.map(\.bytes) == [Self.image])
    }

    @Test func theServerRecordsTheImageItMarked() async throws {
        let rig = Rig()
        _ = try await rig.flash(reset: false).get()
        let marks = try #require(rig.server?.marks)
        #expect(marks.count == 1 && marks[0].bytes == Self.image && !marks[0].confirm)
    }

    @Test func anImageOverTheSlotIsRefusedAsTooLarge() async throws {
        let rig = Rig(SMPServer.Config(slotSize: 10_000))
        guard case .failure(let error) = await rig.flash() else { Issue.record("expected a refusal"); return }
        #expect(error.code == .imageTooLarge, "\(error)")
    }
}
