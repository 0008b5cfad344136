/// A command: its group and id within the group. Read and write of one command share the id.
public struct SMPCommand: Hashable, Sendable, CustomStringConvertible {
    public var group: SMPGroup
    public var id: UInt8

    public init(group: SMPGroup, id: UInt8) {
        self.group = group
        self.id = id
    }

    /// OS 0: echo `d` back as `r`.
    public static let echo = SMPCommand(group: .os, id: 0)
    /// OS 5: reset after answering.
    public static let reset = SMPCommand(group: .os, id: 5)
    /// OS 6: the server's buffer size and count.
    public static let mcumgrParameters = SMPCommand(group: .os, id: 6)
    /// OS 8: the bootloader, or with the query `mode` MCUboot's mode (Zephyr's
    /// `CONFIG_MCUMGR_GRP_OS_BOOTLOADER_INFO`).
    public static let bootloaderInfo = SMPCommand(group: .os, id: 8)
    /// Image 0: read (list slots) or write (test or confirm).
    public static let imageState = SMPCommand(group: .image, id: 0)
    /// Image 1: one chunk of an upload.
    public static let imageUpload = SMPCommand(group: .image, id: 1)
    /// Image 5: erase a slot.
    public static let imageErase = SMPCommand(group: .image, id: 5)
    /// Image 6: each image's slots, their sizes and which one takes an upload
    /// (`CONFIG_MCUMGR_GRP_IMG_SLOT_INFO`).
    public static let imageSlotInfo = SMPCommand(group: .image, id: 6)

    public var description: String {
        switch self {
        case .echo: "echo"
        case .reset: "reset"
        case .mcumgrParameters: "MCUmgr parameters"
        case .bootloaderInfo: "bootloader info"
        case .imageState: "image state"
        case .imageUpload: "image upload"
        case .imageErase: "image erase"
        case .imageSlotInfo: "image slot info"
        default: "\(group) command \(id)"
        }
    }
}

/// One chunk of an image upload (image group, command 1; Zephyr `smp_group_1.rst`, smp
/// `ImageUploadWriteRequest`).
///
/// The first chunk (`offset` 0) carries `length`, `sha` (SHA-256 of the whole file as uploaded,
/// which names the upload session so a server can resume it), `image` and `upgrade`; later chunks
/// carry only `offset` and `data`. Absent fields are omitted from the CBOR.
public struct SMPImageUpload: Hashable, Sendable {
    /// `image`: the image number (0 unless the device has several).
    public var image: UInt32?
    /// `len`: the whole file's size.
    public var length: UInt64?
    /// `off`: where `data` goes.
    public var offset: UInt64
    /// `sha`: SHA-256 of the whole file.
    public var sha: [UInt8]?
    public var data: [UInt8]
    /// `upgrade`: refuse an image not newer than the running one.
    public var upgrade: Bool?

    public init(image: UInt32? = nil, length: UInt64? = nil, offset: UInt64, sha: [UInt8]? = nil, data: [UInt8], upgrade: Bool? = nil) {
        self.image = image
        self.length = length
        self.offset = offset
        self.sha = sha
        self.data = data
        self.upgrade = upgrade
    }

    /// The first chunk of an upload as smpclient builds it: offset 0 and every session field.
    public static func first(image: UInt32 = 0, length: UInt64, sha: [UInt8], data: [UInt8], upgrade: Bool = false) -> SMPImageUpload {
        SMPImageUpload(image: image, length: length, offset: 0, sha: sha, data: data, upgrade: upgrade)
    }

    public var body: CBOR {
        var m: [CBOR: CBOR] = ["off": .unsigned(offset), "data": .bytes(data)]
        if let image { m["image"] = .unsigned(UInt64(image)) }
        if let length { m["len"] = .unsigned(length) }
        if let sha { m["sha"] = .bytes(sha) }
        if let upgrade { m["upgrade"] = .bool(upgrade) }
        return .map(m)
    }

    public init(body: CBOR) throws(SMPWireError) {
        let f = try Fields(body, .imageUpload)
        self.init(image: try f.uint32("image"), length: try f.uint64("len"), offset: try f.required(f.uint64("off"), "off"),
                  sha: try f.bytes("sha"), data: try f.required(f.bytes("data"), "data"), upgrade: try f.bool("upgrade"))
    }

