import GATT
import OTA
import OTAWire

extension SMPEngine {
    // MARK: The check before the confirm

    /// What the check's echo sends.
    static let checkText = "otaflash check"

    /// `confirmAfterCheck`: the new image's answers. An echo answered (with the text sent, or
    /// NOT_SUPPORTED from a server built without echo: its SMP server answers) passes; then the
    /// image is confirmed, unless the caller checks it further (`holdsConfirm`).
    mutating func checked(_ response: SMPResponse, to request: SMPRequest) -> [TransferAction] {
        switch (request, response) {
        case (.echo(let sent), .echo(let echoed)) where echoed == sent:
            return checkPassed()
        case (.echo, .error(let e)) where e.general == .notSupported:
            return checkPassed()
        case (.echo, _):
            return fail(checkFailed("it answered the SMP echo with \(response)"))
        case (.imageStateWrite, .imageStates(let states)):
            guard let hash = markHash,
                  states.images.contains(where: { ($0.image ?? 0) == settings.imageNumber && $0.hash == hash && $0.active && $0.confirmed }) else {
                return fail(OTAError(.protocolError, "the device accepted confirming the checked image but does not list it active and confirmed; check it with otaflash image list"))
            }
            state = .done
            return [.finished]
        case (.imageStateWrite, .empty):
            state = .done
            return [.finished]
        case (_, .error(let e)):
            return fail(e.otaError(device: "the device", request: "\(request)"))
        default:
            return fail(OTAError(.protocolError, "the device answered \(request) with \(response)"))
        }
    }

    private mutating func checkPassed() -> [TransferAction] {
        // A mode without a test run (found when the mark was not supported) keeps it as it is.
        guard !settings.holdsConfirm, bootloader?.mode?.keepsWithoutTest != true, let hash = markHash else {
            state = .done
            return [.finished]
        }
        return send(.imageStateWrite(hash: hash, confirm: true), as: { .checking($0) })
    }

    /// The new image failed its check (`why`): it stays unconfirmed, so MCUboot reverts it.
    func checkFailed(_ why: String) -> OTAError {
        if let mode = bootloader?.mode, mode.keepsWithoutTest {
            return OTAError(.checkFailed, "the new image booted but failed its check: \(why); MCUboot runs in \(mode) mode, which keeps the image (no revert)",
                            hint: "upload a working image")
        }
        let back = revertTo.map { " to \($0)" } ?? ""
        return OTAError(.checkFailed, "the new image booted but failed its check: \(why); it was not confirmed, so MCUboot reverts it\(back) at the next reset",
                        hint: "reset the device to revert (otaflash reset), or confirm the image by hand if it is fine (otaflash image confirm)")
    }
}
