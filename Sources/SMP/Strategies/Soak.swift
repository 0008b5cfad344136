import Crypto
import GATT
import OTA
import OTADevice
import Simulator

/// How the soak runs SMP: `SMPProfile` through the session and the simulator against the Zephyr
/// server model (`SMPPeripheral`, its answers in the drawn encoding), with an MCUboot image built
/// in memory (`SMPSlotImage.build`: a header, the drawn bytes, the SHA256 TLV).
///
/// Beyond the shared checks: every image the server marked for test or confirmed is, byte for
/// byte, the image sent (on a server that answers `match`: an mcumgr server does not, and reports
/// the slot's hash TLV, not a hash of its bytes, so a corrupted upload looks intact to any central;
/// MCUboot refuses it at boot), and so is every image MCUboot swapped in, whatever the server; a run that succeeded marked it
/// (more than once when a mark's answer was lost) as asked and swapped it in once; no resume
/// re-sent more than the window's worth past the server's offset (buf_count × one request's data).
public struct SMPSoak: SoakStrategy {
    public init() {}

    public var name: String { SMPProfile.name }

    /// The server's buffers a run draws: Zephyr's default (4 × 384) or large ones (4 × 2475).
    static let bufferConfigs: [(size: Int, count: Int)] = [(384, 4), (2475, 4)]

    /// The most data one upload request after the first carries in a frame of `bufferSize` bytes.
    static func requestData(bufferSize: Int) -> Int {
        SMPImageUpload(offset: 1, data: []).maxDataSize(frameLimit: bufferSize)
    }

    /// The encoding of the server's answers a run draws, each as likely (from its own generator, so
    /// the rest of a seed's scenario is what it was before the draw existed).
    static func encoding(seed: UInt64) -> SMPReplyEncoding {
        var rng = SeededGenerator(seed: seed ^ 0x5EC0_DE)
        let all = SMPReplyEncoding.allCases
        return all[Int(rng.next() % UInt64(all.count))]
    }

    /// MCUboot's mode a run draws, each as likely (from its own generator): nil for a server that
    /// does not report it (a swap mode, as before the draw existed), or one it reports; and whether
    /// the run confirms only after its check (`confirmAfterCheck`, one run in three where the mode
    /// has a test run and the run does not confirm at once).
    static let modes: [SMPBootloaderMode?] = [nil, .swapScratch, .overwriteOnly, .directXIP, .directXIPWithRevert]

    static func mode(seed: UInt64) -> (mode: SMPBootloaderMode?, afterCheck: Bool) {
        var rng = SeededGenerator(seed: seed ^ 0xB007_10AD)
        let mode = modes[Int(rng.next() % UInt64(modes.count))]
        return (mode, rng.next() % 3 == 0 && !(mode?.keepsWithoutTest ?? false))
    }

    /// The violation of a run that confirmed the image before its check (`--confirm after-check`).
    static let confirmedBeforeCheck = "confirmed the image before it ran and passed its check"

    static func modeName(_ mode: SMPBootloaderMode?) -> String { mode.map { "\($0)" } ?? "not reported" }

    /// Whether a run updates a two-image device (an nRF5340: the application core's image and the
    /// network core's, `SMPMultiImageEngine`), one run in four (from its own generator), in the
    /// modes nRF Connect SDK builds that with (not direct-XIP).
    static func multiImage(seed: UInt64, mode: SMPBootloaderMode?) -> Bool {
        var rng = SeededGenerator(seed: seed ^ 0x5340_0001)
        return rng.next() % 4 == 0 && mode?.runsInPlace != true
    }

    /// The session's bound, with the first upload request's longer wait (a server erases its slot
    /// before answering it) in place of the reply timeout on each try.
    public func bound(_ settings: SoakSettings) -> Duration {
        settings.sessionBound + (SMPEngine.firstRequestTimeout - settings.config.replyTimeout) * (settings.config.commandRetries + 1)
    }

