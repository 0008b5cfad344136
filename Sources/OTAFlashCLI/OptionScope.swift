import OTA
import OTACommandLine

extension Flash {
    /// The options given that only some protocols take (`ProtocolCommandLine.specificOptions`), by name.
    var protocolSpecificOptions: [String] {
        let simulator = target.simulator
        var given: [String] = protocols.protocolGroups.flatMap { $0.given(withSimulator: false) }
        if restart { given.append("--restart") }
        if noActivate { given.append("--no-activate") }
        if simulator.enabled {
            given += protocols.protocolGroups.flatMap { group in
                let flash = group.given(withSimulator: false)
                return group.given(withSimulator: true).filter { !flash.contains($0) }
            }
            if simulator.buttonless != nil { given.append("--sim-buttonless") }
            if simulator.device.firmwareVersionOption != nil { given.append("--sim-firmware-version") }
            if simulator.dataWithoutWriteWithoutResponse { given.append("--sim-data-without-write-without-response") }
            if simulator.device.deviceVersion != 1 { given.append("--sim-device-version") }
            if simulator.stateDir != nil { given.append("--sim-state") }
        }
        return given.filter(ProtocolCommandLine.specificOptions.contains)
    }

    /// Refuses, before any radio time, an option the plan's protocol does not take (each
    /// protocol's registration says which it takes), and the combinations a simulated device
    /// cannot be.
    ///
    /// - Throws: `CLIFailure` `.usage` (exit 2) with one line that names the option and what to do.
    func refuseOptionsThatDoNotApply(to plan: FlashPlan) throws(CLIFailure) {
        let name = plan.profile.name
        let chosen = ProtocolCommandLine.named(name)
        for option in protocolSpecificOptions where !(chosen?.takes.contains(option) ?? false) {
            let why = chosen?.refuses[option].map { " (\($0))" } ?? ""
            throw CLIFailure(.usage, "\(option) applies to \(ProtocolCommandLine.owners(of: option).joined(separator: " and ")) only\(why); "
                                     + "\(image) goes over \(name): drop it")
        }
        let simulator = target.simulator
        if simulator.enabled, simulator.device.deviceVersion == 2 {
            if simulator.buttonless != nil {
                throw CLIFailure(.usage, "--sim-device-version 2 makes a native OTA device; \(image) goes to a buttonless device, drop it")
            }
            if batch.isBatch(devices: target.device) {
                throw CLIFailure(.usage, "--sim-device-version 2 checks one simulated device against the C device library; flash one device (drop --count)")
            }
        }
        if simulator.stateDir != nil, simulator.buttonless != nil {
            throw CLIFailure(.usage, "--sim-state keeps the native simulated device only; drop it to flash a buttonless device in the simulator")
        }
    }
}
