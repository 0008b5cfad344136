import ArgumentParser
import Foundation
import GATT
import OTA
import OTADevice
import OTAWire
import Simulator

/// One protocol as the command line drives it: its profile, the loader of its own image format,
/// its own options, and its simulated device for `flash --simulator` and for `otaflash simulate`.
/// Each protocol module declares one (`SMP.commandLine`); the command line registers them in one
/// list (OTAFlashCLI's Protocols.swift) and loops over it.
public struct ProtocolCommandLine: Sendable {
    public let profile: any OTAProfile
    /// The format of its own (its content detector) and its loader, which makes the plan of a file
    /// the detector claimed from what was read of it (`ImageDetection`); nil: it sends raw binaries
    /// and Intel HEX as the generic loader reads them.
    public let loader: Loader?

    public struct Loader: Sendable {
        public let detector: ImageFormat.Detector
        public let load: @Sendable (_ image: ClaimedImage, _ request: FlashRequest) throws(CLIFailure) -> FlashPlan

        public init(detector: ImageFormat.Detector,
                    load: @escaping @Sendable (_ image: ClaimedImage, _ request: FlashRequest) throws(CLIFailure) -> FlashPlan) {
            self.detector = detector
            self.load = load
        }

        public var format: ImageFormat.Kind { detector.kind }
    }

    /// The options only some protocols take (`flash`'s and its simulated device's) that this one
    /// takes; a given one this protocol does not take is refused.
    public let takes: Set<String>
    /// Why it does not take an option some other protocol takes, where that is worth a word.
    public let refuses: [String: String]
    /// What its simulated device is, for the line that refuses another protocol's options.
    public let device: String
    /// What a person reads of it where a text lists every protocol: `flash`'s help, `otaflash
    /// --help`, `scan --ota-only`, `simulate`'s help, the exit codes. Those texts are built from
    /// the registrations, so that none can leave a protocol out.
    public let texts: Texts
    /// The device `flash --simulator` sends a plan of this protocol to. The device
    /// `otaflash simulate` serves is its `ServedOptionGroup`'s.
    public let simulatedDevice: @Sendable (SimulatedDeviceRequest) throws -> SimulatedDevice
    /// The option that starts its simulated device in its application, whose bootloader then
    /// answers at the address + 1 (Secure DFU's `--sim-buttonless`); nil: it has no such start.
    public var applicationFirst: String?
    /// Its profile as a request configures it; nil: as registered.
    public var configure: (@Sendable (FlashRequest) -> any OTAProfile)?
    /// The plan for a file it is asked to send as it is whatever its format (`--smp-any-image`);
    /// nil: the request does not ask that of it.
    public var sendsAsIs: (@Sendable (FirmwareImage, FlashRequest) -> FlashPlan?)?
    /// Runs once a flash of one device over this protocol activated its image, before the outcome
    /// is reported (SMP's `--check-command`): the outcome to report; nil: nothing runs.
    public var afterActivation: (@Sendable (AfterActivation) async -> Result<OTAResult, OTAError>)?
    /// What a simulated device of its own runs after a flash, when that is worth a line.
    public var describe: @Sendable (SimulatedDevice) -> String? = { _ in nil }
    /// Checks a simulated device of its own after a flash: a line worth a note, or a failure.
    public var check: @Sendable (SimulatedDevice) throws(CLIFailure) -> String? = { _ in nil }
    /// How its simulated device keeps its state between runs (native's `--sim-state`); nil: it
    /// keeps none. Its options group says where (`ProtocolOptionGroup.stateDirectory`).
    public var state: SimulatorStateKeeper?
    /// What `otaflash info` reports of a device that exposes its service (`services`): the
    /// `ota_*` fields of the info event, as key and value; nil: it reports nothing of its own.
    public var info: (@Sendable (any GATTConnection, [GATTService]) async -> [(String, String?)]?)?
    /// The ranges of its own numeric options, for the line that refuses a value that is not a
    /// number at all (`Ranges.texts(whole:numbers:)`).
    public var rangeTexts: [String: String] = [:]
    /// Its words on files it knows but does not send (a file its builds write beside the image):
    /// they replace the generic refusal of such a file.
    public var fileHints: [ImageFormat.Hint] = []
    /// Its own device commands (SMP's `otaflash image`, `reset`, `echo`), made for the command
    /// line's `DeviceCommandContext`.
    public var commands: @Sendable (any DeviceCommandContext.Type) -> [any ParsableCommand.Type] = { _ in [] }
    /// An example of each event its own commands print (docs/EVENTS.md).
    public var eventSamples: [EventSample] = []
    /// Its throughput figures (`otaflash-bench`) and its fault soak (`otaflash-soak`).
    public var bench: (any BenchStrategy)?
    public var soak: (any SoakStrategy)?

