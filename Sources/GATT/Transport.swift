/// A live link to one peripheral, seen from the central.
///
/// Shaped after BlueZ's `Device1` + `GattCharacteristic1` (doc/org.bluez.GattCharacteristic.rst):
/// async reads and writes that complete when the peer answers, notifications after
/// `StartNotify`, the negotiated `MTU`, and a link that can drop at any moment.
///
/// Everything the peer or the link does arrives on one ordered event queue, read with
/// `nextEvent(timeout:)`: notifications, completions of writes submitted with `submitWrite`, and
/// disconnects. One queue rather than separate streams keeps their order (a notification sent just
/// before a disconnect is seen before it) and lets a consumer wait for "anything" with one deadline.
///
/// Conformers implement the `transport*` requirements. Callers use the `read`/`write`/`submitWrite`
/// extension methods, which first check the characteristic's properties so that every transport
/// reports a missing property the same way (the counterpart of CoreBluetooth's "Writing is not
/// permitted").
public protocol GATTConnection: AnyObject, Sendable {
    /// The peer, as the user named it.
    var peer: String { get }

    /// The time this link runs on (virtual on the simulator).
    var clock: any MonotonicClock { get }

    /// Discovers the primary services and their characteristics.
    func discoverServices() async throws(GATTError) -> [GATTService]

    /// The negotiated ATT MTU (BlueZ `GattCharacteristic1.MTU`). The largest value one write can
    /// carry is `mtu - 3`.
    func mtu() async throws(GATTError) -> Int

    func transportRead(_ characteristic: GATTCharacteristic) async throws(GATTError) -> [UInt8]

    /// Writes a value and waits until the write is done: for `.withResponse`, until the peer's
    /// ATT Write Response; for `.withoutResponse`, until the transport has taken the packet
    /// (this is where flow control pushes back).
    func transportWrite(_ value: [UInt8], to characteristic: GATTCharacteristic, type: WriteType)
        async throws(GATTError)

    /// Writes without response if the transport can take the packet now, without waiting; false
    /// when flow control says wait (then call `transportWrite`). The fast path for streaming.
    func transportTryWriteWithoutResponse(_ value: [UInt8], to characteristic: GATTCharacteristic) throws(GATTError) -> Bool

    /// Starts a write with response and returns at once; its completion arrives as
    /// `GATTEvent.writeCompleted`. Lets a central keep streaming write commands while a request is
    /// in flight, as ATT allows.
    func transportSubmitWrite(_ value: [UInt8], to characteristic: GATTCharacteristic) throws(GATTError) -> WriteTicket

    func transportSetNotifications(_ enabled: Bool, for characteristic: GATTCharacteristic) async throws(GATTError)

    /// The next event, waiting at most `timeout`; nil when the timeout passed first.
    func nextEvent(timeout: Duration) async -> GATTEvent?

    /// The next event if one is already queued; never waits.
    func pollEvent() -> GATTEvent?

    /// Disconnects on purpose; a later `disconnected(.local)` event confirms it. Idempotent.
    func disconnect() async

    /// True when writes reach the peer in the order they were submitted, write requests and write
    /// commands alike, so a command may follow a request without waiting for its response. False
    /// by default: BlueZ does not promise it (its ATT layer sends queued write commands ahead of a
    /// queued request, and AcquireWrite's socket races the D-Bus calls).
    var keepsWriteOrder: Bool { get }

    /// The pairing the central's stack started with the peer on its own during this link, if
    /// any: kept here as well as queued as `GATTEvent.stackPairing`, since a reader that waits for
    /// one particular answer may take the event off the queue and drop it.
    var stackPairing: StackPairing? { get }
}

extension GATTConnection {
    public var keepsWriteOrder: Bool { false }
    public var stackPairing: StackPairing? { nil }

    /// Finds a primary service by UUID, or throws `serviceNotFound` naming it.
    public func discoverService(_ uuid: BluetoothUUID, name: String) async throws(GATTError) -> GATTService {
        let services = try await discoverServices()
        guard let service = services.first(where: { $0.uuid == uuid }) else {
            throw GATTError(.serviceNotFound, "\(peer) does not expose the \(name) service \(uuid)")
        }
        return service
    }

    public func read(_ characteristic: GATTCharacteristic) async throws(GATTError) -> [UInt8] {
        try characteristic.require(.read, for: "reading")
        return try await transportRead(characteristic)
    }

    public func write(_ value: [UInt8], to characteristic: GATTCharacteristic, type: WriteType) async throws(GATTError) {
        try characteristic.require(type.requiredProperty, for: type == .withResponse ? "writing" : "writing without response")
        try await transportWrite(value, to: characteristic, type: type)
    }

    /// Writes with the type the characteristic prefers: without response when it allows it.
    public func write(_ value: [UInt8], to characteristic: GATTCharacteristic) async throws(GATTError) {
        guard let type = characteristic.preferredWriteType else {
            throw GATTError(.notPermitted, "writing is not permitted on characteristic \(characteristic.uuid): it has neither 'write' nor 'write-without-response' (it has '\(characteristic.properties)')")
        }
        try await transportWrite(value, to: characteristic, type: type)
    }

    public func tryWriteWithoutResponse(_ value: [UInt8], to characteristic: GATTCharacteristic) throws(GATTError) -> Bool {
        try characteristic.require(.writeWithoutResponse, for: "writing without response")
        return try transportTryWriteWithoutResponse(value, to: characteristic)
    }

    public func submitWrite(_ value: [UInt8], to characteristic: GATTCharacteristic) throws(GATTError) -> WriteTicket {
        try characteristic.require(.write, for: "writing")
        return try transportSubmitWrite(value, to: characteristic)
    }

    public func setNotifications(_ enabled: Bool, for characteristic: GATTCharacteristic) async throws(GATTError) {
        guard characteristic.properties.contains(.notify) || characteristic.properties.contains(.indicate) else {
            throw GATTError(.notPermitted, "notifications are not permitted on characteristic \(characteristic.uuid): it lacks the 'notify' property (it has '\(characteristic.properties)')")
        }
        try await transportSetNotifications(enabled, for: characteristic)
    }
}

/// Finds and connects to peripherals: a BlueZ adapter, or the simulator.
public protocol GATTCentral: Sendable {
    /// The time this central's links run on.
    var clock: any MonotonicClock { get }

    /// Scans for `timeout` and returns what matched, strongest signal first.
    func scan(filter: ScanFilter, timeout: Duration) async throws(GATTError) -> [Advertisement]

    /// Connects to a device and waits until its services are resolved, at most `timeout`.
    func connect(to address: DeviceAddress, timeout: Duration) async throws(GATTError) -> any GATTConnection
}
