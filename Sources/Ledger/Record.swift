import Foundation

/// One device attempt, as the ledger keeps it: written, and committed, the moment the attempt
/// ends (docs/LEDGER.md). Columns are the properties in snake case; nil is SQL NULL.
///
/// The ledger knows no protocol: `protocolName` and the device's self-report are text, as the
/// protocol that ran gives them.
public struct LedgerRecord: Codable, Sendable, Hashable {
    /// The row's id, given by the store when written; nil before.
    public var id: Int64?
    /// One run of otaflash (a single device, a batch, a station's shift): its attempts share it.
    public var runID: String
    /// UTC, ISO 8601 with milliseconds: `2026-11-26T13:21:04.123Z`.
    public var startedAt: String
    public var endedAt: String
    /// Which station wrote it (`--station`, default the host name).
    public var station: String
    public var `operator`: String?
    public var adapter: String?
    /// The address the device was given.
    public var device: String
    /// Where its bootloader answered, when the update moved it (Nordic buttonless entry).
    public var bootloaderAddress: String?
    /// What the device reported of itself (Device Information Service, or its protocol).
    public var manufacturer: String?
    public var model: String?
    public var serialNumber: String?
    public var hardwareRevision: String?
    public var firmwareBefore: String?
    public var protocolName: String
    public var imageName: String
    public var imageSize: Int64
    /// Lower-case hex of the image file's SHA-256.
    public var imageSHA256: String
    public var imageVersion: String?
    public var firmwareAfter: String?
    public var bytesSent: Int64
    public var bytesResent: Int64
    public var seconds: Double
    /// Image bytes per second of transfer; 0 when nothing was sent.
    public var rate: Double
    /// Attempts at this device in this run, this one included (1 for the first).
    public var attempts: Int
    /// How the attempt ended.
    public var result: LedgerResult
    public var exitCode: Int
    /// The exit code's name (`verify_failed`, `permission`, …); nil when `ok`.
    public var errorCode: String?
    /// What failed and what to do next; nil when `ok`.
    public var message: String?
    public var otaflashVersion: String
    public var otaflashCommit: String

    public init(id: Int64? = nil, runID: String, startedAt: String, endedAt: String, station: String, operator: String? = nil,
                adapter: String? = nil, device: String, bootloaderAddress: String? = nil, manufacturer: String? = nil,
                model: String? = nil, serialNumber: String? = nil, hardwareRevision: String? = nil, firmwareBefore: String? = nil,
                protocolName: String, imageName: String, imageSize: Int64, imageSHA256: String, imageVersion: String? = nil,
                firmwareAfter: String? = nil, bytesSent: Int64 = 0, bytesResent: Int64 = 0, seconds: Double = 0, rate: Double = 0,
                attempts: Int = 1, result: LedgerResult, exitCode: Int, errorCode: String? = nil, message: String? = nil,
                otaflashVersion: String, otaflashCommit: String) {
        self.id = id
        self.runID = runID
        self.startedAt = startedAt
        self.endedAt = endedAt
        self.station = station
        self.operator = `operator`
        self.adapter = adapter
        self.device = device
        self.bootloaderAddress = bootloaderAddress
        self.manufacturer = manufacturer
        self.model = model
        self.serialNumber = serialNumber
        self.hardwareRevision = hardwareRevision
        self.firmwareBefore = firmwareBefore
        self.protocolName = protocolName
        self.imageName = imageName
        self.imageSize = imageSize
        self.imageSHA256 = imageSHA256
        self.imageVersion = imageVersion
        self.firmwareAfter = firmwareAfter
        self.bytesSent = bytesSent
        self.bytesResent = bytesResent
        self.seconds = seconds
        self.rate = rate
        self.attempts = attempts
        self.result = result
        self.exitCode = exitCode
        self.errorCode = errorCode
        self.message = message
        self.otaflashVersion = otaflashVersion
        self.otaflashCommit = otaflashCommit
    }

    enum CodingKeys: String, CodingKey, CaseIterable {
        case id, runID = "run_id", startedAt = "started_at", endedAt = "ended_at", station, `operator`, adapter, device
        case bootloaderAddress = "bootloader_address", manufacturer, model, serialNumber = "serial_number"
        case hardwareRevision = "hardware_revision", firmwareBefore = "firmware_before", protocolName = "protocol"
        case imageName = "image_name", imageSize = "image_size", imageSHA256 = "image_sha256", imageVersion = "image_version"
        case firmwareAfter = "firmware_after", bytesSent = "bytes_sent", bytesResent = "bytes_resent", seconds, rate, attempts
        case result, exitCode = "exit_code", errorCode = "error_code", message, otaflashVersion = "otaflash_version"
        case otaflashCommit = "otaflash_commit"
    }

