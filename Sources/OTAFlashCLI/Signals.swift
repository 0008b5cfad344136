import Dispatch
import Foundation

/// Turns SIGINT/SIGTERM into task cancellation: the first signal asks the running work to stop
/// cleanly (the current write finishes and the device stays resumable); a second one exits at
/// once with the `interrupted` code.
///
/// Signals are delivered through `DispatchSource` signal sources, not handlers, so nothing
/// async-unsafe runs in signal context.
final class InterruptHandler {
    private let sources: [any DispatchSourceSignal]

    /// - Parameter onFirst: called on the first signal (cancel the work, print a note).
    init(onFirst: @escaping @Sendable (Int32) -> Void) {
        let queue = DispatchQueue(label: "otaflash.signals")
        let count = ManagedCounter()
        sources = [SIGINT, SIGTERM].map { sig in
            signal(sig, SIG_IGN)
            let source = DispatchSource.makeSignalSource(signal: sig, queue: queue)
            source.setEventHandler {
                if count.increment() == 1 {
                    onFirst(sig)
                } else {
                    FileHandle.standardError.write(Data("otaflash: interrupted again; exiting now\n".utf8))
                    exit(ExitCode.interrupted.rawValue)
                }
            }
            source.resume()
            return source
        }
    }

    /// Restores the default dispositions.
    func cancel() {
        for source in sources { source.cancel() }
        signal(SIGINT, SIG_DFL)
        signal(SIGTERM, SIG_DFL)
    }
}

/// A counter touched only on the signal queue.
private final class ManagedCounter: @unchecked Sendable {
    // Accessed only from the serial signal queue that owns the sources.
    private var value = 0
    func increment() -> Int {
        value += 1
        return value
    }
}
