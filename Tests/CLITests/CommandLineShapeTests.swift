import Foundation
@testable import OTAFlashCLI
import OTACommandLine
import Testing

/// The command line as a person meets it: a help that fits a screen, the simulator's options in
/// their own topic, choices that name their values, errors that point at the right help, and
/// options that do not apply to the image's protocol refused rather than ignored.
@Suite("otaflash command line")
struct CommandLineShapeTests {
    static let app = samplePath("seeded-4k.bin")
    static let package = samplePath("nordic/blinky-app.zip")
    static let mcuboot = samplePath("mcuboot/blinky-ec256-v1.3.0.bin")

    /// The option entries of a help text: lines that start with two spaces and a dash.
    static func entryNames(_ help: String) -> Set<String> {
        Set(HelpText(help).entries.flatMap(\.names))
    }

    // MARK: otaflash --help: one screen

    @Test func rootHelpFitsOneScreenAndShowsWhatAFactoryEngineerUses() async {
        let run = await otaflash(["--help"])
        #expect(run.code == 0)
        let lines = run.stdout.split(separator: "\n", omittingEmptySubsequences: false).dropLast()
        #expect(lines.count <= 50, "otaflash --help is \(lines.count) lines")
        #expect(lines.allSatisfy { $0.count <= 80 }, "\(lines.filter { $0.count > 80 })")
        for needed in ["--device", "--devices-file", "--scan", "--adapter", "--protocol", "--connect-timeout", "--parallel",
                       "--json", "--quiet", "--report", "--simulator", "otaflash help simulator", "otaflash help flash",
                       "exits with its own code", "MCUboot", "nordic-dfu", "smp"] {
            #expect(run.stdout.contains(needed), "otaflash --help does not mention \(needed)")
        }
        let simOptions = run.stdout.matches(of: /--sim-[a-z-]+/).map { String($0.output) }
        #expect(simOptions.isEmpty, "otaflash --help lists \(simOptions)")
    }

    /// Every option the short help names is one `flash` takes, under that name.
    @Test func everyOptionTheRootHelpNamesIsAFlashOption() async {
        let flash = await otaflash(["flash", "--help-hidden"])
        let names = Self.entryNames(flash.stdout)
        #expect(names.count > 40)
        for option in RootHelp.optionNames {
            #expect(names.contains(option), "otaflash --help names \(option), which flash does not take")
        }
    }

    @Test(arguments: [["help", "flash"], ["flash", "--help"]])
    func flashHelpLeavesTheSimulatorOptionsToTheirTopic(arguments: [String]) async {
        let run = await otaflash(arguments)
        #expect(run.code == 0)
        let names = Self.entryNames(run.stdout)
        #expect(names.contains("--simulator") && names.contains("--checkpoint-interval") && names.contains("--protocol"))
        #expect(names.filter { $0.hasPrefix("--sim-") }.isEmpty, "\(names.filter { $0.hasPrefix("--sim-") }.sorted())")
        #expect(run.stdout.contains("otaflash help simulator"))
        #expect(run.stdout.contains("MCUboot"), "the flash overview does not mention MCUboot images")
    }

    /// `otaflash help simulator` lists every --sim-* option flash takes (but the batch's
    /// --sim-device-fault, which its text explains), grouped by what it sets up.
    @Test func helpSimulatorListsEverySimulatorOption() async {
        let topic = await otaflash(["help", "simulator"])
        #expect(topic.code == 0, "\(topic.stderr)")
        let all = await otaflash(["flash", "--help-hidden"])
        let simOptions = Self.entryNames(all.stdout).filter { $0.hasPrefix("--sim") }.subtracting(["--sim-device-fault"])
        #expect(simOptions.count >= 40, "\(simOptions.count)")
        let listed = Self.entryNames(topic.stdout)
        #expect(simOptions.subtracting(listed).isEmpty, "help simulator misses \(simOptions.subtracting(listed).sorted())")
        for title in ["SIMULATED DEVICE:", "FAULTS:", "SECURE DFU BOOTLOADER", "SMP DEVICE", "otaflash simulate", "--sim-device-fault"] {
            #expect(topic.stdout.contains(title), "help simulator lacks \(title)")
        }
        let again = await otaflash(["simulator"])
        #expect(again.code == 0 && again.stdout == topic.stdout)
    }

