import Ledger

/// Follows a ledger as it grows, reading only what it has not read (`otaflash dashboard`): each
/// read asks for the records above a watermark, the highest id below which every id has been read
/// or given up.
///
/// Ids are handed out when a record is inserted, not when it is committed: on PostgreSQL a station
/// can commit id 101 after another station's 102 was read. An id below the newest one read that
/// has not been seen is a hole; the watermark stays below it, so the next reads ask for it again,
/// until it shows up or `holeWait` has passed (an insert rolled back or one that conflicted uses
/// an id that never shows up). A record read twice is kept once.
public struct LineFollower: Sendable {
    /// How long a hole is asked for again before it is given up: far past the longest commit.
    public static let holeWait: Duration = .seconds(30)
    /// The most holes kept: a jump of ids wider than this (a sequence set forward by hand) is
    /// given up at once rather than remembered id by id.
    public static let holeLimit = 10_000
    /// On the first read, only the ids this far below the newest can be holes: the older ones
    /// missing were committed long ago or never will be.
    public static let firstReadSpan: Int64 = 1000

    /// Every record read, in the order read.
    public private(set) var records: [LedgerRecord] = []
    /// Every id at or below it has been read or given up.
    public private(set) var watermark: Int64 = 0
    /// The highest id read.
    public private(set) var newest: Int64 = 0
    /// Ids above the watermark that were read (a record read again is not kept twice).
    private var seen: Set<Int64> = []
    /// Ids below `newest` not read yet, with when they were first missed.
    private var holes: [Int64: ContinuousClock.Instant] = [:]

    public init() {}

    /// What the next read asks for.
    public var query: LedgerQuery { LedgerQuery(afterID: watermark) }

    /// Ids still asked for again.
    public var holeCount: Int { holes.count }

    /// Takes what a read of `query` returned; true when a record was new.
    public mutating func take(_ read: [LedgerRecord], now: ContinuousClock.Instant = .now) -> Bool {
        var added = false
        var top = newest
        for record in read {
            guard let id = record.id, id > watermark, seen.insert(id).inserted else { continue }
            records.append(record)
            holes[id] = nil
            top = max(top, id)
            added = true
        }
        if top > newest {
            let from = newest == 0 ? max(0, top - Self.firstReadSpan) : newest
            let gap = top - from - 1
            if gap > 0, gap <= Int64(read.count + Self.holeLimit) {
                for id in (from + 1)..<top where !seen.contains(id) && holes.count < Self.holeLimit {
                    holes[id] = now
                }
            }
            newest = top
        }
        holes = holes.filter { now - $0.value < Self.holeWait }
        watermark = holes.keys.min().map { $0 - 1 } ?? newest
        seen = seen.filter { $0 > watermark }
        return added
    }
}
