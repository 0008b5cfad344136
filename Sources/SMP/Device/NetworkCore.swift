/// An nRF5340's second image pair as MCUboot and img_mgmt see it (`CONFIG_UPDATEABLE_IMAGE_NUMBER=2`,
/// nRF Connect SDK's simultaneous multi-image DFU): image 1, the network core's firmware.
///
/// Its secondary slot (img_mgmt slot 3) lies in the application core's flash and takes uploads
/// with `image` 1. The network core cannot be updated in place: at the application core's reset,
/// MCUboot (on the application core) validates a marked image 1 and hands it to the network
/// core's bootloader (b0n) over PCD, which copies it into the network core's flash; there is no
/// swap and no revert, and the secondary slot is erased. The running image (slot 2) is what the
/// network core then runs, always confirmed.
///
/// The order rule (sdk-nrf pull request 30274, known issue NCSDK-34106): when the application
/// core's image was marked (test or confirm) before the network core's, MCUboot skips the network
/// core's update. The model skips it then too: the mark is dropped, the image stays in slot 3 and
/// the network core runs on its old image (`SMPServer.boot()`).
public struct SMPNetworkCore: Sendable {
    /// What the network core runs (image 1, slot 0 as img_mgmt lists it).
    public internal(set) var running: SMPSlotImage
    /// The secondary slot's bytes (written so far, while an upload is under way).
    public internal(set) var secondaryBytes: [UInt8] = []
    public internal(set) var secondaryComplete = false
    /// Marked to be taken at the application core's next reset; `permanent`: confirmed.
    public internal(set) var pending = false
    public internal(set) var permanent = false
    /// What the last application core reset did with the network core's image.
    public internal(set) var lastUpdate = Update.none

    public enum Update: Sendable, Hashable {
        /// Nothing was marked.
        case none
        /// Copied over PCD: the network core runs the new image.
        case updated
        /// Marked after the application core's image: MCUboot skipped it.
        case skipped
        /// Invalid (hash or signature): MCUboot erased it.
        case refused(why: String)
    }

    public init(running: [UInt8]? = nil) {
        self.running = SMPSlotImage(running ?? SMPSlotImage.build(major: 1, minor: 0, revision: 0, body: Array("otaflash network core factory image".utf8)))
    }

    public var secondary: SMPSlotImage? { secondaryComplete ? SMPSlotImage(secondaryBytes) : nil }

    /// The slots as img_mgmt lists them for image 1.
    var states: [SMPImageSlot] {
        var running = SMPImageSlot(slot: 0, version: self.running.versionText, hash: self.running.hash, bootable: self.running.bootable,
                                   confirmed: true, active: true)
        running.image = 1
        guard let secondary else { return [running] }
        var waiting = SMPImageSlot(slot: 1, version: secondary.versionText, hash: secondary.hash, bootable: secondary.bootable)
        waiting.image = 1
        waiting.pending = pending
        waiting.permanent = pending && permanent
        return [running, waiting]
    }

    mutating func eraseSecondary() {
        secondaryBytes = []
        secondaryComplete = false
        pending = false
        permanent = false
    }
}

extension SMPServer {
    /// The image number a state write's `hash` names: 1 for the network core's images, else 0.
    func imageNumber(ofHash hash: [UInt8]) -> UInt32 {
        guard let network else { return 0 }
        return network.secondary?.hash == hash || network.running.hash == hash ? 1 : 0
    }

    /// A state write for image 1: marks the secondary slot (test or permanent: the network core
    /// keeps whatever it is given), or confirms the running image (a no-op: it always is).
    mutating func networkStateWrite(hash: [UInt8], confirm: Bool) -> SMPResponse {
        guard var core = network else { return .error(.image(.hashNotFound)) }
        if hash == core.running.hash {
            guard confirm else { return .error(.image(.testToActiveDenied)) }
            return .imageStates(states)
        }
        guard let secondary = core.secondary, secondary.hash == hash else { return .error(.image(.hashNotFound)) }
        core.pending = true
        core.permanent = confirm
        network = core
        markOrder.append(1)
        marks.append((secondary.bytes, confirm))
        return .imageStates(states)
    }

    /// MCUboot at the application core's reset, for image 1: a marked image is validated and
    /// handed to the network core, unless the application core's image was marked first.
    mutating func bootNetworkCore() {
        guard var core = network else { return }
        defer { network = core }
        guard core.pending, let secondary = core.secondary else {
            core.lastUpdate = .none
            return
        }
        let applicationFirst = markOrder.firstIndex(of: 0).map { app in markOrder.firstIndex(of: 1).map { app < $0 } ?? false } ?? false
        if applicationFirst {
            // NCSDK-34106: the update is skipped; the image stays in its slot, unmarked.
            core.pending = false
            core.permanent = false
            core.lastUpdate = .skipped
            return
        }
        if let why = invalidImage(core.secondaryBytes, slot: "image 1's slot 1") {
            core.eraseSecondary()
            core.lastUpdate = .refused(why: why)
            return
        }
        core.running = secondary
        core.eraseSecondary()
        core.lastUpdate = .updated
    }
}
