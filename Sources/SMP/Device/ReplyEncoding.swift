/// How the simulated SMP server writes its answers: the CBOR each family of real servers sends.
///
/// Read from their sources (docs/SMP.md, "How servers encode their answers"):
/// - Zephyr 3.x and later (nRF Connect SDK too) encode with zcbor: `zcbor_map_start_encode` and
///   `zcbor_list_start_encode` write an indefinite-length head (0xbf, 0x9f) and `..._end_encode` a
///   break (0xff) unless `ZCBOR_CANONICAL` is set, which is not the default. Fields go in the
///   order the handler writes them; `rc` is left out on success (unless
///   `CONFIG_MCUMGR_SMP_LEGACY_RC_BEHAVIOUR`); `image state-read` writes every flag, false ones too,
///   and `splitStatus: 0` (unless `CONFIG_MCUMGR_GRP_IMG_FRUGAL_LIST`); a group's error is
///   `{"err": {"group": g, "rc": n}}`, and answering an SMP v1 request it is translated to a general
///   code (`img_mgmt_translate_error_code`: an image too large becomes MGMT_ERR_EUNKNOWN, 1).
/// - mcumgr with tinycbor (Mynewt, Zephyr up to 2.7): `cbor_encoder_create_map(…,
///   CborIndefiniteLength)` for every map and array, `rc: 0` in upload and erase answers, no
///   `match`, no MCUmgr parameters command (MGMT_ERR_ENOTSUP), every error a general code
///   `{"rc": n}` (an image too large fails the slot erase: MGMT_ERR_EUNKNOWN, 1), and the answer's
///   header says version 0.
/// Both write every integer and length in its shortest head.
public enum SMPReplyEncoding: String, Sendable, Hashable, CaseIterable, CustomStringConvertible {
    /// Canonical CBOR (`CBOREncoder`): definite lengths, keys sorted; only the fields that say
    /// something (no `rc` on success, only true flags). A zcbor server built with `ZCBOR_CANONICAL`
    /// sends definite lengths like this.
    case definite
    /// The same fields as `definite`, in the order the message types list them (not sorted), with
    /// indefinite-length maps and arrays.
    case indefinite
    /// Zephyr 3.x and later, as its handlers write their answers with zcbor (the default).
    case zcbor
    /// mcumgr with tinycbor (Mynewt, Zephyr up to 2.7).
    case tinycbor

    /// What Zephyr sends today.
    public static let zephyr = SMPReplyEncoding.zcbor

    public var description: String { rawValue }

    /// Whether maps and arrays are written with indefinite lengths.
    public var indefiniteLengths: Bool { self != .definite }
}

/// A CBOR item as a device writes it: map entries in the order given, containers definite or
/// indefinite. The device side's own encoder, apart from `CBOREncoder` (which sorts map keys).
indirect enum DeviceCBOR: Sendable, Hashable {
    case unsigned(UInt64)
    case negative(UInt64)
    case text(String)
    case bytes([UInt8])
    case bool(Bool)
    case array([DeviceCBOR])
    case map([Entry])

    struct Entry: Sendable, Hashable {
        var key: String
        var value: DeviceCBOR
    }

    static func int(_ n: Int64) -> DeviceCBOR { n >= 0 ? .unsigned(UInt64(n)) : .negative(UInt64(-1 - n)) }

    /// A map of text keys in this order.
    static func map(_ entries: KeyValuePairs<String, DeviceCBOR>) -> DeviceCBOR {
        .map(entries.map { Entry(key: $0.key, value: $0.value) })
    }

    /// The item's bytes: shortest heads, maps and arrays definite or indefinite.
    func encoded(indefinite: Bool) -> [UInt8] {
        var out: [UInt8] = []
        append(to: &out, indefinite: indefinite)
        return out
    }

    private func append(to out: inout [UInt8], indefinite: Bool) {
        switch self {
        case .unsigned(let n): CBOREncoder.appendHead(major: 0, n, to: &out)
        case .negative(let n): CBOREncoder.appendHead(major: 1, n, to: &out)
        case .text(let s):
            CBOREncoder.appendHead(major: 3, UInt64(s.utf8.count), to: &out)
            out += s.utf8
        case .bytes(let b):
            CBOREncoder.appendHead(major: 2, UInt64(b.count), to: &out)
            out += b
        case .bool(let b): out.append(b ? 0xF5 : 0xF4)
        case .array(let items):
            if indefinite { out.append(0x9F) } else { CBOREncoder.appendHead(major: 4, UInt64(items.count), to: &out) }
            for item in items { item.append(to: &out, indefinite: indefinite) }
            if indefinite { out.append(0xFF) }
        case .map(let entries):
            if indefinite { out.append(0xBF) } else { CBOREncoder.appendHead(major: 5, UInt64(entries.count), to: &out) }
            for entry in entries {
                DeviceCBOR.text(entry.key).append(to: &out, indefinite: indefinite)
                entry.value.append(to: &out, indefinite: indefinite)
            }
            if indefinite { out.append(0xFF) }
        }
    }
}

