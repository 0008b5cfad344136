/// What a firmware file is, read once (`FirmwareImage.read`): an image any protocol that sends
/// raw binaries or Intel HEX can take, or a file a protocol's detector claimed, for that
/// protocol's loader.
public enum DetectedImage: Sendable {
    /// A raw binary, or Intel HEX text decoded.
    case firmware(FirmwareImage)
    /// A format of a protocol's own, with the bytes read.
    case claimed(ClaimedImage)
}

/// A file in a protocol's own format, as its detector found it and as it was read: what a loader
/// of that format parses instead of opening the file again.
public struct ClaimedImage: Sendable {
    /// The file, for messages.
    public let path: String
    /// What the detector found: its kind, its description (for Intel HEX text, "Intel HEX text
    /// holding …"), an archive's entries, its size limit.
    public let format: ImageFormat
    /// The file's first bytes (up to `ImageFormat.headSize`) as the detector saw them: for Intel
    /// HEX text, the text's.
    public let head: [UInt8]
    /// For Intel HEX text: the address of the decoded image's first byte.
    public let baseAddress: UInt32?
    /// The file's bytes (Intel HEX text decoded), or the refusal of a file over the format's limit.
    private let contents: Result<[UInt8], ImageError>

    /// A file in memory: for a loader's tests, and for callers that read the file themselves.
    public init(path: String, format: ImageFormat, bytes: [UInt8], head: [UInt8]? = nil, baseAddress: UInt32? = nil) {
        self.path = path
        self.format = format
        self.head = head ?? Array(bytes.prefix(ImageFormat.headSize))
        self.baseAddress = baseAddress
        self.contents = .success(bytes)
    }

    /// The rest of `file` after `head`, up to the format's limit.
    init(path: String, format: ImageFormat, file: ImageFile, head: [UInt8]) throws(ImageError) {
        self.path = path
        self.format = format
        self.head = head
        self.baseAddress = nil
        self.contents = try FirmwareImage.readWhole(file, head: head, limit: format.limit)
    }

    /// The file's bytes (Intel HEX text decoded).
    ///
    /// - Throws: `ImageError` for a file larger than its format's limit ("is 300000000 bytes;
    ///   packages over 192 MiB are not supported"), which was not read.
    public func bytes() throws(ImageError) -> [UInt8] { try contents.get() }

    /// The same, the refusal of a file over the limit told as the loader's own error.
    public func bytes<Failure: Error>(or failure: (ImageError) -> Failure) throws(Failure) -> [UInt8] {
        switch contents {
        case .success(let bytes): return bytes
        case .failure(let error): throw failure(error)
        }
    }

    /// The bytes as an image to send, with its CRC32.
    public func firmware() throws(ImageError) -> FirmwareImage {
        FirmwareImage(bytes: try bytes(), source: path, baseAddress: baseAddress)
    }
}
