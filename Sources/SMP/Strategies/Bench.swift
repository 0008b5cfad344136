import Foundation
import GATT
import OTA
import OTAWire
import Simulator

/// How the bench measures SMP: goodput over links and server buffers, otaflash's engine beside
/// smpclient's strategy and a windowed one without reassembly, against the protocol's bound
/// (docs/PERFORMANCE.md, "MCUmgr SMP").
public struct SMPBench: BenchStrategy {
    public init() {}

    public var sections: [BenchSection] {
        [BenchSection(flag: "--smp") { image in try await Self.grid(imageSize: image.size) },
         BenchSection(flag: "--smp-files") { _ in try await Self.fileRates() }]
    }

    /// One SMP upload strategy: how many requests it keeps in flight and how large its frames are.
    struct UploadStrategy {
        var key: String
        var title: String
        /// Requests in flight at most (the engine also keeps to the device's buffer count).
        var window: Int
        /// Frames of at most one ATT write (no reassembly on the server needed).
        var oneWritePerFrame: Bool
        /// Frames of the whole buffer, as smpclient sends them; neither: the engine picks (its probe).
        var wholeBuffer = false

        /// The frame size the strategy fixes; nil: otaflash's own choice.
        func frame(buffer: Int, mtu: Int) -> Int? {
            oneWritePerFrame ? ATTWriteLimit.value(mtu: mtu) : wholeBuffer ? buffer : nil
        }
    }

    static let uploadStrategies = [
        UploadStrategy(key: "otaflash", title: "otaflash", window: SMPEngine.defaultMaxWindow, oneWritePerFrame: false),
        UploadStrategy(key: "smpclient", title: "smpclient", window: 1, oneWritePerFrame: false, wholeBuffer: true),
        UploadStrategy(key: "window3", title: "3/no-reasm", window: 3, oneWritePerFrame: true),
    ]

    /// Goodput of one strategy through the real session, profile and engine against the Zephyr SMP
    /// server model: the file's bytes over the time from the first upload request to the answer to
    /// the last (`OTAResult.transferSeconds`). Nil when the strategy cannot upload at all on this
    /// link (no request fits one write at MTU 23).
    static func goodput(_ link: LinkModel, file: [UInt8], mcuboot: MCUbootImage, buffer: (size: Int, count: Int),
                    _ strategy: UploadStrategy) async throws -> Double? {
        let model = SMPPeripheral(bufferSize: buffer.size, bufferCount: buffer.count, slotSize: 4 << 20,
                                  firmwareVersion: FirmwareVersion(major: 1, minor: 0, patch: 0))
        let d = SimulatedDevice(SimulatedDeviceConfig(slotSize: 4 << 20, link: link), model: model)
        let central = SimulatedCentral(devices: [d])
        let settings = SMPUploadSettings(fileSHA256: mcuboot.sha256, imageHash: mcuboot.imageHash, reset: false, maxWindow: strategy.window,
                                         maxFrame: strategy.frame(buffer: buffer.size, mtu: link.mtu))
        let session = OTASession(central: central, address: d.config.address, image: FirmwareImage(bytes: file),
                                 profile: SMPProfile(settings: settings))
        let result: OTAResult
        do {
            result = try await session.run()
        } catch {
            // No request fits one write: the strategy cannot run on this link.
            if error.code == .incompatibleDevice && strategy.oneWritePerFrame { return nil }
            throw error
        }
        guard let server = d.model(as: SMPPeripheral.self)?.server, server.secondary?.bytes == file else {
            throw BenchFailure("SMP run (\(strategy.key)) did not leave the image in slot 1")
        }
        guard result.stats.bytesResent == 0 else { throw BenchFailure("SMP run (\(strategy.key)) sent \(result.stats.bytesResent) bytes again on a clean link") }
        return Double(file.count) / result.transferSeconds
    }

