import Crypto

/// A Zephyr MCUmgr SMP server with MCUboot's two slots as a pure state machine: requests in,
/// answers out, `boot()` for what MCUboot does at a reset. `SMPPeripheral` serves it over GATT.
///
/// It follows Zephyr's img_mgmt and os_mgmt (docs/SMP.md, "The device model"):
/// - slot 0 runs; uploads go to slot 1. The first upload request (`off` 0) must carry `len`; an
///   image over the slot's size is refused (IMG_MGMT_ERR_INVALID_IMAGE_TOO_LARGE), and so is a
///   first chunk without MCUboot's magic (INVALID_IMAGE_HEADER_MAGIC) unless the header check is
///   off. A first request whose `sha` names the unfinished upload is answered with the offset
///   held, nothing written; another `sha` starts over. A request at another offset than the one
///   held is answered with that offset, nothing written; data past `len` is refused
///   (INVALID_IMAGE_DATA_OVERRUN). The last answer carries `match` when the upload named a `sha`.
/// - slot 1 is in use while it is pending, or holds the image to revert to while an unconfirmed
///   test image runs: an upload or an erase is then refused with NO_FREE_SLOT.
/// - state write: `hash` with `confirm` false marks that slot for test; with `confirm` true for
///   a permanent swap; `confirm` true without `hash` (or with the running image's) confirms the
///   running image. Marking the running image for test is refused (33), an unknown hash too (8).
/// - `Config` also makes it refuse as particular devices do: an older server without the MCUmgr
///   parameters read, a downgrade check on every upload, EBUSY, or a given image group code on
///   the first upload request; `Leftover` starts it with slot 1 in use.
/// - MCUboot at boot: a pending slot 1 is swapped in and runs unconfirmed (or confirmed, when
///   permanent); an unconfirmed running image is swapped back out (revert). Before a swap MCUboot
///   validates slot 1 (bootutil's `boot_validate_slot`): its hash TLV must match the hashed bytes
///   and, when the device was given `signatureKey`, its signature must verify with that key; an
///   image that fails is erased and slot 0 runs on.
///
/// Its answers are written as `Config.encoding` says (`reply(_:to:)`): Zephyr's zcbor by default,
/// or mcumgr's tinycbor, canonical, or indefinite in otaflash's order.
///
/// The upload's progress lives in RAM: a lost link keeps it, a reset loses it (the slot's bytes
/// stay, but a new upload starts over).
public struct SMPServer: Sendable {
    public struct Config: Sendable, Hashable {
        /// `buf_size`: the largest SMP frame (header and CBOR) the server takes
        /// (`CONFIG_MCUMGR_TRANSPORT_NETBUF_SIZE`, 384 by default).
        public var bufferSize: Int
        /// `buf_count`: how many frames it holds at once (`CONFIG_MCUMGR_TRANSPORT_NETBUF_COUNT`, 4).
        public var bufferCount: Int
        /// Each slot's size in bytes.
        public var slotSize: Int
        /// Refuse a first upload chunk without MCUboot's magic (Zephyr does); false takes any bytes.
        public var checksImageHeader: Bool
        /// Answer `match` on the last chunk (`CONFIG_IMG_ENABLE_IMAGE_CHECK`).
        public var reportsMatch: Bool
        /// Answer the MCUmgr parameters read; false: an older server, which answers it with
        /// MGMT_ERR_ENOTSUP (before `CONFIG_MCUMGR_GRP_OS_MCUMGR_PARAMS`).
        public var reportsParameters: Bool
        /// Refuse an image whose version is not newer than the running one
        /// (IMG_MGMT_ERR_CURRENT_VERSION_IS_NEWER), as img_mgmt does for an upload that asks
        /// `upgrade`, whether or not it does.
        public var refusesDowngrade: Bool
        /// Answer every upload request with MGMT_ERR_EBUSY (another transport or a shell command
        /// holds the image manager).
        public var busy: Bool
        /// Answer an upload request with MGMT_ERR_EBUSY when it finds this many requests or more
        /// still held: a device whose buffer pool is shared with other users gives fewer buffers
        /// than `bufferCount` says (the peripheral model counts them). Nil: never.
        public var busyAbove: Int?
        /// Refuse the first upload request with this image group code (a device-specific
        /// refusal: a hook, a flash driver error, its own checks).
        public var uploadRefusal: ImageManagementError?
        /// How the answers are written (`reply(_:to:)`); `.tinycbor` is an mcumgr server, which
        /// also has no MCUmgr parameters read and no `match`, whatever the two settings above say.
        public var encoding: SMPReplyEncoding
        /// An image MCUboot swapped in for test crashes when asked for an SMP echo (its
        /// application is broken: the watchdog resets the device before it answers), so MCUboot
        /// reverts it; see `crashesOnEcho`.
        public var testImageCrashes = false
        /// MCUboot's mode (`swapScratch`: the slots as documented above). `overwriteOnly` copies a
        /// marked image over slot 0 at the reset, kept for good; `directXIP` (and `ramLoad`) runs
        /// either slot in place, uploads go to the one not running, there is no state write, and
        /// MCUboot boots the slot with the highest version; `directXIPWithRevert` boots the other
        /// slot when it is marked, for test or for good.
        public var mode = SMPBootloaderMode.swapScratch
        /// Answer os_mgmt's bootloader info (`CONFIG_MCUMGR_GRP_OS_BOOTLOADER_INFO`); without it
        /// the server answers MGMT_ERR_ENOTSUP, as one built without it does.
        public var reportsBootloaderInfo = false
        /// MCUboot's downgrade prevention: an image older than the running one is not booted
        /// (erased at the reset), and the bootloader info says `no-downgrade`.
        public var noDowngrade = false
        /// In a direct-XIP mode, refuse an upload whose image is fixed (`IMAGE_F_ROM_FIXED`) to
        /// another address than the slot's (`CONFIG_MCUMGR_GRP_IMG_REJECT_DIRECT_XIP_MISMATCHED_SLOT`).
        public var rejectsMismatchedSlot = true
        /// Answer img_mgmt's slot info (`CONFIG_MCUMGR_GRP_IMG_SLOT_INFO`); mcumgr's server has none.
        public var reportsSlotInfo = true
        /// fs_mgmt's file system (`SMPFileSystem`): its mount points, limits and files at power-on.
        public var fileSystem = SMPFileSystem.Config()
        /// A second image pair, image 1: an nRF5340's network core, updated at the application
        /// core's reset (`SMPNetworkCore`).
        public var networkCore = false