    @Test(arguments: ["scan", "image", "ledger", "simulate", "completions"])
    func helpOfEachCommandStillWorks(command: String) async {
        let run = await otaflash(["help", command])
        #expect(run.code == 0, "\(run.stderr)")
        #expect(run.stdout.contains("USAGE: otaflash \(command)"), "\(run.stdout.prefix(300))")
    }

    // MARK: Choices are types: a bad value is refused naming the values

    struct BadChoice: Sendable, CustomTestStringConvertible {
        let arguments: [String]
        let values: String
        var testDescription: String { arguments.joined(separator: " ") }
    }

    static let badChoices: [BadChoice] = [
        BadChoice(arguments: simulator + ["--sim-security", "maybe", app], values: "'none', 'encrypt' or 'authenticate'"),
        BadChoice(arguments: ["pair", "--simulator", "--sim-security", "high"], values: "'none', 'encrypt' or 'authenticate'"),
        BadChoice(arguments: simulator + ["--sim-phy", "3M", app], values: "'1M' and '2M'"),
        BadChoice(arguments: ["--simulator", "--sim-time", "fast", app], values: "'real', 'virtual' or 'unlimited'"),
        BadChoice(arguments: simulator + ["--sim-buttonless", "sideways", package], values: "'unbonded', 'bonded', 'refusing' or 'lost'"),
        BadChoice(arguments: simulator + ["--sim-smp-cbor", "json", mcuboot], values: "'definite', 'indefinite', 'zcbor' or 'tinycbor'"),
        BadChoice(arguments: ["image", "list", "--simulator", "--sim-smp-cbor", "json"], values: "'definite', 'indefinite', 'zcbor' or 'tinycbor'"),
        BadChoice(arguments: ["simulate", "--sim-security", "maybe"], values: "'none', 'encrypt' or 'authenticate'"),
        BadChoice(arguments: ["simulate", "--security", "maybe"], values: "'none', 'encrypt' or 'authenticate'"),
        BadChoice(arguments: ["simulate", "--protocol", "nordic-dfu", "--sim-buttonless", "maybe"], values: "'unbonded', 'bonded', 'refusing' or 'lost'"),
        BadChoice(arguments: ["ledger", "--result", "failed"], values: "'ok', 'skipped', 'error' or 'bond_left'"),
        BadChoice(arguments: ["completions", "tcsh"], values: "'zsh', 'bash' or 'fish'"),
    ]

    @Test(arguments: badChoices)
    func aValueOutsideAChoiceIsRefusedNamingTheValues(_ bad: BadChoice) async {
        let run = await otaflash(bad.arguments)
        expectOneUsageLine(run, saying: ["is invalid for", "Please provide one of \(bad.values)"])
    }

    /// `--protocol` offers the registered protocols (and `auto` where a file picks one).
    @Test(arguments: [["--simulator", "--sim-time", "virtual", "--protocol", "dfu", "app.bin"], ["simulate", "--protocol", "auto"]])
    func aProtocolNoneRegisteredIsRefusedNamingEachThatIs(_ arguments: [String]) async {
        let run = await otaflash(arguments)
        let names = (arguments.first == "simulate" ? [] : ["auto"]) + ProtocolCommandLine.all.map(\.name)
        expectOneUsageLine(run, saying: ["is invalid for", "Please provide one of"] + names.map { "'\($0)'" })
        if arguments.first == "simulate" {
            let offered = (run.errorLines.first ?? "").components(separatedBy: "Please provide one of").last ?? ""
            #expect(!offered.contains("'auto'"), "\(offered)")
        }
    }

    /// --sim-phy takes 1m as 1M, as it always did; --sim-security is no longer re-parsed with a
    /// silent fallback: a value it takes reaches the device.
    @Test func choicesTakeTheirValues() async throws {
        let phy = await otaflash(simulator + ["--sim-phy", "1m", "--json", Self.app])
        #expect(phy.code == 0, "\(phy.stderr)")
        let secured = await otaflash(simulator + ["--sim-security", "encrypt", Self.app])
        #expect(secured.code == 12, "an encrypting device without --pair is exit 12: \(secured.stderr)")
    }

    // MARK: Errors point at their own command's help

