import OTACommandLine
import OTAFlashCLI
import Simulator

/// The protocols the bench measures: each registered protocol's strategy (from its own module),
/// in the order of the registration, which is the order their figures print.
let benchStrategies: [any BenchStrategy] = ProtocolCommandLine.all.compactMap(\.bench)
