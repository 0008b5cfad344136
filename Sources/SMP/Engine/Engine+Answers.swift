import GATT
import OTA
import OTAWire

extension SMPEngine {
    // MARK: Answers

    mutating func answer(_ frame: SMPFrame) -> [TransferAction] {
        let seq = frame.header.sequence
        let response: SMPResponse
        do {
            response = try SMPResponse(decoding: frame)
        } catch {
            // An answer to something this engine did not send (or no longer waits for) is ignored.
            guard inFlight[seq] != nil || command?.sequence == seq else { return [] }
            return fail(OTAError(.protocolError, "the device's SMP answer is malformed: \(error)", cause: error))
        }
        if let end = inFlight.removeValue(forKey: seq) {
            return uploadAnswered(response, expected: end)
        }
        if let command, command.sequence == seq {
            return commandAnswered(response, to: command.request)
        }
        return []  // stale: a request forgotten after a rewind or a timeout
    }

    private mutating func uploadAnswered(_ response: SMPResponse, expected end: Int) -> [TransferAction] {
        let opening: Bool
        switch state {
        case .opening: opening = true
        case .streaming: opening = false
        default: return []  // the upload is over: an answer to a request still in flight changes nothing
        }
        let status: SMPUploadStatus
        switch response {
        case .upload(let s):
            status = s
            retries = 0
            state = opening ? .opening(nil) : .streaming(nil)
        case .error(let e) where e.general == .busy || e.general == .noMemory:
            if window > 1 {
                // The server ran out of buffers: go on with one request at a time.
                if !toldBusy {
                    toldBusy = true
                    notes.append("the device answered \(Self.name(of: e)) with \(window) requests in flight (out of SMP buffers, or busy): one request in flight from here on, slower")
                }
                window = 1
                // The first request is asked again at once; a later one when the window refills.
                return opening ? sendChunk(at: 0) : rewind(to: acked)
            }
            // Busy with one request at a time: wait, then ask again from the server's offset,
            // as often as a command is retried.
            let waiting = Busy(refusal: e, waiting: true)
            state = opening ? .opening(waiting) : .streaming(waiting)
            return rewind(to: acked)
        case .error(let e):
            return fail(refusal(e))
        default:
            return fail(OTAError(.protocolError, "the device answered an upload request with \(response)"))
        }
        guard let offset = Int(exactly: status.offset), offset <= image.size else {
            return fail(OTAError(.protocolError, "the device reported upload offset \(status.offset), past the image's \(image.size) bytes"))
        }
        if opening {
            state = .streaming(nil)
            if offset != end {
                // The server holds part of this very file (same sha): resume there (the first
                // request's data, which it already had, went for nothing).
                tally.resumed(from: offset)
                acked = offset
                sent = offset
                if offset < image.size { return [] }
            } else {
                // The server wrote the first request's data at 0: a new upload, or one it starts
                // over (it lost the upload in a reset, say), whatever this engine had seen it
                // confirm before. What it held goes again, and is counted so as it goes.
                tally.resumed(from: 0)
                tally.startedOver()
                acked = 0
            }
        }
        if offset == image.size {
            acked = offset
            prefix.record(offset: offset, crc: ackedCRC)
            serverMatch = status.match
            if status.match == false {
                let what = "the device's SHA-256 of the uploaded file does not match the file's"
                return startOver(because: what, OTAError(.verifyFailed, "the device's SHA-256 of the uploaded file does not match the file's\(againSaid); nothing was marked",
                                          hint: "run the same command again: it uploads the file anew; if it fails again, the link or the device's flash corrupts data",
                                          resumable: true))
            }
            return verify()
        }
        if offset != end {
            // The server is elsewhere: it refused or lost a request, or holds more of this file.
            tally.stats.rewinds += 1
            return rewind(to: offset)
        }
        acked = max(acked, offset)
        tally.stats.checkpoints += 1
        probe?.answered(end: offset, at: now)
        return []
    }

    /// How the note names a busy server's answer: "busy (10)", "out of memory (2)".
    static func name(of error: SMPDeviceError) -> String {
        switch error.general {
        case .busy?: "busy (10)"
        case .noMemory?: "out of memory (2)"
        default: "error \(error.rc)"
        }
    }

