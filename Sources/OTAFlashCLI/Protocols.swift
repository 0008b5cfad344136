import ArgumentParser
import ESPOTA
import Native
import NordicDFU
import OTACommandLine
import SilabsOTA
import SMP

// The one file of the command line that names a protocol. A protocol registers with one line in
// each list: its options group for `flash` and its served-device group for `simulate`, whose
// types name the protocol's value (`commandLine`). Adding a protocol: docs/ARCHITECTURE.md.

/// Every protocol the command line speaks, by its options group, in order of preference
/// (`--protocol auto` picks the first that fits; the first is `simulate`'s default and the device
/// `scan`, `info` and `pair` simulate).
public struct ProtocolOptions: ParsableArguments {
    @OptionGroup var native: NativeFlashOptions
    @OptionGroup var nordicDFU: NordicDFUOptions
    @OptionGroup var smp: SMPOptions
    @OptionGroup var espOTA: ESPOTAOptions
    @OptionGroup var silabsOTA: SilabsOTAOptions

    public init() {}
}

/// The device `scan`, `info`, `pair` and the device commands simulate is the first protocol's:
/// its own options (the native device's protocol version), under the simulated peripheral's.
struct LookedAtProtocolOptions: ParsableArguments {
    @OptionGroup var native: NativeDeviceVersionOptions
}

/// The device `otaflash simulate` serves, one group per protocol: the group of `--protocol`
/// makes it, another's options given are refused.
struct ServedProtocolOptions: ParsableArguments {
    @OptionGroup(title: "Native OTA device") var native: NativeServedOptions
    @OptionGroup(title: "Secure DFU device") var nordicDFU: NordicDFUServedOptions
    @OptionGroup(title: "SMP device") var smp: SMPServedOptions
    @OptionGroup var espOTA: ESPOTAServedOptions
    @OptionGroup var silabsOTA: SilabsOTAServedOptions
}
