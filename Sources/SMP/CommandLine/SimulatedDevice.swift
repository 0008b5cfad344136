import ArgumentParser
import Foundation
import GATT
import OTA
import OTACommandLine
import OTADevice
import OTAWire
import Simulator

/// The simulated SMP device (`SMPPeripheral`): a Zephyr SMP server with MCUboot's two slots.
enum SimulatedSMP {
    /// A device with `config`'s address, link, faults and boot delay, two slots of `config`'s slot
    /// size, slot 0 running `config`'s firmware version, and the server `options` describe (its
    /// buffers and its refusals; without them Zephyr's defaults: 4 × 384 B buffers, no refusal).
    /// - Throws: `CLIFailure` `.usage` when `--sim-smp-key` names no readable key.
    static func device(config: SimulatedDeviceConfig, options: SimulatedSMPOptions? = nil) throws(CLIFailure) -> SimulatedDevice {
        let options = options ?? SimulatedSMPOptions()
        return SimulatedDevice(config, model: options.peripheral(slotSize: config.slotSize, firmwareVersion: config.firmwareVersion,
                                                                 signatureKey: try options.signatureKey(), faults: config.faults,
                                                                 resetDelay: config.bootDelay))
    }

    /// The key in the PEM file at `path` (given with `option`) that the simulated MCUboot checks
    /// signatures with: ECDSA P-256 or Ed25519, public or private (imgtool's files).
    ///
    /// - Throws: `CLIFailure` `.usage` when the file cannot be read or holds no such key.
    static func signatureKey(file path: String, option: String) throws(CLIFailure) -> MCUbootImage.PublicKey {
        guard let data = FileManager.default.contents(atPath: path) else {
            throw CLIFailure(.usage, "\(option) \(path) cannot be read; give the PEM file of the key MCUboot checks signatures with (imgtool getpub -e pem -k KEY)")
        }
        do {
            return try MCUbootImage.PublicKey(pem: String(decoding: data, as: UTF8.self), source: path)
        } catch {
            throw CLIFailure(.usage, "\(option) \(path) is not an ECDSA P-256 or Ed25519 key in PEM form; give the key from imgtool keygen -t ecdsa-p256|ed25519 or imgtool getpub -e pem")
        }
    }
}

/// The simulated SMP device's buffers and refusals (`--simulator` with an MCUboot image): each
/// refusal is what a real Zephyr device with MCUboot answers in that state or configuration.
public struct SimulatedSMPOptions: ParsableArguments, Sendable {
    @Option(name: .customLong("sim-smp-buf-size"), parsing: .unconditional, help: SMPRanges.bufferSize.help("The simulated SMP server's buffer size (MCUmgr buf_size)", valueName: "bytes"))
    var bufferSize = 384

    @Option(name: .customLong("sim-smp-buf-count"), parsing: .unconditional, help: SMPRanges.bufferCount.help("The simulated SMP server's buffer count (MCUmgr buf_count)", valueName: "n"))
    var bufferCount = 4

    @Flag(name: .customLong("sim-smp-pending"), help: "The simulated SMP device's slot 1 holds an image marked for test, waiting for a reset: an upload is refused with NO_FREE_SLOT (9).")
    var pending = false

    @Flag(name: .customLong("sim-smp-unconfirmed"), help: "The simulated SMP device runs an unconfirmed test image (slot 1 holds the one to revert to): an upload is refused with NO_FREE_SLOT (9).")
    var unconfirmed = false

    @Flag(name: .customLong("sim-smp-downgrade-check"), help: "The simulated SMP server refuses an image not newer than the running one with CURRENT_VERSION_IS_NEWER (27); see --sim-firmware-version.")
    var downgradeCheck = false

    @Flag(name: .customLong("sim-smp-busy"), help: "The simulated SMP server answers every upload request with MGMT_ERR_EBUSY (10).")
    var busy = false

    @Option(name: .customLong("sim-smp-busy-above"), parsing: .unconditional, help: SMPRanges.busyAbove.help("The simulated SMP server reports --sim-smp-buf-count buffers but answers an upload request with MGMT_ERR_EBUSY (10) when it finds this many requests still held (a buffer pool shared with other users); otaflash goes on with one request in flight. Use with --sim-slow-flash-ms, or no request is ever held", valueName: "n"))
    var busyAbove: Int?

