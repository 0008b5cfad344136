import GATT
import OTA
import OTAWire

extension SMPEngine {
    // MARK: Verify, mark, reset

    mutating func verify() -> [TransferAction] {
        if settings.imageHash == nil {
            // Not an MCUboot image: the server's own check is all there is.
            guard serverMatch == true else {
                return fail(OTAError(.verifyFailed, "the device did not confirm the upload's SHA-256 (no 'match' in its answer), and the file is not an MCUboot image whose hash could be checked; nothing was marked",
                                     hint: "send an MCUboot image (imgtool sign), or enable CONFIG_IMG_ENABLE_IMAGE_CHECK on the device"),
                            in: .verifying)
            }
            return markOrFinish()
        }
        return send(.imageStateRead, as: { .verifying($0) })
    }

    mutating func verified(_ states: SMPImageStates) -> [TransferAction] {
        // The freshest list: the marks that follow check the other images of the update in it.
        self.states = states
        let slots = states.images.filter { ($0.image ?? 0) == settings.imageNumber }
        guard let hash = settings.imageHash else {
            // The server checked the SHA-256; mark what it reports for the slot it wrote.
            guard let written = slots.first(where: { !$0.active && $0.hash != nil })?.hash else {
                return fail(OTAError(.protocolError, "after the upload the device lists no slot besides the running one; nothing was marked"))
            }
            markHash = written
            return markOrFinish()
        }
        guard slots.contains(where: { $0.hash == hash }) else {
            let listed = slots.map { "slot \($0.slot) \($0.hash.map(hexString) ?? "without a hash")" }.joined(separator: ", ")
            let what = "after the upload the device holds no image with this image's hash \(hexString(hash))"
            return startOver(because: what, OTAError(.verifyFailed, "after the upload the device holds no image with this image's hash \(hexString(hash)) (it lists \(listed.isEmpty ? "no slot" : listed))\(againSaid); nothing was marked",
                                      hint: "run the same command again: it uploads the file anew; if it fails again, the device's flash or its image check is at fault",
                                      resumable: true))
        }
        return markOrFinish()
    }

    private mutating func markOrFinish() -> [TransferAction] {
        guard config.activate, !settings.uploadOnly else {
            state = .done
            return [.finished]
        }
        if let mode = bootloader?.mode, mode == .directXIP || mode == .ramLoad {
            // No state write in these modes: MCUboot boots the slot with the highest version.
            guard settings.reset else {
                state = .done
                return [.finished]
            }
            return send(.reset(force: false), as: { .activating($0) })
        }
        guard let hash = markHash else {
            return fail(OTAError(.internalError, "no hash to mark the uploaded image with; please report this"), in: .activating)
        }
        if serverMatch == nil, settings.imageHash != nil {
            // An mcumgr server answers no `match` and reports the slot's hash TLV, not a hash of
            // what it holds: a corrupted upload looks intact until MCUboot checks it at the reset.
            notes.append("the device did not check the uploaded file's SHA-256 (its answer has no 'match', as an mcumgr server's), and the slot's hash it reports is read from the image: only MCUboot's check at the reset can find a corrupted upload; check that the new version runs afterwards (otaflash image list)")
        }
        marking = 0
        return markNext(ownHash: hash)
    }

    /// Marks the next image: the companions first, in order (each but one the device already
    /// runs), then this one. With a hash, confirm marks the uploaded image (without one it would
    /// confirm the running image).
    private mutating func markNext(ownHash hash: [UInt8]) -> [TransferAction] {
        let confirm = settings.confirm && !settings.confirmAfterCheck
        while marking < settings.companions.count {
            let companion = settings.companions[marking]
            marking += 1
            let slots = (states?.images ?? []).filter { ($0.image ?? 0) == companion.imageNumber && $0.hash == companion.imageHash }
            if slots.contains(where: \.active) { continue }
            guard states == nil || !slots.isEmpty else {
                // MCUboot refused it at a reset (and erased it) before this image was marked.
                return fail(OTAError(.verifyFailed, "the \(companion.label)'s image \(companion.version) is no longer on the device (MCUboot refused it at a reset and erased it); the \(settings.label)'s image was not marked, so nothing runs half updated",
                                     hint: "run the same command again: it uploads every image anew"), in: .activating)
            }
            return send(.imageStateWrite(hash: companion.imageHash, confirm: confirm), as: { .activating($0) })
        }
        marking = settings.companions.count + 1
        return send(.imageStateWrite(hash: hash, confirm: confirm), as: { .activating($0) })
    }