    public init(profile: any OTAProfile, loader: Loader?, takes: Set<String>, refuses: [String: String],
                device: String, texts: Texts, simulatedDevice: @escaping @Sendable (SimulatedDeviceRequest) throws -> SimulatedDevice) {
        self.profile = profile
        self.loader = loader
        self.takes = takes
        self.refuses = refuses
        self.device = device
        self.texts = texts
        self.simulatedDevice = simulatedDevice
    }

    /// A protocol's words in the texts that list every protocol.
    public struct Texts: Sendable {
        /// The protocol as people call it: "MCUmgr's SMP".
        public var title: String
        /// The images it sends: "an MCUboot image (`imgtool sign`, .signed.bin or .signed.hex)".
        public var images: String
        /// The devices it updates, after "to": "a Zephyr or nRF Connect SDK device".
        public var devices: String
        /// The endings of its image files, which a shell offers for `flash`'s image.
        public var extensions: [String]
        /// What `otaflash simulate` serves for it, after "--protocol <name>": "serves a Zephyr
        /// device with MCUmgr's SMP server and MCUboot (…)".
        public var served: String
        /// The name that device advertises unless `--name` gives one: "otaflash-smp".
        public var servedName: String
        /// What `--sim-slot-size` is of its simulated device, where that is not plainly its image
        /// slot: "each of its two slots"; nil: its slot.
        public var slot: String?
        /// Its options `otaflash --help` shows, one line each: ("--confirm, --no-reset", "confirm at
        /// once; no reset after the upload").
        public var mainOptions: [(names: String, text: String)]
        /// What `flash`'s description says of this protocol alone, in sentences: "A Nordic device
        /// that runs its application with the buttonless DFU service is asked into its bootloader
        /// first, …"; nil: nothing.
        public var flashNote: String?
        /// Where its images carry their version, which `--skip-if-version image` reads (the
        /// loader's `FlashPlan.imageVersion`): "an MCUboot image's header"; nil: they carry none.
        public var imageVersion: String?
        /// What an exit code also covers with this protocol, for its meaning (`ExitCode.meaning(_:)`).
        public var exitCodes: [ExitCode: String]

        public init(title: String, images: String, devices: String, extensions: [String], served: String, servedName: String,
                    slot: String? = nil, mainOptions: [(names: String, text: String)] = [], flashNote: String? = nil, imageVersion: String? = nil,
                    exitCodes: [ExitCode: String] = [:]) {
            self.title = title
            self.images = images
            self.devices = devices
            self.extensions = extensions
            self.served = served
            self.servedName = servedName
            self.slot = slot
            self.mainOptions = mainOptions
            self.flashNote = flashNote
            self.imageVersion = imageVersion
            self.exitCodes = exitCodes
        }
    }

    public var name: String { profile.name }

    /// Its profile as `request` configures it.
    public func configured(_ request: FlashRequest) -> any OTAProfile { configure?(request) ?? profile }
}