    /// The most data bytes this chunk can carry so that its whole frame (header and CBOR) is at
    /// most `frameLimit` bytes: the server's `buf_size` (or ATT MTU - 3 when the device does not
    /// say). Every other field is counted as it is now; only `data` is sized, its byte-string
    /// head growing by 0, 1, 2 or 4 bytes with its length (smpclient's request sizing, exact at
    /// the boundaries). 0 when even an empty chunk does not fit.
    public func maxDataSize(frameLimit: Int) -> Int {
        var empty = self
        empty.data = []
        return SMPFraming.dataCapacity(emptyBody: empty.body, frameLimit: frameLimit)
    }
}

/// A request from the central (the `SMPRequest.frame` encoder) or, on the server, what a received
/// frame asks for (`init(decoding:)`).
public enum SMPRequest: Hashable, Sendable, CustomStringConvertible {
    /// OS 6 read: `{}`.
    case mcumgrParameters
    /// OS 0 write: `{"d": text}`.
    case echo(String)
    /// OS 5 write: `{}`, or `{"force": 1}` to reset even if the device is busy (smp sends 0/1).
    case reset(force: Bool = false)
    /// Image 0 read: `{}`.
    case imageStateRead
    /// Image 0 write: `{"hash"?: bytes, "confirm": bool}`. `confirm` false marks the image with
    /// `hash` (its MCUboot SHA256 TLV) for test; true confirms it, or without `hash` the running image.
    case imageStateWrite(hash: [UInt8]?, confirm: Bool)
    /// Image 1 write.
    case imageUpload(SMPImageUpload)
    /// Image 5 write: `{}` or `{"slot": n}`.
    case imageErase(slot: UInt32?)
    /// OS 8 read: `{}` (which bootloader), or `{"query": "mode"}` (MCUboot's mode).
    case bootloaderInfo(query: String?)
    /// Image 6 read: `{}`.
    case imageSlotInfo
    /// File management (group 8).
    case file(SMPFileRequest)

    public var command: SMPCommand {
        switch self {
        case .file(let f): f.command
        case .mcumgrParameters: .mcumgrParameters
        case .bootloaderInfo: .bootloaderInfo
        case .imageSlotInfo: .imageSlotInfo
        case .echo: .echo
        case .reset: .reset
        case .imageStateRead, .imageStateWrite: .imageState
        case .imageUpload: .imageUpload
        case .imageErase: .imageErase
        }
    }

    public var operation: SMPOperation {
        switch self {
        case .mcumgrParameters, .imageStateRead, .bootloaderInfo, .imageSlotInfo: .read
        case .file(let f): f.operation
        default: .write
        }
    }

    public var body: CBOR {
        switch self {
        case .mcumgrParameters, .imageStateRead, .imageSlotInfo: [:]
        case .echo(let d): ["d": .text(d)]
        case .reset(let force): force ? ["force": 1] : [:]
        case .imageStateWrite(let hash, let confirm):
            if let hash { ["hash": .bytes(hash), "confirm": .bool(confirm)] } else { ["confirm": .bool(confirm)] }
        case .imageUpload(let upload): upload.body
        case .imageErase(let slot): slot.map { ["slot": .unsigned(UInt64($0))] } ?? [:]
        case .bootloaderInfo(let query): query.map { ["query": .text($0)] } ?? [:]
        case .file(let f): f.body
        }
    }

    /// The request as an SMP v2 frame. Throws `.frameTooLarge` only for an echo text or upload
    /// chunk whose CBOR is over 65,535 bytes.
    public func frame(sequence: UInt8) throws(SMPWireError) -> SMPFrame {
        try SMPFrame(header: SMPHeader(operation: operation, version: .v2, length: 0, group: command.group,
                                   sequence: sequence, command: command.id),
                 body: body)
    }

