import Foundation
import GATT
import OTA
import SMP
import Synchronization

/// `--check-command`: the user's check of a new image, run through `/bin/sh -c` once the image
/// answers after its reset. Its output goes to stderr (stdout keeps otaflash's own lines).
enum CheckCommand {
    enum Outcome: Sendable, Equatable {
        case passed
        case exited(Int32)
        case signalled(Int32)
        case timedOut
        case cannotStart(String)

        /// Why it failed, for the check_failed line; nil when it passed.
        func failure(_ command: String, timeout: Double) -> String? {
            switch self {
            case .passed: nil
            case .exited(let status): "--check-command '\(command)' exited \(status)"
            case .signalled(let signal): "--check-command '\(command)' was killed by signal \(signal)"
            case .timedOut: "--check-command '\(command)' did not finish within \(timeout.optionText) s (--check-timeout); it was stopped"
            case .cannotStart(let why): "--check-command '\(command)' could not be started: \(why)"
            }
        }
    }

    /// Runs `command` with `environment` added, for at most `timeout`: past it the shell is sent
    /// SIGTERM and the check has failed.
    static func run(_ command: String, environment: [String: String], timeout: Duration) async -> Outcome {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/bin/sh")
        process.arguments = ["-c", command]
        process.environment = ProcessInfo.processInfo.environment.merging(environment) { $1 }
        process.standardInput = FileHandle.nullDevice
        process.standardOutput = FileHandle.standardError
        let result = Once<Outcome>()
        return await withCheckedContinuation { (continuation: CheckedContinuation<Outcome, Never>) in
            result.set(continuation)
            process.terminationHandler = { ended in
                let outcome: Outcome = switch (ended.terminationReason, ended.terminationStatus) {
                case (.exit, 0): .passed
                case (.exit, let status): .exited(status)
                case (_, let signal): .signalled(signal)
                }
                result.resume(outcome)
            }
            do {
                try process.run()
            } catch {
                result.resume(.cannotStart("\(error.localizedDescription)"))
                return
            }
            let deadline = Task {
                try? await Task.sleep(for: timeout)
                if !Task.isCancelled, result.resume(.timedOut) { process.terminate() }
            }
            result.onResume { deadline.cancel() }
        }
    }
}

/// A continuation resumed once, by whichever comes first (the process's end, its deadline).
private final class Once<Value: Sendable>: Sendable {
    private struct State {
        var continuation: CheckedContinuation<Value, Never>?
        var done = false
        var onResume: (@Sendable () -> Void)?
    }
    private let state = Mutex(State())

    func set(_ continuation: CheckedContinuation<Value, Never>) {
        state.withLock { $0.continuation = continuation }
    }

    /// Runs `body` once it resumed (at once if it already did).
    func onResume(_ body: @escaping @Sendable () -> Void) {
        let now = state.withLock { s -> Bool in
            if s.done { return true }
            s.onResume = body
            return false
        }
        if now { body() }
    }

    /// Resumes with `value` unless it already resumed; true when this call did.
    @discardableResult
    func resume(_ value: Value) -> Bool {
        let taken = state.withLock { s -> (CheckedContinuation<Value, Never>?, (@Sendable () -> Void)?)? in
            guard !s.done else { return nil }
            s.done = true
            defer { s.continuation = nil; s.onResume = nil }
            return (s.continuation, s.onResume)
        }
        guard let taken else { return false }
        taken.0?.resume(returning: value)
        taken.1?()
        return true
    }
}

extension Flash {
    /// `--confirm-after-check --check-command`: the engine left the new image running unconfirmed
    /// after its SMP echo; the command decides. It passes: connect again and confirm the image
    /// (`hash`, or the running one). It fails: the image stays unconfirmed (check_failed).
    func checkThenConfirm(_ result: OTAResult, after: DeviceSummary?, plan: FlashPlan, central: any GATTCentral,
                          address: DeviceAddress, printer: EventPrinter) async -> Result<OTAResult, OTAError> {
        let settings = smp.settings(noReset: smp.noReset)
        let hash = (plan.profile as? SMPProfile)?.settings?.imageHash
        guard let command = settings.checkCommand else { return .success(result) }
        let version = after?.firmwareVersion.map { "\($0)" } ?? ""
        printer.note("the new image answers; running --check-command before confirming it")
        let outcome = await CheckCommand.run(command, environment: ["OTAFLASH_DEVICE": address.description, "OTAFLASH_VERSION": version],
                                             timeout: Ranges.checkTimeout.duration(settings.checkTimeout))
        if let why = outcome.failure(command, timeout: settings.checkTimeout) {
            return .failure(OTAError(.checkFailed, "the new image booted but failed its check: \(why); it was not confirmed, so MCUboot reverts it at the next reset",
                                     hint: "reset the device to revert (otaflash reset), or confirm the image by hand if it is fine (otaflash image confirm)"))
        }
        do throws(OTAError) {
            try await confirm(hash: hash, central: central, address: address)
        } catch {
            return .failure(OTAError(error.code, "--check-command passed, but confirming the image failed: \(error.message); it stays unconfirmed and MCUboot reverts it at the next reset",
                                     hint: "confirm it with otaflash image confirm before the device resets", resumable: false))
        }
        printer.note("--check-command passed: the image is confirmed")
        return .success(result)
    }

    /// Connects to `address` and confirms the image with `hash` (the running one when nil): it
    /// must then be listed active and confirmed.
    private func confirm(hash: [UInt8]?, central: any GATTCentral, address: DeviceAddress) async throws(OTAError) {
        let connection: any GATTConnection
        do {
            connection = try await central.connect(to: address, timeout: Ranges.connectTimeout.duration(target.connectTimeout))
        } catch {
            throw OTAError.from(error, device: address.description)
        }
        do throws(OTAError) {
            let client: SMPClient
            do {
                client = try await SMPClient.attach(to: connection, device: address.description)
            } catch {
                throw OTAError.from(error, device: address.description)
            }
            let states = try await client.imageStates(.imageStateWrite(hash: hash, confirm: true), timeout: Ranges.replyTimeout.duration(replyTimeout))
            guard states.images.contains(where: { $0.active && $0.confirmed && (hash == nil || $0.hash == hash) }) else {
                throw OTAError(.protocolError, "the device accepted the confirm but does not list the image active and confirmed")
            }
        } catch {
            await connection.disconnect()
            throw error
        }
        await connection.disconnect()
    }
}