    /// The least time any central needs on `link` to upload `size` bytes to a server with `buffer`,
    /// computed from the link model's formulas (no simulation), from the arrival of the first
    /// request's answer (which says where the upload stands: nothing can follow the first request
    /// before it) to the arrival of the last answer (docs/PERFORMANCE.md, "MCUmgr SMP"). The rules: a
    /// request is one SMP frame of at most `buffer.size` bytes (header and CBOR; the first also
    /// carries `len` and `sha`), sent as ATT writes of at most MTU − 3 bytes, each an L2CAP PDU in LL
    /// packets; the server answers each frame (its header and `{"off": n}`) as soon as it holds it,
    /// and holds at most `buffer.count` frames: frame k + count may not start before the answer to
    /// frame k has reached the central. An answer rides in the peripheral's slot of a central packet
    /// while the central has data queued (its extra air time), and takes a pair of its own otherwise
    /// (the last one, or one the central waits for). Every frame size a central could choose is tried
    /// (`buffer.size`, and every size whose last write fills its last LL packet or its write); the
    /// bound is the fastest.
    static func boundSeconds(_ link: LinkModel, size: Int, buffer: (size: Int, count: Int)) -> Double {
        let maxWrite = ATTWriteLimit.value(mtu: link.mtu)
        var candidates: Set<Int> = [buffer.size]
        var writes = 1
        while (writes - 1) * maxWrite < buffer.size {
            // Frames of whole writes, and frames whose last write ends on a whole LL packet.
            let full = writes * maxWrite
            if full <= buffer.size { candidates.insert(full) }
            var lastValue = link.maxLLPayload - 7
            while lastValue <= maxWrite {
                let frame = (writes - 1) * maxWrite + lastValue
                if frame <= buffer.size { candidates.insert(frame) }
                lastValue += link.maxLLPayload
            }
            writes += 1
        }
        let sha = [UInt8](repeating: 0, count: 32)
        return candidates.compactMap { frameLimit -> Double? in
            let first = SMPImageUpload.first(image: 0, length: UInt64(size), sha: sha, data: [])
            guard first.maxDataSize(frameLimit: frameLimit) > 0, SMPImageUpload(offset: UInt64(size), data: []).maxDataSize(frameLimit: frameLimit) > 0 else { return nil }
            return boundSeconds(link, size: size, frameLimit: frameLimit, bufferCount: buffer.count)
        }.min() ?? .infinity
    }

    /// The bound for one frame size.
    static func boundSeconds(_ link: LinkModel, size: Int, frameLimit: Int, bufferCount: Int) -> Double {
        let ci = link.connectionInterval.seconds * 1e6
        let maxWrite = ATTWriteLimit.value(mtu: link.mtu)
        var eventStart = 0.0
        var used = 0.0
        var now: Double { eventStart + used }
        func place(_ cost: Double) {
            if used > 0, used + cost > ci { eventStart += ci; used = 0 }
            used += cost
        }
        /// The answer's air time: riding a central packet, or a pair of its own.
        func answerCost(offset: Int, riding: Bool) -> Double {
            let value = SMPHeader.size + SMPUploadStatus(offset: UInt64(offset)).body.encoded.count
            return link.fragments(attBytes: value + 3).reduce(0.0) {
                $0 + (riding ? link.airTime(payload: $1) - link.airTime(payload: 0) : link.pairTime(payload: $1))
            }
        }
        let sha = [UInt8](repeating: 0, count: 32)
        var offset = 0
        var start = 0.0
        /// When each frame's answer reaches the central, and each frame's end offset, in order.
        var answers: [Double] = []
        var pendingAnswer: Int?
        while offset < size {
            let k = answers.count
            if k >= bufferCount, answers[k - bufferCount] > now {
                // Every buffer is held: the central waits for the oldest answer, which then takes
                // a pair of its own.
                if let end = pendingAnswer {
                    place(answerCost(offset: end, riding: false))
                    answers[answers.count - 1] = now
                    pendingAnswer = nil
                }
            }
            var request = offset == 0
                ? SMPImageUpload.first(image: 0, length: UInt64(size), sha: sha, data: [])
                : SMPImageUpload(offset: UInt64(offset), data: [])
            let count = min(request.maxDataSize(frameLimit: frameLimit), size - offset)
            request.data = [UInt8](repeating: 0, count: count)
            let frameSize = (try? SMPRequest.imageUpload(request).frame(sequence: 0).encoded.count) ?? frameLimit
            var left = frameSize
            var firstPacket = true
            while left > 0 {
                let value = min(maxWrite, left)
                left -= value
                for f in link.fragments(attBytes: value + 3) {
                    if firstPacket, let end = pendingAnswer {
                        // The previous frame's answer rides in the slot before this packet.
                        place(answerCost(offset: end, riding: true))
                        answers[answers.count - 1] = now
                        pendingAnswer = nil
                    }
                    firstPacket = false
                    place(link.pairTime(payload: f))
                }
            }
            offset += count
            answers.append(.infinity)
            pendingAnswer = offset
            if k == 0 {
                // The first answer says where the server stands: it comes alone, and the clock
                // starts there (as `OTAResult.transferSeconds` does).
                place(answerCost(offset: offset, riding: false))
                answers[0] = now
                pendingAnswer = nil
                start = now
            }
        }
        if let end = pendingAnswer { place(answerCost(offset: end, riding: false)) }
        return (now - start) / 1e6
    }

