import ArgumentParser
import Foundation
import GATT
import OTA
import OTACommandLine
import OTADevice

// `otaflash files put|get|hash|stat`: MCUmgr's file management (fs_mgmt, group 8) on a device
// that runs an SMP server, so a line can put a certificate or a configuration next to the firmware.

extension ProtocolCommandLine {
    /// An example of each event `otaflash files` prints.
    static let fileEventSamples: [EventSample] = {
        let device = "AA:BB:CC:DD:EE:FF"
        return [EventSample("otaflash files", FileEvents.Progress(device: device, path: "/lfs/cert.pem", bytes: 1024, total: 2048, rate: 4000, elapsed: 0.25)),
                EventSample("otaflash files", FileEvents.File(device: device, path: "/lfs/cert.pem", operation: "put", size: 2048,
                                                              check: "sha256", digest: String(repeating: "ab", count: 32), seconds: 0.5)),
                EventSample("otaflash files", FileEvents.Hash(device: device, path: "/lfs/cert.pem", type: "crc32", offset: 0, length: 2048, output: "a1206a16")),
                EventSample("otaflash files", FileEvents.Status(device: device, path: "/lfs/cert.pem", size: 2048)),
                EventSample("otaflash files", ImageEvents.Done())]
    }()
}

public enum FileEvents {
    /// A transfer's progress (`put`, `get`): at most about twenty per file.
    public struct Progress: JSONEvent {
        public static let name = "progress"
        public var device: String
        public var path: String
        public var bytes: Int
        public var total: Int
        public var rate: Double
        public var elapsed: Double
    }

    /// A file put (and checked) or got.
    public struct File: JSONEvent {
        public static let name = "file"
        public var device: String
        public var path: String
        public var operation: String
        public var size: Int
        public var check: String?
        public var digest: String?
        public var seconds: Double
    }

    public struct Hash: JSONEvent {
        public static let name = "file_hash"
        public var device: String
        public var path: String
        public var type: String
        public var offset: Int
        public var length: Int
        public var output: String
    }

    public struct Status: JSONEvent {
        public static let name = "file_status"
        public var device: String
        public var path: String
        public var size: Int
    }
}

/// The simulated device's file system (`--simulator`): files on it at power-on, its size, the
/// hash types built in.
struct SimulatedFileSystemOptions: ParsableArguments {
    static let size = Bounds("--sim-smp-fs-size", 0...(64 << 20))

    @Option(name: .customLong("sim-smp-file"), parsing: .unconditionalSingleValue,
            help: ArgumentHelp("A file on the simulated device at power-on: its path there and the local file it holds, e.g. /lfs/cert.pem=cert.pem; repeatable.", valueName: "remote=local"))
    var files: [String] = []

    @Option(name: .customLong("sim-smp-fs-size"), parsing: .unconditional, help: size.help("Bytes the simulated device's file system holds (default 65536); a write past it fails as on a full LittleFS (fs_mgmt error 10)", valueName: "bytes"))
    var fsSize: Int?

    @Option(name: .customLong("sim-smp-fs-disconnect-at"), parsing: .unconditional, help: size.help("The simulated device drops the link when a file upload or download reaches this offset", valueName: "offset"))
    var disconnectAt: Int?

    @Flag(name: .customLong("sim-smp-fs-no-sha256"), help: "The simulated device is built without fs_mgmt's SHA-256 (crc32 only): `files put` checks the upload by CRC32.")
    var noSHA256 = false

    func validate() throws {
        try Self.size.check(fsSize)
        try Bounds("--sim-smp-fs-disconnect-at", Self.size.range).check(disconnectAt)
        for entry in files {
            let parts = entry.split(separator: "=", maxSplits: 1).map(String.init)
            guard parts.count == 2, parts[0].hasPrefix("/"), !parts[1].isEmpty else {
                throw ValidationError("--sim-smp-file takes REMOTE=LOCAL with an absolute REMOTE path, e.g. /lfs/cert.pem=cert.pem, got '\(entry)'")
            }
        }
    }

