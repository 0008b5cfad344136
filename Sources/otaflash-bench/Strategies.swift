import Native
import NordicDFU
import Simulator
import SMP
import ESPOTA

/// The protocols the bench measures, each with its strategy from its own module, in the order
/// their figures print. The one place this program names a protocol.
let benchStrategies: [any BenchStrategy] = [NativeBench(), NordicDFUBench(), SMPBench(), ESPOTABench()]
