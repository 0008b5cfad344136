import ArgumentParser
import OTA
import SMP

/// `otaflash image slots`: img_mgmt's slot info (image group, command 6): each image's slots,
/// their sizes and the one an upload goes to.
struct ImageSlots: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "slots",
        abstract: "Show the device's image slots: their sizes and which one takes an upload (MCUmgr image slot info).")

    @OptionGroup var options: SMPCommandOptions

    func run() async throws {
        try await runSMPCommand(options) { printer in
            let (info, device) = try await options.withClient { (client, timeout) async throws(OTAError) in
                let answer = try await client.send(.imageSlotInfo, timeout: timeout)
                switch answer {
                case .slotInfo(let info):
                    return (info, client.device)
                case .error(let e) where e.general == .notSupported:
                    throw OTAError(.incompatibleDevice, "\(client.device) does not answer the image slot info (an older SMP server, or one built without CONFIG_MCUMGR_GRP_IMG_SLOT_INFO); otaflash image list shows the images in its slots")
                case .error(let e):
                    throw e.otaError(device: client.device, request: "the image slot info read")
                default:
                    throw OTAError(.protocolError, "\(client.device) answered the image slot info read with \(answer)")
                }
            }
            for image in info.images {
                for slot in image.slots {
                    printer.json(ImageEvents.SlotInfo(device: device, image: Int(image.image), slot: Int(slot.slot), size: slot.size.map { Int(clamping: $0) },
                                                      uploadImageId: slot.uploadImageID.map(Int.init),
                                                      maxImageSize: image.maxImageSize.map { Int(clamping: $0) }))
                }
            }
            printer.table([["image", "slot", "size", "upload"]] + info.images.flatMap { image in
                image.slots.map { slot in
                    ["\(image.image)", "\(slot.slot)", slot.size.map { formatBytes(Int(clamping: $0)) } ?? "-",
                     slot.uploadImageID.map { "image \($0)" } ?? "-"]
                }
            })
        }
    }
}

extension ImageEvents {
    /// One slot of `image slots`.
    public struct SlotInfo: JSONEvent {
        public static let name = "slot_info"
        public var device: String
        public var image: Int
        public var slot: Int
        public var size: Int?
        public var uploadImageId: Int?
        public var maxImageSize: Int?
    }
}