    /// The image (number and hash) the state write in flight marks.
    private var markedNow: (number: UInt32, hash: [UInt8]?) {
        guard marking > 0, marking <= settings.companions.count else { return (settings.imageNumber, markHash) }
        let companion = settings.companions[marking - 1]
        return (companion.imageNumber, companion.imageHash)
    }

    mutating func marked(_ states: SMPImageStates?) -> [TransferAction] {
        let now = markedNow
        if let states, let hash = now.hash,
           let slot = states.images.first(where: { ($0.image ?? 0) == now.number && $0.hash == hash }),
           !(slot.pending || slot.confirmed || slot.active) {
            return fail(OTAError(.protocolError, "the device accepted marking the image but lists it neither pending nor confirmed"))
        }
        if marking <= settings.companions.count, let hash = markHash { return markNext(ownHash: hash) }
        guard settings.reset else {
            state = .done
            return [.finished]
        }
        return send(.reset(force: false), as: { .activating($0) })
    }

    /// The session reconnects on this (a resumable link loss) and the next connection's image
    /// states say whether MCUboot swapped the image in (`booted`).
    var rebootError: OTAError {
        OTAError(.connection, "the device reset to swap the image in; reconnecting to read which image it runs",
                 hint: "if it does not come back, check what it runs with otaflash image list", resumable: true)
    }

    /// After the reset: ok only when the slot that runs holds the image's hash. MCUboot refuses an
    /// image whose hash or signature does not check out (a corrupted upload that an mcumgr server,
    /// answering no `match`, could not find) and runs the old one: that image is uploaded again
    /// while start-overs are left, else the run fails.
    mutating func booted(_ states: SMPImageStates?) -> [TransferAction] {
        guard let states, let hash = markHash else {
            return fail(OTAError(.protocolError, "after its reset the device did not report its image states; check what it runs with otaflash image list"))
        }
        let slots = states.images.filter { ($0.image ?? 0) == settings.imageNumber }
        let running = slots.first(where: \.active)
        if running?.hash == hash {
            if let stale = settings.companions.first(where: { companion in
                !states.images.contains { ($0.image ?? 0) == companion.imageNumber && $0.hash == companion.imageHash && $0.active }
            }) {
                return fail(companionNotRunning(stale, states))
            }
            if !settings.companions.isEmpty {
                let all = settings.companions.map { "\($0.label) \($0.version)" } + ["\(settings.label) \(running?.version ?? "")"]
                notes.append("after the reset every image runs its new version: " + all.joined(separator: ", "))
            }
            guard settings.confirmAfterCheck else {
                state = .done
                return [.finished]
            }
            revertTo = slots.first(where: { !$0.active && $0.hash != hash })?.version
            return send(.echo(Self.checkText), as: { .checking($0) })
        }
        if let waiting = slots.first(where: { $0.hash == hash && $0.pending }) {
            return fail(OTAError(.timeout, "after its reset the device still lists the image in slot \(waiting.slot), marked to run at the next reset: it did not reset, or MCUboot did not swap the image in",
                                 hint: "reset the device (otaflash reset), then check what it runs with otaflash image list"))
        }
        let old = running.map { "its old image \($0.version)" } ?? "its old image"
        let what = "MCUboot refused the image at boot (its hash or signature did not check out) and the device runs \(old)"
        return startOver(because: what, OTAError(.verifyFailed, "\(what)\(againSaid)",
                                                 hint: "run the same command again: it uploads the file anew; if MCUboot refuses it again, check the image's signature key and the device's flash",
                                                 resumable: true))
    }

    /// After the reset this image runs, but `companion` (marked before it) does not: MCUboot
    /// skipped or refused its update.
    private func companionNotRunning(_ companion: SMPCompanion, _ states: SMPImageStates) -> OTAError {
        let slots = states.images.filter { ($0.image ?? 0) == companion.imageNumber }
        let runs = slots.first(where: \.active).map { "still runs \($0.version)" } ?? "lists no running image"
        let held = slots.contains { $0.hash == companion.imageHash } ? "; the new image is still in its slot" : ""
        return OTAError(.verifyFailed, "after the reset the \(settings.label) runs its new image, but the \(companion.label) \(runs), not \(companion.version): MCUboot did not take its update\(held)",
                        hint: "check each image with otaflash image list; run the same command again to upload and mark it anew (the network core's image is marked before the application's)")
    }
}