        public init(bufferSize: Int = 384, bufferCount: Int = 4, slotSize: Int = 512 * 1024,
                    checksImageHeader: Bool = true, reportsMatch: Bool = true, reportsParameters: Bool = true,
                    refusesDowngrade: Bool = false, busy: Bool = false, busyAbove: Int? = nil,
                    uploadRefusal: ImageManagementError? = nil, encoding: SMPReplyEncoding = .zephyr) {
            self.bufferSize = bufferSize
            self.bufferCount = bufferCount
            self.slotSize = slotSize
            self.checksImageHeader = checksImageHeader
            self.reportsMatch = reportsMatch
            self.reportsParameters = reportsParameters
            self.refusesDowngrade = refusesDowngrade
            self.busy = busy
            self.busyAbove = busyAbove
            self.uploadRefusal = uploadRefusal
            self.encoding = encoding
        }

        /// Whether the server knows the MCUmgr parameters read (mcumgr's does not).
        public var answersParameters: Bool { reportsParameters && encoding != .tinycbor }
        /// Whether the last upload answer carries `match` (mcumgr's does not).
        public var answersMatch: Bool { reportsMatch && encoding != .tinycbor }
    }

    /// What slot 1 holds at power-on besides nothing: a state an earlier update left.
    public enum Leftover: Sendable, Hashable {
        /// An image marked for test at the next reset (`image test` without the reset).
        case pending([UInt8])
        /// The image to revert to: slot 0 runs an unconfirmed test image (the reset after `image
        /// test` happened, and nothing confirmed it).
        case revertTarget([UInt8])
    }

    /// The upload in progress (img_mgmt's RAM state).
    public struct Upload: Sendable, Hashable {
        /// The image number it goes to (its secondary slot).
        public var image: UInt32 = 0
        public var sha: [UInt8]?
        public var length: Int
        public var offset: Int
    }

    /// What a boot did.
    public enum BootOutcome: Sendable, Hashable {
        /// Nothing to swap: slot 0 runs on.
        case unchanged
        /// Slot 1 was swapped in; `permanent`: confirmed at once.
        case swapped(permanent: Bool)
        /// The unconfirmed image was swapped back out.
        case reverted
        /// Slot 1 was marked but MCUboot found it invalid (`why`): it erased slot 1, slot 0 runs on.
        case refused(why: String)
    }

