import Foundation
import GATT
import Logging
import OTAWire

/// How long a session may go on without progress, counted over connected time while data is
/// being sent (not while reconnecting, verifying or activating, which have limits of their own):
/// the budget is spent while no new data is confirmed, and refilled whenever the device confirms
/// more of the image than ever before.
struct StallBudget {
    let limit: Duration
    private(set) var left: Duration
    private var mark = 0
    private var since: Duration?

    init(limit: Duration) {
        self.limit = limit
        self.left = limit
    }

    /// Spends from `now` on, unless already spending.
    mutating func spend(at now: Duration) {
        if since == nil { since = now }
    }

    /// Stops spending: the connection is gone, or a phase with its own deadline runs.
    mutating func hold(at now: Duration) {
        if let since { left -= now - since }
        since = nil
    }

    /// Refills the budget when the device holds more than before.
    mutating func observe(furthest: Int, at now: Duration) {
        guard furthest > mark else { return }
        mark = furthest
        left = limit
        since = since.map { _ in now }
    }

    /// When the budget runs out on the running connection.
    var deadline: Duration? { since.map { $0 + left } }
}

extension OTASession {
    // MARK: The stall budget

    /// The stall deadline while it applies: VERIFY and ACTIVATE have deadlines of their own; so
    /// does one wait the protocol allows to last longer than the whole budget (SMP's first
    /// upload request: the server erases its slot before it answers), timed by the engine's
    /// timeout and retries.
    func stallDeadline<Engine: TransferEngine>(_ run: inout ConnectionRun<Engine>) -> Duration? {
        let now = run.clock.now
        run.stall.observe(furthest: run.engine.furthestAgreed, at: now)
        guard run.engine.phase == .beginning || run.engine.phase == .streaming,
              !(run.engine.isAwaitingReply && run.engine.currentTimeout > run.stall.limit) else {
            run.stall.hold(at: now)
            return nil
        }
        run.stall.spend(at: now)
        return run.stall.deadline
    }

    func checkStall<Engine: TransferEngine>(_ run: inout ConnectionRun<Engine>) throws(OTAError) {
        guard let limit = stallDeadline(&run), run.clock.now >= limit else { return }
        run.stall.hold(at: run.clock.now)
        let stats = run.engine.stats
        throw OTAError(.timeout, "\(device) confirmed no new data in \(run.stall.limit.seconds) s of connected time (\(run.engine.acked) of \(image.size) bytes confirmed, \(stats.rewinds) rewinds, \(stats.rollbacks) rollbacks)",
                       hint: "the link loses or corrupts the data, the device writes its flash too slowly, or it stopped answering: check the link and the device, then \(OTAError.resumeAdvice)",
                       resumable: true)
    }
}
