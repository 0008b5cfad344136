import Foundation
import GATT
import OTA
import OTAWire

/// One image of a multi-image update as the engine sends it.
public struct SMPImagePlan: Sendable, Hashable {
    public var imageNumber: UInt32
    /// The file as uploaded.
    public var bytes: [UInt8]
    public var fileSHA256: [UInt8]
    /// The MCUboot hash the device reports for the slot holding it.
    public var imageHash: [UInt8]
    /// Its version as img_mgmt lists it (`1.2.3`, `1.2.3.4`), for messages.
    public var version: String

    public init(imageNumber: UInt32, bytes: [UInt8], fileSHA256: [UInt8], imageHash: [UInt8], version: String) {
        self.imageNumber = imageNumber
        self.bytes = bytes
        self.fileSHA256 = fileSHA256
        self.imageHash = imageHash
        self.version = version
    }

    /// "network core (image 1)".
    public var label: String { SMPPackage.Part.label(imageNumber) }
}

/// A multi-image update (nRF5340: the application core's image 0 and the network core's image 1)
/// as one pure state machine: one `SMPEngine` per image, run one after the other on the same
/// connection. Every image but the last is uploaded and verified only (`uploadOnly`); the last
/// one, the application's, marks the others first and then itself, resets the device once, and
/// after the reset checks that every image runs (`companions`). The images go in
/// `SMPPackage.markingOrder`: the application's last (docs/SMP.md, "Multi-image updates").
///
/// Offsets are the session's, in the images' bytes one after the other (`image`); each image's
/// upload is the device's own, at its own offsets.
public struct SMPMultiImageEngine: TransferEngine {
    public typealias Peer = SMPLink

    /// Every image's bytes in upload order: what the session counts progress in.
    public let image: FirmwareImage
    public let images: [SMPImagePlan]
    private var engines: [SMPEngine]
    /// Where each image starts in `image`.
    private let bases: [Int]
    private var index = 0
    /// The last connection, for an engine that starts on it once the one before finished.
    private var link: (peer: SMPLink, mtu: Int)?
    private var now = Duration.zero
    /// The finished engines' figures, merged.
    private var finishedStats = TransferStats()
    private var finishedNotes: [String] = []
    /// Whether the current engine began on a connection an earlier engine counted.
    private var sharesConnection = false
    private var prefix: PrefixCRC

    /// - Parameter settings: the options every image's upload takes (confirm, reset, window…);
    ///   its image number, hashes and `uploadOnly`/`companions` are set per image here.
    public init(images: [SMPImagePlan], config: EngineConfig, settings: SMPUploadSettings) {
        precondition(!images.isEmpty, "a multi-image update sends at least one image")
        self.images = images
        var bases: [Int] = []
        var all: [UInt8] = []
        for plan in images {
            bases.append(all.count)
            all += plan.bytes
        }
        self.bases = bases
        image = FirmwareImage(bytes: all, source: images.map(\.label).joined(separator: " + "))
        prefix = PrefixCRC(image: all)
        engines = images.enumerated().map { i, plan in
            var own = settings
            own.imageNumber = plan.imageNumber
            own.fileSHA256 = plan.fileSHA256
            own.imageHash = plan.imageHash
            let last = i == images.count - 1
            own.uploadOnly = !last
            own.companions = last ? images.dropLast().map { SMPCompanion(imageNumber: $0.imageNumber, imageHash: $0.imageHash, version: $0.version) } : []
            return SMPEngine(image: FirmwareImage(bytes: plan.bytes, source: plan.label), config: config, settings: own)
        }
    }

    private var current: SMPEngine {
        get { engines[index] }
        set { engines[index] = newValue }
    }

    private var base: Int { bases[index] }

    /// The image being sent now.
    public var imageIndex: Int { index }

    public var phase: TransferPhase { current.phase }
    public var failedIn: TransferPhase? { current.failedIn }
    public var currentTimeout: Duration { current.currentTimeout }
    public var isAwaitingReply: Bool { current.isAwaitingReply }
    public var sent: Int { base + current.sent }
    public var resumeOffset: Int { base + current.resumeOffset }
    public var acked: Int { base + current.acked }
    public var ackedCRC: UInt32 { prefix.crc(upTo: acked) ?? 0 }
    public var highWater: Int { base + current.highWater }
    public var furthestAgreed: Int { base + current.furthestAgreed }
    public var awaitsNextConnection: Bool { current.awaitsNextConnection }
    public var chunkSize: Int { current.chunkSize }
    public var notes: [String] { finishedNotes + current.notes }

    public var stats: TransferStats {
        var own = current.stats
        own.resumedFrom = own.resumedFrom.map { $0 + base }
        var out = finishedStats
        out.bytesSent += own.bytesSent
        out.bytesResent += own.bytesResent
        out.packets += own.packets
        out.checkpoints += own.checkpoints
        out.rewinds += own.rewinds
        out.rollbacks += own.rollbacks
        out.restarts += own.restarts
        out.commandRetries += own.commandRetries
        out.resumedFrom += own.resumedFrom
        out.resumeResends += own.resumeResends
        var perConnection = own.resentPerConnection
        if sharesConnection, !out.resentPerConnection.isEmpty, !perConnection.isEmpty {
            out.resentPerConnection[out.resentPerConnection.count - 1] += perConnection.removeFirst()
        }
        out.resentPerConnection += perConnection
        return out
    }

