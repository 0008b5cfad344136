import OTA

/// MCUmgr's general result codes (`MGMT_ERR_*`, smp `error.py`), carried as v1's `rc` by servers of
/// either version.
///
/// `description` is one line: what the device said and what to do.
public struct MCUmgrError: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
    public let rawValue: Int64
    public init(rawValue: Int64) { self.rawValue = rawValue }

    public static let ok = MCUmgrError(rawValue: 0)
    public static let unknown = MCUmgrError(rawValue: 1)
    public static let noMemory = MCUmgrError(rawValue: 2)
    public static let invalidValue = MCUmgrError(rawValue: 3)
    public static let timeout = MCUmgrError(rawValue: 4)
    public static let noEntry = MCUmgrError(rawValue: 5)
    public static let badState = MCUmgrError(rawValue: 6)
    public static let messageTooLarge = MCUmgrError(rawValue: 7)
    public static let notSupported = MCUmgrError(rawValue: 8)
    public static let corrupt = MCUmgrError(rawValue: 9)
    public static let busy = MCUmgrError(rawValue: 10)
    public static let accessDenied = MCUmgrError(rawValue: 11)
    public static let protocolTooOld = MCUmgrError(rawValue: 12)
    public static let protocolTooNew = MCUmgrError(rawValue: 13)

    public var description: String {
        switch self {
        case .ok: "no error (0)"
        case .unknown: "unknown error (1): the device failed without saying why; reset it and retry"
        case .noMemory: "out of memory (2): the device had no memory for the request or its answer; reset it and retry"
        case .invalidValue: "invalid value (3): the device refused a field of the request; check the image and the command's arguments"
        case .timeout: "timed out (4): the device's own operation took too long; retry"
        case .noEntry: "no such entry (5): the device has nothing at that slot or name"
        case .badState: "bad state (6): the device's current state does not allow this command (an upload or a swap may be under way); reset it and retry"
        case .messageTooLarge: "message too large (7): the answer does not fit the device's buffer"
        case .notSupported: "not supported (8): the device's MCUmgr lacks this command; enable its group in the firmware (CONFIG_MCUMGR_GRP_*)"
        case .corrupt: "corrupt (9): the device found corrupt data; upload the image again"
        case .busy: "busy (10): the device is handling another command (another upload, a shell or another transport); wait for it to finish and retry"
        case .accessDenied: "access denied (11): the device refuses this command (locked, or it wants authentication)"
        case .protocolTooOld: "protocol too old (12): the device refuses this SMP version; update otaflash"
        case .protocolTooNew: "protocol too new (13): the device speaks an older SMP only; update its MCUmgr"
        default:
            rawValue >= 256 ? "application error \(rawValue): the device's own handler refused the request"
                : "unknown MCUmgr error \(rawValue)"
        }
    }

    /// The failure class a user acts on.
    public var otaCode: OTAError.Code {
        switch self {
        case .notSupported, .protocolTooOld, .protocolTooNew: .incompatibleDevice
        case .accessDenied: .permission
        default: .protocolError
        }
    }
}

