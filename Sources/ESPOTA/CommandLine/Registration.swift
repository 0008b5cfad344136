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
            profile: ESPOTAProfile(), loader: Loader(detector: .espAppImage) { claimed, request throws(CLIFailure) in
                let options = request.options(ESPOTAOptions.self)
                let partition = try options?.partitionLimit()
                do throws(OTAError) {
                    let loaded = try ESPOTARegistration.load(claimed, protocolName: request.protocolName, registry: request.registry,
                                                             chip: options?.chip, partition: partition)
                    return FlashPlan(update: loaded.plan, warnings: loaded.warnings, imageVersion: loaded.version)
                } catch {
                    throw CLIFailure(ExitCode(error.code), "\(error)")
                }
            },
            takes: ["--sim-firmware-version", "--chip", "--esp-partition-size", "--partition-table"],
            refuses: ["--checkpoint-interval": "an ESP32 ACKs each 4 KiB sector itself",
                      "--restart": "Espressif's BLE OTA cannot resume: every run sends the whole image",
                      "--no-activate": "an ESP32 restarts into an image as soon as its application checked it",
                      "--image-version": "an ESP-IDF app image carries its own"],
            device: "ESP32 with Espressif's BLE OTA",
            texts: Texts(
                title: "Espressif's BLE OTA", images: "an ESP-IDF app image (.bin from `idf.py build`, magic 0xE9)",
                devices: "an ESP32 with Espressif's BLE OTA component", extensions: ["bin"],
                served: "serves an ESP32 application with Espressif's BLE OTA component (service 0x8018, docs/ESP32.md): "
                    + "esp-iot-solution's ble_ota on NimBLE by default, on Bluedroid with --name ESP-C919, or ble_ota_raw with "
                    + "--sim-esp-component raw, which announces its sector window (--sim-esp-ring-kib / 4). It takes the image in "
                    + "4 KiB sectors, each acknowledged, with --sim-slot-size its OTA partition and --sim-firmware-version the "
                    + "version it runs; once the last sector is in, it checks the app image and restarts into it. It cannot "
                    + "resume: every transfer sends the whole image.",
                servedName: "\(ESPOTAService.nimbleName), as Espressif's NimBLE example (\(ESPOTAService.bluedroidName) makes it the Bluedroid one)",
                slot: "its OTA partition",
                mainOptions: [("--chip <chip>", "the chip the devices are, e.g. esp32c3")],
                imageVersion: "an ESP-IDF app image's esp_app_desc_t",
                exitCodes: [.imageFile: "an ESP-IDF app image that does not check out (segments, chip, checksum, appended SHA-256), "
                                + "or another file of the build (a merged flash image, the ELF)",
                            .imageTooLarge: "the OTA partition --esp-partition-size or --partition-table gives (without them, over 4 MiB)",
                            .incompatibleDevice: "an app image built for another chip than --chip",
                            .verifyFailed: "every sector acknowledged, but the device did not restart into the image within --verify-timeout",
                            .protocolError: "a START refused, or a sector refused or taken short"]),
            simulatedDevice: { request in
                ESPOTARegistration.simulatedDevice(request.config, device: request.options(ESPOTAOptions.self)?.simulated ?? SimulatedESPOptions())
            })
        esp.fileHints = [.espIDFLinkerOutput]
        esp.rangeTexts = [ESPOTAOptions.partitionSizeRange.option: "a size in bytes (decimal, 0x hex, or with K or M as partitions.csv writes it) "
                          + ESPOTAOptions.partitionSizeRange.text]
        esp.bench = ESPOTABench()
        esp.soak = ESPOTASoak()
        return esp
    }()
}

/// Espressif's BLE OTA's own options: the chip the devices are, and their OTA partition (which
/// the device cannot report).
public struct ESPOTAOptions: ProtocolOptionGroup {
    @Option(name: .customLong("chip"), help: ArgumentHelp("esp-ota: the chip the devices are (\(ESPChip.knownNames.joined(separator: ", "))): an app image built for another is refused before any radio time (exit 7); the device would take it and not restart.", valueName: "chip"))
    var chip: ESPChip?

    @OptionGroup(title: "Simulated ESP32 (esp-ota)") var simulated: SimulatedESPOptions

