import GATT
import Native
import OTA
import OTADevice
import OTAWire
import Simulator
import Synchronization
import Testing

/// `DeviceUpdater`: one device's whole update, image by image, and where a failed attempt leaves
/// the next one.
@Suite("Device updater")
struct DeviceUpdaterTests {
    static let first = testImage(4096, seed: 5)
    static let second = testImage(64 * 1024, seed: 6)
    static let plan = UpdatePlan(parts: [
        UpdatePlan.Part(firmware: first, profile: NativeProfile(), label: "first"),
        UpdatePlan.Part(firmware: second, profile: NativeProfile(), label: "second"),
    ], format: .rawBinary, reason: "two images")

    static func updater(reconnectWindow: Duration = .zero) -> DeviceUpdater {
        DeviceUpdater(plan: plan, reconnect: ReconnectPolicy(window: reconnectWindow))
    }

    final class Recorder: Sendable {
        let events = Mutex<[DeviceUpdater.Event]>([])
        func record(_ event: DeviceUpdater.Event) { events.withLock { $0.append(event) } }
        var images: [Int] {
            events.withLock { $0.compactMap { if case .image(_, let index, _, _) = $0 { index } else { nil } } }
        }
        var prepared: Int {
            events.withLock { $0.filter { if case .prepared = $0 { true } else { false } }.count }
        }
    }

    @Test func everyImageIsSentInOrderAndTheResultCoversThemAll() async throws {
        let device = simulatedDevice()
        let central = SimulatedCentral(devices: [device], clock: VirtualClock())
        let recorder = Recorder()
        let outcome = await Self.updater().run(central: central, address: device.address, events: recorder.record)
        let result = try outcome.result.get()
        #expect(recorder.images == [0, 1])
        #expect(recorder.prepared == 1)
        #expect(outcome.progress.imagesDone == 2)
        #expect(result.bytes == Self.first.size + Self.second.size)
        #expect(result.crc32 == CRC32.checksum(Self.first.bytes + Self.second.bytes))
        #expect(result.device == device.address.description)
        #expect(device.activatedImage == Self.second.bytes)
    }

    /// The link drops in the second image with no reconnect allowed: the attempt fails with the
    /// first image installed, and the next attempt sends only the second.
    @Test func aNewAttemptGoesOnWithTheImageThatFailed() async throws {
        let device = simulatedDevice(faults: FaultPlan(disconnectAt: [20_000]))
        let central = SimulatedCentral(devices: [device], clock: VirtualClock())
        let failed = await Self.updater().run(central: central, address: device.address, events: { _ in })
        guard case .failure(let error) = failed.result else {
            Issue.record("the attempt did not fail")
            return
        }
        #expect(error.resumable)
        #expect(failed.progress.imagesDone == 1)

        let recorder = Recorder()
        let outcome = await Self.updater().run(central: central, address: device.address, from: failed.progress, events: recorder.record)
        let result = try outcome.result.get()
        #expect(recorder.images == [1])
        // The device was checked once already: no second preparation.
        #expect(recorder.prepared == 0)
        #expect(result.bytes == Self.first.size + Self.second.size)
        #expect(result.stats.bytesSent < Self.second.size)
        #expect(device.activatedImage == Self.second.bytes)
    }

    /// A device that exposes no service of the plan's protocol fails in the first image's session,
    /// for good: the next images are not tried.
    @Test func aDeviceWithoutTheServiceFailsAtTheFirstImage() async {
        let device = simulatedDevice(hasOTAService: false)
        let central = SimulatedCentral(devices: [device], clock: VirtualClock())
        let recorder = Recorder()
        let outcome = await Self.updater().run(central: central, address: device.address, events: recorder.record)
        guard case .failure(let error) = outcome.result else {
            Issue.record("a device without the OTA service was flashed")
            return
        }
        #expect(error.code == .incompatibleDevice)
        #expect(!error.resumable)
        #expect(outcome.progress.imagesDone == 0)
        #expect(recorder.images == [0])
    }
}