    /// The file system these options describe.
    /// - Throws: `CLIFailure` `.usage` for a `--sim-smp-file` whose local file cannot be read.
    func config() throws(CLIFailure) -> SMPFileSystem.Config {
        var config = SMPFileSystem.Config()
        if let fsSize { config.capacity = fsSize }
        if noSHA256 { config.hashTypes = [.crc32] }
        for entry in files {
            let parts = entry.split(separator: "=", maxSplits: 1).map(String.init)
            guard parts.count == 2, let data = FileManager.default.contents(atPath: parts[1]) else {
                throw CLIFailure(.usage, "--sim-smp-file \(entry): \(parts.last ?? entry) cannot be read; give a readable local file")
            }
            config.files[parts[0]] = Array(data)
        }
        return config
    }
}

/// What every `files` subcommand takes: the SMP command options and the simulated file system.
struct FileCommandOptions<Context: DeviceCommandContext>: ParsableArguments {
    @OptionGroup var smp: SMPCommandOptions<Context>
    @OptionGroup(title: "Simulated file system") var simulated: SimulatedFileSystemOptions

    /// Connects and runs `body` with the client (see `SMPCommandOptions.withClient`).
    func withClient<T: Sendable>(_ body: (SMPClient, Duration) async throws(OTAError) -> T) async throws -> T {
        try await smp.withClient(fileSystem: simulated.config(), faults: simulated.disconnectAt.map { FaultPlan(disconnectAt: [$0]) }, body)
    }

}

/// A file's path on the device: absolute, naming a file.
struct RemotePath: ParsableArguments {
    @Argument(help: ArgumentHelp("The file's path on the device (absolute, e.g. /lfs/cert.pem).", valueName: "remote"))
    var remote: String

    func validate() throws {
        guard remote.hasPrefix("/"), !remote.hasSuffix("/"), remote.count > 1 else {
            throw ValidationError("the device path must be absolute and name a file, e.g. /lfs/cert.pem, got '\(remote)'")
        }
    }
}

/// Reports a transfer's progress: JSON `progress` about every 5 %, a bar on a terminal.
struct FileProgress {
    let printer: any CommandOutput
    let device: String
    let path: String
    let clock: any MonotonicClock
    let start: Duration
    private var reported = -1

    init(printer: any CommandOutput, client: SMPClient, path: String) {
        self.printer = printer
        device = client.device
        self.path = path
        clock = client.connection.clock
        start = clock.now
    }

    var elapsed: Double { (clock.now - start).seconds }

    mutating func report(_ bytes: Int, of total: Int) {
        let elapsed = self.elapsed
        let rate = elapsed > 0 ? Double(bytes) / elapsed : 0
        printer.progress(TransferProgress(device: device, bytes: bytes, confirmed: bytes, total: total, rate: rate,
                                          eta: rate > 0 ? Double(total - bytes) / rate : nil, elapsed: elapsed))
        let step = total > 0 ? bytes * 20 / total : 20
        guard step != reported else { return }
        reported = step
        printer.json(FileEvents.Progress(device: device, path: path, bytes: bytes, total: total, rate: rate, elapsed: elapsed))
    }
}

/// `otaflash files`: MCUmgr file management.
struct FilesCommand<Context: DeviceCommandContext>: AsyncParsableCommand {
    static var configuration: CommandConfiguration {
        CommandConfiguration(
            commandName: "files",
            abstract: "Put, get and check files on an SMP (MCUmgr) device's file system: certificates, configurations.",
            discussion: """
                A Zephyr or nRF Connect SDK device with MCUmgr's file management (CONFIG_MCUMGR_GRP_FS) and a \
                mounted file system (LittleFS at /lfs in Zephyr's samples) takes files over the same SMP \
                service as its firmware. `put` checks the upload by asking the device for the file's \
                SHA-256 (its CRC32 when it has no SHA-256); `get` writes the local file only once all of it \
                arrived.

                Examples:
                  otaflash files put cert.pem /lfs/cert.pem --device AA:BB:CC:DD:EE:FF
                  otaflash files get /lfs/config.json config.json --device AA:BB:CC:DD:EE:FF
                  otaflash files hash /lfs/cert.pem --type sha256 --device AA:BB:CC:DD:EE:FF
                  otaflash files stat /lfs/cert.pem --device AA:BB:CC:DD:EE:FF
                """,
            subcommands: [FilesPut<Context>.self, FilesGet<Context>.self, FilesHash<Context>.self, FilesStat<Context>.self]
        )
    }
}

