import GATT
@testable import SMP
import Testing

@Suite("SMP frame size probe")
struct SMPFrameProbeTests {
    @Test(arguments: [
        (384, 244, [244, 384]),          // MTU 247: one whole write, or the buffer in two
        (384, 510, [384, 244]),          // MTU 517: the buffer in one write, or one full LL packet
        (384, 182, [364, 384]),          // MTU 185: two whole writes, or the buffer
        (2475, 244, [2440, 2475]),       // ten whole writes, or the buffer
        (2475, 510, [2040, 2475, 2284]), // four whole writes, the buffer, or a fifth write of one LL packet
    ])
    func theCandidatesAreWholeWritesTheBufferAndLLAligned(buffer: Int, maxWrite: Int, expected: [Int]) {
        #expect(SMPFrameProbe.candidates(bufferSize: buffer, maxWrite: maxWrite) == expected)
    }

    /// Runs a probe over `rates` (bytes per second of each candidate's frames, in order), with
    /// answers coming as a link of that rate would send them; returns the frame it chose.
    func run(_ frames: [Int], rates: [Int: Double], window: Int, remaining: Int = 1 << 20) -> (chosen: Int?, sent: Int) {
        var probe = SMPFrameProbe(candidates: frames, window: window, remaining: remaining) { $0 - 20 }
        var offset = 0
        var now = Duration.zero
        var inFlight: [(end: Int, frame: Int)] = []
        var sent = 0
        while probe.chosen == nil, sent < 1000 {
            while inFlight.count < window {
                let frame = probe.nextFrame
                offset += frame - 20
                probe.sent(end: offset)
                inFlight.append((offset, frame))
                sent += 1
            }
            let (end, frame) = inFlight.removeFirst()
            now += .seconds(Double(frame - 20) / (rates[frame] ?? 1))
            probe.answered(end: end, at: now)
        }
        return (probe.chosen, sent)
    }

    @Test(arguments: [0, 1, 2])
    func theFastestTrialWins(fastest: Int) {
        let frames = [2040, 2475, 2284]
        var rates = Dictionary(uniqueKeysWithValues: frames.map { ($0, 100_000.0) })
        rates[frames[fastest]] = 130_000
        let (chosen, sent) = run(frames, rates: rates, window: 4)
        #expect(chosen == frames[fastest])
        // Each trial: the window, then the timed requests.
        #expect(sent <= frames.count * (4 + max(SMPFrameProbe.timedRequests, SMPFrameProbe.timedBytes / 2000 + 1)) + 4)
    }

    @Test func aShortUploadKeepsTheDefaultWithoutProbing() {
        let probe = SMPFrameProbe(candidates: [2040, 2475], window: 4, remaining: 20_000) { $0 - 20 }
        #expect(probe.chosen == 2040)
        #expect(probe.nextFrame == 2040)
    }

    @Test func nothingToChooseIsDecidedAtOnce() {
        #expect(SMPFrameProbe(candidates: [384], window: 4, remaining: 1 << 20) { $0 - 20 }.chosen == 384)
    }

    @Test func aBrokenStreamKeepsTheBestTrialSoFar() {
        var probe = SMPFrameProbe(candidates: [244, 384], window: 1, remaining: 1 << 20) { $0 - 20 }
        // The first trial is timed (one skipped, then enough for its bytes), the second not at all.
        var offset = 0
        for i in 0..<(1 + max(SMPFrameProbe.timedRequests, (SMPFrameProbe.timedBytes + 223) / 224)) {
            #expect(probe.nextFrame == 244)
            offset += 224
            probe.sent(end: offset)
            probe.answered(end: offset, at: .milliseconds(10 * (i + 1)))
        }
        #expect(probe.chosen == nil)
        #expect(probe.nextFrame == 384)
        probe.decide()
        #expect(probe.chosen == 244)
        // Untimed: the default.
        var fresh = SMPFrameProbe(candidates: [2040, 2475], window: 4, remaining: 1 << 20) { $0 - 20 }
        fresh.decide()
        #expect(fresh.chosen == 2040)
    }
}
