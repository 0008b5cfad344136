import Foundation
import GATT

/// The simulated devices' own count of what they did (docs/SIMULATOR.md): with
/// `OTAFLASH_SIM_ACTIVATION_LOG=FILE` in the environment, every reset a device makes that is not an
/// injected fault (booting an image it activated, an SMP reset) appends one line, `ADDRESS reason`,
/// to FILE, whichever process simulates it. Tests of the ledger count a device's flashes there,
/// not in the records the ledger was told of.
enum ActivationLog {
    private static let path: String? = ProcessInfo.processInfo.environment["OTAFLASH_SIM_ACTIVATION_LOG"].flatMap { $0.isEmpty ? nil : $0 }

    static func note(_ address: DeviceAddress, _ reason: String) {
        guard let path else { return }
        // One write(2) with O_APPEND: lines of concurrent processes never interleave.
        let line = Array("\(address) \(reason)\n".utf8)
        let fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0o644)
        guard fd >= 0 else { return }
        _ = line.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
        close(fd)
    }
}
