import OTAFlashCLI
import Testing

/// `otaflash simulate --sim-buttonless` serves one Secure DFU device on two adapters; every wrong
/// combination of its options is one usage line saying what to add or change, before any adapter
/// is opened.
@Suite("otaflash simulate --buttonless options")
struct SimulateButtonlessTests {
    typealias Case = BadValue

    static let nordic = ["simulate", "--protocol", "nordic-dfu"]

    @Test(arguments: [
        Case(arguments: ["simulate", "--sim-buttonless", "unbonded", "--adapter", "hci1", "--bootloader-adapter", "hci2"],
             says: ["--sim-buttonless", "add --protocol nordic-dfu"]),
        // The former name, --buttonless, is --sim-buttonless unbonded; the line names it as given.
        Case(arguments: ["simulate", "--buttonless", "--adapter", "hci1", "--bootloader-adapter", "hci2"],
             says: ["--buttonless configures a simulated Secure DFU bootloader", "add --protocol nordic-dfu"]),
        Case(arguments: nordic + ["--sim-buttonless", "bonded", "--adapter", "hci1"],
             says: ["--sim-buttonless needs --bootloader-adapter", "cannot change its address", "application's + 1"]),
        Case(arguments: nordic + ["--buttonless", "--bootloader-adapter", "hci2"],
             says: ["--sim-buttonless needs --adapter"]),
        Case(arguments: nordic + ["--buttonless", "--adapter", "hci1", "--bootloader-adapter", "hci1"],
             says: ["--bootloader-adapter must be another adapter than --adapter (hci1)"]),
        Case(arguments: nordic + ["--buttonless", "--adapter", "hci1", "--bootloader-adapter", "usb0"],
             says: ["--bootloader-adapter must look like hci0", "'usb0'"]),
        Case(arguments: nordic + ["--adapter", "hci1", "--bootloader-adapter", "hci2"],
             says: ["--bootloader-adapter", "add --sim-buttonless unbonded"]),
        Case(arguments: ["simulate", "--bootloader-adapter", "hci2", "--json"],
             says: ["--bootloader-adapter", "add --sim-buttonless unbonded"]),
        Case(arguments: nordic + ["--address", "C0:11:22:33:44:10"],
             says: ["--address", "add --sim-buttonless unbonded"]),
        Case(arguments: nordic + ["--buttonless", "--adapter", "hci1", "--bootloader-adapter", "hci2", "--address", "C0:11:22:33:44"],
             says: ["--address must look like", "'C0:11:22:33:44'"]),
    ])
    func aWrongCombinationIsOneUsageLine(input: Case) async {
        let run = await otaflash(input.arguments)
        expectOneUsageLine(run, saying: input.says)
        #expect(!run.stdout.contains("\"event\":\"serving\""))
    }

    /// The right combination passes validation: what stops it then is the next check (here a
    /// --store that is a file), not a usage line about the buttonless options.
    @Test func theRightCombinationGetsPastValidation() async throws {
        let scratch = try Scratch()
        let file = try scratch.file("file", "x")
        let run = await otaflash(Self.nordic + ["--buttonless", "--adapter", "hci1", "--bootloader-adapter", "hci2",
                                                "--address", "c0:11:22:33:44:10", "--store", file])
        #expect(run.errorLines == ["otaflash: error: --store \(file) is a file, not a directory"], "\(run.stderr)")
    }
}