    /// Every key, nil ones as null: a JSON export has the same keys on every line.
    public func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: CodingKeys.self)
        try c.encode(id, forKey: .id)
        try c.encode(runID, forKey: .runID)
        try c.encode(startedAt, forKey: .startedAt)
        try c.encode(endedAt, forKey: .endedAt)
        try c.encode(station, forKey: .station)
        try c.encode(`operator`, forKey: .operator)
        try c.encode(adapter, forKey: .adapter)
        try c.encode(device, forKey: .device)
        try c.encode(bootloaderAddress, forKey: .bootloaderAddress)
        try c.encode(manufacturer, forKey: .manufacturer)
        try c.encode(model, forKey: .model)
        try c.encode(serialNumber, forKey: .serialNumber)
        try c.encode(hardwareRevision, forKey: .hardwareRevision)
        try c.encode(firmwareBefore, forKey: .firmwareBefore)
        try c.encode(protocolName, forKey: .protocolName)
        try c.encode(imageName, forKey: .imageName)
        try c.encode(imageSize, forKey: .imageSize)
        try c.encode(imageSHA256, forKey: .imageSHA256)
        try c.encode(imageVersion, forKey: .imageVersion)
        try c.encode(firmwareAfter, forKey: .firmwareAfter)
        try c.encode(bytesSent, forKey: .bytesSent)
        try c.encode(bytesResent, forKey: .bytesResent)
        try c.encode(seconds, forKey: .seconds)
        try c.encode(rate, forKey: .rate)
        try c.encode(attempts, forKey: .attempts)
        try c.encode(result, forKey: .result)
        try c.encode(exitCode, forKey: .exitCode)
        try c.encode(errorCode, forKey: .errorCode)
        try c.encode(message, forKey: .message)
        try c.encode(otaflashVersion, forKey: .otaflashVersion)
        try c.encode(otaflashCommit, forKey: .otaflashCommit)
    }

    /// The record's values as text in `columns` order, nil as nil (CSV and table exports).
    public var texts: [String?] {
        [id.map { "\($0)" }, runID, startedAt, endedAt, station, `operator`, adapter, device, bootloaderAddress, manufacturer,
         model, serialNumber, hardwareRevision, firmwareBefore, protocolName, imageName, "\(imageSize)", imageSHA256,
         imageVersion, firmwareAfter, "\(bytesSent)", "\(bytesResent)", String(format: "%.3f", seconds),
         String(format: "%.0f", rate), "\(attempts)", result.rawValue, "\(exitCode)", errorCode, message, otaflashVersion, otaflashCommit]
    }

    /// Every column, in the table's order (the CSV export's header).
    public static let columns: [String] = CodingKeys.allCases.map(\.rawValue)

    /// The error code of a row an older otaflash wrote for a device it found held by another
    /// station (nothing was sent): an encounter, not an attempt.
    public static let encounterErrorCode = "held_elsewhere"

    /// Whether an older otaflash wrote this row for an encounter (`encounterErrorCode`).
    public var isEncounter: Bool { errorCode == Self.encounterErrorCode }

    /// The timestamp format of `startedAt` and `endedAt`.
    public static func timestamp(_ date: Date) -> String {
        date.formatted(.iso8601.year().month().day().dateSeparator(.dash).time(includingFractionalSeconds: true)
            .timeSeparator(.colon).timeZone(separator: .omitted)).replacingOccurrences(of: "+0000", with: "Z")
    }
}

/// How an attempt ended: the `result` column's text. A struct with the results otaflash writes as
/// static members rather than an enum: a row with other text (another program's, a hand edit)
/// still reads, and `ledger --check` reports it.
public struct LedgerResult: RawRepresentable, Codable, Sendable, Hashable, CaseIterable, CustomStringConvertible {
    public var rawValue: String

    public init(rawValue: String) { self.rawValue = rawValue }

    public static let ok = LedgerResult(rawValue: "ok")
    /// `--skip-if-version`: the device already ran that version; nothing was sent.
    public static let skipped = LedgerResult(rawValue: "skipped")
    public static let error = LedgerResult(rawValue: "error")
    /// The update ended but the bond could not be removed (`--unpair-after`).
    public static let bondLeft = LedgerResult(rawValue: "bond_left")

    /// The results otaflash writes.
    public static let allCases: [LedgerResult] = [.ok, .skipped, .error, .bondLeft]

    /// The device is done with the image: it took it, or already ran it.
    public var succeeded: Bool { self == .ok || self == .skipped }

    public var description: String { rawValue }

    /// The text alone, as the column holds it.
    public init(from decoder: any Decoder) throws {
        rawValue = try decoder.singleValueContainer().decode(String.self)
    }

    public func encode(to encoder: any Encoder) throws {
        var c = encoder.singleValueContainer()
        try c.encode(rawValue)
    }
}

/// Which records a query returns: every filter given must hold.
public struct LedgerQuery: Sendable, Hashable {
    /// Inclusive bounds on `startedAt`, as timestamps.
    public var since: String?
    public var until: String?
    public var device: String?
    public var serialNumber: String?
    public var result: LedgerResult?
    /// An image file name, or a prefix of its SHA-256 (at least 8 hex digits).
    public var image: String?
    public var station: String?
    /// At most this many records, the newest; nil for all.
    public var limit: Int?
    /// Only records whose id is above this (a reader that follows the ledger: `otaflash dashboard`).
    public var afterID: Int64?

    public init(since: String? = nil, until: String? = nil, device: String? = nil, serialNumber: String? = nil,
                result: LedgerResult? = nil, image: String? = nil, station: String? = nil, limit: Int? = nil, afterID: Int64? = nil) {
        self.since = since
        self.until = until
        self.device = device
        self.serialNumber = serialNumber
        self.result = result
        self.image = image
        self.station = station
        self.limit = limit
        self.afterID = afterID
    }

    /// Whether `record` passes every filter (the stores filter in SQL; this is their reference).
    public func matches(_ record: LedgerRecord) -> Bool {
        if let since, record.startedAt < since { return false }
        if let until, record.startedAt > until { return false }
        if let device, record.device.caseInsensitiveCompare(device) != .orderedSame { return false }
        if let serialNumber, record.serialNumber != serialNumber { return false }
        if let result, record.result != result { return false }
        if let station, record.station != station { return false }
        if let afterID, (record.id ?? 0) <= afterID { return false }
        if let image, record.imageName != image, !(image.count >= 8 && record.imageSHA256.hasPrefix(image.lowercased())) {
            return false
        }
        return true
    }
}