/// A protocol's own options: `flash`'s and its simulated device's, in the groups (and under the
/// titles) its help shows them in. The command line registers a protocol by holding its group
/// (`@OptionGroup`), which names the protocol's value.
public protocol ProtocolOptionGroup: ParsableArguments, Sendable {
    /// The protocol these options are of.
    static var commandLine: ProtocolCommandLine { get }
    /// The options given, by name, for the refusal when the image goes over another protocol;
    /// its simulated device's only `withSimulator`.
    func given(withSimulator: Bool) -> [String]
    /// The checks that need the protocol asked for (`--protocol`).
    func check(protocolName: String) throws
    /// The checks that also need the run: whether images are activated (`--no-activate`) and
    /// whether several devices are flashed (a batch).
    func check(protocolName: String, noActivate: Bool, batch: Bool) throws
    /// The version an image is said to carry (`--image-version`), as given.
    var imageVersionText: String? { get }
    /// The checks of its simulated device's options that need the simulated device's slot size
    /// (given with `slotOption`).
    func check(simulatedSlotSize: Int, slotOption: String) throws
    /// The checks of its simulated device's options against the run, once the image's plan is known.
    func check(_ run: SimulatedRun) throws(CLIFailure)
    /// What its simulated device is when these options start it in its application, whose
    /// bootloader then answers at the address + 1 (Secure DFU's "buttonless device" with
    /// `--sim-buttonless`): that device is simulated whatever the image. Nil: they do not.
    var applicationDevice: String? { get }
    /// The folder its simulated device keeps its state in between runs, as given with the option
    /// its registration's `state` names; nil: none.
    var stateDirectory: String? { get }
}

extension ProtocolOptionGroup {
    public func check(protocolName: String) throws {}
    public func check(protocolName: String, noActivate: Bool, batch: Bool) throws { try check(protocolName: protocolName) }
    public var imageVersionText: String? { nil }
    public func check(simulatedSlotSize: Int, slotOption: String) throws {}
    public func check(_ run: SimulatedRun) throws(CLIFailure) {}
    public var applicationDevice: String? { nil }
    public var stateDirectory: String? { nil }
}

/// What a protocol's simulated-device options are checked against once `flash` knows the image's plan.
public struct SimulatedRun: Sendable {
    /// The image, as given.
    public var image: String
    /// Whether `--simulator` is given.
    public var simulated: Bool
    /// Whether several devices are flashed.
    public var batch: Bool
    /// What the simulated device is when another protocol's options start it in its application
    /// (`ProtocolOptionGroup.applicationDevice`); nil: none does.
    public var applicationDevice: String?

    public init(image: String, simulated: Bool, batch: Bool, applicationDevice: String?) {
        self.image = image
        self.simulated = simulated
        self.batch = batch
        self.applicationDevice = applicationDevice
    }
}

/// An `@OptionGroup` of a protocol's options, as a command holds it: the group's type (known
/// before parsing) and, once parsed, its values.
public protocol ProtocolOptionGroupHolder {
    var groupType: any ProtocolOptionGroup.Type { get }
    var group: any ProtocolOptionGroup { get }
}

extension OptionGroup: ProtocolOptionGroupHolder where Value: ProtocolOptionGroup {
    public var groupType: any ProtocolOptionGroup.Type { Value.self }
    public var group: any ProtocolOptionGroup { wrappedValue }
}

extension ParsableArguments {
    /// The protocols whose options groups this type holds (`@OptionGroup`), in declaration order.
    public static var protocolsHeld: [ProtocolCommandLine] {
        Mirror(reflecting: Self()).children.compactMap { ($0.value as? any ProtocolOptionGroupHolder)?.groupType.commandLine }
    }

    /// The protocols' options groups these parsed options hold, in declaration order.
    public var protocolGroups: [any ProtocolOptionGroup] {
        Mirror(reflecting: self).children.compactMap { ($0.value as? any ProtocolOptionGroupHolder)?.group }
    }
}

/// A request that carries every protocol's own options groups, each protocol reading its own.
public protocol HoldsProtocolOptions {
    var options: [any ProtocolOptionGroup] { get }
}

extension HoldsProtocolOptions {
    /// The options group of type `Group`, when the command line has it.
    public func options<Group: ProtocolOptionGroup>(_: Group.Type) -> Group? {
        options.lazy.compactMap { $0 as? Group }.first
    }
}

