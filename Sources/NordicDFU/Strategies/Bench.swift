import Foundation
import GATT
import OTA
import Simulator

/// How the bench measures Secure DFU: goodput over the grid of links, otaflash's engine beside
/// the strategies of nrfutil and Nordic's mobile libraries, against the protocol's bound
/// (docs/PERFORMANCE.md, "Nordic Secure DFU").
public struct NordicDFUBench: BenchStrategy {
    public init() {}

    public var sections: [BenchSection] {
        [BenchSection(flag: "--nordic") { image in try await Self.grid(image) }]
    }

    /// Goodput of one Secure DFU strategy through the real session, profile and engine against the
    /// bootloader model on `link`: firmware bytes over the time from SELECT data's answer to the
    /// confirmation of the last byte (`OTAResult.transferSeconds`; the last EXECUTE, where the
    /// bootloader checks the image's SHA-256, is left out, as VERIFY is for the native protocol).
    static func goodput(_ image: FirmwareImage, _ link: LinkModel, _ config: NordicDFUConfig) async throws -> Double {
        var settings = NordicDFUBootloader.Config()
        // The synthetic package is unsigned; the model still checks its SHA-256 at the last EXECUTE.
        settings.requireSignature = false
        settings.bankSize = max(settings.bankSize, image.size)
        let d = SimulatedDevice(SimulatedDeviceConfig(link: link), model: NordicDFUPeripheral(bootloader: NordicDFUBootloader(config: settings)))
        let central = SimulatedCentral(devices: [d])
        // The image as an application package would carry it (`nrfutil pkg generate --application`).
        let initPacket = DFUInitPacket(command: .application(firmware: image.bytes, version: 1)).bytes
        let profile = NordicDFUProfile(initPacket: initPacket, dfuConfig: config)
        let session = OTASession(central: central, address: d.config.address, image: image, profile: profile)
        let result = try await session.run()
        guard d.model(as: NordicDFUPeripheral.self)?.bootloader.activations.last?.image == image.bytes else {
            throw BenchFailure("Secure DFU run did not activate the image")
        }
        guard result.stats.bytesResent == 0 else { throw BenchFailure("Secure DFU run sent \(result.stats.bytesResent) bytes again on a clean link") }
        return Double(image.size) / result.transferSeconds
    }

    /// The least time any central keeping Secure DFU's rules needs on `link`, from SELECT data's
    /// answer to the confirmation of the last byte, computed from the link model's formulas (no
    /// simulation). The rules (docs/PERFORMANCE.md, "Nordic Secure DFU"): an object's packets follow
    /// its CREATE (they may go at once, in order); EXECUTE follows the confirmation of the object's
    /// CRC, at the cheapest the receipt of its last packet; the next CREATE follows EXECUTE's answer
    /// (one ATT request at a time, and a CREATE before EXECUTE discards the object). An answer closes
    /// its connection event when nothing else may be sent, so each EXECUTE has an event of its own.
    static func boundSeconds(_ link: LinkModel, imageSize: Int, objectSize: Int) -> Double {
        let ci = link.connectionInterval.seconds * 1e6
        var eventStart = 0.0
        var used = 0.0
        /// A central PDU of `value` bytes (a write's value; ATT adds 3): each LL fragment is a pair.
        func send(value: Int) {
            for f in link.fragments(attBytes: value + 3) {
                let cost = link.pairTime(payload: f)
                if used + cost > ci { eventStart += ci; used = 0 }
                used += cost
            }
        }
        /// A peripheral PDU of `att` bytes: its extra air time in a central packet's slot while the
        /// central has data queued, a whole pair otherwise.
        func answer(att: Int, riding: Bool) {
            let cost = link.fragments(attBytes: att).reduce(0.0) {
                $0 + (riding ? link.airTime(payload: $1) - link.airTime(payload: 0) : link.pairTime(payload: $1))
            }
            if used > 0, used + cost > ci { eventStart += ci; used = 0 }
            used += cost
        }
        func nextEvent() { eventStart += ci; used = 0 }
        // SELECT data (2-byte value) opens an event; its write response (1 byte) and notification
        // (15-byte value) answer it; the transfer's clock starts there and the event closes.
        send(value: 2)
        answer(att: 1, riding: false)
        answer(att: 15 + 3, riding: false)
        let start = used
        nextEvent()
        let chunk = ATTWriteLimit.value(mtu: link.mtu)
        var offset = 0
        while true {
            let size = min(objectSize, imageSize - offset)
            send(value: 6)  // CREATE, its packets queued right behind it
            answer(att: 1, riding: true)
            answer(att: 3 + 3, riding: true)
            var left = size
            while left > 0 {
                send(value: min(chunk, left))
                left -= min(chunk, left)
            }
            answer(att: 11 + 3, riding: false)  // the receipt of the last packet: offset and CRC
            offset += size
            if offset == imageSize { return (eventStart + used - start) / 1e6 }
            nextEvent()
            send(value: 1)  // EXECUTE, alone: nothing may follow it before its answer
            answer(att: 1, riding: false)
            answer(att: 3 + 3, riding: false)
            nextEvent()
        }
    }

