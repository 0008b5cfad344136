import Native
import NordicDFU
import Simulator
import SMP
import ESPOTA

/// The protocols the soak runs, each with its strategy from its own module; the first is the
/// default of `--protocol`. The one place this program names a protocol.
let soakStrategies: [any SoakStrategy] = [NativeSoak(), NordicDFUSoak(), SMPSoak(), ESPOTASoak()]
