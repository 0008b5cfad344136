import GATT
import NordicDFU
import OTA
import OTADevice
import Simulator

/// One Secure DFU run: `NordicDFUProfile` through `OTASession` and the simulator against the
/// bootloader model. Beyond the shared checks: whatever the bootloader activated is the image
/// sent, byte for byte, with the hash its init packet names; a run that succeeded activated it
/// exactly once; a run that failed activated nothing, unless the link was lost during the last
/// EXECUTE (then the device may have activated it, and the error says so).
func runNordic(_ scenario: Scenario, seed scenarioSeed: UInt64, trace: Bool, verbose: Bool) async -> RunRecord {
    var rng = SeededGenerator(seed: scenarioSeed ^ 0xABCDEF)
    let firmware = (0..<scenario.size).map { _ in UInt8(truncatingIfNeeded: rng.next()) }
    let command = DFUInitCommand.application(firmware: firmware, version: 2, softDeviceRequirements: [0xAF])
    let initPacket = DFUInitPacket(command: command, signature: DFUInitPacket.Signature(type: 0, bytes: Array(repeating: 0x5A, count: 64)))
    let image = FirmwareImage(bytes: firmware)
    let deviceConfig = SimulatedDeviceConfig(link: scenario.link)
    let device = SimulatedDevice(deviceConfig, model: NordicDFUPeripheral(faults: scenario.faults, resetDelay: deviceConfig.bootDelay))
    let clock = VirtualClock()
    let central = SimulatedCentral(devices: [device], clock: clock)
    let session = OTASession(central: central, address: device.config.address, image: image, config: config,
                             profile: NordicDFUProfile(initPacket: initPacket.bytes), timeouts: timeouts,
                             reconnect: ReconnectPolicy(window: reconnectWindow, seed: scenarioSeed))
    let run = await runSession(session, clock: clock, trace: trace)
    var record = RunRecord(run, neverConfirms: scenario.neverConfirms != nil)
    let activations = device.model(as: NordicDFUPeripheral.self)?.bootloader.activations ?? []
    if activations.contains(where: { $0.image != firmware || DFUInitCommand.hashField(for: $0.image) != command.hash }) {
        record.violation = "activated an image that differs from the one sent"
        record.mismatchedActivation = true
    }
    switch run.result {
    case .success(let r):
        if trace { print("  stats: \(r.stats)") }
        if activations.count != 1 {
            record.violation = record.violation ?? "reported ok with \(activations.count) activations"
        }
    case .failure(let e):
        if verbose { print("  \(e)") }
        if !activations.isEmpty {
            if e.code == .connection, e.message.contains("during the last EXECUTE"), activations.count == 1 {
                record.unconfirmedActivation = true
            } else {
                record.activatedOnFailure = true
                record.violation = record.violation ?? "failed (\(e.code)) after \(activations.count) activations"
            }
        }
    }
    record.checkShared(bound: bound, resendLimit: resendLimit, limitName: resendLimitName)
    return record
}
