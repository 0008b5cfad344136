import GATT
import OTA
import OTAWire

extension SMPEngine {
    // MARK: Timeouts and failures

    /// ", after uploading it again from 0": said in a failure after a start-over.
    var againSaid: String { startOvers > 0 ? ", also after uploading it again from 0" : "" }

    /// The server found the upload wrong: upload it again from offset 0 (a first request, which
    /// starts a new upload on a server whose last one finished) while start-overs are left;
    /// else fail with `error`.
    mutating func startOver(because what: String, _ error: OTAError) -> [TransferAction] {
        guard startOvers < min(Self.maxStartOvers, config.maxRecoveries) else { return fail(error) }
        startOvers += 1
        agreedBefore += acked
        tally.stats.restarts += 1
        notes.append("\(what): uploading it again from 0")
        serverMatch = nil
        retries = 0
        inFlight = [:]
        queue = []
        queueHead = 0
        acked = 0
        sent = 0
        state = .opening(nil)
        return sendChunk(at: 0)
    }

    mutating func timedOut() -> [TransferAction] {
        guard phase != .done, phase != .failed, phase != .idle else { return [] }
        if isRebooting {
            // The device answered the reset but kept the link: a new connection finds out.
            return [.failed(OTAError(.timeout, "the device answered the reset but did not drop the link within \(currentTimeout.seconds) s; reconnecting to read which image it runs",
                                     resumable: true))]
        }
        let afterBusy = waitingOutBusy
        let timeout = currentTimeout
        switch state {
        case .opening(let b?): state = .opening(Busy(refusal: b.refusal, waiting: false))
        case .streaming(let b?): state = .streaming(Busy(refusal: b.refusal, waiting: false))
        default: break
        }
        retries += 1
        if let busy, retries > config.commandRetries { return fail(refusal(busy.refusal)) }
        if case .opening = state, !afterBusy, retries > 1 || config.commandRetries == 0 {
            // The link is up, the request was written, and nothing came back for the whole erase allowance.
            let waited = Int((timeout + (retries > 1 ? config.replyTimeout : .zero)).seconds.rounded())
            return fail(OTAError(.timeout, "the device kept the link but did not answer the first upload request in \(waited) s: it erases its slot for longer than that, or it hung",
                                 hint: "reset the device (power cycle) and run the same command again; for a slot that takes longer to erase, raise --reply-timeout (the first request waits at least that long)",
                                 resumable: true))
        }
        if case .checking(let c) = state, retries > config.commandRetries {
            return fail(checkFailed("it did not answer \(c.request) within \(timeout.seconds) s, \(retries) times"))
        }
        guard retries <= config.commandRetries else {
            let what = command.map { "\($0.request)" } ?? "the upload request at \(acked)"
            return fail(OTAError(.timeout, "the device did not answer \(what) within \(timeout.seconds) s, \(retries) times",
                                 hint: "check the link and the device, then run the same command again to resume", resumable: true))
        }
        tally.stats.commandRetries += 1
        if case .opening = state, !afterBusy {
            let waited = timeout.seconds == timeout.seconds.rounded() ? "\(Int(timeout.seconds))" : "\(timeout.seconds)"
            notes.append("the device has not answered the first upload request in \(waited) s (it erases its slot for the \(image.size)-byte image before it answers): asking again, and waiting up to \(Int(currentTimeout.seconds)) s for the erase")
        }
        switch state {
        case .erasing(let c): return send(c.request, as: { .erasing($0) })
        case .verifying(let c): return send(c.request, as: { .verifying($0) })
        case .activating(let c): return send(c.request, as: { .activating($0) })
        case .checking(let c): return send(c.request, as: { .checking($0) })
        case .opening: return sendChunk(at: 0)
        case .streaming, .idle, .rebooting, .done, .failed: break
        }
        // Upload answers went missing, or a busy server was waited out: ask again from the last
        // offset the server confirmed (only the former is a rewind: nothing was lost).
        if !afterBusy { tally.stats.rewinds += 1 }
        return rewind(to: acked)
    }

    mutating func fail(_ error: OTAError, in failedPhase: TransferPhase? = nil) -> [TransferAction] {
        state = .failed(in: failedPhase ?? phase)
        inFlight = [:]
        queue = []
        queueHead = 0
        return [.failed(error)]
    }
}