    /// The device's refusal of the upload, explained with the slot states it reported: which
    /// image holds slot 1 (NO_FREE_SLOT), which version runs (CURRENT_VERSION_IS_NEWER).
    func refusal(_ e: SMPDeviceError) -> OTAError {
        let general = e.otaError(device: "the device", request: "the upload at \(acked)")
        let slots = (states?.images ?? []).filter { ($0.image ?? 0) == settings.imageNumber }
        let active = slots.first { $0.active }
        if e.imageError == .noFreeSlot {
            if let waiting = slots.first(where: { $0.pending && !$0.active }) {
                return OTAError(general.code, "the device refused the upload: no free slot (9): slot \(waiting.slot) holds image \(waiting.version), marked to run at the next reset; reset the device (otaflash reset), then confirm the image that runs (otaflash image confirm) or reset again to revert it, and retry", cause: e)
            }
            if let active, !active.confirmed {
                return OTAError(general.code, "the device refused the upload: no free slot (9): it runs test image \(active.version), not confirmed, and slot 1 holds the image to revert to; confirm it (otaflash image confirm) or reset the device (otaflash reset) to revert, then retry", cause: e)
            }
        }
        if e.imageError == .invalidFlashAddress, let mode = bootloader?.mode, mode.runsInPlace {
            let target = slots.first(where: { !$0.active }).map(\.slot) ?? active.map { 1 - $0.slot } ?? 1
            let built = header?.fixedAddress.map { " (load address 0x\(String($0, radix: 16)))" } ?? ""
            return OTAError(general.code, "the device refused the upload: invalid flash address (25): in \(mode) mode an image runs only at the address it was built for, and this one\(built) is not built for slot \(target), the slot not running, where the upload goes; give the image built for slot \(target) (nRF Connect SDK's direct-XIP build makes one for each slot)", cause: e)
        }
        if settings.imageNumber != 0, acked == 0, e.general == .invalidValue, case .opening = state {
            // img_mgmt refuses an image number past CONFIG_MCUMGR_GRP_IMG_UPDATABLE_IMAGE_NUMBER so.
            return OTAError(.incompatibleDevice, "the device refused the upload to image \(settings.imageNumber) with invalid value (3): it has no \(settings.label) (its MCUboot updates fewer images); give only the images it has, or build it with CONFIG_UPDATEABLE_IMAGE_NUMBER=\(settings.imageNumber + 1)", cause: e)
        }
        if e.imageError == .currentVersionIsNewer, let active {
            return OTAError(general.code, "the device refused the upload: current version is newer (27): it runs \(active.version), the same as or newer than this image, and refuses a downgrade; upload an image with a higher version (imgtool sign --version)", cause: e)
        }
        if e.general == .unknown, acked == 0, case .opening = state {
            // An image over the slot, answered in general codes: Zephyr translates its "too large"
            // (30) to this for an SMP v1 client, and mcumgr fails to erase that much. Resetting the
            // device cannot help then.
            let said = e.reason.map { " (device says: \($0))" } ?? ""
            return OTAError(general.code, "the device refused the first upload request with unknown error (1)\(said): the image (\(image.size) bytes) may not fit its slot (an SMP server that reports errors in general codes answers so to an image over its slot size); check the image against the device's slot (its flash partition), build a smaller one, or retry if the device's flash failed", cause: e)
        }
        return general
    }

    /// Forgets what is in flight and streams again from the server's `offset`.
    mutating func rewind(to offset: Int) -> [TransferAction] {
        probe?.decide()
        inFlight = [:]
        queue = []
        queueHead = 0
        acked = offset
        sent = offset
        return []
    }

    private mutating func commandAnswered(_ response: SMPResponse, to request: SMPRequest) -> [TransferAction] {
        retries = 0
        if case .checking = state { return checked(response, to: request) }
        if case .imageStateWrite(_, let confirm) = request, case .error(let e) = response, e.general == .notSupported,
           !settings.confirmAfterCheck || !confirm, settings.reset {
            // No state write on this device: MCUboot in direct-XIP or RAM load, which boots the
            // slot with the highest version (a server that does not report its mode, say
            // mcumgr's, shows it only here). The reset follows; what booted decides.
            notes.append("the device has no image state write (NOT_SUPPORTED: MCUboot in direct-XIP or RAM load mode, which boots the slot with the highest version): resetting it without a mark")
            bootloader = bootloader ?? SMPBootloaderInfo(mode: .directXIP)
            return send(.reset(force: false), as: { .activating($0) })
        }
        if case .error(let e) = response {
            return fail(e.otaError(device: "the device", request: "\(request)"))
        }
        switch (request, response) {
        case (.imageStateRead, .imageStates(let states)):
            return verified(states)
        case (.imageStateWrite, .imageStates(let states)):
            return marked(states)
        case (.imageStateWrite, .empty):
            return marked(nil)
        case (.reset, _):
            // The link drops when the device resets (`rebootError`); the next connection reads
            // what MCUboot booted.
            state = .rebooting
            return []
        case (.imageErase, _):
            state = .opening(nil)
            return sendChunk(at: 0)
        default:
            return fail(OTAError(.protocolError, "the device answered \(request) with \(response)"))
        }
    }
}
