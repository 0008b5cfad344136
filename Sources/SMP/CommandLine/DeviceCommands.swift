import ArgumentParser
import Foundation
import GATT
import OTA
import OTADevice
import OTACommandLine
import OTAWire
import Simulator

// SMP's own device commands: MCUmgr's image management, reset and echo. Generic over the command
// line's `DeviceCommandContext`, which names and reaches the device and prints.

extension ProtocolCommandLine {
    /// `otaflash image`, `reset` and `echo`, for the command line's context.
    static func smpCommands(_ context: any DeviceCommandContext.Type) -> [any ParsableCommand.Type] {
        func commands<Context: DeviceCommandContext>(_: Context.Type) -> [any ParsableCommand.Type] {
            [ImageCommand<Context>.self, ResetCommand<Context>.self, EchoCommand<Context>.self, FilesCommand<Context>.self]
        }
        return commands(context)
    }

    /// An example of each event the SMP commands print.
    static let smpEventSamples: [EventSample] = {
        let device = "AA:BB:CC:DD:EE:FF"
        return [EventSample("otaflash image", ImageEvents.Slot(device: device, image: 0, slot: 0, version: "1.0.0", hash: String(repeating: "ab", count: 32),
                                                                bootable: true, pending: false, confirmed: true, active: true, permanent: false)),
                EventSample("otaflash image", ImageEvents.SlotInfo(device: device, image: 0, slot: 1, size: 483_328, uploadImageId: 0, maxImageSize: nil)),
                EventSample("otaflash image", ImageEvents.Echo(device: device, text: "hello")),
                EventSample("otaflash image", ImageEvents.Done())] + fileEventSamples
    }()
}

/// What the SMP commands (`image list|slots|test|confirm|erase`, `reset`, `echo`, `files`)
/// share: the device and output (the command line's `Context`), the simulated SMP device's
/// options (as `flash --simulator` takes them) and the reply timeout.
struct SMPCommandOptions<Context: DeviceCommandContext>: ParsableArguments {
    @OptionGroup var context: Context

    @OptionGroup(title: "SMP device (with --simulator)") var simulated: SimulatedSMPOptions

    @Option(name: .customLong("reply-timeout"), parsing: .unconditional, help: Ranges.replyTimeout.help("Seconds to wait for the device's answer", valueName: "seconds"))
    var replyTimeout: Double = 5

    func validate() throws {
        try Ranges.replyTimeout.check(replyTimeout)
        if !context.simulates, let option = simulated.given.first {
            throw ValidationError("\(option) sets up the simulated SMP device; add --simulator, or drop it to reach a real device")
        }
    }

    /// Runs the command's work, then its `done` line.
    func run(_ work: (any CommandOutput) async throws -> Void) async throws {
        try await context.run(ImageEvents.Done.self, work)
    }

    /// Connects, attaches to the SMP characteristic, runs `body` with the client, disconnects.
    /// With `--simulator`, the device is a Zephyr one with an SMP server as the `--sim-smp-*`
    /// options describe it, running an image of `--sim-firmware-version`, with `fileSystem`'s
    /// files and `faults` (by default the simulated device's).
    /// - Throws: `CLIFailure` with the failure's exit code.
    func withClient<T: Sendable>(fileSystem: SMPFileSystem.Config = SMPFileSystem.Config(), faults: FaultPlan? = nil,
                                 _ body: (SMPClient, Duration) async throws(OTAError) -> T) async throws -> T {
        let simulated = simulated
        let key = try simulated.signatureKey()
        let (connection, address) = try await context.connect { config in
            simulated.peripheral(slotSize: config.slotSize, firmwareVersion: config.firmwareVersion, signatureKey: key,
                                 faults: faults ?? config.faults, resetDelay: config.bootDelay, fileSystem: fileSystem)
        }
        defer { Task { await connection.disconnect() } }
        do {
            let client: SMPClient
            do {
                client = try await SMPClient.attach(to: connection, device: address.description)
            } catch {
                throw OTAError.from(error, device: address.description)
            }
            let result = try await body(client, Ranges.replyTimeout.duration(replyTimeout))
            await connection.disconnect()
            return result
        } catch let error as OTAError {
            throw CLIFailure(error)
        }
    }
}