struct FilesPut<Context: DeviceCommandContext>: AsyncParsableCommand {
    static var configuration: CommandConfiguration {
        CommandConfiguration(commandName: "put", abstract: "Upload a local file to a path on the device (replacing a file there), then check it by the device's hash.")
    }

    @OptionGroup var options: FileCommandOptions<Context>

    @Argument(help: ArgumentHelp("The local file to send.", valueName: "local"), completion: .file())
    var local: String

    @OptionGroup var path: RemotePath

    func run() async throws {
        try await options.smp.run { printer in
            let bytes = try Self.read(local)
            let remote = path.remote
            let (check, seconds, device) = try await options.withClient { (client, timeout) async throws(OTAError) in
                var progress = FileProgress(printer: printer, client: client, path: remote)
                try await client.putFile(bytes, to: remote, timeout: timeout) { progress.report($0, of: bytes.count) }
                let check = try await client.verifyFile(remote, against: bytes, timeout: timeout)
                return (check, progress.elapsed, client.device)
            }
            printer.json(FileEvents.File(device: device, path: remote, operation: "put", size: bytes.count, check: check.method, digest: check.digest, seconds: seconds))
            printer.result("\(device): \(remote) written, \(formatBytes(bytes.count)), \(check.digest.map { "\(check.method) \($0)" } ?? "length") checked")
        }
    }

    /// The local file's bytes: a regular, readable, non-empty file of at most 64 MiB.
    /// - Throws: `CLIFailure` `.imageFile` (exit 3) naming what is wrong.
    static func read(_ path: String) throws(CLIFailure) -> [UInt8] {
        var isDirectory: ObjCBool = false
        guard FileManager.default.fileExists(atPath: path, isDirectory: &isDirectory) else {
            throw CLIFailure(.imageFile, "\(path) does not exist; give the local file to send")
        }
        guard !isDirectory.boolValue else { throw CLIFailure(.imageFile, "\(path) is a directory; give the local file to send") }
        let size = (try? FileManager.default.attributesOfItem(atPath: path)[.size] as? Int) ?? 0
        guard size <= 64 << 20 else { throw CLIFailure(.imageFile, "\(path) is \(formatBytes(size)), over the 64 MiB a file may be") }
        guard let data = FileManager.default.contents(atPath: path) else {
            throw CLIFailure(.imageFile, "\(path) cannot be read (permissions?); give a readable file")
        }
        guard !data.isEmpty else { throw CLIFailure(.imageFile, "\(path) is empty; nothing to send") }
        return Array(data)
    }
}

struct FilesGet<Context: DeviceCommandContext>: AsyncParsableCommand {
    static var configuration: CommandConfiguration {
        CommandConfiguration(commandName: "get", abstract: "Download a file from the device; the local file is written only once all of it arrived.")
    }

    @OptionGroup var options: FileCommandOptions<Context>

    @OptionGroup var path: RemotePath

    @Argument(help: ArgumentHelp("Where to write it locally.", valueName: "local"), completion: .file())
    var local: String

    @Flag(name: .long, help: "Replace an existing local file (only once the download is complete).")
    var force = false

    func validate() throws {
        var isDirectory: ObjCBool = false
        if FileManager.default.fileExists(atPath: local, isDirectory: &isDirectory) {
            guard !isDirectory.boolValue else { throw ValidationError("\(local) is a directory; give the local file to write") }
            if let refusal = OutputPaths.notARegularFile(local, for: "a download") { throw ValidationError(refusal) }
            guard force else { throw ValidationError("\(local) exists; pass --force to replace it (it is replaced only once the download is complete)") }
        }
        let folder = (local as NSString).deletingLastPathComponent
        guard folder.isEmpty || FileManager.default.fileExists(atPath: folder) else {
            throw ValidationError("the folder \(folder) does not exist; create it first")
        }
    }

