import GATT
import OTA
import Simulator

/// How the soak runs the native protocol: the session with `NativeProfile` against the simulated
/// `NativePeripheral`; `--device-version 2` runs a version 2 device on NOR flash (4 KiB erase
/// units, 85 ms per erase, 40 µs per word, 32 KiB reorder capacity) with the C device library
/// (Sources/COTADevice) in lockstep beside the Swift model.
///
/// Beyond the shared checks: whatever the device activated is the image sent (bytes and CRC); a
/// run that succeeded activated it; a run that failed activated nothing unless the link was lost
/// (the last ACTIVATE's answer); the device spoke the version asked; a version 2 device ran the C
/// library, which never answered otherwise than the Swift model.
public struct NativeSoak: SoakStrategy {
    public init() {}

    public var name: String { "native" }
    public var deviceVersions: ClosedRange<Int> { 1...2 }

    public func title(_ settings: SoakSettings) -> String? {
        settings.deviceVersion == 2 ? "native v2 (NOR flash: 4 KiB units, 85 ms erase, 40 µs/word)" : nil
    }

    /// A version 2 device's flash.
    func version2(_ settings: SoakSettings) -> OTATarget.Version2? {
        settings.deviceVersion == 2 ? OTATarget.Version2() : nil
    }

    /// The session's bound, and for a version 2 device what its flash adds: a CHECKPOINT or
    /// STATUS waits a window's erases longer on each try.
    public func bound(_ settings: SoakSettings) -> Duration {
        let window = OTAEngine.Settings().window
        return settings.sessionBound + (version2(settings).map { .milliseconds(Int($0.eraseTimeMs)) * (window / $0.eraseUnit + 1) } ?? .zero)
            * (settings.config.commandRetries + 1)
    }

    /// One checkpoint window, and for a version 2 device an erase unit more (a commit rounds down to one).
    public func resendLimit(_ settings: SoakSettings) -> (bytes: Int, name: String) {
        (OTAEngine.Settings().window + (version2(settings)?.eraseUnit ?? 0), "window")
    }

    public func trial(_ scenario: SoakScenario, seed: UInt64, settings: SoakSettings) throws(OTAError) -> SoakTrial {
        var rng = SeededGenerator(seed: seed ^ 0xABCDEF)
        let image = FirmwareImage(bytes: (0..<scenario.size).map { _ in UInt8(truncatingIfNeeded: rng.next()) })
        let version2 = version2(settings)
        let device = SimulatedDevice(SimulatedDeviceConfig(slotSize: 1 << 20, link: scenario.link, faults: scenario.faults),
                                     native: NativeDeviceOptions(version2: version2, runsCLibrary: version2 != nil))
        let deviceVersion = settings.deviceVersion
        return SoakTrial(device: device, image: image, profile: NativeProfile(), resendLimit: resendLimit(settings).bytes,
                         resendLimitName: "window") { result in
            var verdict = SoakVerdict()
            let activation = device.target?.lastActivation
            if let activation, activation.image != image.bytes || activation.crc != image.crc32 {
                verdict.violate("activated an image that differs from the one sent")
                verdict.mismatchedActivation = true
            }
            switch result {
            case .success:
                if activation?.image != image.bytes { verdict.violate("reported ok but the device did not activate the image") }
            case .failure(let e):
                if activation != nil && e.code != .connection { verdict.violate("failed (\(e.code)) after activating") }
            }
            if device.target?.protocolVersion != UInt8(deviceVersion) {
                verdict.violate("the device spoke version \(device.target?.protocolVersion ?? 0)")
            }
            if version2 != nil, device.target?.runsCLibrary != true {
                verdict.violate("the C device library did not run")
            }
            if let divergence = device.target?.lockstepDivergence {
                verdict.violate("the C device library and the Swift model differ: \(divergence)")
            }
            return verdict
        }
    }
}