    /// buf_count requests; each run is checked against its own server's buffers, the largest is printed.
    public func resendLimit(_ settings: SoakSettings) -> (bytes: Int, name: String) {
        (Self.bufferConfigs.map { $0.count * Self.requestData(bufferSize: $0.size) }.max() ?? 0, "window of buf_count requests")
    }

    public func trial(_ scenario: SoakScenario, seed: UInt64, settings: SoakSettings) throws(OTAError) -> SoakTrial {
        var rng = SeededGenerator(seed: seed ^ 0xABCDEF)
        let body = (0..<scenario.size).map { _ in UInt8(truncatingIfNeeded: rng.next()) }
        let buffers = Self.bufferConfigs[Int(rng.next() % UInt64(Self.bufferConfigs.count))]
        let confirm = rng.next() % 4 == 0
        let bytes = SMPSlotImage.build(major: 2, minor: UInt8(rng.next() % 200), revision: UInt16(truncatingIfNeeded: rng.next()), body: body)
        let image: MCUbootImage
        do {
            image = try MCUbootImage(bytes: bytes, source: "soak image")
        } catch {
            throw OTAError(.image, "the soak built an MCUboot image otaflash refuses: \(error)")
        }
        let deviceConfig = SimulatedDeviceConfig(slotSize: 1 << 20, link: scenario.link)
        let encoding = Self.encoding(seed: seed)
        let (mode, drawnAfterCheck) = Self.mode(seed: seed)
        let afterCheck = drawnAfterCheck && !confirm
        var config = SMPServer.Config(bufferSize: buffers.size, bufferCount: buffers.count, slotSize: deviceConfig.slotSize, encoding: encoding)
        if let mode {
            config.mode = mode
            config.reportsBootloaderInfo = true
        }
        let multi = Self.multiImage(seed: seed, mode: mode)
        config.networkCore = multi
        var netRNG = SeededGenerator(seed: seed ^ 0x4E37)
        let network = multi ? SMPSlotImage.build(major: 3, minor: UInt8(netRNG.next() % 200), revision: 1,
                                                 body: (0..<max(1, scenario.size / 2)).map { _ in UInt8(truncatingIfNeeded: netRNG.next()) }) : []
        let model = SMPPeripheral(config: config, firmwareVersion: deviceConfig.firmwareVersion, faults: scenario.faults,
                                  resetDelay: deviceConfig.bootDelay)
        let device = SimulatedDevice(deviceConfig, model: model)
        let settings = SMPUploadSettings(fileSHA256: image.sha256, imageHash: image.imageHash, confirm: confirm, confirmAfterCheck: afterCheck)
        let sent = multi ? [bytes, network] : [bytes]
        let plans = [(UInt32(1), network), (UInt32(0), bytes)].map { number, image in
            SMPImagePlan(imageNumber: number, bytes: image, fileSHA256: Array(SHA256.hash(data: image)), imageHash: SMPSlotImage(image).hash,
                         version: SMPSlotImage(image).versionText)
        }
        let profile: any OTAProfile = multi ? SMPMultiImageProfile(images: plans, settings: settings) : SMPProfile(settings: settings)
        // Direct-XIP has no state write: nothing is marked; MCUboot boots the highest version.
        let marksNothing = mode == .directXIP
        // The window: every buffer holding a request of the most data one takes (the smallest
        // offset encodes shortest; the first request, with `len` and `sha`, takes less).
        let window = buffers.count * Self.requestData(bufferSize: buffers.size)
        return SoakTrial(device: device, image: FirmwareImage(bytes: multi ? network + bytes : bytes), profile: profile,
                         detail: "buffers \(buffers.count)×\(buffers.size), \(encoding) answers, MCUboot \(Self.modeName(mode))\(multi ? ", two images" : "")\(afterCheck ? ", confirm after check" : "")",
                         group: "\(encoding)/\(Self.modeName(mode))\(multi ? "/multi" : "")\(afterCheck ? "/check" : "")",
                         resendLimit: window, resendLimitName: "window") { result in
            var verdict = SoakVerdict()
            let peripheral = device.model(as: SMPPeripheral.self)
            let marks = peripheral?.server.marks ?? []
            let activations = peripheral?.activations ?? []
            if peripheral?.server.config.answersMatch != false, marks.contains(where: { !sent.contains($0.bytes) }) {
                verdict.violate("marked an image that differs from the one sent")
                verdict.mismatchedActivation = true
            }
            if activations.contains(where: { !sent.contains($0.image) }) {
                verdict.violate("MCUboot swapped in an image that differs from the one sent")
                verdict.mismatchedActivation = true
            }
            if afterCheck, marks.first?.confirm == true {
                verdict.violate(Self.confirmedBeforeCheck)
            }
            switch result {
            case .success:
                // A mark whose answer was lost is sent again: the same image, marked twice. After
                // its check the image is marked for test, then confirmed.
                let asked = afterCheck ? marks.first?.confirm == false && marks.last?.confirm == true && peripheral?.server.confirmed == true
                    : marksNothing ? marks.isEmpty : !marks.isEmpty && !marks.contains(where: { $0.confirm != confirm })
                if !asked || activations.count != sent.count {
                    verdict.violate("reported ok with \(marks.count) marks and \(activations.count) swaps")
                }
                if multi {
                    // Both cores run the images sent, and the network core's was marked first.
                    let server = peripheral?.server
                    if server?.primary.bytes != bytes || server?.network?.running.bytes != network {
                        verdict.violate("reported ok with a core not running the image sent")
                    }
                    if !marksNothing, marks.first?.bytes != network {
                        verdict.violate("marked the application core's image before the network core's")
                    }
                }
            case .failure:
                // A check that failed after the image booted for test leaves it to revert: the run
                // failed with the image swapped in, unconfirmed.
                if !activations.isEmpty, !(afterCheck && peripheral?.server.marks.last?.confirm == false) { verdict.activatedOnFailure = true }
            }
            return verdict
        }
    }