    /// What a received request frame asks for. Unknown commands throw `.unsupportedCommand` (a
    /// server answers MGMT_ERR_ENOTSUP); responses throw `.wrongDirection`.
    public init(decoding frame: SMPFrame) throws(SMPWireError) {
        let h = frame.header
        guard !h.operation.isResponse else {
            throw SMPWireError(.wrongDirection, "a \(h.operation) for \(SMPCommand(group: h.group, id: h.command)) where a request belongs")
        }
        let command = SMPCommand(group: h.group, id: h.command)
        if h.group == .fs {
            self = .file(try SMPFileRequest(decoding: frame))
            return
        }
        switch (command, h.operation) {
        case (.mcumgrParameters, .read):
            _ = try Fields(frame.body(), command)
            self = .mcumgrParameters
        case (.imageState, .read):
            _ = try Fields(frame.body(), command)
            self = .imageStateRead
        case (.echo, .write):
            let f = try Fields(frame.body(), command)
            self = .echo(try f.required(f.text("d"), "d"))
        case (.reset, .write):
            let f = try Fields(frame.body(), command)
            self = .reset(force: try f.flag("force") ?? false)
        case (.imageState, .write):
            let f = try Fields(frame.body(), command)
            self = .imageStateWrite(hash: try f.bytes("hash"), confirm: try f.bool("confirm") ?? false)
        case (.imageUpload, .write): self = .imageUpload(try SMPImageUpload(body: frame.body()))
        case (.imageErase, .write):
            let f = try Fields(frame.body(), command)
            self = .imageErase(slot: try f.uint32("slot"))
        case (.bootloaderInfo, .read):
            let f = try Fields(frame.body(), command)
            self = .bootloaderInfo(query: try f.text("query"))
        case (.imageSlotInfo, .read):
            _ = try Fields(frame.body(), command)
            self = .imageSlotInfo
        default:
            throw SMPWireError(.unsupportedCommand, "\(h.operation) of \(command) is not a request this codec knows")
        }
    }

    public var description: String {
        switch self {
        case .mcumgrParameters: "MCUmgr parameters read"
        case .echo(let d): "echo of \(d.utf8.count) bytes"
        case .reset(let force): force ? "reset (forced)" : "reset"
        case .imageStateRead: "image state read"
        case .imageStateWrite(let hash, let confirm):
            confirm ? (hash == nil ? "confirm the running image" : "confirm image \(hexString(hash ?? []))")
                : "test image \(hexString(hash ?? []))"
        case .imageUpload(let u): "image upload of \(u.data.count) bytes at \(u.offset)"
        case .imageErase(let slot): slot.map { "erase slot \($0)" } ?? "erase"
        case .bootloaderInfo(let query): query.map { "bootloader info read (\($0))" } ?? "bootloader info read"
        case .imageSlotInfo: "image slot info read"
        case .file(let f): f.description
        }
    }
}

/// MCUmgr parameters (OS 6): the server's SMP buffer, the bound on a frame and on the requests in
/// flight.
public struct SMPParameters: Hashable, Sendable {
    /// `buf_size`: the largest frame (header and CBOR) the server takes.
    public var bufferSize: UInt32
    /// `buf_count`: how many such buffers it has.
    public var bufferCount: UInt32

    public init(bufferSize: UInt32, bufferCount: UInt32) {
        self.bufferSize = bufferSize
        self.bufferCount = bufferCount
    }

    public var body: CBOR { ["buf_size": .unsigned(UInt64(bufferSize)), "buf_count": .unsigned(UInt64(bufferCount))] }

    public init(body: CBOR) throws(SMPWireError) {
        let f = try Fields(body, .mcumgrParameters)
        self.init(bufferSize: try f.required(f.uint32("buf_size"), "buf_size"),
                  bufferCount: try f.required(f.uint32("buf_count"), "buf_count"))
    }
}

/// One slot in an image state answer (smp `ImageState`). Flags are true or absent: a server writes
/// only the true ones, and the decoder takes an explicit false as absent.
public struct SMPImageSlot: Hashable, Sendable {
    /// `image`: the image number, when the device has several.
    public var image: UInt32?
    public var slot: UInt32
    /// `version`: "major.minor.revision[.build]".
    public var version: String
    /// `hash`: the image's MCUboot hash (its SHA256 TLV).
    public var hash: [UInt8]?
    public var bootable: Bool
    /// Marked for test (or permanent) at the next reset.
    public var pending: Bool
    public var confirmed: Bool
    /// Running now.
    public var active: Bool
    /// The pending swap is permanent (confirmed when marked).
    public var permanent: Bool

