import Foundation
import GATT
import OTA
import Simulator
import Synchronization

/// How the bench measures Silicon Labs' OTA: goodput over links, against the AppLoader and an
/// application OTA DFU device, with OTA Data as write requests (otaflash's default, and the
/// sequence of Silicon Labs' NCP host example: one request at a time, each answered once the
/// device wrote it to flash) and as write commands (`--silabs-write-commands`), against the
/// protocol's bound: the link's capacity for writes of whole 32-bit words (ATT MTU − 3 rounded
/// down to a multiple of 4), the device's flash never waited for.
public struct SilabsOTABench: BenchStrategy {
    public init() {}

    public var sections: [BenchSection] {
        [BenchSection(flag: "--silabs-ota") { image in try await Self.grid(imageSize: image.size) }]
    }

    /// Goodput of one run through the real session against the device model.
    static func goodput(_ link: LinkModel, image: [UInt8], kind: SilabsDeviceKind, commands: Bool) async throws -> Double {
        let slot = 4 << 20
        let model = SilabsOTAPeripheral(config: .init(kind: kind, slotSize: slot, startsInAppLoader: true, writePerKiB: .milliseconds(2)),
                                        firmwareVersion: 0x0100_0000)
        let device = SimulatedDevice(SimulatedDeviceConfig(slotSize: slot, link: link), model: model)
        let central = SimulatedCentral(devices: [device])
        let session = OTASession(central: central, address: device.config.address, image: FirmwareImage(bytes: image),
                                 profile: SilabsOTAProfile(imageVersion: 0x0200_0000, writeCommands: commands))
        // From the transfer's start to 0x03 reaching the device, after every byte of the GBL (write
        // commands still queued when 0x03 is written go on the air before it): the session's own
        // transfer time is its last connection's, and this protocol ends on the one after the close.
        let times = TransferTimes()
        let clock = central.clock
        _ = try await session.run { event in
            if case .transferStarted = event { times.value.withLock { if $0.start == nil { $0.start = clock.now } } }
        }
        guard let peripheral = device.model(as: SilabsOTAPeripheral.self), peripheral.activations == [image] else {
            throw BenchFailure("silabs-ota run (\(kind), \(commands ? "commands" : "requests")) did not boot the GBL")
        }
        let start = times.value.withLock { $0.start }
        let end = peripheral.endsReceived.last
        guard let start, let end, end > start else { throw BenchFailure("silabs-ota run (\(kind)) reported no transfer") }
        return Double(image.count) / (end - start).seconds
    }

    /// Image bytes over the ATT value bytes a full write could carry: the word alignment's share.
    static func bound(mtu: Int) -> Double {
        Double(SilabsOTAEngine.chunk(mtu: mtu)) / Double(ATTWriteLimit.value(mtu: mtu))
    }

    static func grid(imageSize: Int) async throws -> [(key: String, value: Any)] {
        var rng = SeededGenerator(seed: 2026)
        let image = SilabsSoakImage.gbl(version: 0x0200_0000, body: (0..<imageSize).map { _ in UInt8.random(in: 0...255, using: &rng) })
        print("Silicon Labs OTA link efficiency: goodput / model capacity, \(image.count / 1024) KiB GBL, virtual time from the transfer's start to 0x03, 2 ms flash per KiB")
        print("requests: write requests, one at a time (otaflash's default; Silicon Labs' host example's sequence); commands: --silabs-write-commands; bound: whole words of ATT MTU − 3")
        print("device     MTU  PHY interval  capacity kB/s  bound   requests  commands  commands÷requests")
        var rows: [[String: Any]] = []
        var minGain = Double.infinity
        for kind in SilabsDeviceKind.allCases {
            for mtu in [23, 185, 247] {
                for phy in LinkModel.PHY.allCases {
                    for ci in [7500, 30000] {
                        let link = LinkModel(mtu: mtu, phy: phy, connectionInterval: .microseconds(Int64(ci)))
                        let cap = link.capacityBytesPerSecond
                        let requests = try await goodput(link, image: image, kind: kind, commands: false) / cap
                        let commands = try await goodput(link, image: image, kind: kind, commands: true) / cap
                        let bound = bound(mtu: mtu)
                        if max(requests, commands) > bound * (1 + 1e-9) {
                            throw BenchFailure(String(format: "a strategy beat the silabs-ota bound at MTU %d: %.4f > %.4f", mtu, max(requests, commands), bound))
                        }
                        minGain = min(minGain, commands / requests)
                        rows.append(["device": kind.rawValue, "mtu": mtu, "phy": phy.rawValue, "interval_ms": Double(ci) / 1000,
                                     "capacity": cap, "bound": bound, "requests": requests, "commands": commands])
                        print(String(format: "%-9@  %3d  %@  %4.1f ms  %10.1f      %.3f   %.3f     %.3f     %.2f", kind.rawValue, mtu, phy.rawValue,
                                     Double(ci) / 1000, cap / 1000, bound, requests, commands, commands / requests))
                    }
                }
            }
        }
        print(String(format: "commands ÷ requests over the table: min %.2f", minGain))
        print()
        return [("silabs_ota_grid", rows), ("silabs_ota_commands_vs_requests_min", minGain)]
    }
}

/// When a bench run's transfer started, as its events say.
final class TransferTimes: Sendable {
    let value = Mutex<(start: Duration?, end: Duration?)>((nil, nil))
}