    @Option(name: .customLong("esp-partition-size"), help: ArgumentHelp("esp-ota: the size of the devices' OTA partition, in bytes, 0x hex or with K or M as partitions.csv writes it (\(partitionSizeRange.text)): a larger app image is refused before any radio time (exit 4). Without it (or --partition-table), images over 4 MiB are refused and those over 1 MiB get a warning.", valueName: "size"))
    var partitionSize: ESPPartitionSizeArgument?

    @Option(name: .customLong("partition-table"), help: ArgumentHelp("esp-ota: the devices' partition table (the build's partitions.csv, or build/partition_table/partition-table.bin): an app image larger than its OTA partitions (ota_0, ota_1, …) is refused before any radio time (exit 4).", valueName: "file"), completion: .file())
    var partitionTable: String?

    public init() {}

    public static var commandLine: ProtocolCommandLine { .espOTA }

    /// An app partition is at least a flash sector, and no image ESP-IDF loads is larger than 16 MiB.
    public static let partitionSizeRange = Bounds("--esp-partition-size", 4096...(16 << 20), unit: " bytes")

    public func given(withSimulator: Bool) -> [String] {
        [chip != nil ? "--chip" : nil, partitionSize != nil ? "--esp-partition-size" : nil,
         partitionTable != nil ? "--partition-table" : nil].compactMap { $0 } + (withSimulator ? simulated.given : [])
    }

    public func check(protocolName: String) throws {
        if let partitionSize { try Self.partitionSizeRange.check(partitionSize.bytes) }
        if partitionSize != nil, partitionTable != nil {
            throw ValidationError("--esp-partition-size and --partition-table both give the OTA partition's size; give one")
        }
    }

    /// The OTA partition the options give: the size given, or the one the partition table gives.
    ///
    /// - Throws: `CLIFailure` `.usage` (exit 2) for a partition table that cannot be read or has no
    ///   OTA app partition.
    public func partitionLimit() throws(CLIFailure) -> ESPPartitionLimit? {
        if let partitionSize {
            return ESPPartitionLimit(size: partitionSize.bytes, what: "the OTA partition --esp-partition-size gives")
        }
        guard let partitionTable else { return nil }
        do {
            return try ESPPartitionLimit(table: ESPPartitionTable.load(path: partitionTable))
        } catch {
            throw CLIFailure(.usage, "--partition-table \(error)")
        }
    }
}

/// `--esp-partition-size`: bytes, 0x hex, or with K or M (1024, 1024 × 1024), as partitions.csv
/// writes sizes.
public struct ESPPartitionSizeArgument: ExpressibleByArgument, Sendable, Hashable {
    public let bytes: Int

    public init?(argument: String) {
        guard let bytes = ESPPartitionTable.number(argument), bytes >= 0 else { return nil }
        self.bytes = bytes
    }
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
    /// or `esp-ota`), against `chip` when one is known and the OTA partition `partition` when one is
    /// given (else the 4 MiB ceiling). A pre-encrypted image is sent as it is, checked only for its
    /// header and size. A file that starts with 0xE9 but is no app image goes as a raw binary only
    /// when a protocol that sends raw binaries is asked for by name (`--protocol native`).
    ///
    /// - Throws: `OTAError`: `.image` (exit 3) for a file that is not a sendable app image (a
    ///   damaged one, with the damage; another file of an ESP-IDF build, with the one to use),
    ///   `.imageTooLarge` (exit 4), `.incompatibleDevice` (exit 7) for another chip.
    public static func load(path: String, protocolName: String, registry: ProtocolRegistry, chip: ESPChip? = nil,
                            partition: ESPPartitionLimit? = nil) throws(OTAError) -> Loaded {
        let firmware: FirmwareImage
        do {
            firmware = try FirmwareImage.load(path: path, accepting: [.espAppImage, .elf], detecting: [.espAppImage])
        } catch {
            throw OTAError(.image, "\(error)")
        }
        return try load(firmware, protocolName: protocolName, registry: registry, chip: chip, partition: partition)
    }

    /// The same for a file `FirmwareImage.read` claimed (`ImageFormat.Detector.espAppImage`),
    /// from the bytes it read.
    public static func load(_ claimed: ClaimedImage, protocolName: String, registry: ProtocolRegistry, chip: ESPChip? = nil,
                            partition: ESPPartitionLimit? = nil) throws(OTAError) -> Loaded {
        let firmware: FirmwareImage
        do {
            firmware = try claimed.firmware()
        } catch {
            throw OTAError(.image, "\(error)")
        }
        return try load(firmware, protocolName: protocolName, registry: registry, chip: chip, partition: partition)
    }

