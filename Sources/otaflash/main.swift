import Foundation
import OTAFlashCLI

exit(await runOtaflash(Array(CommandLine.arguments.dropFirst())))