    @Option(name: .customLong("sim-smp-erase-seconds"), parsing: .unconditional, help: SMPRanges.eraseSeconds.help("The simulated SMP server erases its slot for this long at a new upload's first request, before it answers (Zephyr's img_mgmt without progressive erase: 20-40 s for 1 MiB on nRF52/nRF5340)", valueName: "s"))
    var eraseSeconds: Double = 0

    @Option(name: .customLong("sim-smp-refuse-upload"), parsing: .unconditional, help: SMPRanges.refuseUpload.help("The simulated SMP server refuses the first upload request with this image management error code (3 no image, 24 invalid hash, 30 too large, 31 data overrun…)", valueName: "rc"))
    var refuseUpload: Int?

    @Flag(name: .customLong("sim-smp-no-params"), help: "The simulated SMP server is an older one that does not answer the MCUmgr parameters read (MGMT_ERR_ENOTSUP): one request in flight, one write each.")
    var noParameters = false

    @Option(name: .customLong("sim-smp-cbor"), help: SMPReplyEncoding.help)
    var cbor: SMPReplyEncoding?

    @Option(name: .customLong("sim-smp-key"), help: ArgumentHelp("The simulated MCUboot checks each image's signature with this key (PEM, ECDSA P-256 or Ed25519, public or private, as imgtool writes it) before it swaps the image in, and refuses one that does not verify (default: the hash only).", valueName: "pem"), completion: .file(extensions: ["pem"]))
    var key: String?

    @Option(name: .customLong("sim-smp-mode"), help: SimulatedBootMode.help)
    var mode: SimulatedBootMode?

    @Flag(name: .customLong("sim-smp-no-downgrade"), help: "The simulated MCUboot prevents downgrades: it does not boot an image older than the running one (it erases it), and the bootloader info says no-downgrade.")
    var noDowngrade = false

    @Flag(name: .customLong("sim-smp-network-core"), help: "The simulated SMP device is an nRF5340 with two images: image 1 is its network core, which takes its update at the application core's reset (and skips it when the application core's image was marked first, as MCUboot does).")
    var networkCore = false

    @Flag(name: .customLong("sim-smp-crashing-image"), help: "The image the simulated MCUboot swaps in for test is broken: asked for an SMP echo it crashes and its watchdog resets the device, so MCUboot reverts it (see --confirm-after-check).")
    var crashingImage = false

    public init() {}

    public func validate() throws {
        try SMPRanges.bufferSize.check(bufferSize)
        try SMPRanges.bufferCount.check(bufferCount)
        try SMPRanges.refuseUpload.check(refuseUpload)
        try SMPRanges.busyAbove.check(busyAbove)
        try SMPRanges.eraseSeconds.check(eraseSeconds)
        if pending, unconfirmed {
            throw ValidationError("--sim-smp-pending and --sim-smp-unconfirmed are two states of slot 1; give one")
        }
    }

    /// The options given, by name: each sets up a simulated SMP device, which only an MCUboot image reaches.
    public static let names: Set<String> = ["--sim-smp-buf-size", "--sim-smp-buf-count", "--sim-smp-pending", "--sim-smp-unconfirmed",
                                     "--sim-smp-downgrade-check", "--sim-smp-busy", "--sim-smp-refuse-upload", "--sim-smp-busy-above",
                                     "--sim-smp-no-params", "--sim-smp-cbor", "--sim-smp-key",
                                     "--sim-smp-crashing-image", "--sim-smp-mode", "--sim-smp-no-downgrade", "--sim-smp-network-core",
                                     "--sim-smp-erase-seconds"]

