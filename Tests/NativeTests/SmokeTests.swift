import GATT
import Native
import OTA
import OTAWire
import Simulator
import Testing

@Test func flashes256KiBIntoTheSimulatorOnVirtualTime() async throws {
    var rng = SeededGenerator(seed: 7)
    let bytes = (0..<(256 * 1024)).map { _ in UInt8.random(in: 0...255, using: &rng) }
    let image = FirmwareImage(bytes: bytes)
    let device = SimulatedDevice(SimulatedDeviceConfig())
    let central = SimulatedCentral(devices: [device])
    let session = OTASession(central: central, address: device.config.address, image: image, profile: NativeProfile())
    let result = try await session.run()
    #expect(result.crc32 == CRC32.checksum(bytes))
    #expect(device.activatedImage == bytes)
    print("256 KiB in \(result.seconds) s virtual, \(result.throughput / 1000) kB/s, capacity \(LinkModel.default.capacityBytesPerSecond / 1000) kB/s, stats \(result.stats)")
}