    /// The same for the bytes of the file `firmware.source`.
    static func load(_ firmware: FirmwareImage, protocolName: String, registry: ProtocolRegistry, chip: ESPChip?,
                     partition: ESPPartitionLimit?) throws(OTAError) -> Loaded {
        let path = firmware.source
        func resolve(_ format: ImageFormat.Kind) throws(OTAError) -> ProtocolRegistry.Resolution {
            do {
                return try registry.resolve(protocolName, format: format)
            } catch {
                throw OTAError(error.code, "\(path): \(error.message)", hint: error.hint)
            }
        }
        if ESPEncryptedImage.isEncrypted(firmware.bytes) {
            let encrypted: ESPEncryptedImage
            let sizeWarnings: [String]
            do {
                encrypted = try ESPEncryptedImage(bytes: firmware.bytes, source: path)
                sizeWarnings = try ESPPartitionLimit.check(appSize: encrypted.appSize, source: path, limit: partition)
            } catch {
                throw error.otaError
            }
            let resolution = try resolve(.espAppImage)
            let chipWarning = chip.map { ["--chip \($0) cannot be checked against \(path): the chip it is built for is inside the encryption"] } ?? []
            let plan = UpdatePlan(parts: [UpdatePlan.Part(firmware: encrypted.firmware, profile: resolution.profile, label: "app")],
                                  format: .espAppImage, reason: resolution.reason,
                                  contents: "; a pre-encrypted image (esp_encrypted_img) of a \(encrypted.appSize)-byte app image")
            return Loaded(plan: plan, warnings: encrypted.warnings + chipWarning + sizeWarnings, version: nil)
        }
        let image: ESPAppImage
        do {
            image = try ESPAppImage(bytes: firmware.bytes, source: path)
        } catch {
            if let raw = rawFallback(firmware, damage: error, protocolName: protocolName, registry: registry) { return raw }
            throw error.otaError
        }
        let resolution = try resolve(.espAppImage)
        let sizeWarnings: [String]
        do {
            try image.check(chip: chip)
            sizeWarnings = try ESPPartitionLimit.check(appSize: image.size, source: path, limit: partition)
        } catch {
            throw error.otaError
        }
        let contents = "; an ESP-IDF app image for \(image.chip), \(image.segments.count) segments"
            + (image.version.map { ", version \($0)" } ?? "") + (image.hashAppended ? ", SHA-256 appended" : "")
            + (partition.map { ", fits \($0.what) (\($0.size) bytes)" } ?? "")
        let plan = UpdatePlan(parts: [UpdatePlan.Part(firmware: image.firmware, profile: resolution.profile, label: "app")],
                              format: .espAppImage, reason: resolution.reason, contents: contents)
        return Loaded(plan: plan, warnings: image.warnings + sizeWarnings, version: image.version.flatMap(FirmwareVersion.init))
    }

    /// A file that starts with the app image magic but does not check out, asked by name to go over
    /// a protocol that sends raw binaries: sent as one, with a warning. Nil: refuse it.
    static func rawFallback(_ firmware: FirmwareImage, damage: ESPImageError, protocolName: String, registry: ProtocolRegistry) -> Loaded? {
        guard protocolName != ProtocolRegistry.auto, damage.code == .image, firmware.bytes.first == ESPAppImage.magic,
              ESPAppImage.otherBuildFile(firmware.bytes, source: firmware.source) == nil,
              registry.profile(named: protocolName)?.imageFormats.contains(.rawBinary) == true,
              let resolution = try? registry.resolve(protocolName, format: .rawBinary) else { return nil }
        let plan = UpdatePlan(parts: [UpdatePlan.Part(firmware: firmware, profile: resolution.profile, label: "app")],
                              format: .rawBinary, reason: resolution.reason)
        return Loaded(plan: plan, warnings: ["\(firmware.source) starts with 0xE9 like an ESP-IDF app image, but is none (\(damage.description)); it is sent as a raw binary, as --protocol \(protocolName) asks"],
                      version: nil)
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