    var given: [String] {
        [bufferSize != 384 ? "--sim-smp-buf-size" : nil, bufferCount != 4 ? "--sim-smp-buf-count" : nil,
         pending ? "--sim-smp-pending" : nil, unconfirmed ? "--sim-smp-unconfirmed" : nil,
         downgradeCheck ? "--sim-smp-downgrade-check" : nil, busy ? "--sim-smp-busy" : nil,
         refuseUpload != nil ? "--sim-smp-refuse-upload" : nil, busyAbove != nil ? "--sim-smp-busy-above" : nil, noParameters ? "--sim-smp-no-params" : nil,
         cbor != nil ? "--sim-smp-cbor" : nil, key != nil ? "--sim-smp-key" : nil,
         crashingImage ? "--sim-smp-crashing-image" : nil, mode != nil ? "--sim-smp-mode" : nil,
         noDowngrade ? "--sim-smp-no-downgrade" : nil, networkCore ? "--sim-smp-network-core" : nil,
         eraseSeconds > 0 ? "--sim-smp-erase-seconds" : nil].compactMap { $0 }
    }

    /// What slot 1 holds at the start.
    var leftover: SMPLeftover? { pending ? .pending : unconfirmed ? .unconfirmed : nil }

    /// The key `--sim-smp-key` names, read from its file.
    /// - Throws: `CLIFailure` `.usage` when the file holds no such key.
    func signatureKey() throws(CLIFailure) -> MCUbootImage.PublicKey? {
        try key.map { path throws(CLIFailure) in try SimulatedSMP.signatureKey(file: path, option: "--sim-smp-key") }
    }

    /// The device these options describe: `flash --simulator`'s, `simulate`'s and the device
    /// commands' (with `fileSystem`'s files), its slot 0 running `firmwareVersion`.
    func peripheral(slotSize: Int, firmwareVersion: FirmwareVersion, signatureKey: MCUbootImage.PublicKey?, faults: FaultPlan,
                    resetDelay: Duration = .milliseconds(100), fileSystem: SMPFileSystem.Config = SMPFileSystem.Config()) -> SMPPeripheral {
        var server = serverConfig(slotSize: slotSize)
        server.fileSystem = fileSystem
        var device = SMPPeripheral(config: server, firmwareVersion: firmwareVersion, leftover: leftover, signatureKey: signatureKey,
                                   faults: faults, resetDelay: resetDelay)
        device.eraseTime = SMPRanges.eraseSeconds.duration(eraseSeconds)
        return device
    }

    /// The server these options describe, with slots of `slotSize` bytes.
    func serverConfig(slotSize: Int) -> SMPServer.Config {
        var config = SMPServer.Config(bufferSize: bufferSize, bufferCount: bufferCount, slotSize: slotSize, reportsParameters: !noParameters,
                         refusesDowngrade: downgradeCheck, busy: busy, busyAbove: busyAbove,
                         uploadRefusal: refuseUpload.map { ImageManagementError(rawValue: Int64($0)) }, encoding: cbor ?? .zephyr)
        config.testImageCrashes = crashingImage
        config.networkCore = networkCore
        SimulatedBootMode.configure(&config, mode: mode, noDowngrade: noDowngrade)
        return config
    }
}

/// `otaflash simulate`'s options for an SMP server: its buffers, encoding, MCUboot mode and
/// refusals, as `flash --simulator` takes them, and their former names.
public struct SMPServedOptions: ServedOptionGroup {
    @OptionGroup(title: "SMP device") var device: SimulatedSMPOptions

    @Option(name: .customLong("buf-size"), parsing: .unconditional, help: ArgumentHelp("The former name of --sim-smp-buf-size.", visibility: .hidden))
    var formerBufferSize: Int?
    @Option(name: .customLong("buf-count"), parsing: .unconditional, help: ArgumentHelp("The former name of --sim-smp-buf-count.", visibility: .hidden))
    var formerBufferCount: Int?
    // Taken as text: ArgumentParser names the values of a hidden option's type in no refusal.
    @Option(name: .customLong("cbor"), help: ArgumentHelp("The former name of --sim-smp-cbor.", visibility: .hidden))
    var formerCBOR: String?

    public init() {}

    public static var commandLine: ProtocolCommandLine { .smp }