/// `otaflash image`: MCUmgr's image management on a device that runs an SMP server.
struct ImageCommand<Context: DeviceCommandContext>: AsyncParsableCommand {
    static var configuration: CommandConfiguration {
        CommandConfiguration(
            commandName: "image",
            abstract: "Read and change the image slots of an SMP (MCUmgr) device: list, test, confirm, erase.",
            discussion: """
                A device running Zephyr or nRF Connect SDK with MCUboot keeps two slots: the image it runs \
                and the one uploaded next. After `otaflash --protocol smp` uploaded an image, `image test` \
                marks it to run once after the next reset and `image confirm` keeps it for good.

                Examples:
                  otaflash image list --device AA:BB:CC:DD:EE:FF
                  otaflash image confirm --device AA:BB:CC:DD:EE:FF
                  otaflash image test --device AA:BB:CC:DD:EE:FF --hash 4f2a…
                """,
            subcommands: [ImageList<Context>.self, ImageSlots<Context>.self, ImageTest<Context>.self, ImageConfirm<Context>.self, ImageErase<Context>.self]
        )
    }
}

/// Prints the slot list, as a table for people and one `slot` event per slot.
func printSlots(_ states: SMPImageStates, device: String, printer: any CommandOutput) {
    for slot in states.images {
        printer.json(ImageEvents.Slot(device: device, image: Int(slot.image ?? 0), slot: Int(slot.slot), version: slot.version,
                                      hash: slot.hash.map(hexString), bootable: slot.bootable, pending: slot.pending,
                                      confirmed: slot.confirmed, active: slot.active, permanent: slot.permanent))
    }
    let flags: (SMPImageSlot) -> String = { slot in
        [slot.active ? "active" : nil, slot.confirmed ? "confirmed" : nil, slot.pending ? "pending" : nil,
         slot.permanent ? "permanent" : nil, slot.bootable ? "bootable" : nil].compactMap { $0 }.joined(separator: ",")
    }
    printer.table([["image", "slot", "version", "flags", "hash"]] + states.images.map { slot in
        ["\(slot.image ?? 0)", "\(slot.slot)", slot.version, flags(slot), slot.hash.map(hexString) ?? "-"]
    })
}

struct ImageList<Context: DeviceCommandContext>: AsyncParsableCommand {
    static var configuration: CommandConfiguration {
        CommandConfiguration(commandName: "list", abstract: "List the device's image slots (MCUmgr image state read).")
    }

    @OptionGroup var options: SMPCommandOptions<Context>

    func run() async throws {
        try await options.run { printer in
            let (states, device) = try await options.withClient { (client, timeout) async throws(OTAError) in
                (try await client.imageStates(.imageStateRead, timeout: timeout), client.device)
            }
            printSlots(states, device: device, printer: printer)
        }
    }
}

/// A hash given in hex, or taken from an MCUboot image file.
struct ImageHashOptions: ParsableArguments {
    @Option(name: .long, help: ArgumentHelp("The image's hash (hex, as `image list` shows it).", valueName: "hex"))
    var hash: String?

    func validate() throws {
        if let hash, Self.bytes(hash) == nil {
            throw ValidationError("--hash must be 32, 48 or 64 bytes of hex (as `otaflash image list` shows), got '\(hash)'")
        }
    }

    static func bytes(_ text: String) -> [UInt8]? {
        let digits = Array(text.utf8)
        guard [64, 96, 128].contains(digits.count) else { return nil }
        var out: [UInt8] = []
        for i in stride(from: 0, to: digits.count, by: 2) {
            guard let byte = UInt8(String(decoding: digits[i..<(i + 2)], as: UTF8.self), radix: 16) else { return nil }
            out.append(byte)
        }
        return out
    }
}

