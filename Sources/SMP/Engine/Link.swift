/// What the SMP profile read from a device when it attached, for the engine's `.connected`.
public struct SMPLink: Sendable, Hashable {
    /// The server's SMP buffer (`buf_size`, `buf_count`); nil when it did not answer the read
    /// (an older server): one request in flight, each at most one ATT write.
    public var parameters: SMPParameters?
    /// The image states before the upload; nil when not read.
    public var states: SMPImageStates?
    /// MCUboot's mode and downgrade prevention (os_mgmt's bootloader info); nil when the server
    /// does not answer it (an older one): a swap mode is assumed.
    public var bootloader: SMPBootloaderInfo?

    public init(parameters: SMPParameters?, states: SMPImageStates?, bootloader: SMPBootloaderInfo? = nil) {
        self.parameters = parameters
        self.states = states
        self.bootloader = bootloader
    }
}
