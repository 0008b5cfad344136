import Dispatch
import Foundation
import OTACommandLine
import Synchronization

/// Turns SIGINT/SIGTERM/SIGHUP (a closed SSH session) into task cancellation: the first signal asks the running work to stop
/// cleanly (the current write finishes and the device stays resumable); a second one exits at
/// once with the `interrupted` code.
///
/// Signals are delivered through `DispatchSource` signal sources, not handlers, so nothing
/// async-unsafe runs in signal context.
final class InterruptHandler {
    private let sources: [any DispatchSourceSignal]
    private let count = ManagedCounter()

    /// True once SIGINT, SIGTERM or SIGHUP arrived: the run ends with the `interrupted` code.
    var signalled: Bool { count.value > 0 }

    /// - Parameter onFirst: called on the first signal (cancel the work, print a note).
    init(onFirst: @escaping @Sendable (Int32) -> Void) {
        let queue = DispatchQueue(label: "otaflash.signals")
        let count = self.count
        sources = [SIGINT, SIGTERM, SIGHUP].map { sig in
            signal(sig, SIG_IGN)
            let source = DispatchSource.makeSignalSource(signal: sig, queue: queue)
            source.setEventHandler {
                if count.increment() == 1 {
                    onFirst(sig)
                } else {
                    StandardOutput().err("otaflash: interrupted again; exiting now\n")
                    exit(ExitCode.interrupted.rawValue)
                }
            }
            source.resume()
            return source
        }
    }

    /// Stops watching: the work has ended. A signal from now on (a second Ctrl-C as the run
    /// prints its summary) exits at once with the `interrupted` code, never killed by the signal
    /// (which would leave the shell no documented exit code); a later `InterruptHandler` takes over.
    func cancel() {
        for source in sources { source.cancel() }
        for sig in [SIGINT, SIGTERM, SIGHUP] {
            // Only async-signal-safe work in a handler: _exit, not exit.
            signal(sig) { _ in _exit(ExitCode.interrupted.rawValue) }
        }
    }
}

/// A counter of signals received, read from any thread.
private final class ManagedCounter: Sendable {
    private let count = Mutex(0)
    var value: Int { count.withLock { $0 } }
    func increment() -> Int {
        count.withLock { c in
            c += 1
            return c
        }
    }
}