    public func validate() throws {
        try SMPRanges.formerBufferSize.check(formerBufferSize)
        try SMPRanges.formerBufferCount.check(formerBufferCount)
        try checkChoice(formerCBOR, SMPReplyEncoding.self, option: "--cbor")
        let given = Set(device.given)
        for (former, formerGiven, current) in [("--buf-size", formerBufferSize != nil, "--sim-smp-buf-size"),
                                               ("--buf-count", formerBufferCount != nil, "--sim-smp-buf-count"),
                                               ("--cbor", formerCBOR != nil, "--sim-smp-cbor")] where formerGiven && given.contains(current) {
            throw ValidationError("\(former) is the former name of \(current); give \(current) once")
        }
    }

    public var given: [String] {
        device.given + [("--buf-size", formerBufferSize != nil), ("--buf-count", formerBufferCount != nil), ("--cbor", formerCBOR != nil)]
            .filter(\.1).map(\.0)
    }

    /// The options with their former names folded in.
    var options: SimulatedSMPOptions {
        var options = device
        if let formerBufferSize { options.bufferSize = formerBufferSize }
        if let formerBufferCount { options.bufferCount = formerBufferCount }
        if let cbor = formerCBOR.flatMap(SMPReplyEncoding.init(argument:)) { options.cbor = cbor }
        return options
    }

    public func served(_ request: ServeRequest) throws -> ServedDevice {
        let options = options
        let version = request.firmwareVersion.flatMap(FirmwareVersion.init) ?? FirmwareVersion(major: 1, minor: 0, patch: 0)
        let model = options.peripheral(slotSize: request.slotSize, firmwareVersion: version, signatureKey: try options.signatureKey(),
                                       faults: request.faults)
        let server = model.server.config
        return ServedDevice(model: model, name: request.name ?? "otaflash-smp", firmwareVersion: model.server.primary.versionText,
                            what: "SMP server (MCUmgr with MCUboot, \(server.bufferCount) × \(server.bufferSize) B buffers, \(server.encoding) answers)")
    }
}

/// `--sim-smp-cbor` and `simulate --cbor`: how the simulated SMP server writes its answers.
extension SMPReplyEncoding: ExpressibleByArgument {
    public static let help = ArgumentHelp(
        "How the simulated SMP server encodes its answers: zcbor (default: Zephyr 3.x and later, indefinite-length maps in its handlers' field order, no rc on success), tinycbor (mcumgr on Mynewt or Zephyr up to 2.7: indefinite lengths, rc 0 in answers, general error codes only, no MCUmgr parameters read), indefinite (otaflash's fields in its own order, indefinite lengths) or definite (canonical CBOR).",
        valueName: "zcbor|tinycbor|indefinite|definite")
}

/// `--sim-smp-mode`: the simulated MCUboot's mode, which its bootloader info then reports.
public enum SimulatedBootMode: String, ExpressibleByArgument, CaseIterable, Sendable {
    case swap, swapMove = "swap-move", swapOffset = "swap-offset", overwrite
    case directXIP = "direct-xip", directXIPRevert = "direct-xip-revert"

    var mode: SMPBootloaderMode {
        switch self {
        case .swap: .swapScratch
        case .swapMove: .swapMove
        case .swapOffset: .swapOffset
        case .overwrite: .overwriteOnly
        case .directXIP: .directXIP
        case .directXIPRevert: .directXIPWithRevert
        }
    }

    public static let help = ArgumentHelp(
        "The simulated MCUboot's mode, reported by its bootloader info (OS 8): swap, swap-move, swap-offset (test, then revert unless confirmed), overwrite (the image is copied over the running one and kept: no test, no revert), direct-xip (uploads go to the slot not running; the highest version boots; no test) or direct-xip-revert (as direct-xip, marked for test and reverted unless confirmed). Without it the device answers no bootloader info, as an older one (a swap mode).",
        valueName: allCases.map(\.rawValue).joined(separator: "|"))

    /// Sets `config`'s MCUboot: `mode` (answering the bootloader info) and downgrade prevention.
    static func configure(_ config: inout SMPServer.Config, mode: SimulatedBootMode?, noDowngrade: Bool) {
        if let mode {
            config.mode = mode.mode
            config.reportsBootloaderInfo = true
        }
        if noDowngrade {
            config.noDowngrade = true
            config.reportsBootloaderInfo = true
        }
    }
}
