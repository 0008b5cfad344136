import Foundation
import GATT
import Native
import OTA
import OTACommandLine
@testable import OTAFlashCLI
import Testing

/// A sixth protocol, registered only here: nothing attaches to it.
private struct SixthProfile: OTAProfile {
    let name = "sixth"
    let serviceUUID = BluetoothUUID(uint16: 0x6666)
    let imageFormats: Set<ImageFormat.Kind> = [ImageFormat.Kind("sixth-image")]
    var imageCheck: String { "checks the trailer's checksum" }
    var resumesTransfer: Bool { false }

    func attach(to connection: any GATTConnection, device: String,
                discoveryTimeout: Duration) async throws(OTAError) -> AttachedLink<Native.DeviceInfo> {
        throw OTAError(.incompatibleDevice, "not attachable")
    }
    func chunkSize(mtu: Int) -> Int { mtu - 3 }
    func makeEngine(image: FirmwareImage, config: EngineConfig) -> OTAEngine { OTAEngine(image: image, config: config) }
}

/// Every text a person reads that lists the protocols, their images or their refusals is built
/// from the registrations: a protocol registered is in each, and the command line shows those texts.
@Suite("texts that list the protocols")
struct ProtocolTextsTests {
    static let sixth = ProtocolCommandLine(
        profile: SixthProfile(), loader: nil, takes: Set(ownedOptions), refuses: [:], device: "sixth board",
        texts: .init(title: "the Sixth Protocol", images: "a sixth image (.six, trailer 0x66)", devices: "a sixth-generation board",
                     extensions: ["six"], served: "serves a sixth-generation board that takes .six files", servedName: "sixth-sim", slot: "its trailer-checked bank",
                     mainOptions: [("--sixth-key <key>", "the key the board checks")], flashNote: "A sixth-generation board is woken by a knock first.",
                     imageVersion: "a .six file's trailer",
                     exitCodes: [.imageFile: "a .six file without its trailer", .verifyFailed: "the trailer's checksum"]),
        simulatedDevice: { _ in throw CLIFailure(.internalError, "no simulated sixth board") })

    /// The options only some protocols take whose help names those that take them. (An option
    /// one protocol declares in its own group, as native's --sim-data-without-write-without-response,
    /// is that protocol's alone.)
    static let ownedOptions = ["--sim-firmware-version", "--no-activate", "--restart"]

    /// Each text, built for `protocols`, by what it is.
    static func texts(_ protocols: [ProtocolCommandLine]) -> [(what: String, text: String)] {
        [("flash's description", ProtocolTexts.flashDescription(protocols)),
         ("flash's image argument", ProtocolTexts.imageArgument(protocols)),
         ("flash --protocol", ProtocolTexts.protocolOption(protocols)),
         ("otaflash --help", RootHelp.text(protocols)),
         ("scan --ota-only", ProtocolTexts.otaOnly(protocols)),
         ("--sim-firmware-version", ProtocolTexts.simFirmwareVersion(protocols)),
         ("flash --no-activate", ProtocolTexts.noActivate(protocols)),
         ("flash --restart", ProtocolTexts.restart(protocols)),
         ("simulate --name", ProtocolTexts.servedName(protocols)),
         ("--skip-if-version", ProtocolTexts.skipIfVersion(protocols)),
         ("--sim-slot-size", ProtocolTexts.simSlotSize(protocols)),
         ("simulate's description", ProtocolTexts.served(protocols)),
         ("help simulator", ProtocolTexts.simulatedDevices(protocols)),
         ("the exit codes", ExitCode.helpTable(protocols)),
         ("the image completions", ProtocolTexts.imageExtensions(protocols).joined(separator: " "))]
    }

    /// What of `registration` each text must say (whitespace folded).
    static func expected(_ registration: ProtocolCommandLine, in what: String) -> [String] {
        switch what {
        case "flash's description": [registration.texts.images, registration.texts.title, registration.texts.devices,
                                     "the \(registration.device) \(registration.profile.imageCheck)"] + (registration.texts.flashNote.map { [$0] } ?? [])
        case "flash's image argument": [registration.texts.images, registration.texts.devices]
        case "flash --protocol": [registration.texts.images + ": " + registration.name]
        case "otaflash --help": [registration.texts.images + ": " + registration.texts.title + " (" + registration.name + ")"]
            + registration.texts.mainOptions.flatMap { [$0.names, "\(registration.name): \($0.text)"] }
        case "scan --ota-only": [registration.texts.title]
        case let owned where ownedOptions.contains(owned.replacing("flash ", with: "")):
            registration.takes.contains(owned.replacing("flash ", with: "")) ? [registration.name] : []
        case "simulate --name": [registration.name + ": " + registration.texts.servedName]
        case "--skip-if-version": registration.texts.imageVersion.map { [$0] } ?? []
        case "--sim-slot-size": registration.texts.slot.map { ["\(registration.name): \($0)"] } ?? []
        case "simulate's description": ["--protocol \(registration.name)", registration.texts.served]
        case "help simulator": ["the \(registration.device) for \(registration.texts.images)"]
        case "the exit codes": registration.texts.exitCodes.map { "; \(registration.name): \($0.value)" }
        case "the image completions": registration.texts.extensions
        default: ["(no such text)"]
        }
    }

