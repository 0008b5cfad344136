/// What is uploaded, and what happens once the device holds it.
public struct SMPUploadSettings: Sendable, Hashable {
    /// The image number on a multi-image device (0: the application).
    public var imageNumber: UInt32
    /// SHA-256 of the whole file as uploaded: the upload's `sha`, which identifies it on the
    /// server and lets a new run resume it.
    public var fileSHA256: [UInt8]
    /// The MCUboot image hash (its SHA-256/384/512 TLV): what the device reports for the slot once
    /// it holds the image, and what marks it for test or confirms it. Nil for an image that is
    /// not an MCUboot image: then only the server's own `match` check can verify it.
    public var imageHash: [UInt8]?
    /// After the upload: confirm the image at once (it becomes permanent at the next reset)
    /// instead of marking it for test (MCUboot reverts a test image not confirmed by itself).
    public var confirm: Bool
    /// Reset the device after marking the image (MCUboot then swaps it in).
    public var reset: Bool
    /// The most requests kept in flight, whatever the device's buffer count allows.
    public var maxWindow: Int
    /// The request frame (header and CBOR) at most, exactly as given when the buffer takes it
    /// (no probe, no rounding to whole writes); nil: the engine picks it. `ATTWriteLimit.value(mtu:)`
    /// sends each request in one write, as a client that cannot rely on the server's reassembly does.
    public var maxFrame: Int?
    /// Pick the frame size on the link (`SMPFrameProbe`) when `maxFrame` is nil; false: frames of
    /// the most whole writes the buffer holds.
    public var probeFrames: Bool
    /// Confirm only once the image has run (`--confirm after-check`): mark it for test, reset,
    /// and on the next connection check that it is active and answers an SMP echo; then confirm
    /// it (or, with `holdsConfirm`, finish unconfirmed for the caller's own check). A failed check
    /// leaves it unconfirmed, for MCUboot to revert at the next reset (`checkFailed`).
    public var confirmAfterCheck: Bool
    /// With `confirmAfterCheck`: finish after the echo without confirming; the caller runs its own
    /// check (`--check-command`) and confirms.
    public var holdsConfirm: Bool
    /// The upload's `upgrade` flag: the device refuses an image not newer than the one it runs
    /// (IMG_MGMT_ERR_CURRENT_VERSION_IS_NEWER) before it erases anything.
    public var upgrade: Bool
    /// Upload and verify only: another image of the same update marks it and resets the device
    /// (`SMPMultiImageEngine`, every image but the last).
    public var uploadOnly = false
    /// The other images of the same update, already uploaded: marked, in this order, before this
    /// image, and checked to run after the reset (`SMPMultiImageEngine`, the last image).
    public var companions: [SMPCompanion] = []

    public init(imageNumber: UInt32 = 0, fileSHA256: [UInt8], imageHash: [UInt8]?, confirm: Bool = false, reset: Bool = true,
                maxWindow: Int = SMPEngine.defaultMaxWindow, maxFrame: Int? = nil, probeFrames: Bool = true,
                confirmAfterCheck: Bool = false, holdsConfirm: Bool = false, upgrade: Bool = false) {
        self.probeFrames = probeFrames
        self.upgrade = upgrade
        self.confirmAfterCheck = confirmAfterCheck
        self.holdsConfirm = holdsConfirm
        self.imageNumber = imageNumber
        self.fileSHA256 = fileSHA256
        self.imageHash = imageHash
        self.confirm = confirm
        self.reset = reset
        self.maxWindow = maxWindow
        self.maxFrame = maxFrame
    }
}
