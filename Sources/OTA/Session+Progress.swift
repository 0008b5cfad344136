import Foundation
import GATT
import Logging
import OTAWire

extension OTASession {
    // MARK: What a connection reports

    /// A progress event, at most every `progressInterval` unless `force`d; none before the
    /// transfer's `transferStarted` event.
    func report<Engine: TransferEngine>(_ run: inout ConnectionRun<Engine>, force: Bool) {
        let now = run.clock.now
        guard run.announcedStart, force || now - run.lastProgress >= Self.progressInterval else { return }
        run.lastProgress = now
        run.meter.sample(bytes: run.engine.highWater, at: now)
        let rate = run.meter.rate
        let left = Double(image.size - run.engine.sent)
        run.events(.progress(TransferProgress(device: device, bytes: run.engine.sent, confirmed: run.engine.acked, total: image.size,
                                              rate: rate, eta: rate > 0 ? left / rate : nil, elapsed: (now - run.started).seconds)))
    }

    /// The `transferStarted` event, once the engine streams.
    func announceStart<Engine: TransferEngine>(_ run: inout ConnectionRun<Engine>) {
        guard !run.announcedStart, run.engine.phase == .streaming else { return }
        run.announcedStart = true
        run.streamStart = run.clock.now
        run.events(.transferStarted(device: device, resumeOffset: run.engine.resumeOffset, total: image.size))
    }

    /// Before a command goes out: the events of the phase it belongs to (a streaming engine
    /// may send its first verifying command as a stream step or as an action).
    func announcePhase<Engine: TransferEngine>(_ run: inout ConnectionRun<Engine>, profile: some OTAProfile) {
        if run.engine.phase == .verifying, run.streamEnd == nil {
            run.streamEnd = run.clock.now
            report(&run, force: true)
            run.events(.verifying(device: device, check: profile.imageCheck))
        }
        // Once: activating may take several commands (SMP: mark, then reset) or retries.
        if run.engine.phase == .activating, !run.announcedActivate {
            run.announcedActivate = true
            run.events(.activating(device: device))
        }
    }

    /// Says what the engine noted, and records a newly confirmed position in the journal.
    func recordProgress<Engine: TransferEngine>(_ run: inout ConnectionRun<Engine>) {
        let notes = run.engine.notes
        while run.told < notes.count {
            run.events(.notice(device: device, message: notes[run.told]))
            run.told += 1
        }
        guard run.engine.acked != run.journaled, let journal else { return }
        run.journaled = run.engine.acked
        let entry = TransferJournal(device: device, imageSize: image.size, imageCRC: hex32(image.crc32),
                                    confirmedOffset: run.engine.acked, confirmedCRC: run.engine.ackedCRC, updated: Date())
        do { try journal.save(entry, image: image) } catch {
            logger.warning("cannot write the journal", metadata: ["path": "\(journal.path(device: device, image: image))", "error": "\(error)"])
        }
    }
}

/// Bytes per second over the last few seconds.
struct RateMeter {
    private var samples: [(time: Duration, bytes: Int)]
    static let span: Duration = .seconds(3)

    init(start: Duration) { samples = [(start, 0)] }

    mutating func sample(bytes: Int, at time: Duration) {
        samples.append((time, bytes))
        while samples.count > 2, time - samples[1].time >= Self.span { samples.removeFirst() }
    }

    var rate: Double {
        guard let first = samples.first, let last = samples.last else { return 0 }
        let dt = (last.time - first.time).seconds
        return dt > 0 ? Double(last.bytes - first.bytes) / dt : 0
    }
}