extension SMPServer {
    /// The frame answering `request` with `response`, written as `config.encoding` says.
    public func reply(_ response: SMPResponse, to request: SMPHeader) -> SMPFrame {
        let encoding = config.encoding
        var response = response
        if case .error(let error) = response { response = .error(Self.answered(error, to: request, encoding: encoding)) }
        guard encoding != .definite else {
            // Canonical, as before; no answer of this server is over 65,535 bytes of CBOR.
            return (try? response.frame(replyingTo: request)) ?? SMPFrame(checked: request.response(length: 0), length: 0, payload: [])
        }
        let payload = Self.body(response, to: request, encoding: encoding).encoded(indefinite: true)
        // mcumgr's answers leave the header's version bits 0; Zephyr answers in the request's version.
        var header = request.response(length: UInt16(clamping: payload.count))
        if encoding == .tinycbor { header.version = .v1 }
        return SMPFrame(checked: header, length: header.length, payload: payload)
    }

    /// `error` as the server sends it: a group's code as is to an SMP v2 request of a Zephyr
    /// server; translated to a general code for a v1 request (Zephyr's `img_mgmt_translate_error_code`)
    /// and always by mcumgr, which has only the general codes.
    static func answered(_ error: SMPDeviceError, to request: SMPHeader, encoding: SMPReplyEncoding) -> SMPDeviceError {
        guard error.group != nil, encoding == .tinycbor || request.version == .v1 else { return error }
        if let code = error.fileError { return .general(code.legacyCode, reason: error.reason) }
        guard let code = error.imageError else { return .general(.unknown, reason: error.reason) }
        guard encoding == .tinycbor else { return .general(legacyCode(code), reason: error.reason) }
        // mcumgr refuses an upload into a slot in use with ENOMEM (erasing it: EBADSTATE).
        let upload = SMPCommand(group: request.group, id: request.command) == .imageUpload
        return .general(code == .noFreeSlot && upload ? .noMemory : mcumgrCode(code))
    }

    /// The answer's fields in the order `encoding`'s server writes them.
    static func body(_ response: SMPResponse, to request: SMPHeader, encoding: SMPReplyEncoding) -> DeviceCBOR {
        let tinycbor = encoding == .tinycbor
        switch response {
        case .mcumgrParameters(let p):
            return .map(["buf_size": .unsigned(UInt64(p.bufferSize)), "buf_count": .unsigned(UInt64(p.bufferCount))])
        case .echo(let r):
            return .map(["r": .text(r)])
        case .empty:
            // mcumgr's erase answers `rc` 0; its reset, and every Zephyr answer with nothing to say, `{}`.
            return tinycbor && SMPCommand(group: request.group, id: request.command) == .imageErase ? .map(["rc": .unsigned(0)]) : .map([])
        case .upload(let status):
            var entries: [DeviceCBOR.Entry] = tinycbor ? [.init(key: "rc", value: .unsigned(0))] : []
            entries.append(.init(key: "off", value: .unsigned(status.offset)))
            if let match = status.match, !tinycbor { entries.append(.init(key: "match", value: .bool(match))) }
            return .map(entries)
        case .imageStates(let states):
            return imageStates(states, encoding: encoding)
        case .slotInfo(let info):
            // img_mgmt_slot_info's order: image, slots (slot, size, upload_image_id), max_image_size.
            return .map([.init(key: "images", value: .array(info.images.map { image in
                var entries: [DeviceCBOR.Entry] = [.init(key: "image", value: .unsigned(UInt64(image.image))),
                                                   .init(key: "slots", value: .array(image.slots.map { slot in
                    var s: [DeviceCBOR.Entry] = [.init(key: "slot", value: .unsigned(UInt64(slot.slot)))]
                    if let size = slot.size { s.append(.init(key: "size", value: .unsigned(size))) }
                    if let id = slot.uploadImageID { s.append(.init(key: "upload_image_id", value: .unsigned(UInt64(id)))) }
                    return .map(s)
                }))]
                if let max = image.maxImageSize { entries.append(.init(key: "max_image_size", value: .unsigned(max))) }
                return .map(entries)
            }))])
        case .bootloaderInfo(let info):
            // os_mgmt writes `bootloader`, or `mode` then `no-downgrade` (only when set).
            var entries: [DeviceCBOR.Entry] = []
            if let bootloader = info.bootloader { entries.append(.init(key: "bootloader", value: .text(bootloader))) }
            if let mode = info.mode { entries.append(.init(key: "mode", value: mode.rawValue < 0 ? .negative(UInt64(-1 - mode.rawValue)) : .unsigned(UInt64(mode.rawValue)))) }
            if info.noDowngrade { entries.append(.init(key: "no-downgrade", value: .bool(true))) }
            return .map(entries)
        case .file(let answer):
            return fileBody(answer, to: request, encoding: encoding)
        case .error(let error):
            return errorBody(error, encoding: encoding)
        }
    }