    public init(image: UInt32? = nil, slot: UInt32, version: String, hash: [UInt8]? = nil, bootable: Bool = false,
                pending: Bool = false, confirmed: Bool = false, active: Bool = false, permanent: Bool = false) {
        self.image = image
        self.slot = slot
        self.version = version
        self.hash = hash
        self.bootable = bootable
        self.pending = pending
        self.confirmed = confirmed
        self.active = active
        self.permanent = permanent
    }

    public var body: CBOR {
        var m: [CBOR: CBOR] = ["slot": .unsigned(UInt64(slot)), "version": .text(version)]
        if let image { m["image"] = .unsigned(UInt64(image)) }
        if let hash { m["hash"] = .bytes(hash) }
        for (key, on) in [("bootable", bootable), ("pending", pending), ("confirmed", confirmed), ("active", active), ("permanent", permanent)] where on {
            m[.text(key)] = true
        }
        return .map(m)
    }

    public init(body: CBOR) throws(SMPWireError) {
        let f = try Fields(body, .imageState)
        self.init(image: try f.uint32("image"), slot: try f.required(f.uint32("slot"), "slot"),
                  version: try f.required(f.text("version"), "version"), hash: try f.bytes("hash"),
                  bootable: try f.bool("bootable") ?? false, pending: try f.bool("pending") ?? false,
                  confirmed: try f.bool("confirmed") ?? false, active: try f.bool("active") ?? false,
                  permanent: try f.bool("permanent") ?? false)
    }
}

/// The image state answer (image 0, read and write): every slot the server reports.
public struct SMPImageStates: Hashable, Sendable {
    public var images: [SMPImageSlot]
    /// `splitStatus`, which only split-image devices send.
    public var splitStatus: Int64?

    public init(images: [SMPImageSlot], splitStatus: Int64? = nil) {
        self.images = images
        self.splitStatus = splitStatus
    }

    public var body: CBOR {
        var m: [CBOR: CBOR] = ["images": .array(images.map(\.body))]
        if let splitStatus { m["splitStatus"] = .int(splitStatus) }
        return .map(m)
    }

    public init(body: CBOR) throws(SMPWireError) {
        let f = try Fields(body, .imageState)
        guard let list = f.map["images"] else { throw SMPWireError(.missingField("images"), "image state answer without \"images\"") }
        guard let entries = list.array else {
            throw SMPWireError(.badField("images"), "image state answer's \"images\" is \(list.kindName), not an array")
        }
        var images: [SMPImageSlot] = []
        for entry in entries { images.append(try SMPImageSlot(body: entry)) }
        self.init(images: images, splitStatus: try f.int64("splitStatus"))
    }
}

/// The answer to an upload chunk: the server's offset (the next byte it wants; the checkpoint a
/// resumed upload continues from) and, on the last chunk of a server with image checks, `match`.
public struct SMPUploadStatus: Hashable, Sendable {
    /// `off`.
    public var offset: UInt64
    /// `match`: whether the received file's SHA-256 equals the first chunk's `sha`.
    public var match: Bool?

    public init(offset: UInt64, match: Bool? = nil) {
        self.offset = offset
        self.match = match
    }

    public var body: CBOR {
        var m: [CBOR: CBOR] = ["off": .unsigned(offset)]
        if let match { m["match"] = .bool(match) }
        return .map(m)
    }

    public init(body: CBOR) throws(SMPWireError) {
        let f = try Fields(body, .imageUpload)
        self.init(offset: try f.required(f.uint64("off"), "off"), match: try f.bool("match"))
    }
}

/// An answer to a request, as the central reads it and a server writes it.
public enum SMPResponse: Hashable, Sendable {
    case mcumgrParameters(SMPParameters)
    /// Echo's `r`.
    case echo(String)
    /// Reset, erase and other answers with nothing to say: `{}`.
    case empty
    /// Image state read and write.
    case imageStates(SMPImageStates)
    case upload(SMPUploadStatus)
    case bootloaderInfo(SMPBootloaderInfo)
    case slotInfo(SMPSlotInfo)
    /// A file management answer (group 8).
    case file(SMPFileResponse)
    /// The server refused the request.
    case error(SMPDeviceError)