    @Test(arguments: [
        (["image", "list", "--bogus"], "See 'otaflash image list --help'."),
        (["scan", "--timeout", "x"], "See 'otaflash scan --help'."),
        (["ledger", "--limit", "0"], "See 'otaflash ledger --help'."),
        (["simulate", "--sim-smp-buf-size", "10"], "See 'otaflash simulate --help'."),
        (["--bogus", "app.bin"], "See 'otaflash flash --help'."),
        (["flash", "--bogus", "app.bin"], "See 'otaflash flash --help'."),
        (["--simulator", "--sim-mtu", "5", "app.bin"], "See 'otaflash help simulator'."),
    ])
    func aUsageErrorPointsAtItsCommandsHelp(arguments: [String], pointer: String) async {
        let run = await otaflash(arguments)
        #expect(run.code == 2)
        #expect(run.stderr.hasSuffix(pointer + "\n"), "\(run.stderr)")
        #expect(!run.stderr.contains("otaflash --help"), "\(run.stderr)")
    }

    // MARK: Completions

    /// `otaflash completions SHELL --install` is the one line: it works in an empty home, where
    /// none of the folders exist yet, and writes the script where the shell looks.
    @Test(arguments: [("bash", ".local/share/bash-completion/completions/otaflash"), ("zsh", ".zfunc/_otaflash"),
                      ("fish", ".config/fish/completions/otaflash.fish")])
    func completionsInstallIntoAFreshHome(shell: String, target: String) async throws {
        let help = await otaflash(["completions", "--help"])
        #expect(help.stdout.contains("otaflash completions \(shell) --install"))
        let home = try Scratch()
        let path = try Completions.install(shellNamed: shell, environment: ["HOME": home.url.path])
        #expect(path == home.url.appendingPathComponent(target).path)
        let printed = await otaflash(["completions", shell])
        #expect(FileManager.default.contents(atPath: path).map { String(decoding: $0, as: UTF8.self) } == printed.stdout)
    }

    /// The manual lines (for the docs) work on a fresh machine too: they make the folder first.
    @Test func theManualInstallLinesMakeTheFolderFirst() async throws {
        for (shell, line) in Completions.installLines {
            #expect(line.hasPrefix("mkdir -p "), "\(shell): \(line)")
            let home = try Scratch()
            let bash = Process()
            bash.executableURL = URL(fileURLWithPath: "/bin/bash")
            bash.environment = ["PATH": "/usr/bin:/bin", "HOME": home.url.path]
            bash.arguments = ["-c", "otaflash() { echo \"# completion script for $2\"; }\n" + line]
            try bash.run()
            bash.waitUntilExit()
            #expect(bash.terminationStatus == 0, "\(shell): \(line)")
            let target = ["bash": ".local/share/bash-completion/completions/otaflash", "zsh": ".zfunc/_otaflash",
                          "fish": ".config/fish/completions/otaflash.fish"][shell] ?? "?"
            let written = FileManager.default.contents(atPath: home.url.appendingPathComponent(target).path).map { String(decoding: $0, as: UTF8.self) }
            #expect(written == "# completion script for \(shell)\n", "\(shell): \(target)")
        }
    }

    @Test(arguments: ["bash", "zsh", "fish"])
    func completionsPrintsTheSameScriptAsTheGeneratorOption(shell: String) async {
        let command = await otaflash(["completions", shell])
        let option = await otaflash(["--generate-completion-script", shell])
        #expect(command.code == 0 && option.code == 0)
        #expect(command.stdout == option.stdout)
        #expect(command.stdout.contains("nordic-dfu"), "\(shell) does not complete --protocol's values")
        #expect(command.stdout.contains("/sys/class/bluetooth"), "\(shell) does not complete --adapter")
    }

    @Test(arguments: [
        ("otaflash --protocol ", ["auto"] + ProtocolCommandLine.all.map(\.name)),
        ("otaflash simulate --protocol ", ProtocolCommandLine.all.map(\.name)),
        ("otaflash --simulator --sim-phy ", ["1M", "2M"]),
        ("otaflash ledger --result ", ["ok", "skipped", "error", "bond_left"]),
        ("otaflash --device AA:BB:CC:DD:EE:FF ", ["app.bin", "app.hex", "app_dfu_package.zip", "zephyr.signed.bin", "images"]),
    ])
    func bashCompletesChoicesAndImages(line: String, expected: [String]) async throws {
        let scratch = try Scratch()
        for name in ["app.bin", "app.hex", "app_dfu_package.zip", "zephyr.signed.bin", "notes.txt"] { _ = try scratch.file(name, "") }
        try FileManager.default.createDirectory(at: scratch.url.appendingPathComponent("images"), withIntermediateDirectories: true)
        let offered = try await HelpAndReadmeTests.bashCompletions(line, in: scratch.url)
        #expect(offered.sorted() == expected.sorted(), "\(line)<TAB>")
    }

