import GATT
import Simulator
import Testing

/// The link model's figures, checked against hand calculations from the Core Specification's
/// packet format: (preamble + access address 4 + header 2 + payload + MIC-less CRC 3) bytes on air,
/// 8 µs per byte on the 1M PHY and 4 µs on 2M, T_IFS 150 µs.
@Suite("Link model")
struct LinkModelTests {
    @Test(arguments: [
        (LinkModel.PHY.le1M, 0, 80.0),       // (1+4+2+0+3) × 8
        (.le1M, 27, 296.0),                  // (1+4+2+27+3) × 8
        (.le1M, 251, 2088.0),                // (1+4+2+251+3) × 8
        (.le2M, 0, 44.0),                    // (2+4+2+0+3) × 4
        (.le2M, 251, 1048.0),                // (2+4+2+251+3) × 4
    ])
    func airTimeIsBytesOnAirTimesTheBitTime(phy: LinkModel.PHY, payload: Int, microseconds: Double) {
        #expect(LinkModel(phy: phy).airTime(payload: payload) == microseconds)
    }

    @Test func pairTimeIsAPacketAnEmptyReplyAndTwoInterFrameSpaces() {
        let link = LinkModel(phy: .le2M)
        #expect(link.pairTime(payload: 251) == 1048 + 150 + 44 + 150)
    }

    @Test(arguments: [
        (true, 244, [248]), (true, 247, [251]), (true, 248, [251, 1]), (true, 510, [251, 251, 12]),
        (false, 23, [27]), (false, 24, [27, 1]), (false, 247, [27, 27, 27, 27, 27, 27, 27, 27, 27, 8]),
    ])
    func attPDUsSplitIntoLinkLayerPayloads(dle: Bool, attBytes: Int, fragments: [Int]) {
        #expect(LinkModel(dataLengthExtension: dle).fragments(attBytes: attBytes) == fragments)
    }

    /// MTU 247 / 2M / 15 ms: 10 writes of 244 bytes (1392 µs each) fit an event: 162.7 kB/s.
    @Test func defaultLinkCarriesAbout162kBPerSecond() {
        let capacity = LinkModel(mtu: 247, phy: .le2M, connectionInterval: .milliseconds(15)).capacityBytesPerSecond
        #expect(abs(capacity - 10 * 244 / 0.015) < 1)
        #expect(LinkModel.default.capacityBytesPerSecond == capacity)
    }

    /// On the 1M PHY a 244-byte write takes 2468 µs with its acknowledgement: back to back that is
    /// 98.9 kB/s, which a long connection interval approaches from below.
    @Test(arguments: [1000, 2000, 4000])
    func onePHYApproachesItsBackToBackCeilingAtLongIntervals(intervalMs: Int) {
        let ceiling = 244 / 2468e-6
        let capacity = LinkModel(mtu: 247, phy: .le1M, connectionInterval: .milliseconds(intervalMs)).capacityBytesPerSecond
        #expect(capacity <= ceiling)
        #expect(capacity > ceiling * 0.997)
        #expect((ceiling / 1000 * 10).rounded() / 10 == 98.9)
    }

    @Test func capacityRisesWithTheMTUUpToOneLinkLayerPacket() {
        let capacities = [23, 27, 50, 100, 185, 247].map { LinkModel(mtu: $0).capacityBytesPerSecond }
        #expect(zip(capacities, capacities.dropFirst()).allSatisfy { $0 < $1 }, "\(capacities)")
    }

    @Test func packetsPerEventCapsTheCapacity() {
        let capped = LinkModel(mtu: 247, packetsPerEvent: 4).capacityBytesPerSecond
        #expect(abs(capped - 4 * 244 / 0.015) < 1)
    }

    @Test func twoMPHYCarriesMoreThanOneM() {
        #expect(LinkModel(phy: .le2M).capacityBytesPerSecond > LinkModel(phy: .le1M).capacityBytesPerSecond)
    }

    @Test func describesItself() {
        #expect(LinkModel.default.description == "MTU 247, 2M PHY, 15.0 ms interval")
        #expect(LinkModel.unlimited.description == "MTU 517, untimed")
    }
}
