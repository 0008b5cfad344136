import Foundation
import GATT
import OTA
import OTAWire
import Simulator

/// fs_mgmt's upload rate on the link model (docs/PERFORMANCE.md, "MCUmgr file uploads").
extension SMPBench {
    /// Goodput of `SMPClient.putFile` against the Zephyr SMP server model: the file's bytes
    /// after the first answer over the time from that answer to the last (as
    /// `OTAResult.transferSeconds` counts an image), in virtual time. `window` 1 is smpclient's
    /// `upload_file` (smpmgr's file upload): one request in flight, each frame filled to
    /// `buf_size` (`_maximize_upload_packet`), the next at the answer's `off`; `otaflash files
    /// put` keeps up to `buf_count` in flight.
    static func fileGoodput(_ link: LinkModel, file: [UInt8], buffer: (size: Int, count: Int), window: Int) async throws -> Double {
        var config = SMPServer.Config(bufferSize: buffer.size, bufferCount: buffer.count, slotSize: 4 << 20)
        config.fileSystem.capacity = 8 << 20
        let model = SMPPeripheral(config: config, firmwareVersion: FirmwareVersion(major: 1, minor: 0, patch: 0))
        let d = SimulatedDevice(SimulatedDeviceConfig(slotSize: 4 << 20, link: link), model: model)
        let central = SimulatedCentral(devices: [d])
        let connection = try await central.connect(to: d.config.address, timeout: .seconds(10))
        let client = try await SMPClient.attach(to: connection, device: d.config.address.description)
        let clock = connection.clock
        var first: (at: Duration, offset: Int)?
        var last = Duration.zero
        try await client.putFile(file, to: "/lfs/bench.bin", timeout: .seconds(5), window: window) { offset in
            if first == nil { first = (clock.now, offset) }
            last = clock.now
        }
        await connection.disconnect()
        guard let first, let device = d.model(as: SMPPeripheral.self), device.server.files.files["/lfs/bench.bin"] == file else {
            throw BenchFailure("fs_mgmt run did not leave the file on the device")
        }
        guard device.droppedFrames == 0 else { throw BenchFailure("fs_mgmt run (window \(window)) had \(device.droppedFrames) frames dropped on a clean link") }
        return Double(file.count - first.offset) / (last - first.at).seconds
    }

    /// The file upload table: `files put` beside smpclient's `upload_file` and otaflash's image
    /// upload on the same link and buffers.
    static func fileRates(fileSize: Int = 48 * 1024) async throws -> [(key: String, value: Any)] {
        var rng = SeededGenerator(seed: 2026)
        let file = (0..<fileSize).map { _ in UInt8.random(in: 0...255, using: &rng) }
        let image = SMPSlotImage.build(major: 1, minor: 2, revision: 3, body: file)
        let mcuboot = try MCUbootImage(bytes: image, source: "bench image")
        print("MCUmgr fs_mgmt upload rate: \(fileSize / 1024) KiB file, virtual time, kB/s")
        print("files put: buf_size frames, buf_count in flight; smpclient upload_file (smpmgr): buf_size frames, one in flight; image: otaflash's image upload of the same bytes as an MCUboot image")
        print("buffers   MTU  PHY interval  capacity kB/s  files put  smpclient  image  files÷smpclient  files÷image")
        var rows: [[String: Any]] = []
        var minVsSmpclient = Double.infinity
        for buffer in [(size: 384, count: 4), (size: 2475, count: 4)] {
            for mtu in [23, 247] {
                for phy in LinkModel.PHY.allCases {
                    for ci in [7500, 30000] {
                        let link = LinkModel(mtu: mtu, phy: phy, connectionInterval: .microseconds(Int64(ci)))
                        let cap = link.capacityBytesPerSecond
                        let files = try await fileGoodput(link, file: file, buffer: buffer, window: buffer.count)
                        let smpclient = try await fileGoodput(link, file: file, buffer: buffer, window: 1)
                        let imageRate = try await goodput(link, file: image, mcuboot: mcuboot, buffer: buffer, uploadStrategies[0]) ?? 0
                        minVsSmpclient = min(minVsSmpclient, files / smpclient)
                        rows.append(["buf_size": buffer.size, "buf_count": buffer.count, "mtu": mtu, "phy": phy.rawValue, "interval_ms": Double(ci) / 1000,
                                     "capacity": cap, "files_put": files, "smpclient_upload_file": smpclient, "image_otaflash": imageRate])
                        print(String(format: "%d×%-5d  %3d  %@  %4.1f ms  %10.1f     %6.1f     %6.1f  %6.1f     %5.2f           %.2f",
                                     buffer.count, buffer.size, mtu, phy.rawValue, Double(ci) / 1000, cap / 1000, files / 1000, smpclient / 1000,
                                     imageRate / 1000, files / smpclient, imageRate > 0 ? files / imageRate : 0))
                    }
                }
            }
        }
        print(String(format: "files put ÷ smpclient upload_file over the table: min %.2f", minVsSmpclient))
        print()
        return [("smp_files_grid", rows), ("smp_files_vs_smpclient_min", minVsSmpclient)]
    }
}
