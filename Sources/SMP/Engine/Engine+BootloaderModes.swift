import GATT
import OTA
import OTAWire

extension SMPEngine {
    // MARK: Bootloader modes

    /// The image's header as a slot holds it, for an MCUboot image.
    var header: SMPSlotImage? { settings.imageHash == nil ? nil : SMPSlotImage(image.bytes) }

    /// What MCUboot's mode (first reported on this connection) says before anything is sent: a
    /// refusal where the update cannot work as asked, else a note on how it goes.
    mutating func modeRefusal() -> OTAError? {
        guard let info = bootloader, let mode = info.mode else { return nil }
        let slots = (states?.images ?? []).filter { ($0.image ?? 0) == settings.imageNumber }
        let running = slots.first(where: \.active)
        let runningVersion = running.map { " \($0.version)" } ?? ""
        let runningImage = running.flatMap(MCUbootVersionText.slotImage)
        let candidate = header
        if mode.singleSlot {
            return OTAError(.incompatibleDevice, "the device's MCUboot runs in \(mode) mode: it has no second slot to upload an image to over SMP",
                            hint: "update it through MCUboot's serial recovery, or build MCUboot with two slots")
        }
        if settings.confirmAfterCheck, mode.keepsWithoutTest {
            return OTAError(.incompatibleDevice, "the device's MCUboot runs in \(mode) mode: it keeps an image as soon as it boots it, with no test run and no revert, so --confirm-after-check cannot leave a failed image to revert",
                            hint: "drop --confirm-after-check (the image is kept at the reset), or build MCUboot in a swap or direct-XIP-with-revert mode")
        }
        if info.noDowngrade, let candidate, let runningImage, candidate.isOlder(than: runningImage) {
            return OTAError(.incompatibleDevice, "the device's MCUboot refuses downgrades (no-downgrade): it runs\(runningVersion) and would not boot this older image \(candidate.versionText)",
                            hint: "upload an image with a higher version (imgtool sign --version)")
        }
        if mode == .directXIP || mode == .ramLoad, let candidate, let runningImage, !candidate.isNewer(than: runningImage) {
            return OTAError(.incompatibleDevice, "the device's MCUboot runs in \(mode) mode and boots the slot with the highest version: this image \(candidate.versionText) is not newer than the running\(runningVersion), so it would not run",
                            hint: "upload an image with a higher version (imgtool sign --version)")
        }
        switch mode {
        case .overwriteOnly:
            notes.append("the device's MCUboot runs in overwrite-only mode: at the reset it copies the image over the running one and keeps it, with no test run and no revert")
        case .directXIP, .directXIPWithRevert, .ramLoad:
            let target = slots.first(where: { !$0.active }).map(\.slot) ?? running.map { 1 - $0.slot } ?? 1
            let built = candidate?.fixedAddress.map { "it is built for load address 0x\(String($0, radix: 16))" }
                ?? "it does not say which address it is built for (no ROM_FIXED flag), so only booting it shows it fits"
            let marks = mode == .directXIPWithRevert ? "it runs for test, reverted unless confirmed" : "MCUboot then boots the slot with the highest version, with no test run"
            notes.append("the device's MCUboot runs in \(mode) mode: the image goes to slot \(target), the one not running, and runs there in place; \(built); \(marks)")
        default:
            break
        }
        return nil
    }
}