    /// The answer's CBOR. An error is written in the style of `version`.
    public func body(version: SMPVersion = .v2) -> CBOR {
        switch self {
        case .mcumgrParameters(let p): p.body
        case .echo(let r): ["r": .text(r)]
        case .empty: [:]
        case .imageStates(let s): s.body
        case .upload(let u): u.body
        case .bootloaderInfo(let b): b.body
        case .slotInfo(let i): i.body
        case .file(let f): f.body
        case .error(let e): e.body(version: version)
        }
    }

    /// The frame answering `request`: its version, group, sequence and command, the response
    /// operation. Throws `.frameTooLarge` only for an answer over 65,535 bytes of CBOR.
    public func frame(replyingTo request: SMPHeader) throws(SMPWireError) -> SMPFrame {
        try SMPFrame(header: request.response(length: 0), body: body(version: request.version))
    }

    /// Reads an answer: an error in either version's form (v2 `err`, or a nonzero v1 `rc`) first,
    /// then the command's fields, in any order and encoding, unknown fields ignored. An image
    /// state write answered without `images` (`{}` or `{"rc": 0}`) is `.empty`. Requests throw
    /// `.wrongDirection`; commands this codec does not know throw `.unsupportedCommand`.
    public init(decoding frame: SMPFrame) throws(SMPWireError) {
        let h = frame.header
        let command = SMPCommand(group: h.group, id: h.command)
        guard h.operation.isResponse else {
            throw SMPWireError(.wrongDirection, "a \(h.operation) request for \(command) where a response belongs")
        }
        let body = try frame.body()
        if let error = try SMPDeviceError(body: body) {
            self = .error(error)
            return
        }
        if h.group == .fs {
            self = .file(try SMPFileResponse(body: body, command: command, operation: h.operation))
            return
        }
        switch (command, h.operation) {
        case (.mcumgrParameters, .readResponse): self = .mcumgrParameters(try SMPParameters(body: body))
        case (.echo, .writeResponse):
            let f = try Fields(body, command)
            self = .echo(try f.required(f.text("r"), "r"))
        case (.reset, .writeResponse), (.imageErase, .writeResponse):
            _ = try Fields(body, command)
            self = .empty
        case (.imageState, .writeResponse) where body["images"] == nil:
            // A test or confirm answered without the state list: a success with nothing to show.
            _ = try Fields(body, command)
            self = .empty
        case (.imageState, _): self = .imageStates(try SMPImageStates(body: body))
        case (.imageUpload, .writeResponse): self = .upload(try SMPUploadStatus(body: body))
        case (.bootloaderInfo, .readResponse): self = .bootloaderInfo(try SMPBootloaderInfo(body: body))
        case (.imageSlotInfo, .readResponse): self = .slotInfo(try SMPSlotInfo(body: body))
        default:
            throw SMPWireError(.unsupportedCommand, "\(h.operation) of \(command) is not a response this codec knows")
        }
    }
}

