import Foundation
import OTACommandLine
import OTADevice
import Simulator

/// Keeps a simulated device's non-volatile state in a folder between runs (`--sim-state DIR`), so
/// that "run the same command again" resumes on the simulator as it does on a real device.
/// `state.json` holds the transfer's position, `flash.bin` the slot; both are replaced atomically.
enum SimulatorState {
    static func load(from dir: String, _ request: SimulatedDeviceRequest) throws -> SimulatedDevice {
        let (config, native) = (request.config, request.native)
        let stateURL = URL(fileURLWithPath: dir).appendingPathComponent("state.json")
        let flashURL = URL(fileURLWithPath: dir).appendingPathComponent("flash.bin")
        guard FileManager.default.fileExists(atPath: stateURL.path) else { return SimulatedDevice(config, native: native) }
        do {
            let snapshot = try JSONDecoder().decode(OTATarget.Snapshot.self, from: Data(contentsOf: stateURL))
            let flash = (try? Data(contentsOf: flashURL)).map { [UInt8]($0) } ?? []
            guard let target = OTATarget(snapshot: snapshot, flash: flash) else {
                throw CLIFailure(.usage, "simulator state in \(dir) is inconsistent (flash.bin does not match state.json); delete the folder to start afresh")
            }
            return SimulatedDevice(config, native: native, restoring: target)
        } catch let failure as CLIFailure {
            throw failure
        } catch {
            throw CLIFailure(.usage, "cannot read simulator state in \(dir): \(error.localizedDescription); delete the folder to start afresh")
        }
    }

    static func save(_ device: SimulatedDevice, to dir: String) throws {
        let fm = FileManager.default
        try fm.createDirectory(atPath: dir, withIntermediateDirectories: true)
        guard let target = device.target else { return }  // only the native model's state is saved
        let base = URL(fileURLWithPath: dir)
        try Data(target.flash).write(to: base.appendingPathComponent("flash.bin"), options: .atomic)
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.prettyPrinted, .sortedKeys]
        try encoder.encode(target.snapshot).write(to: base.appendingPathComponent("state.json"), options: .atomic)
        if let image = target.lastActivation?.image {
            try Data(image).write(to: base.appendingPathComponent("activated.bin"), options: .atomic)
        }
    }
}
