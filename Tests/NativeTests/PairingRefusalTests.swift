import GATT
import Native
import OTA
import OTAWire
import Simulator
import Synchronization
import Testing

/// The session learns that a device wants pairing from whatever says so, for any protocol, and
/// ends with `permission` in seconds rather than after its retries and timeouts.
@Suite("Refusals for want of pairing")
struct PairingRefusalTests {
    static let image = testImage(8 * 1024, seed: 5)

    func run(_ wrap: @escaping @Sendable (any GATTConnection) -> any GATTConnection) async -> (Result<OTAResult, OTAError>, Duration) {
        let device = simulatedDevice()
        let clock = VirtualClock()
        let central = SimulatedCentral(devices: [device], clock: clock)
        let session = OTASession(device: device.config.address.description, image: Self.image, profile: NativeProfile(), reconnect: .never, clock: clock) {
            () async throws(GATTError) in
            wrap(try await central.connect(to: device.config.address, timeout: .seconds(5)))
        }
        do {
            return (.success(try await session.run()), clock.now)
        } catch {
            return (.failure(error), clock.now)
        }
    }

    /// Writes vanish unanswered (as on an unencrypted link to an embedded stack) and the info
    /// characteristic, read openly at first, is refused with 0x05 once writes were dropped: the
    /// probe on the first reply timeout finds that, long before the engine's retries run out.
    @Test func silenceAfterWritesIsProbedWithAReadOnTheFirstReplyTimeout() async {
        let (result, elapsed) = await run { SilentWrites($0) }
        guard case .failure(let error) = result else {
            Issue.record("flashed a device that dropped every write")
            return
        }
        #expect(error.code == .permission, "\(error)")
        #expect(error.wantsPairing)
        #expect(error.description.contains("pass --pair"))
        #expect(elapsed < EngineConfig().replyTimeout * 2, "\(elapsed)")
    }

    @Test func aWriteRequestRefusedWithInsufficientEncryptionEndsTheRun() async {
        let (result, _) = await run { RefusedRequests($0) }
        guard case .failure(let error) = result else {
            Issue.record("flashed a device that refused every write request")
            return
        }
        #expect(error.code == .permission, "\(error)")
        #expect(error.wantsPairing)
    }

    @Test func theStacksOwnPairingMidRunEndsItAndSaysWhatWasAsked() async {
        let (result, _) = await run { StackPairsOnFirstWrite($0) }
        guard case .failure(let error) = result else {
            Issue.record("flashed on although the stack paired by itself")
            return
        }
        #expect(error.code == .permission, "\(error)")
        #expect(error.stackPairing == StackPairing(bonded: true, asked: .passkey))
        #expect(error.description.contains("--pair --passkey"), "\(error)")
    }
}

/// Forwards everything to `inner`; subclasses change one thing.
class Forwarding: GATTConnection, @unchecked Sendable {
    let inner: any GATTConnection
    init(_ inner: any GATTConnection) { self.inner = inner }
    var peer: String { inner.peer }
    var clock: any MonotonicClock { inner.clock }
    var stackPairing: StackPairing? { inner.stackPairing }
    func discoverServices() async throws(GATTError) -> [GATTService] { try await inner.discoverServices() }
    func mtu() async throws(GATTError) -> Int { try await inner.mtu() }
    func transportRead(_ c: GATTCharacteristic) async throws(GATTError) -> [UInt8] { try await inner.transportRead(c) }
    func transportWrite(_ value: [UInt8], to c: GATTCharacteristic, type: WriteType) async throws(GATTError) {
        try await inner.transportWrite(value, to: c, type: type)
    }
    func transportTryWriteWithoutResponse(_ value: [UInt8], to c: GATTCharacteristic) throws(GATTError) -> Bool {
        try inner.transportTryWriteWithoutResponse(value, to: c)
    }
    func transportSubmitWrite(_ value: [UInt8], to c: GATTCharacteristic) throws(GATTError) -> WriteTicket {
        try inner.transportSubmitWrite(value, to: c)
    }
    func transportSetNotifications(_ enabled: Bool, for c: GATTCharacteristic) async throws(GATTError) {
        try await inner.transportSetNotifications(enabled, for: c)
    }
    func nextEvent(timeout: Duration) async -> GATTEvent? { await inner.nextEvent(timeout: timeout) }
    func pollEvent() -> GATTEvent? { inner.pollEvent() }
    func disconnect() async { await inner.disconnect() }
}

/// Every write vanishes without an answer; reads are refused with 0x05 once one did.
final class SilentWrites: Forwarding, @unchecked Sendable {
    private let dropped = Mutex(false)
    override func transportRead(_ c: GATTCharacteristic) async throws(GATTError) -> [UInt8] {
        if dropped.withLock({ $0 }) { throw GATTError(.attError, "reading \(c.uuid): ATT error 0x05", attError: .insufficientAuthentication) }
        return try await inner.transportRead(c)
    }
    override func transportWrite(_ value: [UInt8], to c: GATTCharacteristic, type: WriteType) async throws(GATTError) {
        dropped.withLock { $0 = true }
    }
    override func transportTryWriteWithoutResponse(_ value: [UInt8], to c: GATTCharacteristic) throws(GATTError) -> Bool {
        dropped.withLock { $0 = true }
        return true
    }
    override func transportSubmitWrite(_ value: [UInt8], to c: GATTCharacteristic) throws(GATTError) -> WriteTicket {
        dropped.withLock { $0 = true }
        return WriteTicket(.max)
    }
}

/// Every write request completes with ATT insufficient encryption (0x0F).
final class RefusedRequests: Forwarding, @unchecked Sendable {
    private let queued = Mutex<[GATTEvent]>([])
    override func transportSubmitWrite(_ value: [UInt8], to c: GATTCharacteristic) throws(GATTError) -> WriteTicket {
        let ticket = WriteTicket(.max)
        queued.withLock { $0.append(.writeCompleted(ticket, .att(.insufficientEncryption, "writing \(c.uuid)"))) }
        return ticket
    }
    override func nextEvent(timeout: Duration) async -> GATTEvent? {
        if let event = queued.withLock({ $0.isEmpty ? nil : $0.removeFirst() }) { return event }
        return await inner.nextEvent(timeout: timeout)
    }
}

/// The first write request sets off the stack's own pairing: it bonds Just Works, then asks for
/// a passkey nobody gives (two reports, as BlueZ makes them).
final class StackPairsOnFirstWrite: Forwarding, @unchecked Sendable {
    private let state = Mutex<(stack: StackPairing?, queued: [GATTEvent])>((nil, []))
    override var stackPairing: StackPairing? { state.withLock { $0.stack } }
    override func transportSubmitWrite(_ value: [UInt8], to c: GATTCharacteristic) throws(GATTError) -> WriteTicket {
        state.withLock { s in
            guard s.stack == nil else { return }
            s.stack = StackPairing(bonded: true, asked: .passkey)
            s.queued = [.stackPairing(StackPairing(bonded: true)), .stackPairing(StackPairing(bonded: true, asked: .passkey))]
        }
        return WriteTicket(.max)
    }
    override func nextEvent(timeout: Duration) async -> GATTEvent? {
        if let event = state.withLock({ $0.queued.isEmpty ? nil : $0.queued.removeFirst() }) { return event }
        return await inner.nextEvent(timeout: timeout)
    }
    override func pollEvent() -> GATTEvent? {
        state.withLock { $0.queued.isEmpty ? nil : $0.queued.removeFirst() } ?? inner.pollEvent()
    }
}
