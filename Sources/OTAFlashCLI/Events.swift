import BlueZ
import OTA
import OTACommandLine
import OTAWire


/// Printed by every command when its command line is rejected and `--json` is among the arguments.
public struct UsageErrorEvent: JSONEvent {
    public static let name = "error"
    public var exitCode: Int
    public var error: String
    public var message: String

    public init(message: String) {
        exitCode = Int(ExitCode.usage.rawValue)
        error = ExitCode.usage.name
        self.message = message
    }
}

// MARK: flash

/// The events of `otaflash flash` (the default command), for one device or a batch.
public enum FlashEvents {
    public struct Start: JSONEvent {
        public static let name = "start"
        public var device: String?
        /// Where the device's bootloader answers after buttonless entry.
        public var bootloader: String?
        public var image: String
        public var size: Int
        public var crc32: String
        public var simulator: Bool
        /// The protocol the image goes over (`--protocol`, or what `auto` picked).
        public var `protocol`: String
        /// This otaflash's version and commit (`otaflash --version`), for logs kept of a run.
        public var otaflashVersion = OtaflashVersion.number
        public var otaflashCommit = OtaflashVersion.commit

        public init(device: String?, bootloader: String? = nil, image: String, size: Int, crc32: UInt32, simulator: Bool, protocol: String) {
            self.device = device
            self.bootloader = bootloader
            self.image = image
            self.size = size
            self.crc32 = hex32(crc32)
            self.simulator = simulator
            self.protocol = `protocol`
        }
    }

    public struct Batch: JSONEvent {
        public static let name = "batch"
        public var devices: Int
        public var parallel: Int
        public var adapters: [String]

        public init(devices: Int, parallel: Int, adapters: [String]) {
            self.devices = devices
            self.parallel = parallel
            self.adapters = adapters
        }
    }

    public struct Connecting: JSONEvent {
        public static let name = "connecting"
        public var device: String
    }

    public struct DeviceInfo: JSONEvent {
        public static let name = "device_info"
        public var device: String
        /// The profile's name: "native", "nordic-dfu".
        public var protocolName: String
        public var `protocol`: Int?
        /// `DeviceSummary.State`'s name.
        public var state: String
        public var slotSize: Int?
        public var firmwareVersion: String?
        /// The state in the protocol's words.
        public var stateText: String
    }

    public struct Connected: JSONEvent {
        public static let name = "connected"
        public var device: String
        public var mtu: Int
        public var chunk: Int
    }

    public struct Transfer: JSONEvent {
        public static let name = "transfer"
        public var device: String
        public var resumeOffset: Int
        public var total: Int
    }

    public struct Progress: JSONEvent {
        public static let name = "progress"
        public var device: String
        public var bytes: Int
        public var confirmed: Int
        public var total: Int
        public var rate: Double
        public var eta: Double?
        public var elapsed: Double
    }

    public struct Verify: JSONEvent {
        public static let name = "verify"
        public var device: String
    }

    public struct Activate: JSONEvent {
        public static let name = "activate"
        public var device: String
    }

    public struct Reconnect: JSONEvent {
        public static let name = "reconnect"
        public var device: String
        public var attempt: Int
        public var reason: String
        public var delay: Double
    }

    /// Something the engine changed in how it works (SMP: one request in flight after the
    /// device ran out of buffers), said once.
    public struct Note: JSONEvent {
        public static let name = "note"
        public var device: String
        public var message: String
    }

    /// How one device ended, the same for a single device and for each device of a batch.
    public struct Done: CommandDone {
        public static let name = "done"
        public var result = EventResult.ok
        public var device: String?
        /// Where the device's bootloader answered after buttonless entry.
        public var bootloader: String?
        public var adapter: String?
        public var bytes: Int?
        public var crc32: String?
        public var seconds: Double?
        public var throughput: Double?
        public var mtu: Int?
        public var chunk: Int?
        public var activated: Bool?
        public var bytesSent: Int?
        public var bytesResent: Int?
        public var checkpoints: Int?
        public var attempts: Int?
        public var firmwareBefore: String?
        public var firmwareAfter: String?
        public var exitCode = 0
        public var error: String?
        public var message: String?

        public init() {}

        /// A device's outcome, from a single-device run or a batch.
        public init(_ outcome: BatchOutcome) {
            if case .failed(let e) = outcome.result { self.init(failure: CLIFailure(e)) } else { self.init() }
            device = outcome.device
            bootloader = outcome.updateModeAddress
            adapter = outcome.adapter
            seconds = outcome.seconds
            attempts = outcome.attempts
            firmwareBefore = outcome.firmwareBefore?.description
            firmwareAfter = outcome.firmwareAfter?.description
            switch outcome.result {
            case .ok(let r):
                bytes = r.bytes
                crc32 = hex32(r.crc32)
                throughput = r.throughput
                mtu = r.mtu
                chunk = r.chunkSize
                activated = r.activated
                bytesSent = r.stats.bytesSent
                bytesResent = r.stats.bytesResent
                checkpoints = r.stats.checkpoints
            case .skipped:
                result = .skipped
                activated = false
            case .failed:
                break
            }
        }

