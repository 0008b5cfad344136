import Native
import NordicDFU
import OTA
import SMP

/// An option that only some protocols take, as given on the command line: `flash` refuses it
/// with one line when the image goes over another protocol, rather than ignore it.
struct ScopedOption: Sendable {
    let name: String
    let protocols: [String]
    /// Why the other protocols do not take it, for the refusal.
    let why: String

    /// "--checkpoint-interval applies to native only (…); app.zip goes over nordic-dfu: drop it".
    func refusal(image: String, protocolName: String) -> String {
        "\(name) applies to \(protocols.joined(separator: " and ")) only (\(why)); \(image) goes over \(protocolName): drop it"
    }
}

extension Flash {
    /// The options given that only some protocols take, each with those protocols.
    var scopedOptions: [ScopedOption] {
        let (native, nordic, mcumgr) = (NativeProfile.name, NordicDFUProfile.name, SMPProfile.name)
        var given: [ScopedOption] = []
        func add(_ names: [String], _ protocols: [String], _ why: String) {
            given += names.map { ScopedOption(name: $0, protocols: protocols, why: why) }
        }
        add(checkpointInterval != nil ? ["--checkpoint-interval"] : [], [native], "Secure DFU and SMP confirm progress their own way")
        add(imageVersion != nil ? ["--image-version"] : [], [native], "it goes in the native BEGIN command; an MCUboot image carries its own")
        add(restart ? ["--restart"] : [], [native, mcumgr], "a Secure DFU bootloader says itself where a transfer resumes")
        add(noActivate ? ["--no-activate"] : [], [native, mcumgr], "the bootloader activates an image as soon as it has validated it")
        add([hwVersion != nil ? "--hw-version" : nil, sdReq != nil ? "--sd-req" : nil].compactMap { $0 }, [nordic],
            "they check a Nordic DFU package's init packets")
        add(smp.given, [mcumgr], "it is for SMP devices")
        guard target.simulator.enabled else { return given }
        let simulator = target.simulator
        add(simulator.secureDFU.given, [nordic], "it sets up a simulated Secure DFU bootloader, which only a Nordic DFU package (.zip) reaches")
        add(simulator.smp.given, [mcumgr], "it sets up a simulated SMP device, which only an MCUboot image reaches")
        add(simulator.buttonless != nil ? ["--sim-buttonless"] : [], [nordic, native], "it starts a simulated Secure DFU device in its application")
        add(simulator.device.firmwareVersionOption != nil ? ["--sim-firmware-version"] : [], [native, mcumgr],
            "a simulated Secure DFU bootloader's application version is --sim-app-version")
        add(simulator.dataWithoutWriteWithoutResponse ? ["--sim-data-without-write-without-response"] : [], [native],
            "it changes the native OTA service's data characteristic")
        return given
    }

    /// Refuses, before any radio time, an option the plan's protocol does not take, and the
    /// combinations a simulated device cannot be.
    ///
    /// - Throws: `CLIFailure` `.usage` (exit 2) with one line that names the option and what to do.
    func refuseOptionsThatDoNotApply(to plan: FlashPlan) throws(CLIFailure) {
        let name = plan.profile.name
        if let option = scopedOptions.first(where: { !$0.protocols.contains(name) }) {
            throw CLIFailure(.usage, option.refusal(image: image, protocolName: name))
        }
        let simulator = target.simulator
        if simulator.enabled, simulator.device.deviceVersion == 2 {
            if !(plan.profile is NativeProfile) || simulator.buttonless != nil {
                throw CLIFailure(.usage, "--sim-device-version 2 makes a native OTA device; \(image) goes over the \(name) protocol\(simulator.buttonless != nil ? " to a buttonless device" : ""), drop it")
            }
            if batch.isBatch(devices: target.device) {
                throw CLIFailure(.usage, "--sim-device-version 2 checks one simulated device against the C device library; flash one device (drop --count)")
            }
        }
    }
}
