import GATT

/// Picks the upload's frame size on the live link.
///
/// Which frame size uploads fastest depends on how the controllers pack link-layer packets into
/// connection events: the PHY, the connection interval and the data length, none of which BlueZ
/// tells a GATT client. A frame of whole ATT writes wastes no short last write; a frame of the
/// whole buffer carries the most data per answer; a frame whose last write fills its last
/// 251-byte LL packet wastes none of the packet (docs/PERFORMANCE.md, "MCUmgr SMP"). The probe
/// tries each candidate on a few requests in turn, times their answers once the window is full
/// (the answers to a trial's first `window` requests still ride behind the previous trial's
/// frames), and keeps the fastest for the rest of the upload. Anything that breaks the stream
/// (a rewind, a timeout, a lost link) ends the probe with the best trial so far.
///
/// A pure value: the engine tells it what it sent and when each answer came.
struct SMPFrameProbe: Sendable, Hashable {
    struct Trial: Sendable, Hashable {
        var frame: Int
        /// Requests the trial sends: the window, then enough to time `timedBytes`.
        var requests: Int
        /// Where each request of the trial ends, in order sent, and when its answer came.
        var ends: [Int] = []
        var answered: [Int: Duration] = [:]
        /// Image bytes per second once the window was full; nil until measured.
        var rate: Double?
    }

    /// Each trial is timed over at least this many requests after the window, and this much
    /// data: enough connection events that where a frame's packets fall in them averages out.
    static let timedRequests = 4
    static let timedBytes = 16 * 1024
    /// A trial this much slower than a finished one, half timed, stops early.
    static let clearlySlower = 0.95
    /// The probe runs only on an upload this many times larger than the probe itself.
    static let minimumShare = 2

    private(set) var trials: [Trial]
    private let skip: Int
    /// The frame the rest of the upload uses, once decided.
    private(set) var chosen: Int?

    /// The candidate frame sizes for a buffer of `bufferSize` bytes sent in writes of at most
    /// `maxWrite`, the default (whole writes) first: the whole buffer, and the largest frame whose
    /// last write ends on a full 251-byte LL packet (an L2CAP PDU of the write + 7 bytes).
    static func candidates(bufferSize: Int, maxWrite: Int) -> [Int] {
        let whole = bufferSize > maxWrite ? bufferSize - bufferSize % maxWrite : bufferSize
        var frames = [whole, bufferSize]
        let llPayload = 251
        var aligned: Int?
        var writes = 0
        while writes * maxWrite < bufferSize {
            var last = llPayload - 7
            while last <= maxWrite, writes * maxWrite + last <= bufferSize {
                aligned = max(aligned ?? 0, writes * maxWrite + last)
                last += llPayload
            }
            writes += 1
        }
        if let aligned { frames.append(aligned) }
        var seen = Set<Int>()
        return frames.filter { seen.insert($0).inserted }
    }

    /// A probe over `candidates` with `window` requests in flight; decided at once when there is
    /// nothing to choose or the upload (`remaining` bytes, `dataPerFrame` of a frame's size) is too
    /// short for the probe to pay.
    init(candidates: [Int], window: Int, remaining: Int, dataPerFrame: (Int) -> Int) {
        let skip = max(1, window)
        self.skip = skip
        trials = candidates.map { frame in
            let data = max(1, dataPerFrame(frame))
            return Trial(frame: frame, requests: skip + max(Self.timedRequests, (Self.timedBytes + data - 1) / data))
        }
        let probeBytes = trials.reduce(0) { $0 + $1.requests * max(0, dataPerFrame($1.frame)) }
        if candidates.count < 2 || remaining < Self.minimumShare * probeBytes || candidates.contains(where: { dataPerFrame($0) <= 0 }) {
            chosen = candidates.first
        }
    }

    /// A probe that has decided on `frame`.
    init(deciding frame: Int) {
        trials = [Trial(frame: frame, requests: 1)]
        skip = 1
        chosen = frame
    }

    /// The frame for the next request.
    var nextFrame: Int {
        if let chosen { return chosen }
        return (trials.first { $0.ends.count < $0.requests } ?? trials[trials.count - 1]).frame
    }

    /// A request of `nextFrame`'s size went out, ending at `end`.
    mutating func sent(end: Int) {
        guard chosen == nil, let i = trials.firstIndex(where: { $0.ends.count < $0.requests }) else { return }
        trials[i].ends.append(end)
    }

    /// The answer to the request ending at `end` came at `now`, in order.
    mutating func answered(end: Int, at now: Duration) {
        guard chosen == nil, let i = trials.firstIndex(where: { $0.ends.contains(end) }) else { return }
        trials[i].answered[end] = now
        let trial = trials[i]
        let last = trial.requests - 1
        if trial.rate == nil, trial.ends.count == trial.requests, let from = trial.answered[trial.ends[skip - 1]],
           let to = trial.answered[trial.ends[last]], to > from {
            trials[i].rate = Double(trial.ends[last] - trial.ends[skip - 1]) / (to - from).seconds
        } else if trial.rate == nil, let best = trials.compactMap(\.rate).max(), let k = trial.ends.firstIndex(of: end),
                  k >= skip - 1 + Self.timedRequests, trial.ends[k] - trial.ends[skip - 1] >= Self.timedBytes / 2,
                  let from = trial.answered[trial.ends[skip - 1]], now > from {
            // Half timed and clearly slower than a finished trial: stop it there.
            let rate = Double(trial.ends[k] - trial.ends[skip - 1]) / (now - from).seconds
            if rate < best * Self.clearlySlower {
                trials[i].rate = rate
                trials[i].requests = trial.ends.count
            }
        }
        if trials.allSatisfy({ $0.rate != nil }) { decide() }
    }

    /// The stream broke: keep the best trial so far (the default when none was timed).
    mutating func decide() {
        guard chosen == nil else { return }
        let timed = trials.filter { $0.rate != nil }
        chosen = timed.max { ($0.rate ?? 0) < ($1.rate ?? 0) }?.frame ?? trials[0].frame
    }
}
