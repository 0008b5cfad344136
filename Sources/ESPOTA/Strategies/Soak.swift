import GATT
import OTA
import OTADevice
import Simulator

/// How the soak runs Espressif's BLE OTA: `ESPOTAProfile` through the session and the simulator
/// against the example device (`ESPOTAPeripheral`: `ble_ota` on NimBLE or Bluedroid, or
/// `ble_ota_raw` with a ring buffer of 4 to 64 KiB, drawn from the seed), with an ESP-IDF app
/// image built in memory (`ESPAppImage.build`). On top of the scenario's faults (write commands
/// dropped at random, lost notifications, corrupted packets, link losses, reboots), each run
/// drops up to three write commands at chosen packets and loses up to two sector ACKs.
///
/// Beyond the shared checks, every run ends with the image booted byte for byte, or a diagnosis
/// that matches the device: no device booted an image its application's check refuses, or other
/// bytes than the image sent; no device took a second START on one boot or a short sector; a run
/// that succeeded booted the image once; a run that failed booted nothing, unless it ended "sent
/// and executed, not confirmed"; a run that said the application refused the image left a device
/// that took every byte and refused it (not one that waits for bytes).
public struct ESPOTASoak: SoakStrategy {
    public init() {}

    public var name: String { ESPOTAProfile.name }

    /// The device a seed draws: the component and its ring buffer.
    static func device(seed: UInt64) -> (component: ESPOTAComponent, ringBytes: Int?) {
        var rng = SeededGenerator(seed: seed ^ 0xE5B0_7A)
        let component = ESPOTAComponent.allCases[Int(rng.next() % 3)]
        return (component, component == .raw ? [4, 8, 12, 32, 64][Int(rng.next() % 5)] * 1024 : nil)
    }

    /// No resume re-sends anything: at most the largest window a device announces.
    public func resendLimit(_ settings: SoakSettings) -> (bytes: Int, name: String) {
        (ESPOTAEngine.maximumWindow * ESPOTAService.sectorSize, "largest window of un-ACKed sectors")
    }

    public func trial(_ scenario: SoakScenario, seed: UInt64, settings: SoakSettings) throws(OTAError) -> SoakTrial {
        var rng = SeededGenerator(seed: seed ^ 0x0E5B)
        let body = (0..<scenario.size).map { _ in UInt8(truncatingIfNeeded: rng.next()) }
        let bytes = ESPAppImage.build(chip: .esp32, version: "2.\(rng.next() % 100).0", body: body)
        do {
            _ = try ESPAppImage(bytes: bytes, source: "soak image")
        } catch {
            throw OTAError(.image, "the soak built an ESP-IDF app image otaflash refuses: \(error)")
        }
        let (component, ring) = Self.device(seed: seed)
        let packets = max(1, bytes.count / 17)
        let sectors = (bytes.count + ESPOTAService.sectorSize - 1) / ESPOTAService.sectorSize
        // A scenario without faults (`SoakScenario.withoutFaults`) gets none of the device's either.
        let faults = scenario.faults == .none ? ESPDeviceFaults() : ESPDeviceFaults(dropWriteAt: Set((0..<Int(rng.next() % 4)).map { _ in Int(rng.next() % UInt64(packets)) }),
                                     loseACKOfSector: Set((0..<Int(rng.next() % 3)).map { _ in Int(rng.next() % UInt64(sectors)) }))
        let deviceConfig = SimulatedDeviceConfig(slotSize: 0x1A0000, link: scenario.link)
        let model = ESPOTAPeripheral(config: .init(component: component, partitionSize: deviceConfig.slotSize, ringBufferBytes: ring, faults: faults),
                                     faults: scenario.faults)
        let device = SimulatedDevice(deviceConfig, model: model)
        let detail = "\(component)" + (ring.map { " ring \($0 / 1024) KiB" } ?? "")
            + ", dropped writes \(faults.dropWriteAt.sorted()), lost ACKs \(faults.loseACKOfSector.sorted())"
        return SoakTrial(device: device, image: FirmwareImage(bytes: bytes), profile: ESPOTAProfile(), detail: detail,
                         group: component.rawValue, resendLimit: resendLimit(settings).bytes, resendLimitName: "window") { result in
            Self.verdict(device.model(as: ESPOTAPeripheral.self), sent: bytes, result: result)
        }
    }

    static let notConfirmed = "sent and executed, not confirmed"

    static func verdict(_ peripheral: ESPOTAPeripheral?, sent: [UInt8], result: Result<OTAResult, OTAError>) -> SoakVerdict {
        var verdict = SoakVerdict()
        let activations = peripheral?.activations ?? []
        if activations.contains(where: { (try? ESPAppImage(bytes: $0)) == nil }) {
            verdict.violate("booted an image its application's check refuses")
        }
        if activations.contains(where: { $0 != sent }) {
            verdict.violate("booted an image that differs from the one sent")
            verdict.mismatchedActivation = true
        }
        if let peripheral, peripheral.secondStarts > 0 {
            verdict.violate("took \(peripheral.secondStarts) second START(s) on one boot")
        }
        if let peripheral, peripheral.shortSectors > 0, !result.saysShortSector {
            verdict.violate("handed \(peripheral.shortSectors) short sector(s) to its application")
        }
        switch result {
        case .success:
            if activations.count != 1 { verdict.violate("reported ok with \(activations.count) restarts into the new image") }
        case .failure(let error):
            if error.code == .notConfirmed {
                // The link dropped after the last sector and before its ACK: booted or not, the
                // result says it is not confirmed.
                if !activations.isEmpty { verdict.unconfirmedActivation = true }
            } else if !activations.isEmpty {
                verdict.activatedOnFailure = true
                verdict.violate("failed (\(error.message)) yet booted the image")
            }
            if error.code == .verifyFailed, error.message.contains("refused the image"), let peripheral {
                if peripheral.waitingForBytes {
                    verdict.violate("said the application refused the image, but the device waits for bytes (\(peripheral.received) taken)")
                } else if peripheral.refusals.isEmpty {
                    verdict.violate("said the application refused the image, but it refused nothing")
                }
            }
        }
        return verdict
    }

    public func summary(_ records: [SoakRecord]) -> [String] {
        let components = ESPOTAComponent.allCases.map { component in
            let runs = records.filter { $0.group == component.rawValue }
            return "\(component) \(runs.count) (\(runs.filter { $0.outcome == .ok }.count) ok, \(runs.filter { $0.violation != nil }.count) violations)"
        }
        let unconfirmed = records.filter(\.verdict.unconfirmedActivation).count
        let onFailure = records.filter(\.verdict.activatedOnFailure).count
        return [
            "components: " + components.joined(separator: ", "),
            "restarts: \(records.filter(\.passed).count) runs ok with the image sent booted once; runs that ended \"\(Self.notConfirmed)\" with the image booted: \(unconfirmed); other failed runs with an image booted (violations): \(onFailure); second STARTs, short sectors, images booted that fail the application's check, and refusals said of a device that waits for bytes: counted as violations",
        ]
    }
}

extension Result where Success == OTAResult, Failure == OTAError {
    /// The run ended saying the device took a sector short.
    var saysShortSector: Bool {
        if case .failure(let error) = self { return error.message.contains("short") && error.message.contains("waits for bytes") }
        return false
    }
}