    public let config: Config
    /// Slot 0: the running image.
    public private(set) var primary: SMPSlotImage
    /// Slot 1's bytes (written so far, while an upload is under way).
    public private(set) var secondaryBytes: [UInt8] = []
    /// Slot 1 holds a whole image (its upload finished, or a swap put the old image there).
    public private(set) var secondaryComplete = false
    public private(set) var upload: Upload?
    /// Slot 1 is marked to be swapped in at the next boot.
    public private(set) var pending = false
    /// ... and for good (`confirm` true), not for test.
    public private(set) var permanent = false
    /// The running image is confirmed (MCUboot's image_ok in slot 0).
    public private(set) var confirmed = true
    /// Boots so far, and the last one's outcome.
    public private(set) var boots = 0
    public private(set) var lastBoot = BootOutcome.unchanged
    /// Every image marked for test or confirmed by a state write, oldest first: the bytes of the
    /// slot it named at that moment, and whether it was confirmed (for soaks and tests).
    public internal(set) var marks: [(bytes: [UInt8], confirm: Bool)] = []
    /// A fault: the byte of slot 1 at this image offset is stored with its lowest bit flipped when
    /// written (a flash fault; the file's SHA-256 and the slot's hash then differ). Fires once.
    public var flashBitFlipAt: Int?
    /// The key MCUboot was built with (`CONFIG_BOOT_SIGNATURE_KEY_FILE`): an image whose signature
    /// does not verify with it is never swapped in. Nil: MCUboot checks the hash only
    /// (`CONFIG_BOOT_SIGNATURE_TYPE_NONE`).
    public var signatureKey: MCUbootImage.PublicKey?
    /// fs_mgmt's files and transfer context (group 8).
    public private(set) var files: SMPFileSystem
    /// Image 1, the network core, with `Config.networkCore`.
    public internal(set) var network: SMPNetworkCore?
    /// The image numbers marked by state writes since the last boot, oldest first (the order
    /// rule, `SMPNetworkCore`).
    public internal(set) var markOrder: [UInt32] = []

    /// - Parameter running: the image slot 0 holds, confirmed; by default a small MCUboot image
    ///   of version 1.0.0.
    ///   - leftover: what an earlier update left in slot 1; by default nothing.
    ///   - signatureKey: the key MCUboot checks signatures with; by default none (hash only).
    public init(config: Config = Config(), running: [UInt8]? = nil, leftover: Leftover? = nil,
                signatureKey: MCUbootImage.PublicKey? = nil) {
        self.config = config
        self.signatureKey = signatureKey
        files = SMPFileSystem(config.fileSystem)
        network = config.networkCore ? SMPNetworkCore() : nil
        primary = SMPSlotImage(running ?? SMPSlotImage.build(major: 1, minor: 0, revision: 0, body: Array("otaflash factory image".utf8)))
        switch leftover {
        case .pending(let image):
            secondaryBytes = image
            secondaryComplete = true
            pending = true
        case .revertTarget(let image):
            secondaryBytes = image
            secondaryComplete = true
            confirmed = false
        case nil:
            break
        }
    }

    /// Slot 1's image, when it holds a whole one.
    public var secondary: SMPSlotImage? { secondaryComplete ? SMPSlotImage(secondaryBytes) : nil }

    /// MCUboot's swap type as img_mgmt derives it.
    private enum SwapType { case none, test, permanent, revert }
    private var swapType: SwapType {
        if pending { return permanent ? .permanent : .test }
        return confirmed ? .none : .revert
    }

    /// Slot 1 cannot be written: it is pending, or it holds the image to revert to.
    public var secondaryInUse: Bool { pending || !confirmed }

    /// Where each slot lies in flash (an nRF52840's slot0_partition and slot1_partition): what a
    /// direct-XIP image fixed to a slot must name as its load address.
    public static let slotAddresses: [UInt32] = [0x0000_C000, 0x0008_2000]
    /// The slot that runs: 0, or 1 once direct-XIP booted it.
    public private(set) var activeSlot: UInt32 = 0
    /// The slot uploads go to: the one not running.
    public var uploadSlot: UInt32 { 1 - activeSlot }

    /// With `Config.testImageCrashes`: the running image is a test image swapped in at the last
    /// boot and not confirmed, so an echo crashes it (no answer; the device resets).
    public var crashesOnEcho: Bool {
        config.testImageCrashes && !confirmed && lastBoot == .swapped(permanent: false)
    }

    // MARK: Requests