/// The image group's result codes (SMP v2 `err.rc` in group 1; `IMG_MGMT_ERR_*`, smp
/// `image_management.py`).
///
/// `description` is one line: what the device said and what to do.
public struct ImageManagementError: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
    public let rawValue: Int64
    public init(rawValue: Int64) { self.rawValue = rawValue }

    public static let ok = ImageManagementError(rawValue: 0)
    public static let unknown = ImageManagementError(rawValue: 1)
    public static let flashConfigQueryFailed = ImageManagementError(rawValue: 2)
    public static let noImage = ImageManagementError(rawValue: 3)
    public static let noTLVs = ImageManagementError(rawValue: 4)
    public static let invalidTLV = ImageManagementError(rawValue: 5)
    public static let multipleHashes = ImageManagementError(rawValue: 6)
    public static let invalidTLVSize = ImageManagementError(rawValue: 7)
    public static let hashNotFound = ImageManagementError(rawValue: 8)
    public static let noFreeSlot = ImageManagementError(rawValue: 9)
    public static let flashOpenFailed = ImageManagementError(rawValue: 10)
    public static let flashReadFailed = ImageManagementError(rawValue: 11)
    public static let flashWriteFailed = ImageManagementError(rawValue: 12)
    public static let flashEraseFailed = ImageManagementError(rawValue: 13)
    public static let invalidSlot = ImageManagementError(rawValue: 14)
    public static let noFreeMemory = ImageManagementError(rawValue: 15)
    public static let flashContextAlreadySet = ImageManagementError(rawValue: 16)
    public static let flashContextNotSet = ImageManagementError(rawValue: 17)
    public static let flashAreaDeviceNull = ImageManagementError(rawValue: 18)
    public static let invalidPageOffset = ImageManagementError(rawValue: 19)
    public static let invalidOffset = ImageManagementError(rawValue: 20)
    public static let invalidLength = ImageManagementError(rawValue: 21)
    public static let invalidImageHeader = ImageManagementError(rawValue: 22)
    public static let invalidImageHeaderMagic = ImageManagementError(rawValue: 23)
    public static let invalidHash = ImageManagementError(rawValue: 24)
    public static let invalidFlashAddress = ImageManagementError(rawValue: 25)
    public static let versionGetFailed = ImageManagementError(rawValue: 26)
    public static let currentVersionIsNewer = ImageManagementError(rawValue: 27)
    public static let imageAlreadyPending = ImageManagementError(rawValue: 28)
    public static let invalidVectorTable = ImageManagementError(rawValue: 29)
    public static let imageTooLarge = ImageManagementError(rawValue: 30)
    public static let dataOverrun = ImageManagementError(rawValue: 31)
    public static let confirmationDenied = ImageManagementError(rawValue: 32)
    public static let testToActiveDenied = ImageManagementError(rawValue: 33)

    /// Every code MCUmgr defines, for tables and tests.
    public static let known: [ImageManagementError] = (0...33).map { ImageManagementError(rawValue: $0) }

    public var description: String {
        switch self {
        case .ok: "no error (0)"
        case .unknown: "unknown error (1): the image manager failed without saying why; reset the device and retry"
        case .flashConfigQueryFailed: "flash configuration query failed (2): the device could not read its flash layout; reset it and retry"
        case .noImage: "no image (3): that slot holds no image; upload one first"
        case .noTLVs: "no TLVs (4): the uploaded image has no TLV area; sign it with imgtool"
        case .invalidTLV: "invalid TLV (5): the image's TLV area is malformed; sign it again with imgtool"
        case .multipleHashes: "several hash TLVs (6): the image carries more than one hash; sign it again with imgtool"
        case .invalidTLVSize: "invalid TLV size (7): the image's TLV area has a wrong size; sign it again with imgtool"
        case .hashNotFound: "hash not found (8): no slot holds an image with that hash, or the image has no hash TLV; upload the image first"
        case .noFreeSlot: "no free slot (9): slot 1 is in use (an image waits there for the next reset, or the running test image is not confirmed); confirm the running image (otaflash image confirm) or reset the device (otaflash reset), then retry"
        case .flashOpenFailed: "flash open failed (10): the device could not open its image slot; reset it and retry"
        case .flashReadFailed: "flash read failed (11): the device could not read its image slot; reset it and retry"
        case .flashWriteFailed: "flash write failed (12): the device could not write its image slot; reset it and retry, and suspect worn flash if it persists"
        case .flashEraseFailed: "flash erase failed (13): the device could not erase its image slot; reset it and retry"
        case .invalidSlot: "invalid slot (14): the device has no such slot; list the slots (otaflash image list)"
        case .noFreeMemory: "no free memory (15): the device ran out of heap; reset it and retry"
        case .flashContextAlreadySet: "flash context already set (16): another upload holds the slot; reset the device and retry"
        case .flashContextNotSet: "flash context not set (17): the upload was not started; run it again from the beginning"
        case .flashAreaDeviceNull: "no flash device (18): the device's slot has no flash driver; its firmware is misconfigured"
        case .invalidPageOffset: "invalid page offset (19): the device refused the write's position; run the upload again"
        case .invalidOffset: "invalid offset (20): the chunk's offset is missing or not where the device expects; run the upload again"
        case .invalidLength: "invalid length (21): the upload's length is missing or wrong; run the upload again"
        case .invalidImageHeader: "invalid image header (22): the file is shorter than an MCUboot header; is it an imgtool-signed image?"
        case .invalidImageHeaderMagic: "bad image magic (23): the file is not an MCUboot image; sign it with imgtool"
        case .invalidHash: "invalid hash (24): the device refused the hash sent (wrong length, or not the uploaded image's); upload the image again"
        case .invalidFlashAddress: "invalid flash address (25): the image was linked for another address than this slot; build it for this device's slot"
        case .versionGetFailed: "version read failed (26): the device could not read the running image's version; reset it and retry"
        case .currentVersionIsNewer: "current version is newer (27): the device runs the same or a newer version and refuses a downgrade; upload an image with a higher version (imgtool sign --version)"
        case .imageAlreadyPending: "image already pending (28): another image is marked for the next reset; reset the device to install it, or erase the slot first"
        case .invalidVectorTable: "invalid vector table (29): the image's reset vector is not in its slot; build it for this device"
        case .imageTooLarge: "image too large (30): the image does not fit the device's slot; build a smaller image, or one for this device's partitions"
        case .dataOverrun: "data overrun (31): the device received more data than the upload's length; run the upload again from the beginning"
        case .confirmationDenied: "confirmation denied (32): the device refuses to confirm this image; it may not be running it yet"
        case .testToActiveDenied: "test of the active image denied (33): that image is already running; confirm it instead"
        default: "unknown image management error \(rawValue)"
        }
    }

    /// The failure class a user acts on.
    public var otaCode: OTAError.Code {
        switch self {
        case .noTLVs, .invalidTLV, .multipleHashes, .invalidTLVSize, .invalidImageHeader, .invalidImageHeaderMagic,
             .invalidVectorTable:
            .image
        case .invalidFlashAddress, .currentVersionIsNewer, .flashAreaDeviceNull: .incompatibleDevice
        case .imageTooLarge: .imageTooLarge
        default: .protocolError
        }
    }
}