struct ImageTest<Context: DeviceCommandContext>: AsyncParsableCommand {
    static var configuration: CommandConfiguration {
        CommandConfiguration(
            commandName: "test",
            abstract: "Mark an uploaded image to run once after the next reset; MCUboot reverts it unless it is confirmed.")
    }

    @OptionGroup var options: SMPCommandOptions<Context>
    @OptionGroup var image: ImageHashOptions

    func validate() throws {
        guard image.hash != nil else { throw ValidationError("image test needs --hash: the hash of the uploaded image (`otaflash image list` shows it)") }
    }

    func run() async throws {
        let hash = ImageHashOptions.bytes(image.hash ?? "") ?? []
        try await options.run { printer in
            let (states, device) = try await options.withClient { (client, timeout) async throws(OTAError) in
                (try await client.imageStates(.imageStateWrite(hash: hash, confirm: false), timeout: timeout), client.device)
            }
            printSlots(states, device: device, printer: printer)
            printer.result("\(device): image \(hexString(hash)) runs after the next reset (otaflash reset), until then it can be erased")
        }
    }
}

struct ImageConfirm<Context: DeviceCommandContext>: AsyncParsableCommand {
    static var configuration: CommandConfiguration {
        CommandConfiguration(
            commandName: "confirm",
            abstract: "Confirm the running image (or the one with --hash), so MCUboot keeps it after a reset.")
    }

    @OptionGroup var options: SMPCommandOptions<Context>
    @OptionGroup var image: ImageHashOptions

    func run() async throws {
        let hash = image.hash.flatMap(ImageHashOptions.bytes)
        try await options.run { printer in
            let (states, device) = try await options.withClient { (client, timeout) async throws(OTAError) in
                (try await client.imageStates(.imageStateWrite(hash: hash, confirm: true), timeout: timeout), client.device)
            }
            printSlots(states, device: device, printer: printer)
            printer.result("\(device): \(hash.map { "image \(hexString($0))" } ?? "the running image") confirmed")
        }
    }
}

struct ImageErase<Context: DeviceCommandContext>: AsyncParsableCommand {
    static var configuration: CommandConfiguration {
        CommandConfiguration(commandName: "erase", abstract: "Erase the device's upload slot (never the running image).")
    }

    @OptionGroup var options: SMPCommandOptions<Context>

    @Option(name: .long, parsing: .unconditional, help: SMPRanges.slot.help("The slot to erase (default: the device's upload slot)", valueName: "n"))
    var slot: Int?

    func validate() throws {
        try SMPRanges.slot.check(slot)
    }

    func run() async throws {
        let slot = slot.map { UInt32($0) }
        try await options.run { printer in
            let device = try await options.withClient { (client, timeout) async throws(OTAError) in
                _ = try await client.call(.imageErase(slot: slot), timeout: timeout)
                return client.device
            }
            printer.result("\(device): \(slot.map { "slot \($0)" } ?? "the upload slot") erased")
        }
    }
}

struct ResetCommand<Context: DeviceCommandContext>: AsyncParsableCommand {
    static var configuration: CommandConfiguration {
        CommandConfiguration(
            commandName: "reset",
            abstract: "Reset an SMP (MCUmgr) device; MCUboot then swaps in an image marked for test or confirmed.")
    }

    @OptionGroup var options: SMPCommandOptions<Context>

    @Flag(name: .long, help: "Reset even when the device says it is busy.")
    var force = false

    func run() async throws {
        try await options.run { printer in
            let device = try await options.withClient { (client, timeout) async throws(OTAError) in
                _ = try await client.call(.reset(force: force), timeout: timeout)
                return client.device
            }
            printer.result("\(device): resetting")
        }
    }
}

struct EchoCommand<Context: DeviceCommandContext>: AsyncParsableCommand {
    static var configuration: CommandConfiguration {
        CommandConfiguration(
            commandName: "echo",
            abstract: "Send text to an SMP (MCUmgr) device and print what it echoes: a check that its SMP server answers.")
    }