    /// The answer to a request frame. Unknown commands get MGMT_ERR_ENOTSUP, malformed ones
    /// MGMT_ERR_EINVAL; `resetRequested` is set when the answer is to a reset.
    public mutating func handle(_ frame: SMPFrame) -> (response: SMPResponse, resetRequested: Bool) {
        let request: SMPRequest
        do {
            request = try SMPRequest(decoding: frame)
        } catch {
            return (.error(.general(error.serverAnswer)), false)
        }
        if case .reset = request { return (.empty, true) }
        return (handle(request), false)
    }

    public mutating func handle(_ request: SMPRequest) -> SMPResponse {
        switch request {
        case .mcumgrParameters:
            guard config.answersParameters else { return .error(.general(.notSupported)) }
            return .mcumgrParameters(SMPParameters(bufferSize: UInt32(clamping: config.bufferSize), bufferCount: UInt32(clamping: config.bufferCount)))
        case .echo(let text):
            return .echo(text)
        case .reset:
            return .empty
        case .imageStateRead:
            return .imageStates(states)
        case .imageStateWrite(let hash, let confirm):
            return stateWrite(hash: hash, confirm: confirm)
        case .imageUpload(let chunk):
            return receive(chunk)
        case .imageErase(let slot):
            return erase(slot: slot ?? uploadSlot)
        case .imageSlotInfo:
            guard config.reportsSlotInfo, config.encoding != .tinycbor else { return .error(.general(.notSupported)) }
            // Both slots of image 0; the one not running takes an upload (`upload_image_id` 0); and
            // image 1's, whose second slot takes the network core's (`upload_image_id` 1).
            var images = [SMPSlotInfo.Image(image: 0, slots: (0...1).map { slot in
                SMPSlotInfo.Slot(slot: UInt32(slot), size: UInt64(config.slotSize), uploadImageID: UInt32(slot) == uploadSlot ? 0 : nil)
            })]
            if network != nil {
                images.append(SMPSlotInfo.Image(image: 1, slots: [SMPSlotInfo.Slot(slot: 0, size: UInt64(config.slotSize)),
                                                                   SMPSlotInfo.Slot(slot: 1, size: UInt64(config.slotSize), uploadImageID: 1)]))
            }
            return .slotInfo(SMPSlotInfo(images: images))
        case .bootloaderInfo(let query):
            guard config.reportsBootloaderInfo, config.encoding != .tinycbor else { return .error(.general(.notSupported)) }
            guard let query else { return .bootloaderInfo(SMPBootloaderInfo(bootloader: "MCUboot")) }
            // os_mgmt answers only `mode`; another query yields OS_MGMT_ERR_QUERY_YIELDS_NO_ANSWER.
            guard query == "mode" else { return .error(SMPDeviceError(group: .os, rc: 3)) }
            return .bootloaderInfo(SMPBootloaderInfo(mode: config.mode, noDowngrade: config.noDowngrade))
        case .file(let request):
            return files.handle(request, bufferSize: config.bufferSize)
        }
    }

    /// The slot list as img_mgmt reports it: each slot holding a whole image, with its flags.
    public var states: SMPImageStates {
        var slots = [slotState(primary, slot: activeSlot, running: true)]
        if let secondary { slots.append(slotState(secondary, slot: uploadSlot, running: false)) }
        return SMPImageStates(images: slots.sorted { $0.slot < $1.slot } + (network?.states ?? []))
    }

    private func slotState(_ image: SMPSlotImage, slot: UInt32, running: Bool) -> SMPImageSlot {
        var entry = SMPImageSlot(slot: slot, version: image.versionText, hash: image.hash, bootable: image.bootable)
        switch (swapType, running) {
        case (.none, true), (.test, true), (.permanent, true): entry.confirmed = true
        case (.test, false): entry.pending = true
        case (.permanent, false):
            entry.pending = true
            entry.permanent = true
        case (.revert, false): entry.confirmed = true
        default: break
        }
        entry.active = running
        return entry
    }