    private static func imageStates(_ states: SMPImageStates, encoding: SMPReplyEncoding) -> DeviceCBOR {
        // Zephyr's and mcumgr's handlers write every flag and splitStatus 0; `indefinite` writes
        // what the message holds, as `definite` does.
        let everyFlag = encoding == .zcbor || encoding == .tinycbor
        let slots: [DeviceCBOR] = states.images.map { slot in
            var entries: [DeviceCBOR.Entry] = []
            if let image = slot.image { entries.append(.init(key: "image", value: .unsigned(UInt64(image)))) }
            entries.append(.init(key: "slot", value: .unsigned(UInt64(slot.slot))))
            entries.append(.init(key: "version", value: .text(slot.version)))
            if let hash = slot.hash { entries.append(.init(key: "hash", value: .bytes(hash))) }
            let flags = [("bootable", slot.bootable), ("pending", slot.pending), ("confirmed", slot.confirmed),
                         ("active", slot.active), ("permanent", slot.permanent)]
            for (key, on) in flags where on || everyFlag { entries.append(.init(key: key, value: .bool(on))) }
            return .map(entries)
        }
        var entries: [DeviceCBOR.Entry] = [.init(key: "images", value: .array(slots))]
        if let split = states.splitStatus ?? (everyFlag ? 0 : nil) { entries.append(.init(key: "splitStatus", value: .int(split))) }
        return .map(entries)
    }

    private static func errorBody(_ error: SMPDeviceError, encoding: SMPReplyEncoding) -> DeviceCBOR {
        if let group = error.group {
            return .map(["err": .map(["group": .unsigned(UInt64(group.rawValue)), "rc": .int(error.rc)])])
        }
        // Zephyr adds `rsn` only with CONFIG_MCUMGR_SMP_VERBOSE_ERR_RESPONSE, and mcumgr drops it.
        if let reason = error.reason, encoding == .indefinite { return .map(["rc": .int(error.rc), "rsn": .text(reason)]) }
        return .map(["rc": .int(error.rc)])
    }

    /// Zephyr's translation of an image group code for an SMP v1 request
    /// (`img_mgmt_translate_error_code`).
    static func legacyCode(_ code: ImageManagementError) -> MCUmgrError {
        switch code {
        case .ok: .ok
        case .noImage, .noTLVs: .noEntry
        case .noFreeSlot, .currentVersionIsNewer, .imageAlreadyPending: .badState
        case .noFreeMemory: .noMemory
        case .invalidSlot, .invalidPageOffset, .invalidOffset, .invalidLength, .invalidImageHeader, .invalidHash,
             .invalidFlashAddress:
            .invalidValue
        default: .unknown
        }
    }

    /// What mcumgr's img_mgmt answers where Zephyr's has the image group `code`: Zephyr's
    /// translation, except for a bad magic, an unknown hash, data past the length and an upload
    /// not started (EINVAL).
    static func mcumgrCode(_ code: ImageManagementError) -> MCUmgrError {
        switch code {
        case .invalidImageHeaderMagic, .hashNotFound, .dataOverrun, .flashContextNotSet: .invalidValue
        default: legacyCode(code)
        }
    }
}