    static func grid(_ image: FirmwareImage) async throws -> [(key: String, value: Any)] {
        print("Nordic Secure DFU link efficiency: goodput / model capacity, \(image.size / 1024) KiB image, 4096-byte objects, virtual time")
        print("MTU  PHY interval  capacity kB/s  otaflash  nrfutil  mobile/12  bound   otaflash÷best ref  otaflash÷bound  wait-CREATE")
        var report: [(key: String, value: Any)] = []
        var rows: [[String: Any]] = []
        var minVsBound = Double.infinity
        var maxVsBound = 0.0
        var defaultRow: [String: Any] = [:]
        for mtu in [23, 185, 247] {
            for phy in LinkModel.PHY.allCases {
                for ci in [7500, 15000, 30000, 50000] {
                    let link = LinkModel(mtu: mtu, phy: phy, connectionInterval: .microseconds(Int64(ci)))
                    let cap = link.capacityBytesPerSecond
                    let ours = try await goodput(image, link, NordicDFUConfig()) / cap
                    let nrfutil = try await goodput(image, link, .nrfutilStrategy) / cap
                    let mobile = try await goodput(image, link, .mobileLibraryStrategy) / cap
                    let waitCreate = try await goodput(image, link, NordicDFUConfig(streamBeforeCreateResponse: false)) / cap
                    let eff = ["otaflash": ours, "nrfutil": nrfutil, "mobile12": mobile, "otaflash_wait_create": waitCreate]
                    let bound = Double(image.size) / boundSeconds(link, imageSize: image.size, objectSize: 4096) / cap
                    if let beat = eff.first(where: { $0.value > bound * (1 + 1e-9) }) {
                        throw BenchFailure(String(format: "%@ beat the protocol's bound at MTU %d %@ %.1f ms (%.4f > %.4f): the bound is wrong",
                                                  beat.key, mtu, phy.rawValue, Double(ci) / 1000, beat.value, bound))
                    }
                    let vsRef = ours / max(nrfutil, mobile)
                    let vsBound = ours / bound
                    minVsBound = min(minVsBound, vsBound)
                    maxVsBound = max(maxVsBound, vsBound)
                    var row: [String: Any] = ["mtu": mtu, "phy": phy.rawValue, "interval_ms": Double(ci) / 1000, "capacity": cap,
                                              "bound": bound, "otaflash_vs_best_reference": vsRef, "otaflash_vs_bound": vsBound]
                    for (k, v) in eff { row[k] = v }
                    rows.append(row)
                    if link == LinkModel.default { defaultRow = row }
                    print(String(format: "%3d  %@  %5.1f ms  %10.1f      %.3f     %.3f    %.3f    %.3f   %.2f               %.3f           %.3f",
                                 mtu, phy.rawValue, Double(ci) / 1000, cap / 1000, ours, nrfutil, mobile, bound, vsRef, vsBound, waitCreate))
                }
            }
        }
        if let vsRef = defaultRow["otaflash_vs_best_reference"] as? Double, let vsBound = defaultRow["otaflash_vs_bound"] as? Double {
            print(String(format: "default link (MTU 247, 2M, 15 ms): otaflash %.3f, nrfutil %.3f, mobile/12 %.3f, bound %.3f; otaflash ÷ best reference %.2f, otaflash ÷ bound %.3f; otaflash ÷ bound over the grid %.3f…%.3f",
                         defaultRow["otaflash"] as? Double ?? 0, defaultRow["nrfutil"] as? Double ?? 0, defaultRow["mobile12"] as? Double ?? 0,
                         defaultRow["bound"] as? Double ?? 0, vsRef, vsBound, minVsBound, maxVsBound))
            report.append(("nordic_vs_best_reference_default", vsRef))
            report.append(("nordic_vs_bound_default", vsBound))
        }
        report.append(("nordic_grid", rows))
        report.append(("nordic_default", defaultRow))
        report.append(("nordic_vs_bound_grid_min", minVsBound))
        print()
        return report
    }
}