/// A refusal from an SMP server: v1 `{"rc": n, "rsn"?: text}` (an `MCUmgrError`) or v2
/// `{"err": {"group": g, "rc": n}}` (the group's own codes; `ImageManagementError` for group 1).
public struct SMPDeviceError: Error, Hashable, Sendable, CustomStringConvertible {
    /// The v2 group whose code `rc` is; nil for a v1 `rc`, which is an `MCUmgrError`.
    public var group: SMPGroup?
    public var rc: Int64
    /// v1's `rsn`: the server's own words, when it sends them.
    public var reason: String?

    public init(group: SMPGroup? = nil, rc: Int64, reason: String? = nil) {
        self.group = group
        self.rc = rc
        self.reason = reason
    }

    /// A v1 (general) error.
    public static func general(_ code: MCUmgrError, reason: String? = nil) -> SMPDeviceError {
        SMPDeviceError(rc: code.rawValue, reason: reason)
    }

    /// A v2 image group error.
    public static func image(_ code: ImageManagementError) -> SMPDeviceError {
        SMPDeviceError(group: .image, rc: code.rawValue)
    }

    /// The error in an answer's body, or nil when it reports none (`err` and `rc` absent or 0).
    /// A nonzero v2 `err` wins over a v1 `rc`.
    public init?(body: CBOR) throws(SMPWireError) {
        guard let map = body.map else { return nil }
        if let err = map["err"] {
            guard let e = err.map, let group = e["group"]?.uint64, let g = UInt16(exactly: group), let rc = e["rc"]?.int64 else {
                throw SMPWireError(.badField("err"), "error \(err) is not {\"group\": u16, \"rc\": int}")
            }
            if rc != 0 {
                self.init(group: SMPGroup(rawValue: g), rc: rc)
                return
            }
        }
        guard let value = map["rc"] else { return nil }
        guard let rc = value.int64 else { throw SMPWireError(.badField("rc"), "result code \(value) is not an integer") }
        var reason: String?
        if let rsn = map["rsn"] {
            guard let text = rsn.text else { throw SMPWireError(.badField("rsn"), "error reason \(rsn) is not a text string") }
            reason = text
        }
        guard rc != 0 else { return nil }
        self.init(rc: rc, reason: reason)
    }

    /// The error as a server writes it: a general error as v1 `rc` (and `rsn`), a group's error as
    /// v2 `err`, or as v1 `rc` when answering a v1 request.
    public func body(version: SMPVersion) -> CBOR {
        if let group, version == .v2 {
            return ["err": ["group": .unsigned(UInt64(group.rawValue)), "rc": .int(rc)]]
        }
        var m: [CBOR: CBOR] = ["rc": .int(rc)]
        if let reason { m["rsn"] = .text(reason) }
        return .map(m)
    }

    /// The general code, when this is a v1 error.
    public var general: MCUmgrError? { group == nil ? MCUmgrError(rawValue: rc) : nil }

    /// The image group's code, when this is a v2 error of group 1.
    public var imageError: ImageManagementError? { group == .image ? ImageManagementError(rawValue: rc) : nil }

    /// One line: the code's meaning and what to do, then the server's reason if it gave one.
    public var description: String {
        let line: String = if let general {
            general.description
        } else if let imageError {
            imageError.description
        } else if let fileError {
            fileError.description
        } else {
            "\(group.map(\.description) ?? "SMP") error \(rc)"
        }
        return reason.map { "\(line) (device says: \($0))" } ?? line
    }

    /// The failure class a user acts on.
    public var otaCode: OTAError.Code {
        general?.otaCode ?? imageError?.otaCode ?? fileError?.otaCode ?? .protocolError
    }

    /// The refusal as the error the CLI prints: `<device> refused <request>: <meaning>; <what to do>`.
    public func otaError(device: String, request: String, resumable: Bool = false) -> OTAError {
        OTAError(otaCode, "\(device) refused \(request): \(description)", resumable: resumable, cause: self)
    }
}

extension SMPWireError {
    /// What a server answers a request that fails to decode with: ENOTSUP for a command it does not
    /// know, EINVAL for anything malformed (Zephyr's `smp_handle_single_req`).
    public var serverAnswer: MCUmgrError {
        if case .unsupportedCommand = kind { return .notSupported }
        return .invalidValue
    }
}