    @OptionGroup var options: SMPCommandOptions<Context>

    @Argument(help: ArgumentHelp("The text to send (at most 256 bytes).", valueName: "text"))
    var text: String

    func validate() throws {
        guard !text.isEmpty, text.utf8.count <= 256 else {
            throw ValidationError("the text must be 1 to 256 bytes, got \(text.utf8.count)")
        }
    }

    func run() async throws {
        try await options.run { printer in
            let (answer, device) = try await options.withClient { (client, timeout) async throws(OTAError) in
                guard case .echo(let r) = try await client.call(.echo(text), timeout: timeout) else {
                    throw OTAError(.protocolError, "\(client.device) answered the echo with something else")
                }
                return (r, client.device)
            }
            printer.json(ImageEvents.Echo(device: device, text: answer))
            printer.result(answer)
        }
    }
}

/// `otaflash image slots`: img_mgmt's slot info (image group, command 6): each image's slots,
/// their sizes and the one an upload goes to.
struct ImageSlots<Context: DeviceCommandContext>: AsyncParsableCommand {
    static var configuration: CommandConfiguration {
        CommandConfiguration(
            commandName: "slots",
            abstract: "Show the device's image slots: their sizes and which one takes an upload (MCUmgr image slot info).")
    }

    @OptionGroup var options: SMPCommandOptions<Context>

    func run() async throws {
        try await options.run { printer in
            let (info, device) = try await options.withClient { (client, timeout) async throws(OTAError) in
                let answer = try await client.send(.imageSlotInfo, timeout: timeout)
                switch answer {
                case .slotInfo(let info):
                    return (info, client.device)
                case .error(let e) where e.general == .notSupported:
                    throw OTAError(.incompatibleDevice, "\(client.device) does not answer the image slot info (an older SMP server, or one built without CONFIG_MCUMGR_GRP_IMG_SLOT_INFO); otaflash image list shows the images in its slots")
                case .error(let e):
                    throw e.otaError(device: client.device, request: "the image slot info read")
                default:
                    throw OTAError(.protocolError, "\(client.device) answered the image slot info read with \(answer)")
                }
            }
            for image in info.images {
                for slot in image.slots {
                    printer.json(ImageEvents.SlotInfo(device: device, image: Int(image.image), slot: Int(slot.slot), size: slot.size.map { Int(clamping: $0) },
                                                      uploadImageId: slot.uploadImageID.map(Int.init),
                                                      maxImageSize: image.maxImageSize.map { Int(clamping: $0) }))
                }
            }
            printer.table([["image", "slot", "size", "upload"]] + info.images.flatMap { image in
                image.slots.map { slot in
                    ["\(image.image)", "\(slot.slot)", slot.size.map { formatBytes(Int(clamping: $0)) } ?? "-",
                     slot.uploadImageID.map { "image \($0)" } ?? "-"]
                }
            })
        }
    }
}

public enum ImageEvents {
    /// One image slot of an SMP device (`image list`, `test`, `confirm`).
    public struct Slot: JSONEvent {
        public static let name = "slot"
        public var device: String
        public var image: Int
        public var slot: Int
        public var version: String
        public var hash: String?
        public var bootable: Bool
        public var pending: Bool
        public var confirmed: Bool
        public var active: Bool
        public var permanent: Bool
    }

    public struct Echo: JSONEvent {
        public static let name = "echo"
        public var device: String
        public var text: String
    }

    public struct Done: CommandDone {
        public static let name = "done"
        public var result = EventResult.ok
        public var exitCode = 0
        public var error: String?
        public var message: String?

        public init() {}
    }
}

extension ImageEvents {
    /// One slot of `image slots`.
    public struct SlotInfo: JSONEvent {
        public static let name = "slot_info"
        public var device: String
        public var image: Int
        public var slot: Int
        public var size: Int?
        public var uploadImageId: Int?
        public var maxImageSize: Int?
    }
}