    /// --adapter completes with the controllers under /sys/class/bluetooth: the same list the
    /// script's command prints on this machine (none in a container without Bluetooth).
    @Test func bashCompletesAdaptersFromSysfs() async throws {
        let scratch = try Scratch()
        let offered = try await HelpAndReadmeTests.bashCompletions("otaflash --adapter ", in: scratch.url)
        let present = ((try? FileManager.default.contentsOfDirectory(atPath: "/sys/class/bluetooth")) ?? [])
            .filter { $0.wholeMatch(of: /hci[0-9]+/) != nil }
        #expect(offered.sorted() == present.sorted())
    }

    // MARK: Options that do not apply to the image's protocol

    struct Misplaced: Sendable, CustomTestStringConvertible {
        let options: [String]
        let image: String
        let option: String
        let protocolName: String
        var testDescription: String { "\(options.joined(separator: " ")) with \(protocolName)" }
    }

    static let misplaced: [Misplaced] = [
        Misplaced(options: ["--checkpoint-interval", "4096"], image: package, option: "--checkpoint-interval", protocolName: "nordic-dfu"),
        Misplaced(options: ["--checkpoint-interval", "4096"], image: mcuboot, option: "--checkpoint-interval", protocolName: "smp"),
        Misplaced(options: ["--image-version", "1.2.3"], image: package, option: "--image-version", protocolName: "nordic-dfu"),
        Misplaced(options: ["--image-version", "1.2.3"], image: mcuboot, option: "--image-version", protocolName: "smp"),
        Misplaced(options: ["--restart"], image: package, option: "--restart", protocolName: "nordic-dfu"),
        Misplaced(options: ["--no-activate"], image: package, option: "--no-activate", protocolName: "nordic-dfu"),
        Misplaced(options: ["--hw-version", "52"], image: mcuboot, option: "--hw-version", protocolName: "smp"),
        Misplaced(options: ["--sd-req", "0xAF"], image: app, option: "--sd-req", protocolName: "native"),
        Misplaced(options: ["--confirm"], image: package, option: "--confirm", protocolName: "nordic-dfu"),
        Misplaced(options: ["--no-reset"], image: app, option: "--no-reset", protocolName: "native"),
        Misplaced(options: ["--smp-window", "2"], image: app, option: "--smp-window", protocolName: "native"),
        Misplaced(options: ["--sim-hw-version", "52"], image: mcuboot, option: "--sim-hw-version", protocolName: "smp"),
        Misplaced(options: ["--sim-open-bootloader"], image: app, option: "--sim-open-bootloader", protocolName: "native"),
        Misplaced(options: ["--sim-buttonless", "unbonded"], image: mcuboot, option: "--sim-buttonless", protocolName: "smp"),
        Misplaced(options: ["--sim-firmware-version", "1.2.3"], image: package, option: "--sim-firmware-version", protocolName: "nordic-dfu"),
        Misplaced(options: ["--sim-smp-buf-size", "512"], image: app, option: "--sim-smp-buf-size", protocolName: "native"),
        Misplaced(options: ["--sim-data-without-write-without-response"], image: mcuboot, option: "--sim-data-without-write-without-response", protocolName: "smp"),
    ]

    @Test(arguments: misplaced)
    func anOptionForAnotherProtocolIsRefusedNotIgnored(_ m: Misplaced) async {
        let run = await otaflash(simulator + m.options + [m.image])
        expectOneUsageLine(run, saying: ["\(m.option) applies to", "goes over \(m.protocolName): drop it"])
        #expect(!run.stderr.contains("verified"), "\(run.stderr)")
    }