    func run() async throws {
        try await options.smp.run { printer in
            let remote = path.remote
            let (bytes, seconds, device) = try await options.withClient { (client, timeout) async throws(OTAError) in
                var progress = FileProgress(printer: printer, client: client, path: remote)
                let bytes = try await client.getFile(remote, timeout: timeout) { progress.report($0, of: $1) }
                return (bytes, progress.elapsed, client.device)
            }
            try Self.write(bytes, to: local)
            printer.json(FileEvents.File(device: device, path: remote, operation: "get", size: bytes.count, check: nil, digest: nil, seconds: seconds))
            printer.result("\(device): \(remote) read, \(formatBytes(bytes.count)), written to \(local)")
        }
    }

    /// Writes `bytes` to a temporary file beside `path` and renames it over `path`: a reader
    /// never sees half a file, and a failure leaves what was there.
    /// - Throws: `CLIFailure` `.outputFailed` (exit 16).
    static func write(_ bytes: [UInt8], to path: String) throws(CLIFailure) {
        // Checked again at the end: what appeared at the path meanwhile is not replaced either.
        if let refusal = OutputPaths.notARegularFile(path, for: "a download") { throw CLIFailure(.outputFailed, refusal) }
        let url = URL(fileURLWithPath: path)
        let temporary = url.deletingLastPathComponent().appendingPathComponent(".\(url.lastPathComponent).otaflash-\(getpid()).part")
        do {
            try Data(bytes).write(to: temporary)
            // rename(2) replaces an existing file in one step.
            guard rename(temporary.path, url.path) == 0 else {
                throw CocoaError(.fileWriteUnknown, userInfo: [NSLocalizedDescriptionKey: String(cString: strerror(errno))])
            }
        } catch {
            try? FileManager.default.removeItem(at: temporary)
            throw CLIFailure(.outputFailed, "cannot write \(path): \(error.localizedDescription)")
        }
    }
}

/// `--type`: the hash or checksum asked for.
enum FileHashChoice: String, ExpressibleByArgument, CaseIterable {
    case sha256, crc32
}

struct FilesHash<Context: DeviceCommandContext>: AsyncParsableCommand {
    static var configuration: CommandConfiguration {
        CommandConfiguration(commandName: "hash", abstract: "Print the device's hash or checksum of a file (MCUmgr file hash/checksum).")
    }

    @OptionGroup var options: FileCommandOptions<Context>

    @OptionGroup var path: RemotePath

    @Option(name: .long, help: ArgumentHelp("sha256 or crc32 (default: the device's own, crc32 when it has it).", valueName: "sha256|crc32"))
    var type: FileHashChoice?

    func run() async throws {
        try await options.smp.run { printer in
            let (remote, type) = (path.remote, type.map { SMPFileHashType(rawValue: $0.rawValue) })
            let (hash, device) = try await options.withClient { (client, timeout) async throws(OTAError) in
                (try await client.fileHash(remote, type: type, timeout: timeout), client.device)
            }
            printer.json(FileEvents.Hash(device: device, path: remote, type: hash.type.rawValue, offset: Int(clamping: hash.offset ?? 0),
                                         length: Int(clamping: hash.length), output: hash.hex))
            printer.result("\(hash.hex)  \(remote) (\(hash.type), \(hash.length) bytes)")
        }
    }
}

struct FilesStat<Context: DeviceCommandContext>: AsyncParsableCommand {
    static var configuration: CommandConfiguration {
        CommandConfiguration(commandName: "stat", abstract: "Print the size of a file on the device (MCUmgr file status).")
    }

    @OptionGroup var options: FileCommandOptions<Context>

    @OptionGroup var path: RemotePath

    func run() async throws {
        try await options.smp.run { printer in
            let remote = path.remote
            let (size, device) = try await options.withClient { (client, timeout) async throws(OTAError) in
                (try await client.fileStatus(remote, timeout: timeout), client.device)
            }
            printer.json(FileEvents.Status(device: device, path: remote, size: size))
            printer.result("\(remote): \(size) bytes")
        }
    }
}
