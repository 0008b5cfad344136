import GATT
import Simulator
import Testing

/// A simulated line's population: seeded, so a shift is the same on every run; arrivals at the
/// configured mean rate; faults in their shares; addresses distinct.
@Suite("Population")
struct PopulationTests {
    static func members(_ p: Population) -> [Population.Member] {
        Array(sequence(state: p.arrivals()) { $0.next() })
    }

    @Test func theSameSeedGivesTheSameLineAndAnotherSeedAnother() {
        let p = Population(devices: 500, arrivalsPerHour: 600, dwell: .seconds(300), faults: [.gone: 0.1], seed: 5)
        #expect(Self.members(p) == Self.members(p))
        var q = p
        q.seed = 6
        #expect(Self.members(p).map(\.arrives) != Self.members(q).map(\.arrives))
    }

    @Test func arrivalsComeAtTheMeanRateInOrderAndLeaveAfterTheDwell() throws {
        let p = Population(devices: 5000, arrivalsPerHour: 600, dwell: .seconds(300), seed: 1)
        let members = Self.members(p)
        #expect(members.count == 5000 && members.map(\.index) == Array(1...5000))
        #expect(zip(members, members.dropFirst()).allSatisfy { $0.arrives <= $1.arrives })
        #expect(members.allSatisfy { $0.leaves == $0.arrives + .seconds(300) })
        // 5000 arrivals at 600 an hour take about 8.3 hours (a Poisson process: within a few percent).
        let hours = try #require(members.last).arrives.seconds / 3600
        #expect(abs(hours - 5000.0 / 600) < 0.5, "\(hours) h")
        #expect(Set(members.map(\.address)).count == 5000)
        #expect(members.first?.address.description == "0E:5D:00:00:00:01")
    }

    @Test func faultsTakeTheirSharesAndNoneWhenNoneAreGiven() {
        let p = Population(devices: 10_000, arrivalsPerHour: 600, dwell: .seconds(60), faults: [.gone: 0.02, .flaky: 0.1], seed: 9)
        let members = Self.members(p)
        let gone = members.filter { $0.fault == .gone }.count
        let flaky = members.filter { $0.fault == .flaky }.count
        #expect((150...250).contains(gone), "\(gone)")
        #expect((900...1100).contains(flaky), "\(flaky)")
        #expect(!members.contains { $0.fault == .smallSlot || $0.fault == .noOTAService })
        var clean = p
        clean.faults = [:]
        #expect(Self.members(clean).allSatisfy { $0.fault == nil })
        // The shares do not move the arrivals.
        #expect(Self.members(clean).map(\.arrives) == members.map(\.arrives))
    }

    @Test func arrivalsSayWhenTheNextComesAndWhenTheyAreOver() {
        var arrivals = Population(devices: 2, arrivalsPerHour: 60, dwell: .seconds(1), seed: 3).arrivals()
        let first = arrivals.nextArrival
        #expect(arrivals.next()?.arrives == first)
        #expect(arrivals.next() != nil)
        #expect(arrivals.nextArrival == nil && arrivals.next() == nil)
    }
}