/// What `flash` asks of the loaders besides the path: the protocol asked for (or `auto`), the
/// protocols registered (a loader resolves the name among them), and every protocol's own
/// options (each protocol reads its own group).
public struct FlashRequest: Sendable, HoldsProtocolOptions {
    public var protocolName: String
    public var registry: ProtocolRegistry
    public var options: [any ProtocolOptionGroup]

    public init(protocolName: String, registry: ProtocolRegistry, options: [any ProtocolOptionGroup] = []) {
        self.protocolName = protocolName
        self.registry = registry
        self.options = options
    }
}

/// What `flash` sends (`UpdatePlan`: one image, or a package's images in its order, and the
/// protocol they go over), with what the command line says about it before any radio time.
public struct FlashPlan {
    public var update: UpdatePlan
    /// What the user should know about the image before it is sent (an unsigned package…).
    public var warnings: [String] = []
    /// The version the image carries (an MCUboot header's major.minor.revision), for
    /// `--skip-if-version image`.
    public var imageVersion: FirmwareVersion?

    public init(update: UpdatePlan, warnings: [String] = [], imageVersion: FirmwareVersion? = nil) {
        self.update = update
        self.warnings = warnings
        self.imageVersion = imageVersion
    }

    public var parts: [UpdatePlan.Part] { update.parts }
    public var firmware: FirmwareImage { update.firmware }
    public var profile: any OTAProfile { update.profile }
    public var size: Int { update.size }
    public var crc32: UInt32 { update.crc32 }

    /// "path: why; what to do", for a refusal of `path` the registry made.
    public static func refusal(_ path: String, _ error: OTAError) -> String {
        "\(path): \(error.message)" + (error.hint.map { "; \($0)" } ?? "")
    }
}

/// What a protocol's `afterActivation` is given: the flash's result, the device it reached and
/// how to reach it again, and the command line's options.
public struct AfterActivation: Sendable, HoldsProtocolOptions {
    public var result: OTAResult
    /// What the device reported after the update (its firmware version).
    public var after: DeviceSummary?
    /// The profile the image went over (its settings: an image's hash).
    public var profile: any OTAProfile
    public var central: any GATTCentral
    public var address: DeviceAddress
    public var options: [any ProtocolOptionGroup]
    public var connectTimeout: Duration
    public var replyTimeout: Duration
    /// Says a line to the user (a note event).
    public var note: @Sendable (String) -> Void

    public init(result: OTAResult, after: DeviceSummary?, profile: any OTAProfile, central: any GATTCentral, address: DeviceAddress,
                options: [any ProtocolOptionGroup], connectTimeout: Duration, replyTimeout: Duration, note: @escaping @Sendable (String) -> Void) {
        self.result = result
        self.after = after
        self.profile = profile
        self.central = central
        self.address = address
        self.options = options
        self.connectTimeout = connectTimeout
        self.replyTimeout = replyTimeout
        self.note = note
    }
}

/// What the simulated device of `flash --simulator` is asked to be: the plan it receives, the
/// device every protocol's simulator has (address, slot, link, faults), whether it exposes its
/// service, and every protocol's own options.
public struct SimulatedDeviceRequest: HoldsProtocolOptions {
    /// Nil: a device to look at (`scan`, `info`, `pair`), not to flash.
    public var plan: FlashPlan?
    public var config: SimulatedDeviceConfig
    public var settings: SimulatedDeviceSettings
    public var options: [any ProtocolOptionGroup]

    public init(plan: FlashPlan?, config: SimulatedDeviceConfig, settings: SimulatedDeviceSettings, options: [any ProtocolOptionGroup] = []) {
        self.plan = plan
        self.config = config
        self.settings = settings
        self.options = options
    }
}

/// The simulated device's options that are not a protocol's own group (`--sim-no-ota-service`).
public struct SimulatedDeviceSettings: Sendable, Hashable {
    /// False: the device does not expose its update service.
    public var hasOTAService = true

    public init(hasOTAService: Bool = true) {
        self.hasOTAService = hasOTAService
    }
}

