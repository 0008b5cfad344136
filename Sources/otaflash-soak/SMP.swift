import GATT
import OTA
import OTADevice
import SMP
import Simulator

/// The most data one upload request after the first carries in a frame of `bufferSize` bytes.
func smpRequestData(bufferSize: Int) -> Int {
    SMPImageUpload(offset: 1, data: []).maxDataSize(frameLimit: bufferSize)
}

/// The SMP server's buffers a run draws: Zephyr's default (4 × 384) or large ones (4 × 2475).
let smpBufferConfigs: [(size: Int, count: Int)] = [(384, 4), (2475, 4)]

/// The encoding of the server's answers a run draws, each as likely (from its own generator, so
/// the rest of a seed's scenario is what it was before the draw existed).
func smpEncoding(seed: UInt64) -> SMPReplyEncoding {
    var rng = SeededGenerator(seed: seed ^ 0x5EC0_DE)
    let all = SMPReplyEncoding.allCases
    return all[Int(rng.next() % UInt64(all.count))]
}

/// One line for the summary: the runs of each encoding and how many of them passed.
func smpEncodingSummary(_ records: [RunRecord]) -> String {
    let lines = SMPReplyEncoding.allCases.map { encoding in
        let runs = records.filter { $0.smpEncoding == encoding }
        return "\(encoding) \(runs.count) (\(runs.filter { $0.outcome == "ok" }.count) ok, \(runs.filter { $0.violation != nil }.count) violations)"
    }
    return "server answers: " + lines.joined(separator: ", ")
}

/// One SMP run: `SMPProfile` through `OTASession` and the simulator against the Zephyr server
/// model (`SMPPeripheral`, its answers in the drawn encoding), with an MCUboot image built in memory (`SMPSlotImage.build`: a header,
/// the drawn bytes, the SHA256 TLV). Beyond the shared checks: every image the server marked for
/// test or confirmed is, byte for byte, the image sent, and so is every image MCUboot swapped in;
/// a run that succeeded marked it (more than once when a mark's answer was lost) as asked and
/// swapped it in once; no resume re-sent more than
/// the window's worth past the server's offset (buf_count × one request's data).
func runSMP(_ scenario: Scenario, seed scenarioSeed: UInt64, trace: Bool, verbose: Bool) async -> RunRecord {
    var rng = SeededGenerator(seed: scenarioSeed ^ 0xABCDEF)
    let body = (0..<scenario.size).map { _ in UInt8(truncatingIfNeeded: rng.next()) }
    let buffers = smpBufferConfigs[Int(rng.next() % UInt64(smpBufferConfigs.count))]
    let confirm = rng.next() % 4 == 0
    let bytes = SMPSlotImage.build(major: 2, minor: UInt8(rng.next() % 200), revision: UInt16(truncatingIfNeeded: rng.next()), body: body)
    let image: MCUbootImage
    do {
        image = try MCUbootImage(bytes: bytes, source: "soak image")
    } catch {
        var record = RunRecord(SessionRun(result: .failure(OTAError(.image, "\(error)")), reconnects: 0, virtualSeconds: 0, wallSeconds: 0,
                                          afterProgress: 0, hung: false), neverConfirms: false)
        record.violation = "the soak built an MCUboot image otaflash refuses: \(error)"
        return record
    }
    let deviceConfig = SimulatedDeviceConfig(slotSize: 1 << 20, link: scenario.link)
    let encoding = smpEncoding(seed: scenarioSeed)
    let model = SMPPeripheral(bufferSize: buffers.size, bufferCount: buffers.count, slotSize: deviceConfig.slotSize,
                              firmwareVersion: deviceConfig.firmwareVersion, encoding: encoding, faults: scenario.faults,
                              resetDelay: deviceConfig.bootDelay)
    let device = SimulatedDevice(deviceConfig, model: model)
    let clock = VirtualClock()
    let central = SimulatedCentral(devices: [device], clock: clock)
    let settings = SMPUploadSettings(fileSHA256: image.sha256, imageHash: image.imageHash, confirm: confirm)
    let session = OTASession(central: central, address: device.config.address, image: FirmwareImage(bytes: bytes), config: config,
                             profile: SMPProfile(settings: settings), timeouts: timeouts,
                             reconnect: ReconnectPolicy(window: reconnectWindow, seed: scenarioSeed))
    let run = await runSession(session, clock: clock, trace: trace)
    var record = RunRecord(run, neverConfirms: scenario.neverConfirms != nil)
    let peripheral = device.model(as: SMPPeripheral.self)
    let marks = peripheral?.server.marks ?? []
    let activations = peripheral?.activations ?? []
    if marks.contains(where: { $0.bytes != bytes }) {
        record.violation = "marked an image that differs from the one sent"
        record.mismatchedActivation = true
    }
    if activations.contains(where: { $0.image != bytes }) {
        record.violation = record.violation ?? "MCUboot swapped in an image that differs from the one sent"
        record.mismatchedActivation = true
    }
    switch run.result {
    case .success(let r):
        if trace { print("  stats: \(r.stats)") }
        // A mark whose answer was lost is sent again: the same image, marked twice.
        if marks.isEmpty || activations.count != 1 || marks.contains(where: { $0.confirm != confirm }) {
            record.violation = record.violation ?? "reported ok with \(marks.count) marks and \(activations.count) swaps"
        }
    case .failure(let e):
        if verbose { print("  \(e)") }
        if !activations.isEmpty { record.activatedOnFailure = true }
    }
    // The window: every buffer holding a request of the most data one takes (the smallest
    // offset encodes shortest; the first request, with `len` and `sha`, takes less).
    let requestData = smpRequestData(bufferSize: buffers.size)
    record.checkShared(bound: smpBound, resendLimit: buffers.count * requestData, limitName: "window")
    record.smpBuffers = "\(buffers.count)×\(buffers.size)"
    record.smpEncoding = encoding
    return record
}
