import Foundation
import Ledger
@testable import LineView
import Testing

/// The dashboard reads only what it has not read: the watermark, ids committed out of order
/// (PostgreSQL hands ids out at insert), records read twice, holes given up.
@Suite("Line follower")
struct LineFollowerTests {
    static func records(_ ids: [Int64]) -> [LedgerRecord] {
        ids.map { id in
            var r = LineModelTests.record(String(format: "AA:00:00:00:%02X:%02X", id >> 8 & 0xFF, id & 0xFF), at: Int(id))
            r.id = id
            return r
        }
    }

    @Test func eachReadAsksForWhatIsAboveTheLastRead() {
        var f = LineFollower()
        #expect(f.query.afterID == 0)
        let readThree = f.take(Self.records([1, 2, 3]))
        #expect(readThree)
        #expect(f.query.afterID == 3 && f.records.map(\.id) == [1, 2, 3])
        let readNone = f.take([])
        #expect(readNone == false, "nothing new: the model is not drawn again")
        let readFour = f.take(Self.records([4]))
        #expect(readFour)
        #expect(f.query.afterID == 4 && f.records.count == 4)
    }

    @Test func anIDCommittedAfterAHigherOneIsAskedForUntilItComes() {
        var f = LineFollower()
        let t0 = ContinuousClock.now
        let readFirst = f.take(Self.records([1, 2, 4, 5]), now: t0)
        #expect(readFirst)
        #expect(f.query.afterID == 2 && f.holeCount == 1, "3 is missing: asked for again")
        // The next read returns 4 and 5 again, and 3, committed since: each kept once.
        let readAgain = f.take(Self.records([3, 4, 5, 6]), now: t0 + .seconds(1))
        #expect(readAgain)
        #expect(f.records.compactMap(\.id).sorted() == [1, 2, 3, 4, 5, 6])
        #expect(f.query.afterID == 6 && f.holeCount == 0)
        // A read of only records seen is nothing new.
        let readSeen = f.take(Self.records([5, 6]), now: t0 + .seconds(2))
        #expect(readSeen == false)
    }

    @Test func aHoleThatNeverFillsIsGivenUpAfterItsWait() {
        var f = LineFollower()
        let t0 = ContinuousClock.now
        _ = f.take(Self.records([1, 3]), now: t0)
        #expect(f.query.afterID == 1)
        _ = f.take(Self.records([3, 4]), now: t0 + LineFollower.holeWait - .seconds(1))
        #expect(f.query.afterID == 1, "still within the wait")
        _ = f.take(Self.records([3, 4]), now: t0 + LineFollower.holeWait)
        #expect(f.query.afterID == 4 && f.holeCount == 0, "an insert rolled back: its id never shows up")
        #expect(f.records.count == 3)
    }

    @Test func holesAreBoundedOnTheFirstReadAndOnAWideJump() {
        var f = LineFollower()
        // Ids from 5,000 on (older ones gone, or a sequence started there): only the last
        // `firstReadSpan` ids below the newest are waited for.
        _ = f.take(Self.records(Array(5000...5010)))
        #expect(f.holeCount == Int(LineFollower.firstReadSpan) - 11)
        #expect(f.query.afterID == 5010 - LineFollower.firstReadSpan)
        var g = LineFollower()
        _ = g.take(Self.records([1]))
        _ = g.take(Self.records([1 + Int64(LineFollower.holeLimit) * 3]))
        #expect(g.holeCount == 0, "a jump wider than the limit is given up at once")
        #expect(g.query.afterID == 1 + Int64(LineFollower.holeLimit) * 3)
    }

    /// On a real SQLite ledger: the query returns only the records above the watermark, and the
    /// model of what was followed is the model of a whole read.
    @Test func followingASQLiteLedgerGivesTheWholeReadsModel() async throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("line-follower-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: dir) }
        let ledger = try Ledger.open(dir.appendingPathComponent("line.sqlite").path)
        var f = LineFollower()
        for (n, record) in LineModelTests.shift.enumerated() {
            try await ledger.append(record)
            let read = try await ledger.records(f.query)
            #expect(read.count == 1, "record \(n + 1): only the new one is read")
            let readNew = f.take(read)
            #expect(readNew)
        }
        let whole = try await ledger.records(LedgerQuery())
        #expect(f.records == whole)
        #expect(LineModel(records: f.records).counts == LineModel(records: whole).counts)
        #expect(try await ledger.records(f.query).isEmpty)
        await ledger.close()
    }

    /// Axis tops: four round intervals, whole numbers for counts (no tick at half a device).
    @Test(arguments: [(2.0, true, 4.0), (27, true, 40), (50, true, 80), (0, true, 4), (1.2, false, 2), (3, false, 4), (0.07, false, 0.08)])
    func axisTopsHaveRoundTicks(_ value: Double, _ whole: Bool, _ top: Double) {
        let got = LinePlots.niceMax(value, whole: whole)
        #expect(abs(got - top) < 1e-9 && got >= value, "\(value) -> \(got)")
        if whole { #expect((got / 4).rounded() == got / 4, "a whole step") }
    }
}