/// MCUboot's mode as os_mgmt's bootloader info reports it: MCUboot's `enum mcuboot_mode`
/// (bootutil's boot_status.h); Zephyr reports -1 for a mode it does not map.
public struct SMPBootloaderMode: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
    public var rawValue: Int64
    public init(rawValue: Int64) { self.rawValue = rawValue }

    public static let singleSlot = Self(rawValue: 0)
    public static let swapScratch = Self(rawValue: 1)
    /// Upgrade-only: the new image is copied over the old one; no test, no revert.
    public static let overwriteOnly = Self(rawValue: 2)
    public static let swapMove = Self(rawValue: 3)
    /// Both slots run in place; MCUboot boots the one with the highest version.
    public static let directXIP = Self(rawValue: 4)
    /// Direct-XIP with a test run: an image not confirmed is not booted again.
    public static let directXIPWithRevert = Self(rawValue: 5)
    public static let ramLoad = Self(rawValue: 6)
    public static let firmwareLoader = Self(rawValue: 7)
    public static let singleSlotRAMLoad = Self(rawValue: 8)
    public static let swapOffset = Self(rawValue: 9)

    /// Swap modes: the image goes to slot 1, is swapped in for test and reverted unless confirmed.
    public var swaps: Bool { [.swapScratch, .swapMove, .swapOffset].contains(self) }
    /// Direct-XIP and RAM load: the image goes to the slot not running, which runs in place.
    public var runsInPlace: Bool { [.directXIP, .directXIPWithRevert, .ramLoad].contains(self) }
    /// One slot: nothing for an SMP client to upload a second image into.
    public var singleSlot: Bool { [.singleSlot, .firmwareLoader, .singleSlotRAMLoad].contains(self) }
    /// No test run and no revert (the image is kept as soon as MCUboot takes it).
    public var keepsWithoutTest: Bool { [.overwriteOnly, .directXIP, .ramLoad].contains(self) }

    public var description: String {
        switch self {
        case .singleSlot: "single-slot"
        case .swapScratch: "swap using scratch"
        case .overwriteOnly: "overwrite-only"
        case .swapMove: "swap using move"
        case .directXIP: "direct-XIP"
        case .directXIPWithRevert: "direct-XIP with revert"
        case .ramLoad: "RAM load"
        case .firmwareLoader: "firmware loader"
        case .singleSlotRAMLoad: "single-slot RAM load"
        case .swapOffset: "swap using offset"
        default: "mode \(rawValue)"
        }
    }
}

/// os_mgmt's bootloader info answer: `{"bootloader": text}` without a query; with the query
/// `mode`, `{"mode": int, "no-downgrade"?: true}` (downgrade prevention: MCUboot boots no
/// image older than the running one).
public struct SMPBootloaderInfo: Hashable, Sendable {
    public var bootloader: String?
    public var mode: SMPBootloaderMode?
    public var noDowngrade: Bool

    public init(bootloader: String? = nil, mode: SMPBootloaderMode? = nil, noDowngrade: Bool = false) {
        self.bootloader = bootloader
        self.mode = mode
        self.noDowngrade = noDowngrade
    }

    public var body: CBOR {
        var m: [CBOR: CBOR] = [:]
        if let bootloader { m["bootloader"] = .text(bootloader) }
        if let mode { m["mode"] = .int(mode.rawValue) }
        if noDowngrade { m["no-downgrade"] = true }
        return .map(m)
    }

    public init(body: CBOR) throws(SMPWireError) {
        let f = try Fields(body, .bootloaderInfo)
        self.init(bootloader: try f.text("bootloader"), mode: try f.int64("mode").map(SMPBootloaderMode.init(rawValue:)),
                  noDowngrade: try f.bool("no-downgrade") ?? false)
    }
}

/// img_mgmt's slot info answer (image 6): `{"images": [{"image", "slots": [{"slot", "size"?,
/// "upload_image_id"?}], "max_image_size"?}]}`; a slot the device could not open carries `rc`
/// instead of its size.
public struct SMPSlotInfo: Hashable, Sendable {
    public struct Slot: Hashable, Sendable {
        public var slot: UInt32
        /// The slot's flash area size in bytes.
        public var size: UInt64?
        /// The image number an upload to this slot names; absent for the slot that runs.
        public var uploadImageID: UInt32?

        public init(slot: UInt32, size: UInt64?, uploadImageID: UInt32? = nil) {
            self.slot = slot
            self.size = size
            self.uploadImageID = uploadImageID
        }
    }

    public struct Image: Hashable, Sendable {
        public var image: UInt32
        public var slots: [Slot]
        /// The largest image the slots take (MCUboot's trailer and swap space left out), when told.
        public var maxImageSize: UInt64?

        public init(image: UInt32, slots: [Slot], maxImageSize: UInt64? = nil) {
            self.image = image
            self.slots = slots
            self.maxImageSize = maxImageSize
        }
    }

    public var images: [Image]

    public init(images: [Image]) { self.images = images }