    private mutating func stateWrite(hash: [UInt8]?, confirm: Bool) -> SMPResponse {
        // Direct-XIP without revert and RAM load have no state write (img_mgmt's handler is NULL).
        if config.mode == .directXIP || config.mode == .ramLoad { return .error(.general(.notSupported)) }
        if let hash, imageNumber(ofHash: hash) == 1 { return networkStateWrite(hash: hash, confirm: confirm) }
        guard let hash else {
            guard confirm else { return .error(.general(.invalidValue)) }
            confirmed = true
            marks.append((primary.bytes, true))
            return .imageStates(states)
        }
        if hash == primary.hash {
            guard confirm else { return .error(.image(.testToActiveDenied)) }
            confirmed = true
            marks.append((primary.bytes, true))
            return .imageStates(states)
        }
        guard let secondary, secondary.hash == hash else {
            return .error(.image([32, 48, 64].contains(hash.count) ? .hashNotFound : .invalidHash))
        }
        // Slot 1 holds the image to revert to: it cannot be marked (img_mgmt's
        // `img_mgmt_state_set_pending` refuses a confirmed slot).
        guard confirmed else { return .error(.general(.badState)) }
        pending = true
        permanent = confirm
        markOrder.append(0)
        marks.append((secondary.bytes, confirm))
        return .imageStates(states)
    }

    private mutating func erase(slot: UInt32) -> SMPResponse {
        if slot == 3, network != nil {
            // Image 1's second slot (img_mgmt numbers image N's slots 2N and 2N + 1).
            guard network?.pending == false else { return .error(.image(.noFreeSlot)) }
            network?.eraseSecondary()
            if upload?.image == 1 { upload = nil }
            return .empty
        }
        guard slot == 0 || slot == 1 else { return .error(.image(.invalidSlot)) }
        guard slot == uploadSlot, !secondaryInUse else { return .error(.image(.noFreeSlot)) }
        secondaryBytes = []
        secondaryComplete = false
        upload = nil
        return .empty
    }

    private mutating func receive(_ chunk: SMPImageUpload) -> SMPResponse {
        let image = chunk.image ?? 0
        guard image == 0 || (image == 1 && network != nil) else { return .error(.general(.invalidValue)) }
        if config.busy { return .error(.general(.busy)) }
        guard chunk.offset == 0 else { return continueUpload(chunk) }
        if let refusal = config.uploadRefusal { return .error(.image(refusal)) }
        // In the order of Zephyr's img_mgmt_upload_inspect.
        if config.checksImageHeader, chunk.data.count < 32, chunk.length != UInt64(chunk.data.count) {
            return .error(.image(.invalidImageHeader))
        }
        guard let length = chunk.length.flatMap({ Int(exactly: $0) }) else { return .error(.image(.invalidLength)) }
        if config.checksImageHeader, !SMPSlotImage.hasMagic(chunk.data) { return .error(.image(.invalidImageHeaderMagic)) }
        if let sha = chunk.sha, sha.count > 32 { return .error(.image(.invalidHash)) }
        if let upload, let sha = chunk.sha, !sha.isEmpty, upload.sha == sha, upload.length == length, upload.image == image {
            // The same file as the unfinished upload: say where it stands, write nothing.
            return .upload(SMPUploadStatus(offset: UInt64(upload.offset)))
        }
        guard image == 1 ? network?.pending == false : !secondaryInUse else { return .error(.image(.noFreeSlot)) }
        // Zephyr compares `len` with the slot; mcumgr fails to erase that much (EUNKNOWN either
        // way to an SMP v1 request, `reply(_:to:)`).
        guard length <= config.slotSize else { return .error(.image(.imageTooLarge)) }
        if image == 0, config.mode.runsInPlace, config.rejectsMismatchedSlot, chunk.data.count >= 32,
           let fixed = SMPSlotImage.fixedAddress(header: chunk.data),
           fixed != Self.slotAddresses[Int(uploadSlot)] {
            // The image runs only at its load address, and this slot is elsewhere.
            return .error(.image(.invalidFlashAddress))
        }
        if chunk.upgrade == true || config.refusesDowngrade, chunk.data.count >= 32,
           !SMPSlotImage.headerVersion(chunk.data, isNewerThan: image == 1 ? network?.running ?? primary : primary) {
            return .error(.image(.currentVersionIsNewer))
        }
        // A new upload: slot 1 is erased and written from the start.
        upload = Upload(image: image, sha: chunk.sha, length: length, offset: 0)
        if image == 1 {
            network?.eraseSecondary()
        } else {
            secondaryBytes = []
            secondaryComplete = false
        }
        return write(chunk.data)
    }

    private mutating func continueUpload(_ chunk: SMPImageUpload) -> SMPResponse {
        guard let upload, chunk.offset == UInt64(upload.offset) else {
            // Not where the upload stands: the expected offset, nothing written.
            return .upload(SMPUploadStatus(offset: UInt64(upload?.offset ?? 0)))
        }
        return write(chunk.data)
    }

