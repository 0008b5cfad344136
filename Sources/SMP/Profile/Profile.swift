import Crypto
import GATT
import OTA
import OTAWire

/// MCUmgr's SMP (Zephyr and nRF Connect SDK devices with MCUboot) as an `OTAProfile`: one SMP
/// characteristic carries requests and answers; `SMPEngine` uploads windowed, verifies the slot's
/// hash, marks the image and resets the device.
public struct SMPProfile: OTAProfile {
    public typealias Engine = SMPEngine

    /// The name `--protocol` takes.
    public static let name = "smp"

    /// What the upload does once the device holds the image, and the image's hashes; nil for the
    /// registry's instance, which has no image (the engine then hashes what it is given and, with
    /// no MCUboot hash to check, needs the server's `match`).
    public let settings: SMPUploadSettings?
    /// How long each request of the attach (MCUmgr parameters, image states) may take.
    public let replyTimeout: Duration

    public init(settings: SMPUploadSettings? = nil, replyTimeout: Duration = .seconds(5)) {
        self.settings = settings
        self.replyTimeout = replyTimeout
    }

    public var name: String { Self.name }
    public var serviceUUID: BluetoothUUID { SMPService.serviceUUID }
    public var imageFormats: Set<ImageFormat.Kind> { [.mcuboot] }
    public var otherFormatHint: String? {
        "an MCUboot image starts with the magic 0x96f3b83d: sign the binary with `imgtool sign` (a damaged file: build it again), or add --smp-any-image to upload it as it is"
    }
    public var imageCheck: String { "reports the MCUboot hash of the slot it wrote, compared with the image's" }
    /// MCUboot swaps the image in at the reset (or reverts it): the run says what came up.
    public var readsBackAfterActivation: Bool { true }

    /// The summary's version: the active slot's.
    static func runningVersion(_ states: SMPImageStates?, image: UInt32) -> FirmwareVersion? {
        guard let slot = states?.images.first(where: { ($0.image ?? 0) == image && $0.active }) else { return nil }
        return MCUbootVersionText.firmwareVersion(slot.version)
    }

    public func attach(to connection: any GATTConnection, device: String,
                       discoveryTimeout: Duration) async throws(OTAError) -> AttachedLink<SMPLink> {
        let client: SMPClient
        do {
            client = try await withTimeout(discoveryTimeout, clock: connection.clock, "discovering the SMP service") { () async throws(GATTError) in
                try await SMPClient.attach(to: connection, device: device)
            }
        } catch {
            throw OTAError.from(error, device: device)
        }
        // An older server does not know the parameters read: it answers ENOTSUP (or nothing).
        // A lost answer is asked for once more: without the parameters the upload falls back to
        // one write per request, which at MTU 23 holds no upload request at all.
        var parameters: SMPParameters?
        for attempt in 0..<2 where parameters == nil {
            do {
                let answer = try await client.send(.mcumgrParameters, sequence: UInt8(attempt), timeout: replyTimeout)
                if case .mcumgrParameters(let p) = answer { parameters = p }
                break
            } catch where error.code == .timeout {
                parameters = nil
            }
        }
        guard case .imageStates(let states) = try await client.call(.imageStateRead, sequence: 2, timeout: replyTimeout) else {
            throw OTAError(.protocolError, "\(device) answered the image state read with something else")
        }
        // MCUboot's mode, where the server tells it (CONFIG_MCUMGR_GRP_OS_BOOTLOADER_INFO); an
        // older one answers NOT_SUPPORTED (or nothing): a swap mode, as before the command existed.
        var bootloader: SMPBootloaderInfo?
        do {
            if case .bootloaderInfo(let info) = try await client.send(.bootloaderInfo(query: "mode"), sequence: 3, timeout: replyTimeout) {
                bootloader = info
            }
        } catch where error.code == .timeout {
            bootloader = nil
        }
        let image = settings?.imageNumber ?? 0
        let slots = states.images.filter { ($0.image ?? 0) == image }
        let state = slots.map { slot in
            "slot \(slot.slot) \(slot.version)" + (slot.active ? " active" : "") + (slot.confirmed ? " confirmed" : "") + (slot.pending ? " pending" : "")
        }.joined(separator: ", ")
        let buffers = parameters.map { "\($0.bufferCount) × \($0.bufferSize) B buffers" }
            ?? "buffers not reported (an older SMP server): one request in flight, one write each"
        let mode = bootloader?.mode.map { "; MCUboot \($0)" + (bootloader?.noDowngrade == true ? ", no downgrade" : "") } ?? ""
        return AttachedLink(characteristics: [.control: client.characteristic, .data: client.characteristic],
                            peer: SMPLink(parameters: parameters, states: states, bootloader: bootloader),
                            summary: DeviceSummary(protocolName: name, firmwareVersion: Self.runningVersion(states, image: image),
                                                   state: .idle, stateText: "\(state.isEmpty ? "no image" : state); \(buffers)\(mode)"))
    }

    /// Image bytes per write: an upload request spans as many writes as it needs; this is what
    /// one write carries.
    public func chunkSize(mtu: Int) -> Int { ATTWriteLimit.value(mtu: mtu) }

    public func makeEngine(image: FirmwareImage, config: EngineConfig) -> SMPEngine {
        let settings = settings ?? SMPUploadSettings(fileSHA256: Array(SHA256.hash(data: image.bytes)), imageHash: nil)
        return SMPEngine(image: image, config: config, settings: settings)
    }
}

/// MCUboot's version text as SMP reports it: `major.minor.revision` or with `.build` after it.
enum MCUbootVersionText {
    /// The first three numbers as a `FirmwareVersion` (the build number is left out); nil when
    /// they do not fit (minor over 255, revision over 65535).
    static func firmwareVersion(_ text: String) -> FirmwareVersion? {
        let parts = text.split(separator: ".", omittingEmptySubsequences: false).prefix(3)
        return FirmwareVersion(parts.joined(separator: "."))
    }

    /// A header holding the version of a slot's `major.minor.revision[.build]` text, to compare
    /// versions as MCUboot does; nil when the text is not one.
    static func slotImage(_ slot: SMPImageSlot) -> SMPSlotImage? {
        let parts = slot.version.split(separator: ".", omittingEmptySubsequences: false).map { UInt32($0) }
        guard (3...4).contains(parts.count), !parts.contains(nil), let major = UInt8(exactly: parts[0] ?? 0),
              let minor = UInt8(exactly: parts[1] ?? 0), let revision = UInt16(exactly: parts[2] ?? 0) else { return nil }
        return SMPSlotImage(SMPSlotImage.build(major: major, minor: minor, revision: revision, build: parts.count == 4 ? parts[3] ?? 0 : 0, body: []))
    }
}