/// Keeps a simulated device's state in a folder between runs (native's `--sim-state DIR`).
public struct SimulatorStateKeeper: Sendable {
    /// The option that names the folder.
    public let option: String
    /// The device `request` describes, restored from `dir` (a fresh one when it holds no state).
    public let load: @Sendable (_ dir: String, SimulatedDeviceRequest) throws -> SimulatedDevice
    /// Writes the device's state into `dir`.
    public let save: @Sendable (SimulatedDevice, _ dir: String) throws -> Void

    public init(option: String, load: @escaping @Sendable (_ dir: String, SimulatedDeviceRequest) throws -> SimulatedDevice,
                save: @escaping @Sendable (SimulatedDevice, _ dir: String) throws -> Void) {
        self.option = option
        self.load = load
        self.save = save
    }
}

/// What `otaflash simulate` asks of the served device besides its protocol's own options: the
/// options every device takes (the former names already folded in), and the served adapter.
public struct ServeRequest: Sendable {
    public var name: String?
    public var slotSize: Int
    /// `--sim-firmware-version` or the former `--firmware-version`, as text.
    public var firmwareVersion: String?
    public var faults: FaultPlan
    public var adapter: String?
    /// The adapter's address, where a device that starts in its application answers.
    public var address: DeviceAddress?

    public init(name: String? = nil, slotSize: Int, firmwareVersion: String? = nil, faults: FaultPlan = .none,
                adapter: String? = nil, address: DeviceAddress? = nil) {
        self.name = name
        self.slotSize = slotSize
        self.firmwareVersion = firmwareVersion
        self.faults = faults
        self.adapter = adapter
        self.address = address
    }
}

/// A protocol's own options for the device `otaflash simulate` serves, in the group (and under
/// the title) its help shows them in. `simulate` holds one group per protocol (OTAFlashCLI's
/// Protocols.swift); the group of the protocol served makes the device.
public protocol ServedOptionGroup: ParsableArguments, Sendable {
    /// The protocol these options are of.
    static var commandLine: ProtocolCommandLine { get }
    /// The options given, by name (a former name as given), for the line that refuses them when
    /// another protocol is served.
    var given: [String] { get }
    /// Whether the device starts in its application, whose bootloader answers at the address + 1
    /// (`ProtocolCommandLine.applicationFirst` given).
    var startsInApplication: Bool { get }
    /// The checks that need the options every device takes (the slot size given with
    /// `slotOption`, the former `--firmware-version` as text).
    func check(_ request: ServeRequest, slotOption: String) throws
    /// The device these options and `request` describe.
    func served(_ request: ServeRequest) throws -> ServedDevice
}

extension ServedOptionGroup {
    public var startsInApplication: Bool { false }
    public func check(_ request: ServeRequest, slotOption: String) throws {}
}

/// An `@OptionGroup` of a protocol's served-device options, as `simulate` holds it.
public protocol ServedOptionGroupHolder {
    var served: any ServedOptionGroup { get }
}

extension OptionGroup: ServedOptionGroupHolder where Value: ServedOptionGroup {
    public var served: any ServedOptionGroup { wrappedValue }
}

extension ParsableArguments {
    /// The served-device options groups these parsed options hold, in declaration order.
    public var servedGroups: [any ServedOptionGroup] {
        Mirror(reflecting: self).children.compactMap { ($0.value as? any ServedOptionGroupHolder)?.served }
    }
}

/// What `simulate` serves: the model, its name and starting version, and for a device whose
/// bootloader answers at another address, that address and the bootloader's GATT table.
public struct ServedDevice: Sendable {
    public var model: any PeripheralModel
    public var name: String
    public var firmwareVersion: String
    public var what: String
    public var bootloaderAddress: DeviceAddress?
    public var bootloaderServices: [OTADevice.PeripheralService]?

    public init(model: any PeripheralModel, name: String, firmwareVersion: String, what: String,
                bootloaderAddress: DeviceAddress? = nil, bootloaderServices: [OTADevice.PeripheralService]? = nil) {
        self.model = model
        self.name = name
        self.firmwareVersion = firmwareVersion
        self.what = what
        self.bootloaderAddress = bootloaderAddress
        self.bootloaderServices = bootloaderServices
    }
}
