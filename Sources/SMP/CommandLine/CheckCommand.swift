import Foundation
import GATT
import OTA
import OTACommandLine
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

    /// Runs `command` with `environment` added, in a process group of its own, for at most
    /// `timeout`: past it the group is sent SIGTERM (SIGKILL a second later, if it is still there)
    /// and the check has failed. The group goes, so no child of the shell outlives the run.
    static func run(_ command: String, environment: [String: String], timeout: Duration) async -> Outcome {
        var attributes = posix_spawnattr_t()
        var actions = posix_spawn_file_actions_t()
        posix_spawnattr_init(&attributes)
        posix_spawn_file_actions_init(&actions)
        defer {
            posix_spawnattr_destroy(&attributes)
            posix_spawn_file_actions_destroy(&actions)
        }
        posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETPGROUP))
        posix_spawnattr_setpgroup(&attributes, 0)
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        posix_spawn_file_actions_adddup2(&actions, 2, 1)
        let variables = ProcessInfo.processInfo.environment.merging(environment) { $1 }.map { "\($0.key)=\($0.value)" }
        let arguments = ["/bin/sh", "-c", command]
        var pid: pid_t = 0
        let spawned = withCStrings(arguments) { argv in
            withCStrings(variables) { envp in posix_spawn(&pid, "/bin/sh", &actions, &attributes, argv, envp) }
        }
        guard spawned == 0 else { return .cannotStart(String(cString: strerror(spawned))) }
        let group = pid
        let result = Once<Outcome>()
        return await withCheckedContinuation { (continuation: CheckedContinuation<Outcome, Never>) in
            result.set(continuation)
            let deadline = Task {
                try? await Task.sleep(for: timeout)
                guard !Task.isCancelled, result.resume(.timedOut) else { return }
                kill(-group, SIGTERM)
                try? await Task.sleep(for: .seconds(1))
                kill(-group, SIGKILL)
            }
            // The shell's end, waited for on a thread of its own (waitpid blocks).
            Thread {
                var status: Int32 = 0
                while waitpid(group, &status, 0) == -1, errno == EINTR {}
                let signal = status & 0x7F
                let code = (status >> 8) & 0xFF
                if result.resume(signal != 0 ? .signalled(signal) : code == 0 ? .passed : .exited(code)) { deadline.cancel() }
            }.start()
        }
    }

    /// `body` with `strings` as a NULL-terminated array of C strings.
    private static func withCStrings<R>(_ strings: [String], _ body: ([UnsafeMutablePointer<CChar>?]) -> R) -> R {
        var pointers = strings.map { strdup($0) }
        pointers.append(nil)
        defer { for p in pointers { free(p) } }
        return body(pointers)
    }
}

/// A continuation resumed once, by whichever comes first (the process's end, its deadline).
private final class Once<Value: Sendable>: Sendable {
    private struct State {
        var continuation: CheckedContinuation<Value, Never>?
        var done = false
    }
    private let state = Mutex(State())

    func set(_ continuation: CheckedContinuation<Value, Never>) {
        state.withLock { $0.continuation = continuation }
    }

    /// Resumes with `value` unless it already resumed; true when this call did.
    @discardableResult
    func resume(_ value: Value) -> Bool {
        let taken = state.withLock { s -> CheckedContinuation<Value, Never>?? in
            guard !s.done else { return nil }
            s.done = true
            defer { s.continuation = nil }
            return .some(s.continuation)
        }
        guard let taken else { return false }
        taken?.resume(returning: value)
        return true
    }
}

extension SMPOptions {
    /// `--confirm-after-check --check-command`: the engine left the new image running unconfirmed
    /// after its SMP echo; the command decides. It passes: connect again and confirm the image
    /// (its hash, or the running one). It fails: the image stays unconfirmed (check_failed).
    /// Without `--check-command`, the result as it is.
    static func checkThenConfirm(_ run: AfterActivation) async -> Result<OTAResult, OTAError> {
        guard let options = run.options(SMPOptions.self) else { return .success(run.result) }
        let settings = options.flash.settings(noReset: options.flash.noReset)
        guard let command = settings.checkCommand else { return .success(run.result) }
        let hash = (run.profile as? SMPProfile)?.settings?.imageHash
        let version = run.after?.firmwareVersion.map { "\($0)" } ?? ""
        run.note("the new image answers; running --check-command before confirming it")
        let outcome = await CheckCommand.run(command, environment: ["OTAFLASH_DEVICE": run.address.description, "OTAFLASH_VERSION": version],
                                             timeout: SMPRanges.checkTimeout.duration(settings.checkTimeout))
        if let why = outcome.failure(command, timeout: settings.checkTimeout) {
            return .failure(OTAError(.checkFailed, "the new image booted but failed its check: \(why); it was not confirmed, so MCUboot reverts it at the next reset",
                                     hint: "reset the device to revert (otaflash reset), or confirm the image by hand if it is fine (otaflash image confirm)"))
        }
        do throws(OTAError) {
            try await confirm(hash: hash, run)
        } catch {
            return .failure(OTAError(error.code, "--check-command passed, but confirming the image failed: \(error.message); it stays unconfirmed and MCUboot reverts it at the next reset",
                                     hint: "confirm it with otaflash image confirm before the device resets", resumable: false))
        }
        run.note("--check-command passed: the image is confirmed")
        return .success(run.result)
    }

    /// Connects to the device again and confirms the image with `hash` (the running one when
    /// nil): it must then be listed active and confirmed.
    private static func confirm(hash: [UInt8]?, _ run: AfterActivation) async throws(OTAError) {
        let connection: any GATTConnection
        do {
            connection = try await run.central.connect(to: run.address, timeout: run.connectTimeout)
        } catch {
            throw OTAError.from(error, device: run.address.description)
        }
        do throws(OTAError) {
            let client: SMPClient
            do {
                client = try await SMPClient.attach(to: connection, device: run.address.description)
            } catch {
                throw OTAError.from(error, device: run.address.description)
            }
            let states = try await client.imageStates(.imageStateWrite(hash: hash, confirm: true), timeout: run.replyTimeout)
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
