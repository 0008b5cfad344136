import ArgumentParser
import Native
import NordicDFU
import OTACommandLine
import SMP

// The one file of the command line that names a protocol: each registers its value (its module's
// `ProtocolCommandLine`) and its options group. Adding a protocol: docs/ARCHITECTURE.md.

extension ProtocolCommandLine {
    /// Every protocol the command line speaks, in order of preference (`--protocol auto` picks the
    /// first that fits; the first is `simulate`'s default and the device `scan`/`info`/`pair` simulate).
    public static let all: [ProtocolCommandLine] = [.native, .nordicDFU, .smp]
}

/// Every protocol's own options, in the order of `all`: each group keeps its options' titles.
public struct ProtocolOptions: ParsableArguments {
    @OptionGroup var native: NativeFlashOptions
    @OptionGroup var nordicDFU: NordicDFUOptions
    @OptionGroup var smp: SMPOptions

    public init() {}

    var groups: [any ProtocolOptionGroup] { [native, nordicDFU, smp] }
}

/// `simulate --sim-smp-cbor`: how the served SMP server encodes its answers.
typealias ServedReplyEncoding = SMPReplyEncoding
