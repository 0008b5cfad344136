import Foundation
import GATT

/// A production line's devices over virtual time, as a station meets them: each arrives (in
/// range, advertising), waits there to be flashed for up to `dwell`, and leaves. Protocol-neutral:
/// it says who is where and when, and which fault a device carries; whoever builds the simulated
/// devices decides what a fault does to its protocol.
///
/// Seeded: the same configuration gives the same devices, arrivals and faults on every run and
/// platform. Members are made one at a time as the shift reaches them (`Arrivals`), so a shift of
/// a million devices holds only those in range.
public struct Population: Sendable {
    /// What a device does wrong, for a share of the population.
    public enum Fault: String, Sendable, CaseIterable {
        /// It lacks the update service: every attempt fails the same way.
        case noOTAService = "no-ota-service"
        /// Its slot is too small for the image: every attempt fails.
        case smallSlot = "small-slot"
        /// Its link drops mid-transfer and it never answers again: every attempt fails.
        case gone
        /// Its first attempt fails (the link drops, it does not answer again); the next goes through.
        case flaky
    }

    /// One device of the population.
    public struct Member: Sendable, Hashable {
        /// 1-based, in order of arrival.
        public let index: Int
        public let address: DeviceAddress
        /// When it comes into range, from the start of the shift.
        public let arrives: Duration
        /// When it leaves, flashed or not (unless a station is flashing it then: it stays for that).
        public let leaves: Duration
        public let fault: Fault?
    }

    /// Devices in the shift.
    public var devices: Int
    /// Mean arrivals per hour (exponential gaps: a Poisson process).
    public var arrivalsPerHour: Double
    /// How long a device stays in range waiting to be flashed.
    public var dwell: Duration
    /// Each fault's share of the devices (0 to 1; together at most 1).
    public var faults: [Fault: Double]
    public var seed: UInt64

    public init(devices: Int, arrivalsPerHour: Double, dwell: Duration, faults: [Fault: Double] = [:], seed: UInt64 = 1) {
        self.devices = devices
        self.arrivalsPerHour = arrivalsPerHour
        self.dwell = dwell
        self.faults = faults
        self.seed = seed
    }

    /// The address of the `index`th device (1-based): 0E:5D followed by the index (up to 2³²−1),
    /// so it never collides with the single simulated device's or a batch's `--count` addresses.
    public static func address(_ index: Int) -> DeviceAddress {
        let i = UInt32(truncatingIfNeeded: index)
        return DeviceAddress(0x0E, 0x5D, UInt8(truncatingIfNeeded: i >> 24), UInt8(truncatingIfNeeded: i >> 16),
                             UInt8(truncatingIfNeeded: i >> 8), UInt8(truncatingIfNeeded: i))
    }

    /// The members in order of arrival, made as they are asked for.
    public func arrivals() -> Arrivals { Arrivals(self) }

    public struct Arrivals: IteratorProtocol, Sendable {
        private let population: Population
        private var gaps: SeededGenerator
        private var coming = 1
        private var clock: Duration = .zero

        init(_ population: Population) {
            self.population = population
            gaps = SeededGenerator(seed: population.seed)
        }

        /// When the next member arrives, or nil when the shift has no more.
        public var nextArrival: Duration? {
            guard coming <= population.devices else { return nil }
            var peek = gaps
            return clock + Population.gap(&peek, perHour: population.arrivalsPerHour)
        }

        public mutating func next() -> Member? {
            guard coming <= population.devices else { return nil }
            clock += Population.gap(&gaps, perHour: population.arrivalsPerHour)
            defer { coming += 1 }
            return population.member(coming, arrives: clock)
        }
    }

    /// Exponentially distributed, mean 3600 / `perHour` seconds, rounded to the millisecond.
    static func gap(_ g: inout SeededGenerator, perHour: Double) -> Duration {
        let u = Double(g.next() >> 11) / Double(1 << 53)
        let seconds = -log(1 - u) * 3600 / perHour
        return .milliseconds(Int64((seconds * 1000).rounded()))
    }

    func member(_ index: Int, arrives: Duration) -> Member {
        // Its fault is drawn from its own sequence, so the shares do not shift the arrivals.
        var g = SeededGenerator(seed: seed ^ (UInt64(index) &* 0xD1B5_4A32_D192_ED03))
        let u = Double(g.next() >> 11) / Double(1 << 53)
        var edge = 0.0
        var fault: Fault?
        for candidate in Fault.allCases {
            edge += faults[candidate] ?? 0
            if u < edge { fault = candidate; break }
        }
        return Member(index: index, address: Self.address(index), arrives: arrives, leaves: arrives + dwell, fault: fault)
    }
}
