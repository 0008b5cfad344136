import ArgumentParser
import GATT
import OTA
import OTACommandLine
import OTADevice
import OTAWire
import Simulator

extension ProtocolCommandLine {
    /// Espressif's BLE OTA: ESP-IDF app images, the ESP32 of esp-iot-solution's example (NimBLE
    /// host, or Bluedroid by its advertised name) as the simulated device.
    public static let espOTA: ProtocolCommandLine = {
        var esp = ProtocolCommandLine(
            profile: ESPOTAProfile(), loader: Loader(detector: .espAppImage) { path, request throws(CLIFailure) in
                do throws(OTAError) {
                    let loaded = try ESPOTARegistration.load(path: path, protocolName: request.protocolName, registry: request.registry,
                                                             chip: request.options(ESPOTAOptions.self)?.chip)
                    return FlashPlan(update: loaded.plan, warnings: loaded.warnings, imageVersion: loaded.version)
                } catch {
                    throw CLIFailure(ExitCode(error.code), "\(error)")
                }
            },
            takes: ["--sim-firmware-version", "--chip"],
            refuses: ["--checkpoint-interval": "an ESP32 ACKs each 4 KiB sector itself",
                      "--restart": "Espressif's BLE OTA cannot resume: every run sends the whole image",
                      "--no-activate": "an ESP32 restarts into an image as soon as its application checked it",
                      "--image-version": "an ESP-IDF app image carries its own"],
            device: "ESP32 with Espressif's BLE OTA",
            simulatedDevice: { request in
                ESPOTARegistration.simulatedDevice(request.config, device: request.options(ESPOTAOptions.self)?.simulated ?? SimulatedESPOptions())
            })
        esp.bench = ESPOTABench()
        esp.soak = ESPOTASoak()
        return esp
    }()
}

/// Espressif's BLE OTA's own option: the chip the devices are.
public struct ESPOTAOptions: ProtocolOptionGroup {
    @Option(name: .customLong("chip"), help: ArgumentHelp("esp-ota: the chip the devices are (\(ESPChip.knownNames.joined(separator: ", "))): an app image built for another is refused before any radio time (exit 7); the device would take it and not restart.", valueName: "chip"))
    var chip: ESPChip?

    @OptionGroup(title: "Simulated ESP32 (esp-ota)") var simulated: SimulatedESPOptions

    public init() {}

    public static var commandLine: ProtocolCommandLine { .espOTA }

    public func given(withSimulator: Bool) -> [String] { (chip != nil ? ["--chip"] : []) + (withSimulator ? simulated.given : []) }
}

/// The simulated ESP32's own options, for `flash --simulator` and `otaflash simulate`: which
/// component it runs, its ring buffer, and faults of its host at chosen write commands.
public struct SimulatedESPOptions: ParsableArguments, Sendable {
    @Option(name: .customLong("sim-esp-component"), help: ArgumentHelp("The simulated ESP32's BLE OTA component: nimble (ble_ota on NimBLE, the default; Bluedroid's when --name is ESP-C919), bluedroid, or raw (ble_ota_raw 0.2.0, which announces its sector window).", valueName: "component"))
    var component: ESPOTAComponent?

    @Option(name: .customLong("sim-esp-ring-kib"), help: ArgumentHelp("The simulated ESP32 application's ring buffer in KiB (4…256; 8 for ble_ota's example, 12 for ble_ota_raw's): ble_ota_raw announces it / 4 as its window.", valueName: "KiB"))
    var ringKiB: Int?

    @Option(name: .customLong("sim-esp-drop-write"), help: ArgumentHelp("The simulated ESP32's host drops the write command on RECV_FW with this index (0: the first sector packet after boot); repeatable.", valueName: "index"))
    var dropWrite: [Int] = []

    @Option(name: .customLong("sim-esp-lose-ack"), help: ArgumentHelp("The ACK of this sector never reaches the central (the first one); repeatable.", valueName: "sector"))
    var loseACK: [Int] = []

    public init() {}

    public func validate() throws {
        if let ringKiB, !(4...256).contains(ringKiB) { throw ValidationError("--sim-esp-ring-kib \(ringKiB): give 4 to 256 (KiB)") }
        if let bad = dropWrite.first(where: { $0 < 0 }) { throw ValidationError("--sim-esp-drop-write \(bad): give a write index from 0") }
        if let bad = loseACK.first(where: { $0 < 0 || $0 > 0xFFFF }) { throw ValidationError("--sim-esp-lose-ack \(bad): give a sector from 0 to 65535") }
    }

    var given: [String] {
        (component != nil ? ["--sim-esp-component"] : []) + (ringKiB != nil ? ["--sim-esp-ring-kib"] : [])
            + (dropWrite.isEmpty ? [] : ["--sim-esp-drop-write"]) + (loseACK.isEmpty ? [] : ["--sim-esp-lose-ack"])
    }

    /// The device's configuration, for a device named `name`.
    func config(name: String?, partitionSize: Int) -> ESPOTAPeripheral.Config {
        let component = component ?? (ESPOTARegistration.host(name: name) == .nimble ? .nimble : .bluedroid)
        return ESPOTAPeripheral.Config(component: component, partitionSize: partitionSize, ringBufferBytes: ringKiB.map { $0 * 1024 },
                                       faults: ESPDeviceFaults(dropWriteAt: Set(dropWrite), loseACKOfSector: Set(loseACK)))
    }
}

