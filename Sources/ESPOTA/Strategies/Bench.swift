import Foundation
import GATT
import OTA
import Simulator

/// How the bench measures Espressif's BLE OTA: goodput over links, otaflash's engine (the next
/// sector before the ACK, at most two un-ACKed) beside the reference app's strategy (one sector,
/// then wait for its ACK), against the protocol's bound: the link's capacity for its packets
/// (each carries a 3-byte sector header, and each sector's last one its CRC16) with the device's
/// flash never waited for.
public struct ESPOTABench: BenchStrategy {
    public init() {}

    public var sections: [BenchSection] {
        [BenchSection(flag: "--esp-ota") { image in try await Self.grid(imageSize: image.size) }]
    }

    /// Goodput of one window through the real session against the example device model.
    /// `commands`: sector packets as write commands (otaflash's default), else as the
    /// characteristic flags them (write requests).
    /// `component`'s ring buffer holds `ring` sectors (`ble_ota_raw` announces it as its window);
    /// `honoursWindow` false: the reference central, which ignores it.
    static func goodput(_ link: LinkModel, image: [UInt8], component: ESPOTAComponent, ring: Int? = nil, window: Int, commands: Bool,
                        honoursWindow: Bool = true) async throws -> Double {
        let model = ESPOTAPeripheral(config: .init(component: component, partitionSize: 4 << 20, ringBufferBytes: ring.map { $0 * ESPOTAService.sectorSize },
                                                   flashTimePerSector: .milliseconds(12), verifyTime: .milliseconds(200)))
        let device = SimulatedDevice(SimulatedDeviceConfig(slotSize: 4 << 20, link: link), model: model)
        let session = OTASession(central: SimulatedCentral(devices: [device]), address: device.config.address,
                                 image: FirmwareImage(bytes: image),
                                 profile: ESPOTAProfile(window: window, writeCommands: commands, honoursDeviceWindow: honoursWindow))
        let result = try await session.run()
        guard device.model(as: ESPOTAPeripheral.self)?.activations == [image] else {
            throw BenchFailure("esp-ota run (window \(window)) did not boot the image")
        }
        return Double(image.count) / result.transferSeconds
    }

    /// Image bytes over the bytes the link carries for them: the protocol's share of capacity.
    static func packetEfficiency(mtu: Int) -> Double {
        let data = Double(ESPOTAEngine.packetData(mtu: mtu))
        return data / (data + Double(ESPSectorPacket.headerSize))
    }

    static func grid(imageSize: Int) async throws -> [(key: String, value: Any)] {
        var rng = SeededGenerator(seed: 2026)
        let image = ESPAppImage.build(body: (0..<imageSize).map { _ in UInt8.random(in: 0...255, using: &rng) })
        print("Espressif BLE OTA link efficiency: goodput / model capacity, \(image.count / 1024) KiB app image, virtual time from START to the restart, 12 ms flash per sector, 200 ms from the image check to the restart (the examples' delay)")
        let windowed = try await windowGrid(image: image)
        print("otaflash: the next sector before the ACK (2 un-ACKed); reference: one sector, then its ACK; bound: header share of each write command")
        print("writes: commands (otaflash's default: both hosts take them on RECV_FW) or requests (as RECV_FW flags it)")
        print("host       MTU  PHY interval  writes    capacity kB/s  bound   otaflash  reference  otaflash÷reference")
        var rows: [[String: Any]] = []
        var minVsRef = Double.infinity
        for host in [ESPOTAHost.nimble, .bluedroid] {
            for mtu in [23, 185, 517] {
                for phy in LinkModel.PHY.allCases {
                    for ci in [7500, 30000] {
                        for commands in [true, false] {
                            let link = LinkModel(mtu: mtu, phy: phy, connectionInterval: .microseconds(Int64(ci)))
                            let cap = link.capacityBytesPerSecond
                            let component: ESPOTAComponent = host == .nimble ? .nimble : .bluedroid
                            let ours = try await goodput(link, image: image, component: component, window: ESPOTAEngine.defaultWindow, commands: commands) / cap
                            let reference = try await goodput(link, image: image, component: component, window: 1, commands: commands) / cap
                            let bound = packetEfficiency(mtu: mtu)
                            if max(ours, reference) > bound * (1 + 1e-9) {
                                throw BenchFailure(String(format: "a strategy beat the esp-ota bound at MTU %d: %.4f > %.4f", mtu, max(ours, reference), bound))
                            }
                            minVsRef = min(minVsRef, ours / reference)
                            let writes = commands ? "commands" : "requests"
                            rows.append(["host": host.rawValue, "mtu": mtu, "phy": phy.rawValue, "interval_ms": Double(ci) / 1000, "writes": writes,
                                         "capacity": cap, "bound": bound, "otaflash": ours, "reference": reference])
                            print(String(format: "%-9@  %3d  %@  %4.1f ms  %-8@  %10.1f      %.3f   %.3f     %.3f      %.2f", host.rawValue, mtu, phy.rawValue,
                                         Double(ci) / 1000, writes, cap / 1000, bound, ours, reference, ours / reference))
                        }
                    }
                }
            }
        }
        print(String(format: "otaflash ÷ reference over the table: min %.2f", minVsRef))
        print()
        return windowed + [("esp_ota_grid", rows), ("esp_ota_vs_reference_min", minVsRef)]
    }

    /// `ble_ota_raw` 0.2.0 with a ring buffer of 1, 2, 8 and 64 sectors, which it announces as its
    /// window: otaflash keeps that many sectors un-ACKed; the reference central one.
    static func windowGrid(image: [UInt8]) async throws -> [(key: String, value: Any)] {
        print("ble_ota_raw 0.2.0, its window (START ACK byte 6) = ring buffer / 4 KiB; otaflash sends up to the window un-ACKed, the reference one sector then its ACK; write commands")
        print("window  MTU  PHY interval  capacity kB/s  bound   otaflash  reference  otaflash÷reference")
        var rows: [[String: Any]] = []
        for window in [1, 2, 8, 64] {
            for mtu in [23, 185, 517] {
                for phy in LinkModel.PHY.allCases {
                    for ci in [7500, 30000] {
                        let link = LinkModel(mtu: mtu, phy: phy, connectionInterval: .microseconds(Int64(ci)))
                        let cap = link.capacityBytesPerSecond
                        let ours = try await goodput(link, image: image, component: .raw, ring: window, window: ESPOTAEngine.defaultWindow, commands: true) / cap
                        let reference = try await goodput(link, image: image, component: .raw, ring: window, window: 1, commands: true, honoursWindow: false) / cap
                        let bound = packetEfficiency(mtu: mtu)
                        if max(ours, reference) > bound * (1 + 1e-9) {
                            throw BenchFailure(String(format: "a strategy beat the esp-ota bound at MTU %d: %.4f > %.4f", mtu, max(ours, reference), bound))
                        }
                        rows.append(["window": window, "mtu": mtu, "phy": phy.rawValue, "interval_ms": Double(ci) / 1000, "capacity": cap,
                                     "bound": bound, "otaflash": ours, "reference": reference])
                        print(String(format: "%6d  %3d  %@  %4.1f ms  %10.1f      %.3f   %.3f     %.3f      %.2f", window, mtu, phy.rawValue,
                                     Double(ci) / 1000, cap / 1000, bound, ours, reference, ours / reference))
                    }
                }
            }
        }
        print()
        return [("esp_ota_raw_window_grid", rows)]
    }
}
