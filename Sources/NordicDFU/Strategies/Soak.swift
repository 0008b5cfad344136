import GATT
import OTA
import OTADevice
import Simulator

/// How the soak runs Secure DFU: `NordicDFUProfile` through the session and the simulator
/// against the bootloader model (`NordicDFUPeripheral`).
///
/// A run draws sizes around the 4096-byte objects (a short one, whole objects only, a short last
/// object, up to 256 KiB) and a tenth of the drop and corruption rates: a lost or corrupted packet
/// spoils its whole object, as Secure DFU packets carry no offset. Beyond the shared checks:
/// whatever the bootloader activated is the image sent, byte for byte, with the hash its init
/// packet names; a run that succeeded activated it exactly once; a run that failed activated
/// nothing, unless the link was lost during the last EXECUTE (then the device may have activated
/// it, and the error says so). A resume re-sends at most one data object.
public struct NordicDFUSoak: SoakStrategy {
    public init() {}

    public var name: String { NordicDFUProfile.name }
    public var lossScale: Double { 0.1 }

    public func drawSize(_ rng: inout SeededGenerator) -> Int {
        let objects = 1 + Int(rng.next() % 32)
        return switch rng.next() % 4 {
        case 0: 1 + Int(rng.next() % 4096)
        case 1: objects * 4096
        case 2: (objects - 1) * 4096 + 1 + Int(rng.next() % 4095)
        default: 100_000 + Int(rng.next() % 160_000)
        }
    }

    public func resendLimit(_ settings: SoakSettings) -> (bytes: Int, name: String) {
        (NordicDFUBootloader.Config().dataMaxSize, "data object")
    }

    public func trial(_ scenario: SoakScenario, seed: UInt64, settings: SoakSettings) throws(OTAError) -> SoakTrial {
        var rng = SeededGenerator(seed: seed ^ 0xABCDEF)
        let firmware = (0..<scenario.size).map { _ in UInt8(truncatingIfNeeded: rng.next()) }
        let command = DFUInitCommand.application(firmware: firmware, version: 2, softDeviceRequirements: [0xAF])
        let initPacket = DFUInitPacket(command: command, signature: DFUInitPacket.Signature(type: 0, bytes: Array(repeating: 0x5A, count: 64)))
        let deviceConfig = SimulatedDeviceConfig(link: scenario.link)
        let device = SimulatedDevice(deviceConfig, model: NordicDFUPeripheral(faults: scenario.faults, resetDelay: deviceConfig.bootDelay))
        let limit = resendLimit(settings)
        return SoakTrial(device: device, image: FirmwareImage(bytes: firmware), profile: NordicDFUProfile(initPacket: initPacket.bytes),
                         resendLimit: limit.bytes, resendLimitName: limit.name) { result in
            var verdict = SoakVerdict()
            let activations = device.model(as: NordicDFUPeripheral.self)?.bootloader.activations ?? []
            if activations.contains(where: { $0.image != firmware || DFUInitCommand.hashField(for: $0.image) != command.hash }) {
                verdict.violate("activated an image that differs from the one sent")
                verdict.mismatchedActivation = true
            }
            switch result {
            case .success:
                if activations.count != 1 { verdict.violate("reported ok with \(activations.count) activations") }
            case .failure(let e):
                if !activations.isEmpty {
                    if e.code == .notConfirmed, e.message.contains("during the last EXECUTE"), activations.count == 1 {
                        verdict.unconfirmedActivation = true
                    } else {
                        verdict.activatedOnFailure = true
                        verdict.violate("failed (\(e.code)) after \(activations.count) activations")
                    }
                }
            }
            return verdict
        }
    }

    public func summary(_ records: [SoakRecord]) -> [String] {
        let unconfirmed = records.filter(\.verdict.unconfirmedActivation).count
        let onFailure = records.filter(\.verdict.activatedOnFailure).count
        let okOnce = records.filter(\.passed).count
        return ["activations: \(okOnce) runs ok with the image sent activated once, byte-identical, its hash matched; \(unconfirmed) failed runs activated it while the link was lost during the last EXECUTE (not_confirmed, saying so); other failed runs that activated anything: \(onFailure)"]
    }
}