extension ESPOTAComponent: ExpressibleByArgument {}

/// `otaflash simulate`'s options for an ESP32: the simulated device's.
public struct ESPOTAServedOptions: ServedOptionGroup {
    @OptionGroup(title: "Simulated ESP32 (esp-ota)") var simulated: SimulatedESPOptions

    public init() {}

    public static var commandLine: ProtocolCommandLine { .espOTA }

    public var given: [String] { simulated.given }

    public func served(_ request: ServeRequest) throws -> ServedDevice {
        let d = ESPOTARegistration.served(name: request.name, partitionSize: request.slotSize, firmwareVersion: request.firmwareVersion,
                                          faults: request.faults, device: simulated)
        return ServedDevice(model: d.model, name: d.name, firmwareVersion: d.firmwareVersion, what: d.what)
    }
}

extension ESPChip: ExpressibleByArgument {
    /// `esp32c3`, `ESP32-C3` or `esp32-c3`.
    public init?(argument: String) { self.init(name: argument) }
    public static var allValueStrings: [String] { knownNames }
}

/// What the command line needs of this protocol beyond its profile: the loader of ESP-IDF app
/// images, the simulated device for `flash --simulator` and the one `otaflash simulate` serves.
/// Kept here so that a registration names only these.
public enum ESPOTARegistration {
    /// A checked image, the plan that sends it and what to say about it before any radio time.
    public struct Loaded: Sendable {
        public var plan: UpdatePlan
        public var warnings: [String]
        /// The version in the image's `esp_app_desc_t`, when it reads as one.
        public var version: FirmwareVersion?
    }

    /// Loads and checks the app image at `path` for the protocol `protocolName` asks for (`auto`
    /// or `esp-ota`), against `chip` when one is known.
    ///
    /// - Throws: `OTAError`: `.image` (exit 3) for a file that is not a sendable app image (with
    ///   the file of an ESP-IDF build to use), `.imageTooLarge`, `.incompatibleDevice` for
    ///   another chip.
    public static func load(path: String, protocolName: String, registry: ProtocolRegistry, chip: ESPChip? = nil) throws(OTAError) -> Loaded {
        let resolution: ProtocolRegistry.Resolution
        do {
            resolution = try registry.resolve(protocolName, format: .espAppImage)
        } catch {
            throw OTAError(error.code, "\(path): \(error.message)", hint: error.hint)
        }
        let image: ESPAppImage
        do {
            image = try ESPAppImage.load(path: path)
            try image.check(chip: chip)
        } catch {
            throw error.otaError
        }
        let contents = "; an ESP-IDF app image for \(image.chip), \(image.segments.count) segments"
            + (image.version.map { ", version \($0)" } ?? "") + (image.hashAppended ? ", SHA-256 appended" : "")
        let plan = UpdatePlan(parts: [UpdatePlan.Part(firmware: image.firmware, profile: resolution.profile, label: "app")],
                              format: .espAppImage, reason: resolution.reason, contents: contents)
        return Loaded(plan: plan, warnings: image.warnings, version: image.version.flatMap(FirmwareVersion.init))
    }

    /// The host a served or simulated device runs, from the name it advertises: Bluedroid's
    /// component advertises "ESP-C919", NimBLE's example "nimble-ble-ota" (the default).
    public static func host(name: String?) -> ESPOTAHost {
        name == ESPOTAService.bluedroidName ? .bluedroid : .nimble
    }

    /// The device `flash --simulator` sends an esp-ota plan to: the NimBLE example, or the
    /// Bluedroid one when `config.name` is its name; `config.slotSize` is its OTA partition.
    public static func simulatedDevice(_ config: SimulatedDeviceConfig, device: SimulatedESPOptions = SimulatedESPOptions()) -> SimulatedDevice {
        let model = ESPOTAPeripheral(config: device.config(name: config.name, partitionSize: config.slotSize),
                                     firmwareVersion: config.firmwareVersion.description, faults: config.faults)
        return SimulatedDevice(config, model: model)
    }

    /// What `otaflash simulate --protocol esp-ota` serves.
    public struct Served: Sendable {
        public var model: ESPOTAPeripheral
        public var name: String
        public var firmwareVersion: String
        public var what: String
    }

    public static func served(name: String?, partitionSize: Int, firmwareVersion: String?, faults: FaultPlan,
                              device: SimulatedESPOptions = SimulatedESPOptions()) -> Served {
        let config = device.config(name: name, partitionSize: partitionSize)
        let version = firmwareVersion ?? "1.0.0"
        let model = ESPOTAPeripheral(config: config, firmwareVersion: version, faults: faults)
        let component = switch config.component {
        case .nimble: "ble_ota, NimBLE host"
        case .bluedroid: "ble_ota, Bluedroid host"
        case .raw: "ble_ota_raw 0.2.0, window \(config.sectorWindow)"
        }
        return Served(model: model, name: name ?? ESPOTAService.nimbleName, firmwareVersion: version,
                      what: "ESP32 with Espressif's BLE OTA (\(component), \(partitionSize)-byte OTA partition)")
    }
}