    /// The same options where they apply are taken.
    @Test(arguments: [
        (["--checkpoint-interval", "4096", "--image-version", "1.2.3", "--restart"], app),
        (["--restart", "--confirm", "--sim-smp-buf-size", "512", "--sim-firmware-version", "1.2.0"], mcuboot),
        (["--hw-version", "52", "--sim-hw-version", "52", "--sim-buttonless", "unbonded"], package),
    ])
    func optionsOfTheImagesProtocolAreTaken(options: [String], image: String) async {
        let run = await otaflash(simulator + options + [image])
        #expect(run.code == 0, "\(run.stderr)")
    }

    // MARK: simulate: flash's --sim-* names; the former names still taken, hidden

    @Test func simulateHelpUsesTheSimNamesAndHidesTheFormerOnes() async {
        let run = await otaflash(["simulate", "--help"])
        let names = Self.entryNames(run.stdout)
        for option in ["--sim-slot-size", "--sim-firmware-version", "--sim-app-version", "--sim-public-key", "--sim-smp-buf-size",
                       "--sim-smp-buf-count", "--sim-smp-cbor", "--sim-device-version", "--sim-security", "--sim-passkey",
                       "--sim-buttonless", "--sim-drop-rate"] {
            #expect(names.contains(option), "simulate --help lacks \(option)")
        }
        for former in ["--slot-size", "--firmware-version", "--public-key", "--buf-size", "--buf-count", "--cbor",
                       "--device-version", "--security", "--passkey", "--buttonless"] {
            #expect(!names.contains(former), "simulate --help still shows \(former)")
        }
    }

    /// `simulate` holds one served-device group per registered protocol, in the registry's order:
    /// a protocol registered for `flash` and not for `simulate` (or the other way) fails here.
    @Test func everyProtocolServesADeviceOfItsOwnGroup() throws {
        let served = try Simulate.parse([]).devices.servedGroups.map { type(of: $0).commandLine.name }
        #expect(served == ProtocolCommandLine.all.map(\.name))
    }

    /// A served device takes the options `--simulator` takes for the same device, and makes the
    /// device they describe.
    @Test func simulateTakesTheSimulatorsDeviceOptions() throws {
        let smp = try Simulate.parse(["--protocol", "smp", "--sim-smp-buf-size", "2475", "--sim-smp-pending", "--sim-smp-cbor", "tinycbor"])
        let device = try #require(smp.device).served(smp.request())
        #expect(device.what.contains("4 × 2475 B buffers") && device.what.contains("tinycbor"), "\(device.what)")
        let nordic = try Simulate.parse(["--protocol", "nordic-dfu", "--sim-app-version", "7", "--sim-hw-version", "53"])
        #expect(try #require(nordic.device).served(nordic.request()).firmwareVersion == "7")
        let former = try Simulate.parse(["--protocol", "nordic-dfu", "--firmware-version", "9"])
        #expect(try #require(former.device).served(former.request()).firmwareVersion == "9")
    }

    @Test(arguments: [
        (["simulate", "--buf-size", "32", "--protocol", "smp"], ["--buf-size", "64 and 65543"]),
        (["simulate", "--buf-size", "2475"], ["--buf-size configures a simulated SMP server", "add --protocol smp"]),
        (["simulate", "--sim-smp-buf-size", "2475"], ["--sim-smp-buf-size configures a simulated SMP server", "add --protocol smp"]),
        (["simulate", "--sim-public-key", "k.pem"], ["--sim-public-key configures a simulated Secure DFU bootloader", "add --protocol nordic-dfu"]),
        (["simulate", "--protocol", "smp", "--sim-device-version", "2"], ["--sim-device-version configures a simulated native OTA device"]),
        (["simulate", "--protocol", "nordic-dfu", "--sim-firmware-version", "1.2.3"], ["--sim-app-version"]),
        (["simulate", "--protocol", "smp", "--buf-size", "512", "--sim-smp-buf-size", "512"], ["--buf-size is the former name of --sim-smp-buf-size"]),
        (["simulate", "--sim-passkey", "123456"], ["--sim-passkey", "add --sim-security authenticate"]),
        (["simulate", "--protocol", "nordic-dfu", "--buttonless"], ["--sim-buttonless needs --bootloader-adapter"]),
    ])
    func simulateRefusesWhatItsDeviceDoesNotTake(arguments: [String], says: [String]) async {
        let run = await otaflash(arguments)
        expectOneUsageLine(run, saying: says)
    }
}