    public mutating func observe(time: Duration) {
        now = time
        current.observe(time: time)
    }

    public mutating func seed(confirmedOffset: Int, crc: UInt32) {
        // The device decides where each upload stands; a journal entry only saves hashing.
        if prefix.crc(upTo: confirmedOffset) == crc { prefix.record(offset: confirmedOffset, crc: crc) }
    }

    public func dataPacket(offset: Int, count: Int) -> [UInt8] {
        Array(image.bytes[offset..<(offset + count)])
    }

    public mutating func nextStreamStep() -> TransferStep { current.nextStreamStep() }

    public mutating func handle(_ event: TransferEvent<SMPLink>) -> [TransferAction] {
        if case .connected(let peer, let mtu) = event {
            link = (peer, mtu)
            sharesConnection = false
            if current.phase == .idle { skipHeld(peer.states) }
        }
        var actions = current.handle(event)
        // An image uploaded (and verified): the next one goes on the same connection.
        while actions.contains(.finished), index < engines.count - 1, let link {
            actions.removeAll { $0 == .finished }
            advance()
            skipHeld(link.peer.states)
            actions += current.handle(.connected(link.peer, mtu: link.mtu))
        }
        return actions
    }

    /// Leaves the finished engine's figures behind and starts on the next image.
    private mutating func advance() {
        let done = stats
        finishedStats = done
        finishedNotes = notes
        index += 1
        sharesConnection = true
        current.observe(time: now)
    }

    /// Skips images before the last that the device already holds (a slot of their image number
    /// lists their hash): an earlier run uploaded them, and the last image marks them.
    private mutating func skipHeld(_ states: SMPImageStates?) {
        guard let states else { return }
        while index < engines.count - 1, current.phase == .idle,
              states.images.contains(where: { ($0.image ?? 0) == images[index].imageNumber && $0.hash == images[index].imageHash }) {
            finishedNotes = notes + ["the device already holds the \(images[index].label)'s image \(images[index].version): not uploaded again"]
            index += 1
        }
    }
}

/// An image of the same update that the last image's engine marks before its own and checks
/// after the reset (`SMPUploadSettings.companions`).
public struct SMPCompanion: Sendable, Hashable {
    public var imageNumber: UInt32
    public var imageHash: [UInt8]
    public var version: String

    public init(imageNumber: UInt32, imageHash: [UInt8], version: String) {
        self.imageNumber = imageNumber
        self.imageHash = imageHash
        self.version = version
    }

    var label: String { SMPPackage.Part.label(imageNumber) }
}

/// SMP with several images (`SMPMultiImageEngine`): attaches as `SMPProfile` does.
public struct SMPMultiImageProfile: OTAProfile {
    public typealias Engine = SMPMultiImageEngine

    public let images: [SMPImagePlan]
    public let settings: SMPUploadSettings
    private let single: SMPProfile

    public init(images: [SMPImagePlan], settings: SMPUploadSettings) {
        self.images = images
        self.settings = settings
        var first = settings
        first.imageNumber = images.last?.imageNumber ?? 0
        single = SMPProfile(settings: first)
    }

    public var name: String { SMPProfile.name }
    public var serviceUUID: BluetoothUUID { single.serviceUUID }
    public var imageFormats: Set<ImageFormat.Kind> { single.imageFormats }
    public var otherFormatHint: String? { single.otherFormatHint }
    public var imageCheck: String { single.imageCheck }
    public var readsBackAfterActivation: Bool { true }

    public func attach(to connection: any GATTConnection, device: String,
                       discoveryTimeout: Duration) async throws(OTAError) -> AttachedLink<SMPLink> {
        var link = try await single.attach(to: connection, device: device, discoveryTimeout: discoveryTimeout)
        // The application core's slots are the summary's; the other images' follow.
        let others = Set(images.map(\.imageNumber)).subtracting([first]).sorted()
        let slots = others.map { number in
            let listed = (link.peer.states?.images ?? []).filter { ($0.image ?? 0) == number }
            let text = listed.map { "slot \($0.slot) \($0.version)" + ($0.active ? " active" : "") + ($0.pending ? " pending" : "") }
            return "image \(number): " + (text.isEmpty ? "no image" : text.joined(separator: ", "))
        }
        if !slots.isEmpty {
            var state = link.summary.stateText
            let extra = slots.joined(separator: "; ")
            if let cut = state.range(of: "; ") { state.replaceSubrange(cut, with: "; \(extra); ") } else { state += "; \(extra)" }
            link.summary.stateText = "image \(first): " + state
        }
        return link
    }

    /// The image whose slots the summary lists first: the application core's (the last sent).
    private var first: UInt32 { images.last?.imageNumber ?? 0 }

    public func chunkSize(mtu: Int) -> Int { single.chunkSize(mtu: mtu) }

    public func makeEngine(image: FirmwareImage, config: EngineConfig) -> SMPMultiImageEngine {
        SMPMultiImageEngine(images: images, config: config, settings: settings)
    }
}

extension SMPUploadSettings {
    /// "application core (image 0)": the image this upload is for, in messages.
    var label: String { SMPPackage.Part.label(imageNumber) }
}
