import OTACommandLine
import OTAFlashCLI
import Simulator

/// The protocols the soak runs: each registered protocol's strategy (from its own module); the
/// first is the default of `--protocol`.
let soakStrategies: [any SoakStrategy] = ProtocolCommandLine.all.compactMap(\.soak)