    public var body: CBOR {
        .map(["images": .array(images.map { image in
            var m: [CBOR: CBOR] = ["image": .unsigned(UInt64(image.image)), "slots": .array(image.slots.map { slot in
                var s: [CBOR: CBOR] = ["slot": .unsigned(UInt64(slot.slot))]
                if let size = slot.size { s["size"] = .unsigned(size) }
                if let id = slot.uploadImageID { s["upload_image_id"] = .unsigned(UInt64(id)) }
                return .map(s)
            })]
            if let max = image.maxImageSize { m["max_image_size"] = .unsigned(max) }
            return .map(m)
        })])
    }

    public init(body: CBOR) throws(SMPWireError) {
        let f = try Fields(body, .imageSlotInfo)
        guard let list = try f.required(f.map["images"], "images").array else {
            throw SMPWireError(.badField("images"), "image slot info's \"images\" is not an array")
        }
        var images: [Image] = []
        for entry in list {
            let e = try Fields(entry, .imageSlotInfo)
            guard let slotList = try e.required(e.map["slots"], "slots").array else {
                throw SMPWireError(.badField("slots"), "image slot info's \"slots\" is not an array")
            }
            var slots: [Slot] = []
            for slot in slotList {
                let s = try Fields(slot, .imageSlotInfo)
                slots.append(Slot(slot: try s.required(s.uint32("slot"), "slot"), size: try s.uint64("size"), uploadImageID: try s.uint32("upload_image_id")))
            }
            images.append(Image(image: try e.required(e.uint32("image"), "image"), slots: slots, maxImageSize: try e.uint64("max_image_size")))
        }
        self.init(images: images)
    }
}

/// Typed reads of a message's map, each error naming the field.
struct Fields {
    let map: [CBOR: CBOR]
    let command: SMPCommand

    init(_ body: CBOR, _ command: SMPCommand) throws(SMPWireError) {
        guard let map = body.map else {
            throw SMPWireError(.notAMap, "\(command) body is \(body.kindName), not a map")
        }
        self.map = map
        self.command = command
    }

    func required<T>(_ value: T?, _ key: String) throws(SMPWireError) -> T {
        guard let value else { throw SMPWireError(.missingField(key), "\(command) message without \"\(key)\"") }
        return value
    }

    private func bad(_ key: String, _ value: CBOR, _ expected: String) -> SMPWireError {
        SMPWireError(.badField(key), "\(command) field \"\(key)\" is \(value), expected \(expected)")
    }

    func uint64(_ key: String) throws(SMPWireError) -> UInt64? {
        guard let v = map[.text(key)] else { return nil }
        guard let n = v.uint64 else { throw bad(key, v, "an unsigned integer") }
        return n
    }

    func uint32(_ key: String) throws(SMPWireError) -> UInt32? {
        guard let v = map[.text(key)] else { return nil }
        guard let n = v.uint64, let small = UInt32(exactly: n) else { throw bad(key, v, "an unsigned 32-bit integer") }
        return small
    }

    func int64(_ key: String) throws(SMPWireError) -> Int64? {
        guard let v = map[.text(key)] else { return nil }
        guard let n = v.int64 else { throw bad(key, v, "a 64-bit integer") }
        return n
    }

    func bool(_ key: String) throws(SMPWireError) -> Bool? {
        guard let v = map[.text(key)] else { return nil }
        guard let b = v.bool else { throw bad(key, v, "a boolean") }
        return b
    }

    /// A boolean written as CBOR true/false or as the integers 0/1.
    func flag(_ key: String) throws(SMPWireError) -> Bool? {
        guard let v = map[.text(key)] else { return nil }
        switch v {
        case .bool(let b): return b
        case .unsigned(0): return false
        case .unsigned(1): return true
        default: throw bad(key, v, "0, 1 or a boolean")
        }
    }

    func text(_ key: String) throws(SMPWireError) -> String? {
        guard let v = map[.text(key)] else { return nil }
        guard let s = v.text else { throw bad(key, v, "a text string") }
        return s
    }

    func bytes(_ key: String) throws(SMPWireError) -> [UInt8]? {
        guard let v = map[.text(key)] else { return nil }
        guard let b = v.byteString else { throw bad(key, v, "a byte string") }
        return b
    }
}

/// Lower-case hex, as `image list` shows a hash.
public func hexString(_ bytes: [UInt8]) -> String { bytes.map(hex).joined() }
