import GATT
import OTA
import OTADevice
import OTAWire
import Simulator

/// Silicon Labs' OTA under seeded faults: each run draws the device (application OTA DFU, or the
/// AppLoader, as an in-place device is once it rebooted into it), whether it serves its version
/// characteristics, whether OTA Data takes write commands and otaflash sends them, and on top of
/// the shared faults (drops, corruption and link losses on write commands, lost responses, link
/// losses) flash write failures at chosen writes and, now and then, a bootloader that refuses the GBL.
///
/// Beyond the shared checks, every run ends with the GBL booted byte for byte, or a diagnosis that
/// matches the device: no device booted other bytes than the GBL sent, or booted anything its
/// check refused; a run that succeeded booted it exactly once; a run that failed booted nothing,
/// unless it ended "not confirmed"; a run that said the device refused the GBL left a device that
/// refused it.
public struct SilabsOTASoak: SoakStrategy {
    public init() {}

    public var name: String { SilabsOTAProfile.name }

    /// A start-over sends the whole GBL again, which the tally does not count as a resume.
    public func resendLimit(_ settings: SoakSettings) -> (bytes: Int, name: String) {
        (0, "no resume: a lost link sends the whole GBL again")
    }

    /// The device and central a seed draws.
    struct Draw: Sendable, Hashable {
        var kind: SilabsDeviceKind
        var versions: Bool
        var dataCommands: Bool
        var sendCommands: Bool
    }

    static func draw(seed: UInt64) -> Draw {
        var rng = SeededGenerator(seed: seed ^ 0x51AB_5)
        let kind = SilabsDeviceKind.allCases[Int(rng.next() % 2)]
        let versions = rng.next() % 5 != 0
        let dataCommands = rng.next() % 4 != 0
        return Draw(kind: kind, versions: versions, dataCommands: dataCommands, sendCommands: dataCommands && rng.next() % 3 == 0)
    }

    public func trial(_ scenario: SoakScenario, seed: UInt64, settings: SoakSettings) throws(OTAError) -> SoakTrial {
        var rng = SeededGenerator(seed: seed ^ 0x0E1F)
        let body = (0..<scenario.size).map { _ in UInt8(truncatingIfNeeded: rng.next()) }
        let version = 0x0200_0000 | UInt32(truncatingIfNeeded: rng.next() % 0xFFFF)
        let bytes = SilabsSoakImage.gbl(version: version, body: body)
        guard SilabsBootloaderCheck.check(bytes, requiresSignature: false).isValid else {
            throw OTAError(.image, "the soak built a GBL the device model refuses")
        }
        var draw = Self.draw(seed: seed)
        // A device without version characteristics leaves a good update unconfirmed: a scenario
        // without faults (`SoakScenario.withoutFaults`) is one that confirms.
        if scenario.faults == .none { draw.versions = true }
        let writes = max(1, bytes.count / 20)
        var faults = SilabsDeviceFaults()
        if scenario.faults != .none {
            faults.dropWriteAt = Set((0..<Int(rng.next() % 3)).map { _ in Int(rng.next() % UInt64(writes)) })
            faults.storageErrorAt = rng.next() % 6 == 0 ? [Int(rng.next() % UInt64(writes))] : []
            faults.loseResponseAt = rng.next() % 4 == 0 ? [Int(rng.next() % UInt64(writes))] : []
            faults.refuseImage = rng.next() % 10 == 0
        }
        let slot = 0x100000
        let deviceConfig = SimulatedDeviceConfig(slotSize: slot, link: scenario.link)
        let model = SilabsOTAPeripheral(config: .init(kind: draw.kind, slotSize: slot, versionCharacteristics: draw.versions,
                                                      dataWriteCommands: draw.dataCommands, startsInAppLoader: true,
                                                      pageErase: .milliseconds(2), faults: faults),
                                        firmwareVersion: 0x0100_0000, faults: scenario.faults)
        let device = SimulatedDevice(deviceConfig, model: model)
        let detail = "\(draw.kind), versions \(draw.versions), data \(draw.dataCommands ? "commands" : "requests only"), sent as \(draw.sendCommands ? "commands" : "requests")"
            + ", dropped writes \(faults.dropWriteAt.sorted()), storage errors \(faults.storageErrorAt.sorted()), lost responses \(faults.loseResponseAt.sorted())"
            + (faults.refuseImage ? ", bootloader refuses" : "")
        let profile = SilabsOTAProfile(imageVersion: version, writeCommands: draw.sendCommands, settle: .milliseconds(500))
        return SoakTrial(device: device, image: FirmwareImage(bytes: bytes), profile: profile, detail: detail,
                         group: draw.kind.rawValue, resendLimit: 0, resendLimitName: "no resume") { result in
            Self.verdict(device.model(as: SilabsOTAPeripheral.self), sent: bytes, result: result)
        }
    }

    static func verdict(_ peripheral: SilabsOTAPeripheral?, sent: [UInt8], result: Result<OTAResult, OTAError>) -> SoakVerdict {
        var verdict = SoakVerdict()
        let activations = peripheral?.activations ?? []
        if activations.contains(where: { !SilabsBootloaderCheck.check($0, requiresSignature: false).isValid }) {
            verdict.violate("booted an image its bootloader's check refuses")
        }
        if activations.contains(where: { $0 != sent }) {
            verdict.violate("booted an image that differs from the GBL sent")
            verdict.mismatchedActivation = true
        }
        switch result {
        case .success:
            if activations.count != 1 { verdict.violate("reported ok with \(activations.count) boots of the GBL") }
        case .failure(let error):
            if error.code == .notConfirmed {
                if !activations.isEmpty { verdict.unconfirmedActivation = true }
            } else if !activations.isEmpty {
                verdict.activatedOnFailure = true
                verdict.violate("failed (\(error.message)) yet booted the GBL")
            }
            if error.code == .verifyFailed, let peripheral, peripheral.refusals.isEmpty {
                verdict.violate("said the device refused the GBL, but it refused nothing (\(error.message))")
            }
        }
        return verdict
    }

    public func summary(_ records: [SoakRecord]) -> [String] {
        let kinds = SilabsDeviceKind.allCases.map { kind in
            let runs = records.filter { $0.group == kind.rawValue }
            return "\(kind) \(runs.count) (\(runs.filter { $0.outcome == .ok }.count) ok, \(runs.filter { $0.violation != nil }.count) violations)"
        }
        let unconfirmed = records.filter(\.verdict.unconfirmedActivation).count
        return [
            "devices: " + kinds.joined(separator: ", "),
            "boots: \(records.filter(\.passed).count) runs ok with the GBL booted once; runs \"not confirmed\" with it booted: \(unconfirmed); failed runs with a GBL booted, GBLs booted that differ from the one sent or fail the bootloader's check, and refusals said of a device that refused nothing: counted as violations",
        ]
    }
}
