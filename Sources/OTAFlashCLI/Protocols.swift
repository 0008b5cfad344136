import ArgumentParser
import ESPOTA
import Native
import NordicDFU
import OTACommandLine
import SMP

// The one file of the command line that names a protocol. A protocol registers with one line:
// its options group, whose type names the protocol's value (`ProtocolOptionGroup.commandLine`).
// Adding a protocol: docs/ARCHITECTURE.md.

/// Every protocol the command line speaks, by its options group, in order of preference
/// (`--protocol auto` picks the first that fits; the first is `simulate`'s default and the device
/// `scan`, `info` and `pair` simulate).
public struct ProtocolOptions: ParsableArguments {
    @OptionGroup var native: NativeFlashOptions
    @OptionGroup var nordicDFU: NordicDFUOptions
    @OptionGroup var smp: SMPOptions
    @OptionGroup var espOTA: ESPOTAOptions

    public init() {}
}

/// `simulate --sim-smp-cbor`: how the served SMP server encodes its answers.
typealias ServedReplyEncoding = SMPReplyEncoding

/// `simulate --sim-smp-mode`: the served MCUboot's mode.
typealias ServedBootMode = SimulatedBootMode