    private mutating func write(_ data: [UInt8]) -> SMPResponse {
        guard var upload else { return .error(.image(.flashContextNotSet)) }
        guard upload.offset + data.count <= upload.length else { return .error(.image(.dataOverrun)) }
        var data = data
        if let flip = flashBitFlipAt, (upload.offset..<(upload.offset + data.count)).contains(flip) {
            data[flip - upload.offset] ^= 0x01
            flashBitFlipAt = nil
        }
        if upload.image == 1 { network?.secondaryBytes += data } else { secondaryBytes += data }
        upload.offset += data.count
        guard upload.offset == upload.length else {
            self.upload = upload
            return .upload(SMPUploadStatus(offset: UInt64(upload.offset)))
        }
        // Done: slot 1 holds the file; img_mgmt forgets the upload.
        self.upload = nil
        let written: [UInt8]
        if upload.image == 1 {
            network?.secondaryComplete = true
            written = network?.secondaryBytes ?? []
        } else {
            secondaryComplete = true
            written = secondaryBytes
        }
        var match: Bool?
        if config.answersMatch, let sha = upload.sha, !sha.isEmpty {
            match = Array(SHA256.hash(data: written)) == sha
        }
        return .upload(SMPUploadStatus(offset: UInt64(upload.offset), match: match))
    }

    // MARK: Boot

    /// What MCUboot does when the device resets (or power-cycles): swap a pending image in,
    /// or swap an unconfirmed one back out. The upload in progress is lost with the RAM.
    @discardableResult
    public mutating func boot() -> BootOutcome {
        boots += 1
        upload = nil
        files.rebooted()
        bootNetworkCore()
        markOrder = []
        let outcome: BootOutcome
        switch (config.mode, swapType) {
        case (.directXIP, _), (.ramLoad, _):
            // No marks: the slot with the highest version runs, in place.
            if let candidate = secondary, candidate.isNewer(than: primary) {
                outcome = take(permanent: true)
            } else {
                outcome = .unchanged
            }
        case (.overwriteOnly, .test), (.overwriteOnly, .permanent):
            // Upgrade-only: the image is copied over slot 0 and kept; slot 1 is erased.
            outcome = take(permanent: true)
            if case .swapped = outcome { eraseSecondary() }
        case (_, .test), (_, .permanent):
            outcome = take(permanent: permanent)
        case (_, .revert):
            outcome = .reverted
            swap()
            if config.mode.runsInPlace { activeSlot = 1 - activeSlot }
            confirmed = true
        case (_, .none):
            outcome = .unchanged
        }
        pending = false
        permanent = false
        lastBoot = outcome
        return outcome
    }

    /// MCUboot takes slot 1's image, after validating it (and, with downgrade prevention, its
    /// version): swapped in (in direct-XIP, booted in place), or refused and erased.
    private mutating func take(permanent: Bool) -> BootOutcome {
        var why = invalidSecondary()
        if why == nil, config.noDowngrade, let candidate = secondary, candidate.isOlder(than: primary) {
            why = "version \(candidate.versionText) is older than the running \(primary.versionText) (downgrade prevention)"
        }
        if let why {
            // bootutil erases an invalid image (its trailer, and so the mark, with it).
            eraseSecondary()
            return .refused(why: why)
        }
        swap()
        if config.mode.runsInPlace { activeSlot = 1 - activeSlot }
        confirmed = permanent
        return .swapped(permanent: permanent)
    }

    private mutating func eraseSecondary() {
        secondaryBytes = []
        secondaryComplete = false
    }

    /// Why MCUboot would not boot slot 1's image (`bootutil_img_validate`): a header or TLV area it
    /// cannot read, a hash TLV that does not match, a non-bootable flag, or, with a key, a missing
    /// signature, a key hash of another key, or a signature that does not verify. Nil: it boots.
    func invalidSecondary() -> String? { invalidImage(secondaryBytes, slot: "slot 1") }

    /// Why MCUboot would not boot `bytes` (a slot's, named `slot`); nil: it boots.
    func invalidImage(_ bytes: [UInt8], slot: String) -> String? {
        let image: MCUbootImage
        do {
            image = try MCUbootImage(bytes: bytes, source: slot)
        } catch {
            return error.description
        }
        guard let signatureKey else { return nil }
        do {
            try image.verifySignature(with: signatureKey, keyName: "MCUboot's key")
        } catch {
            return error.description
        }
        return nil
    }

    private mutating func swap() {
        let old = primary.bytes
        primary = SMPSlotImage(secondaryBytes)
        secondaryBytes = old
        secondaryComplete = true
    }
}
