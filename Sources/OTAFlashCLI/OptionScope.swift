import OTA
import OTACommandLine

extension Flash {
    /// The folder the simulated device keeps its state in between runs, when a protocol's options
    /// name one (native's `--sim-state`).
    var keptState: KeptState? { KeptState(protocols.protocolGroups) }

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
            if simulator.device.firmwareVersionOption != nil { given.append("--sim-firmware-version") }
        }
        return given.filter(ProtocolCommandLine.specificOptions.contains)
    }

    /// Refuses, before any radio time, an option the plan's protocol does not take (each
    /// protocol's registration says which it takes), and the combinations a simulated device
    /// cannot be (each protocol's group checks its own against the run).
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
        let groups = protocols.protocolGroups
        let run = SimulatedRun(image: image, simulated: target.simulator.enabled, batch: batch.isBatch(devices: target.device),
                               applicationDevice: groups.lazy.compactMap(\.applicationDevice).first)
        for group in groups { try group.check(run) }
    }
}