    static func folded(_ text: String) -> String {
        text.split(whereSeparator: \.isWhitespace).joined(separator: " ")
    }

    @Test func aSixthProtocolRegisteredIsInEveryTextThatListsProtocols() {
        let protocols = ProtocolCommandLine.all + [Self.sixth]
        for (what, text) in Self.texts(protocols) {
            for registration in protocols {
                let expected = Self.expected(registration, in: what)
                if registration.name == Self.sixth.name { #expect(!expected.isEmpty, "\(what) says nothing of the sixth protocol") }
                for part in expected {
                    #expect(Self.folded(text).contains(Self.folded(part)), "\(what) does not say \"\(part)\" of \(registration.name): \(text)")
                }
            }
        }
        #expect(ExitCode.verifyFailed.meaning(protocols).hasSuffix("; sixth: the trailer's checksum"))
        // It cannot resume, as ESP32s and EFR32s cannot.
        #expect(ProtocolTexts.flashDescription(protocols).contains("(esp-ota, silabs-ota, sixth: reset the device first, and the whole image goes again)"))
        #expect(ExitCode.timeout.meaning(protocols) == ExitCode.timeout.meaning)
    }

    /// The texts the command line shows are those built from its registrations.
    @Test(arguments: [
        (["help", "flash"], ["flash's description", "flash's image argument", "flash --protocol", "the exit codes",
                             "flash --no-activate", "flash --restart", "--skip-if-version"]),
        (["--help"], ["otaflash --help"]),
        (["scan", "--help"], ["scan --ota-only"]),
        (["help", "simulator"], ["--sim-firmware-version", "help simulator", "--sim-slot-size"]),
        (["simulate", "--help"], ["--sim-firmware-version", "simulate's description", "simulate --name"]),
    ])
    func theCommandLineShowsTheTextsBuiltFromItsRegistrations(arguments: [String], whats: [String]) async {
        let run = await otaflash(arguments)
        #expect(run.code == 0)
        let texts = Dictionary(uniqueKeysWithValues: Self.texts(ProtocolCommandLine.all).map { ($0.what, $0.text) })
        for what in whats {
            // otaflash --help wraps its own lines: the IMAGE section is what it built.
            let shown = what == "otaflash --help" ? ProtocolTexts.rootImage(ProtocolCommandLine.all) : texts[what] ?? "(no text \(what))"
            #expect(Self.folded(run.stdout).contains(Self.folded(shown)), "otaflash \(arguments.joined(separator: " ")) does not show \(what): \(shown)")
        }
    }

    /// README's table of protocols: one row a registered protocol, in order, with its image and device.
    @Test func readmeListsEveryProtocolWithItsImageAndDevice() throws {
        let rows = try Self.readmeTable(header: "| protocol |")
        #expect(rows.map { $0[0] } == ProtocolCommandLine.all.map { "`\($0.name)`" })
        for (row, registration) in zip(rows, ProtocolCommandLine.all) {
            #expect(row[1] == registration.texts.images, "README's image of \(registration.name)")
            #expect(row[2].hasPrefix(registration.texts.devices), "README's device of \(registration.name)")
        }
    }

    /// README's exit codes mean what the code says they mean, each protocol's cases included.
    @Test func readmeStatesEachExitCodesMeaningWithEveryProtocol() throws {
        let rows = try Self.readmeTable(header: "| code | name | meaning |")
        #expect(rows.count == ExitCode.allCases.count)
        for code in ExitCode.allCases {
            let row = rows.first { $0[0] == "\(code.rawValue)" }
            #expect(row?[2] == code.meaning(ProtocolCommandLine.all), "README's meaning of \(code.rawValue) \(code.name)")
        }
    }

    /// The cells of the rows of README's table whose header line starts with `header`.
    static func readmeTable(header: String) throws -> [[String]] {
        let readme = try String(contentsOf: repositoryRoot.appendingPathComponent("README.md"), encoding: .utf8)
        let lines = readme.split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
        let start = try #require(lines.firstIndex { $0.hasPrefix(header) }, "README.md has no table \(header)")
        return lines[(start + 2)...].prefix { $0.hasPrefix("|") }.map { row in
            row.dropFirst().dropLast().split(separator: "|", omittingEmptySubsequences: false).map { $0.trimmingCharacters(in: .whitespaces) }
        }
    }
}