        /// A run that failed outside a device's session: bad image, bad output path, no device given.
        public init(failure: CLIFailure, device: String?, adapter: String?) {
            self.init(failure: failure)
            self.device = device
            self.adapter = adapter
        }
    }

    /// The last line of a batch.
    public struct Summary: JSONEvent {
        public static let name = "summary"
        public var devices: Int
        public var ok: Int
        public var skipped: Int
        public var failed: Int
        public var exitCode: Int
        public var seconds: Double

        public init(devices: Int, ok: Int, skipped: Int, failed: Int, exitCode: ExitCode, seconds: Double) {
            self.devices = devices
            self.ok = ok
            self.skipped = skipped
            self.failed = failed
            self.exitCode = Int(exitCode.rawValue)
            self.seconds = seconds
        }
    }

    /// A session event as the line that reports it (stdout with `--json`, and the per-device logs).
    public static func event(_ event: SessionEvent) -> any JSONEvent {
        switch event {
        case .connecting(let device):
            Connecting(device: device)
        case .connected(let device, let mtu, let chunk):
            Connected(device: device, mtu: mtu, chunk: chunk)
        case .deviceInfo(let device, let info):
            DeviceInfo(device: device, protocolName: info.protocolName, protocol: info.protocolVersion, state: info.state.rawValue,
                       slotSize: info.slotSize, firmwareVersion: info.firmwareVersion?.description, stateText: info.stateText)
        case .transferStarted(let device, let offset, let total):
            Transfer(device: device, resumeOffset: offset, total: total)
        case .progress(let p):
            Progress(device: p.device, bytes: p.bytes, confirmed: p.confirmed, total: p.total, rate: p.rate, eta: p.eta,
                     elapsed: p.elapsed)
        case .verifying(let device, _):
            Verify(device: device)
        case .activating(let device):
            Activate(device: device)
        case .reconnecting(let device, let attempt, let reason, let delay):
            Reconnect(device: device, attempt: attempt, reason: reason, delay: delay.seconds)
        case .notice(let device, let message):
            Note(device: device, message: message)
        }
    }
}

// MARK: scan and info

public enum ScanEvents {
    public struct Device: JSONEvent {
        public static let name = "device"
        public var address: String
        public var name: String?
        public var rssi: Int?
        public var ota: Bool
        public var `protocol`: String?
        /// True when `--probe` connected to learn the protocol (the device advertised none of ours).
        public var probed = false
    }

    public struct Done: CommandDone {
        public static let name = "done"
        public var result = EventResult.ok
        public var count: Int?
        /// With `--ota-only` and no `--probe`: devices left out because they advertise no service
        /// otaflash updates over, which a device may host all the same.
        public var unclassified: Int?
        public var exitCode = 0
        public var error: String?
        public var message: String?

        public init() {}
        public init(count: Int, unclassified: Int? = nil) {
            self.count = count
            self.unclassified = unclassified
        }
    }
}

public enum InfoEvents {
    /// What `otaflash info` read. Values are text, as the device reports them; null when the device
    /// lacks the characteristic (the `ota_` keys: when it lacks the OTA service).
    public struct Info: JSONEvent {
        public static let name = "info"
        public var device: String
        public var manufacturer: String?
        public var model: String?
        public var firmwareRevision: String?
        public var otaProtocol: String?
        public var otaState: String?
        public var otaSlotSize: String?
        public var otaFirmwareVersion: String?
        public var otaReceived: String?
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

// MARK: simulate

/// The events of `otaflash simulate` (peripheral mode). `central` is the central's address; in the
/// transfer events it is null when BlueZ did not say which central made the request.
public enum SimulateEvents {
    public struct Serving: JSONEvent {
        public static let name = "serving"
        public var adapter: String
        public var address: String?
        public var name: String
        public var `protocol`: String
        public var slotSize: Int
        public var firmwareVersion: String
        public var store: String?
        /// `--buttonless`: the adapter the bootloader answers on, and its address.
        public var bootloaderAdapter: String? = nil
        public var bootloaderAddress: String? = nil
    }

    /// The served device reset and answers at another address, on `adapter` (`--buttonless`).
    public struct Moved: JSONEvent {
        public static let name = "moved"
        public var address: String?
        public var adapter: String
        public var mode: PeripheralServer.Mode
    }

    public struct Connected: JSONEvent {
        public static let name = "connected"
        public var central: String
    }

    public struct Disconnected: JSONEvent {
        public static let name = "disconnected"
        public var central: String
        public var reason: String
    }

    public struct Begin: JSONEvent {
        public static let name = "begin"
        public var central: String?
        public var size: Int
        public var crc32: String?
        public var offset: Int
    }

    public struct Progress: JSONEvent {
        public static let name = "progress"
        public var central: String?
        public var bytes: Int
        public var total: Int
    }

    public struct Verified: JSONEvent {
        public static let name = "verified"
        public var central: String?
        public var crc32: String?
    }

