import GATT
import OTA
import OTADevice
import OTAWire
import Simulator

/// What a command line needs of this protocol beyond its profile: the loader of ESP-IDF app
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
    public static func simulatedDevice(_ config: SimulatedDeviceConfig) -> SimulatedDevice {
        let model = ESPOTAPeripheral(config: .init(host: host(name: config.name), partitionSize: config.slotSize),
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

    public static func served(name: String?, partitionSize: Int, firmwareVersion: String?, faults: FaultPlan) -> Served {
        let host = host(name: name)
        let version = firmwareVersion ?? "1.0.0"
        let model = ESPOTAPeripheral(config: .init(host: host, partitionSize: partitionSize), firmwareVersion: version, faults: faults)
        return Served(model: model, name: name ?? ESPOTAService.nimbleName, firmwareVersion: version,
                      what: "ESP32 with Espressif's BLE OTA (\(host == .nimble ? "NimBLE" : "Bluedroid") host, \(partitionSize)-byte OTA partition)")
    }
}