    public func summary(_ records: [SoakRecord]) -> [String] {
        let encodings = SMPReplyEncoding.allCases.map { encoding in
            let runs = records.filter { ($0.group ?? "").hasPrefix("\(encoding)/") }
            return "\(encoding) \(runs.count) (\(runs.filter { $0.outcome == .ok }.count) ok, \(runs.filter { $0.violation != nil }.count) violations)"
        }
        let okOnce = records.filter(\.passed).count
        let onFailure = records.filter(\.verdict.activatedOnFailure).count
        let mismatched = records.filter(\.verdict.mismatchedActivation).count
        let modes = Self.modes.map { mode in
            let runs = records.filter { ($0.group ?? "").split(separator: "/").dropFirst().first.map(String.init) == Self.modeName(mode) }
            return "\(Self.modeName(mode)) \(runs.count) (\(runs.filter { $0.outcome == .ok }.count) ok)"
        }
        let checked = records.filter { ($0.group ?? "").hasSuffix("/check") }
        let multi = records.filter { ($0.group ?? "").contains("/multi") }
        return [
            "server answers: " + encodings.joined(separator: ", "),
            "MCUboot modes: " + modes.joined(separator: ", "),
            "confirm after check: \(checked.count) runs (\(checked.filter { $0.outcome == .ok }.count) ok, confirmed after the check; \(checked.filter { $0.outcome == .failed(.checkFailed) }.count) checkFailed); confirmed before the image ran: \(records.filter { $0.violation == Self.confirmedBeforeCheck }.count)",
            "two images (nRF5340: network core marked first, one reset, both cores checked after it): \(multi.count) runs (\(multi.filter { $0.outcome == .ok }.count) ok, \(multi.filter { $0.violation != nil }.count) violations)",
            "marks and swaps (marks checked where the server answers match): \(okOnce) runs ok with the image sent marked as asked and swapped in once, byte-identical; failed runs in which MCUboot swapped the image sent in (after its hash matched and it was marked): \(onFailure); marks or swaps of other bytes: \(mismatched)",
        ]
    }
}