    public struct Activated: JSONEvent {
        public static let name = "activated"
        public var central: String?
        public var size: Int
        public var crc32: String
        public var firmwareVersion: String?
        public var stored: String?
    }

    public struct Busy: JSONEvent {
        public static let name = "busy"
        public var central: String
        public var owner: String
    }

    public struct Note: JSONEvent {
        public static let name = "note"
        public var message: String
    }

    public struct Done: CommandDone {
        public static let name = "done"
        public var result = EventResult.ok
        public var activations: Int?
        public var exitCode = 0
        public var error: String?
        public var message: String?

        public init() {}
        public init(activations: Int) { self.activations = activations }
    }
}

// MARK: catalog

/// One example of every event, with the section of docs/EVENTS.md that documents it (the command
/// that prints it). The tests compare each example's keys with the docs' tables.
public enum EventCatalog {
    public static let examples: [(section: String, event: any JSONEvent)] = {
        let device = "C0:FF:EE:00:00:01"
        let central = "AA:BB:CC:DD:EE:01"
        let ok = BatchOutcome(device: device, adapter: nil, result: .skipped(nil), attempts: 1, seconds: 0.1,
                              firmwareBefore: FirmwareVersion("1.0.0"), firmwareAfter: FirmwareVersion("1.0.0"))
        let flash: [any JSONEvent] = [
            FlashEvents.Start(device: device, image: "app.bin", size: 4096, crc32: 0xa1206a16, simulator: true, protocol: "native"),
            FlashEvents.Batch(devices: 3, parallel: 4, adapters: ["default"]),
            FlashEvents.Connecting(device: device),
            FlashEvents.DeviceInfo(device: device, protocolName: "native", protocol: 1, state: "idle", slotSize: 1 << 20, firmwareVersion: "1.0.0",
                                   stateText: "idle"),
            FlashEvents.Connected(device: device, mtu: 247, chunk: 240),
            FlashEvents.Transfer(device: device, resumeOffset: 0, total: 4096),
            FlashEvents.Progress(device: device, bytes: 2048, confirmed: 1024, total: 4096, rate: 20_000, eta: 0.1, elapsed: 0.1),
            FlashEvents.Verify(device: device),
            FlashEvents.Activate(device: device),
            FlashEvents.Reconnect(device: device, attempt: 1, reason: "link lost", delay: 0.25),
            FlashEvents.Note(device: device, message: "the device answered busy (10) with 4 requests in flight (out of SMP buffers, or busy): one request in flight from here on, slower"),
            FlashEvents.Held(device: device, station: "line-2", until: "2026-11-26T13:21:34.123Z"),
            FlashEvents.Done(ok),
            FlashEvents.Summary(devices: 3, ok: 2, skipped: 0, failed: 1, exitCode: .someFailed, seconds: 2.5),
        ]
        let simulate: [any JSONEvent] = [
            SimulateEvents.Serving(adapter: "hci0", address: central, name: "otaflash-sim", protocol: "native", slotSize: 1 << 20,
                                   firmwareVersion: "1.0.0", store: nil, bootloaderAdapter: "hci2", bootloaderAddress: "C0:11:22:33:44:11"),
            SimulateEvents.Moved(address: "C0:11:22:33:44:11", adapter: "hci2", mode: .bootloader),
            SimulateEvents.Connected(central: central),
            SimulateEvents.Disconnected(central: central, reason: "the central disconnected"),
            SimulateEvents.Begin(central: central, size: 4096, crc32: "a1206a16", offset: 0),
            SimulateEvents.Progress(central: central, bytes: 2048, total: 4096),
            SimulateEvents.Verified(central: central, crc32: "a1206a16"),
            SimulateEvents.Activated(central: central, size: 4096, crc32: "a1206a16", firmwareVersion: "2.0.0", stored: nil),
            SimulateEvents.Busy(central: "AA:BB:CC:DD:EE:02", owner: central),
            SimulateEvents.Note(message: "a note"),
            SimulateEvents.Done(activations: 1),
        ]
        let station: [(section: String, event: any JSONEvent)] = StationEvents.examples.map { ("otaflash station", $0) }
        return flash.map { ("otaflash flash", $0) }
            + [("otaflash scan", ScanEvents.Device(address: device, name: "otaflash-sim", rssi: -60, ota: true, protocol: "native")),
               ("otaflash scan", ScanEvents.Done(count: 1)),
               ("otaflash info", InfoEvents.Info(device: device, manufacturer: "otaflash", model: nil, firmwareRevision: "1.0.0",
                                                 otaProtocol: "1", otaState: "idle", otaSlotSize: "1048576",
                                                 otaFirmwareVersion: "1.0.0", otaReceived: "0")),
               ("otaflash info", InfoEvents.Done()),
               ("otaflash pair and unpair", { var done = PairEvents.Done(); done.device = device; done.bonded = true; return done }())]
            + ProtocolCommandLine.all.flatMap(\.eventSamples).map { ($0.section, $0.event) }
            + simulate.map { ("otaflash simulate", $0) }
            + station
            + [("any command", UsageErrorEvent(message: "unknown option '--bogus'"))]
    }()
}
