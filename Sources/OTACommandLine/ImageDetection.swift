import OTA

/// What `flash` was given, read once and routed once: a raw binary or Intel HEX image, whose
/// protocol the registry picks, or a file in a protocol's own format, which that protocol's
/// loader turns into a plan from what was read.
public enum ImageDetection: Sendable {
    /// A raw binary or Intel HEX image (decoded).
    case image(FirmwareImage)
    /// A file `registration`'s detector claimed.
    case own(ProtocolCommandLine, ClaimedImage)

    /// Reads `path` once with every registration's detector and file hints.
    ///
    /// - Throws: `CLIFailure` `.imageFile` (exit 3) for a file no protocol sends (with its line:
    ///   what it is and what to do) or that cannot be read.
    public static func detect(path: String, among registrations: [ProtocolCommandLine]) throws(CLIFailure) -> ImageDetection {
        let detected: DetectedImage
        do {
            detected = try FirmwareImage.read(path: path, detecting: registrations.compactMap(\.loader?.detector),
                                              hints: registrations.flatMap(\.fileHints))
        } catch {
            throw CLIFailure(.imageFile, "\(error)")
        }
        switch detected {
        case .firmware(let image):
            return .image(image)
        case .claimed(let claimed):
            guard let owner = registrations.first(where: { $0.loader?.detector.kind == claimed.format.kind }) else {
                throw CLIFailure(.internalError, "\(path): no protocol loads \(claimed.format.kind) files, though one detected it; please report this")
            }
            return .own(owner, claimed)
        }
    }
}

extension ProtocolCommandLine {
    /// The plan for a file this protocol's detector claimed: its loader's.
    ///
    /// - Throws: `CLIFailure`, as the loader refuses the file.
    public func load(_ claimed: ClaimedImage, _ request: FlashRequest) throws(CLIFailure) -> FlashPlan {
        guard let loader else {
            throw CLIFailure(.internalError, "\(claimed.path): the \(name) protocol claims no image format; please report this")
        }
        return try loader.load(claimed, request)
    }
}
