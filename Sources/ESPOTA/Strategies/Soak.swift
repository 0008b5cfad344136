import GATT
import OTA
import OTADevice
import Simulator

/// How the soak runs Espressif's BLE OTA: `ESPOTAProfile` through the session and the simulator
/// against the example device (`ESPOTAPeripheral`, NimBLE or Bluedroid host drawn from the seed),
/// with an ESP-IDF app image built in memory (`ESPAppImage.build`).
///
/// Beyond the shared checks: no device booted an image its application's check refuses, or
/// other bytes than the image sent; no device took a second START on one boot; a run that
/// succeeded booted the image once. A run that failed after the last sector went out may
/// have booted it (the link dropped before the last ACK): the failure says so, and it is counted.
public struct ESPOTASoak: SoakStrategy {
    public init() {}

    public var name: String { ESPOTAProfile.name }

    static func host(seed: UInt64) -> ESPOTAHost {
        var rng = SeededGenerator(seed: seed ^ 0xE5B0_7A)
        return rng.next() % 2 == 0 ? .nimble : .bluedroid
    }

    /// The window of un-ACKed sectors (two) of what a resume would send again: there is none.
    public func resendLimit(_ settings: SoakSettings) -> (bytes: Int, name: String) {
        (ESPOTAEngine.defaultWindow * ESPOTAService.sectorSize, "window of un-ACKed sectors")
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
        let host = Self.host(seed: seed)
        let deviceConfig = SimulatedDeviceConfig(slotSize: 0x1A0000, link: scenario.link)
        let model = ESPOTAPeripheral(config: .init(host: host, partitionSize: deviceConfig.slotSize), faults: scenario.faults)
        let device = SimulatedDevice(deviceConfig, model: model)
        return SoakTrial(device: device, image: FirmwareImage(bytes: bytes), profile: ESPOTAProfile(), detail: "\(host) host",
                         group: host.rawValue, resendLimit: resendLimit(settings).bytes, resendLimitName: "window") { result in
            Self.verdict(device.model(as: ESPOTAPeripheral.self), sent: bytes, result: result)
        }
    }

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
        switch result {
        case .success:
            if activations.count != 1 { verdict.violate("reported ok with \(activations.count) restarts into the new image") }
        case .failure(let error):
            if !activations.isEmpty {
                // The link dropped after the last sector and before its ACK: the line says the
                // device may have restarted into the new image.
                if error.code == .connection, error.message.contains("may have restarted") {
                    verdict.unconfirmedActivation = true
                } else {
                    verdict.activatedOnFailure = true
                }
            }
        }
        return verdict
    }

    public func summary(_ records: [SoakRecord]) -> [String] {
        let hosts = [ESPOTAHost.nimble, .bluedroid].map { host in
            let runs = records.filter { $0.group == host.rawValue }
            return "\(host) \(runs.count) (\(runs.filter { $0.outcome == "ok" }.count) ok, \(runs.filter { $0.violation != nil }.count) violations)"
        }
        let unconfirmed = records.filter(\.verdict.unconfirmedActivation).count
        let onFailure = records.filter(\.verdict.activatedOnFailure).count
        return [
            "hosts: " + hosts.joined(separator: ", "),
            "restarts: \(records.filter(\.passed).count) runs ok with the image sent booted once; failed runs whose link dropped before the last ACK with the image booted (said so): \(unconfirmed); other failed runs with an image booted: \(onFailure); second STARTs on one boot and images booted that fail the application's check: counted as violations",
        ]
    }
}
