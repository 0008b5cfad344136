import OTA
import Testing

/// The resend figures every engine reports, counted in one place.
@Suite("Resend tally")
struct ResendTallyTests {
    @Test func aCleanStreamResendsNothing() {
        var tally = ResendTally()
        tally.connectionBegan(streamAt: 0)
        tally.resumed(from: 0)
        for offset in stride(from: 0, to: 1000, by: 100) { tally.streamed(offset: offset, count: 100) }
        #expect(tally.stats.bytesSent == 1000)
        #expect(tally.stats.packets == 10)
        #expect(tally.stats.bytesResent == 0)
        #expect(tally.stats.resentPerConnection == [0])
        #expect(tally.stats.resumeResends.isEmpty)
        #expect(tally.highWater == 1000)
    }

    /// A rewind sends again what lies below the high-water mark, counted on its connection;
    /// a packet that straddles the mark counts only its part below it.
    @Test func bytesBelowTheHighWaterMarkAreResent() {
        var tally = ResendTally()
        tally.connectionBegan(streamAt: 0)
        tally.resumed(from: 0)
        tally.streamed(offset: 0, count: 600)
        tally.streamed(offset: 400, count: 300)
        #expect(tally.stats.bytesResent == 200)
        #expect(tally.stats.resentPerConnection == [200])
        #expect(tally.highWater == 700)
    }

    /// A reconnect measures its resume at the first packet after the device said where it
    /// stands: from there up to where the stream stood when the link was lost, not the furthest
    /// it ever went.
    @Test(arguments: [(1000, 800, 200), (1000, 1000, 0), (600, 800, 0)])
    func aResumeIsMeasuredFromWhereTheLinkWasLost(lostAt: Int, resumeAt: Int, expected: Int) {
        var tally = ResendTally()
        tally.connectionBegan(streamAt: 0)
        tally.resumed(from: 0)
        tally.streamed(offset: 0, count: 1000)
        tally.connectionBegan(streamAt: lostAt)
        tally.streamed(offset: 0, count: 10)  // before the device said where it stands: not the resume
        #expect(tally.stats.resumeResends.isEmpty)
        tally.resumed(from: resumeAt)
        tally.streamed(offset: resumeAt, count: 100)
        #expect(tally.stats.resumeResends == [expected])
        #expect(tally.stats.resumedFrom == [0, resumeAt])
        #expect(tally.stats.connections == 2)
    }

    @Test func aDeviceThatStartedOverIsNotAResume() {
        var tally = ResendTally()
        tally.connectionBegan(streamAt: 0)
        tally.resumed(from: 0)
        tally.streamed(offset: 0, count: 500)
        tally.connectionBegan(streamAt: 500)
        tally.resumed(from: 0)
        tally.startedOver()
        tally.streamed(offset: 0, count: 500)
        #expect(tally.stats.resumeResends.isEmpty)
        #expect(tally.stats.resentPerConnection == [0, 500])
    }

    /// What the device reported holding counts as sent: a run that resumes an earlier run's
    /// transfer and then falls back below it sends those bytes again.
    @Test func whatTheDeviceHeldCountsAsSent() {
        var tally = ResendTally()
        tally.connectionBegan(streamAt: 0)
        tally.resumed(from: 4096)
        tally.streamed(offset: 2048, count: 2048)
        #expect(tally.stats.bytesResent == 2048)
        #expect(tally.stats.bytesSent == 2048)
    }

    /// Bytes sent ahead of the image (an init packet) have their own mark.
    @Test func aPreambleIsCountedApartFromTheImageOffsets() {
        var tally = ResendTally()
        tally.connectionBegan(streamAt: 0)
        tally.streamedPreamble(offset: 0, count: 100)
        tally.streamed(offset: 0, count: 100)
        tally.streamedPreamble(offset: 0, count: 100)
        #expect(tally.stats.bytesSent == 300)
        #expect(tally.stats.bytesResent == 100)
        #expect(tally.highWater == 100)
    }
}
