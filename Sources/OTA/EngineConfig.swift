import OTAWire

/// Tunables of a transfer.
public struct EngineConfig: Sendable, Hashable {
    /// Bytes between two checkpoints. One checkpoint may be in flight while the next interval
    /// streams, so at most two intervals are ever unacknowledged (the "checkpoint window").
    /// The default is chosen by measurement: docs/PROTOCOL.md, "Choosing the checkpoint interval".
    public var checkpointInterval: Int
    /// Send ACTIVATE after a successful VERIFY.
    public var activate: Bool
    /// Ignore a partial transfer the device holds and start from zero.
    public var restart: Bool
    /// How often a command is sent again after an ATT error or a lost reply.
    public var commandRetries: Int
    /// How often in a row the engine may fall back (rewind, roll back, restart) without the device
    /// confirming new data before it gives up.
    public var maxRecoveries: Int
    public var replyTimeout: Duration
    public var verifyTimeout: Duration
    public var activateTimeout: Duration
    /// The version the image carries, sent in BEGIN; the device reports it after activation.
    public var imageVersion: FirmwareVersion?
    /// Leave a device alone when it already runs this version.
    public var skipIfVersion: FirmwareVersion?

    public static let defaultCheckpointInterval = 16 * 1024

    public init(checkpointInterval: Int = EngineConfig.defaultCheckpointInterval, activate: Bool = true,
                restart: Bool = false, commandRetries: Int = 3, maxRecoveries: Int = 64,
                replyTimeout: Duration = .seconds(5), verifyTimeout: Duration = .seconds(30),
                activateTimeout: Duration = .seconds(10), imageVersion: FirmwareVersion? = nil,
                skipIfVersion: FirmwareVersion? = nil) {
        self.imageVersion = imageVersion
        self.skipIfVersion = skipIfVersion
        self.checkpointInterval = checkpointInterval
        self.activate = activate
        self.restart = restart
        self.commandRetries = commandRetries
        self.maxRecoveries = maxRecoveries
        self.replyTimeout = replyTimeout
        self.verifyTimeout = verifyTimeout
        self.activateTimeout = activateTimeout
    }

    /// The most data the engine lets out beyond the last acknowledged checkpoint.
    public var window: Int { 2 * checkpointInterval }
}