    /// The table across MTU, PHY, interval and buffers; throws when a strategy beats the bound
    /// (the bound would be wrong).
    static func grid(imageSize: Int) async throws -> [(key: String, value: Any)] {
        var rng = SeededGenerator(seed: 2025)
        let body = (0..<imageSize).map { _ in UInt8.random(in: 0...255, using: &rng) }
        let file = SMPSlotImage.build(major: 1, minor: 2, revision: 3, body: body)
        let mcuboot = try MCUbootImage(bytes: file, source: "bench image")
        let buffers: [(size: Int, count: Int)] = [(384, 4), (2475, 4)]
        print("MCUmgr SMP link efficiency: goodput / model capacity, \(file.count / 1024) KiB MCUboot image, virtual time")
        print("otaflash: window = buf_count, frame size probed on the link (whole writes, the buffer, LL-aligned); smpclient: one buf_size request in flight; 3/no-reasm: 3 in flight, each one ATT write")
        print("buffers   MTU  PHY interval  capacity kB/s  bound   otaflash  smpclient  3/no-reasm  otaflash÷bound  otaflash÷best ref")
        var rows: [[String: Any]] = []
        var minVsBound = Double.infinity
        var minVsRef = Double.infinity
        for buffer in buffers {
            for mtu in [23, 185, 247, 517] {
                for phy in LinkModel.PHY.allCases {
                    for ci in [7500, 15000, 30000] {
                        let link = LinkModel(mtu: mtu, phy: phy, connectionInterval: .microseconds(Int64(ci)))
                        let cap = link.capacityBytesPerSecond
                        let bound = Double(file.count) / boundSeconds(link, size: file.count, buffer: buffer) / cap
                        var eff: [String: Double] = [:]
                        for s in uploadStrategies {
                            if let g = try await goodput(link, file: file, mcuboot: mcuboot, buffer: buffer, s) { eff[s.key] = g / cap }
                        }
                        if let beat = eff.first(where: { $0.value > bound * (1 + 1e-9) }) {
                            throw BenchFailure(String(format: "%@ beat the SMP bound at %d×%d MTU %d %@ %.1f ms (%.4f > %.4f): the bound is wrong",
                                                    beat.key, buffer.count, buffer.size, mtu, phy.rawValue, Double(ci) / 1000, beat.value, bound))
                        }
                        let ours = eff["otaflash"] ?? 0
                        let best = max(eff["smpclient"] ?? 0, eff["window3"] ?? 0)
                        let vsBound = ours / bound
                        let vsRef = ours / best
                        minVsBound = min(minVsBound, vsBound)
                        minVsRef = min(minVsRef, vsRef)
                        var row: [String: Any] = ["buf_size": buffer.size, "buf_count": buffer.count, "mtu": mtu, "phy": phy.rawValue,
                                                  "interval_ms": Double(ci) / 1000, "capacity": cap, "bound": bound,
                                                  "otaflash_vs_bound": vsBound, "otaflash_vs_best_reference": vsRef]
                        for s in uploadStrategies { row[s.key] = eff[s.key] ?? NSNull() }
                        rows.append(row)
                        func cell(_ key: String) -> String { eff[key].map { String(format: "%.3f", $0) } ?? "  n/a" }
                        print(String(format: "%d×%-5d  %3d  %@  %4.1f ms  %10.1f      %.3f   %@     %@      %@       %.3f           %.2f",
                                     buffer.count, buffer.size, mtu, phy.rawValue, Double(ci) / 1000, cap / 1000, bound,
                                     cell("otaflash"), cell("smpclient"), cell("window3"), vsBound, vsRef))
                    }
                }
            }
        }
        print(String(format: "otaflash ÷ bound over the table: min %.3f; otaflash ÷ best reference: min %.2f", minVsBound, minVsRef))
        print()
        return [("smp_grid", rows), ("smp_vs_bound_min", minVsBound), ("smp_vs_best_reference_min", minVsRef)]
    }
}
