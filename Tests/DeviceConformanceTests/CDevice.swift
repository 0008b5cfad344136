import Native
import OTADevice

/// The C device library on its NOR flash model, as the conformance tests set it up.
struct CDeviceSetup {
    var slotSize = 64 * 1024
    var eraseUnit = 4096
    var reorderCapacity = 16 * 1024
    var reorderRanges = 8
    var holdMs: UInt16 = 300
    var eraseMicroseconds: UInt32 = 85_000
    var wordMicroseconds: UInt32 = 40
    var initialVersion: UInt32 = 0x0100_0000

    func make() -> CDeviceLibrary? {
        CDeviceLibrary(slotSize: slotSize, eraseUnit: eraseUnit, eraseMicroseconds: eraseMicroseconds,
                       wordMicroseconds: wordMicroseconds, reorderCapacity: reorderCapacity, reorderRanges: reorderRanges,
                       holdMs: holdMs, firmwareVersion: initialVersion)
    }
}

/// The name both devices know a central by.
func central(_ n: Int) -> String { "central-\(n)" }
