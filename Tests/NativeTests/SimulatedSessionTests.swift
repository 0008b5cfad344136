import Foundation
import GATT
import Native
import OTA
import OTADevice
import OTAWire
import Simulator
import Synchronization
import Testing

// Whole updates through `OTASession` against `SimulatedDevice`s on a `VirtualClock`: the
// simulator's own tests cannot drive a session, so the end-to-end checks live here.

/// Runs one session; the error is returned rather than thrown so tests can inspect it. By default
/// the session does not reconnect, so that one session is one connection.
func flash(_ image: FirmwareImage, to device: SimulatedDevice, through central: SimulatedCentral? = nil,
           config: EngineConfig = EngineConfig(), settings: OTAEngine.Settings = OTAEngine.Settings(),
           reconnect: ReconnectPolicy = .never) async -> Result<OTAResult, OTAError> {
    let central = central ?? SimulatedCentral(devices: [device], clock: VirtualClock())
    let session = OTASession(central: central, address: device.config.address, image: image, config: config,
                             profile: NativeProfile(settings: settings), reconnect: reconnect)
    do {
        return .success(try await session.run())
    } catch {
        return .failure(error)
    }
}

func simulatedDevice(slot: Int = 1 << 20, link: LinkModel = .default, faults: FaultPlan = .none,
                     hasOTAService: Bool = true, dataProperties: CharacteristicProperties = [.writeWithoutResponse]) -> SimulatedDevice {
    SimulatedDevice(SimulatedDeviceConfig(slotSize: slot, link: link, faults: faults), native: NativeDeviceOptions(hasOTAService: hasOTAService, dataProperties: dataProperties))
}

@Suite("Simulated sessions")
struct SimulatedSessionTests {
    static let image = testImage(96 * 1024, seed: 31)
    static let config = EngineConfig()
    static let settings = OTAEngine.Settings(checkpointInterval: 4096)

    @Test(arguments: Samples.entries)
    func everySampleIsActivatedByteForByte(entry: Samples.Entry) async throws {
        let image = try FirmwareImage.load(path: Samples.path(entry.file))
        let device = simulatedDevice()
        let result = try await flash(image, to: device).get()
        #expect(hex32(result.crc32) == entry.crc32)
        #expect(result.bytes == entry.size)
        #expect(result.activated)
        #expect(device.activatedImage == image.bytes)
        #expect(device.target?.lastActivation?.crc == image.crc32)
        #expect(device.target?.activationCount == 1)
        #expect(result.stats.bytesSent == image.size)
        #expect(result.seconds > 0)
    }

    @Test(arguments: [23, 24, 27, 185, 247, 251, 517])
    func sessionUsesTheNegotiatedMTU(mtu: Int) async throws {
        let image = testImage(20_000, seed: UInt64(mtu))
        let device = simulatedDevice(link: LinkModel(mtu: mtu))
        let result = try await flash(image, to: device, config: Self.config, settings: Self.settings).get()
        #expect(result.mtu == mtu)
        #expect(result.chunkSize == OTAProtocol.chunkSize(mtu: mtu))
        #expect(result.stats.packets == (image.size + OTAProtocol.chunkSize(mtu: mtu) - 1) / OTAProtocol.chunkSize(mtu: mtu))
        #expect(device.activatedImage == image.bytes)
    }

    /// Throughput can never beat the link model's capacity, and a clean run gets a good part of it.
    @Test func cleanRunStaysBelowTheLinkCapacity() async throws {
        let result = try await flash(Self.image, to: simulatedDevice()).get()
        let capacity = LinkModel.default.capacityBytesPerSecond
        #expect(result.throughput < capacity)
        #expect(result.throughput > capacity / 2)
    }

    // MARK: Faults

    struct Fault: Sendable, CustomTestStringConvertible {
        let name: String
        let plan: FaultPlan
        /// Proof that the fault fired.
        let fired: @Sendable (TransferStats) -> Bool
        var testDescription: String { name }
    }

    static let faults: [Fault] = [
        Fault(name: "drop rate", plan: FaultPlan(seed: 3, dropRate: 0.03)) { $0.bytesResent > 0 && $0.rewinds > 0 },
        Fault(name: "corrupt at", plan: FaultPlan(corruptAt: [1000, 50_000])) { $0.rollbacks >= 2 },
        Fault(name: "corrupt rate", plan: FaultPlan(seed: 5, corruptRate: 0.01)) { $0.rollbacks > 0 },
        Fault(name: "GATT error rate", plan: FaultPlan(seed: 7, gattErrorRate: 0.2)) { $0.commandRetries > 0 },
        Fault(name: "drops and corruption", plan: FaultPlan(seed: 9, dropRate: 0.02, corruptRate: 0.005)) { $0.bytesResent > 0 },
    ]

    @Test(arguments: faults)
    func faultStillEndsWithAByteIdenticalActivatedImage(fault: Fault) async throws {
        let device = simulatedDevice(faults: fault.plan)
        let result = try await flash(Self.image, to: device, config: Self.config, settings: Self.settings).get()
        #expect(fault.fired(result.stats), "the fault did not fire: \(result.stats)")
        #expect(device.activatedImage == Self.image.bytes)
        #expect(device.target?.activationCount == 1)
    }

    /// A session with `device` alone on a virtual clock, each of whose connections goes through `wrap`.
    static func session(on device: SimulatedDevice, reconnect: ReconnectPolicy,
                        wrap: @escaping @Sendable (any GATTConnection) -> any GATTConnection) -> OTASession {
        let central = SimulatedCentral(devices: [device], clock: VirtualClock())
        return OTASession(device: device.config.address.description, image: image, config: config,
                          profile: NativeProfile(settings: settings), reconnect: reconnect, clock: central.clock) { () async throws(GATTError) in
            wrap(try await central.connect(to: device.config.address, timeout: .seconds(5)))
        }
    }

    /// A lost notification costs a reply timeout, then STATUS or a resend. When the lost one is
    /// ACTIVATE's reply, the device has booted the image but the central cannot confirm it; a
    /// reconnect reads the image the device runs and confirms it without sending anything again.
    @Test(arguments: [UInt64(1), 2, 3])
    func lostNotificationsStillEndWithAByteIdenticalActivatedImage(seed: UInt64) async throws {
        let device = simulatedDevice(faults: FaultPlan(seed: seed, lostNotificationRate: 0.1))
        let result = try await flash(Self.image, to: device, config: Self.config, settings: Self.settings, reconnect: ReconnectPolicy()).get()
        #expect(result.stats.commandRetries > 0, "no notification was lost: \(result.stats)")
        #expect(result.activated)
        #expect(device.activatedImage == Self.image.bytes)
        #expect(device.target?.activationCount == 1)
    }

    /// Without reconnecting, a lost ACTIVATE reply ends the run with a resumable connection error
    /// that says the image was verified; the device runs it all the same.
    @Test func lostActivateReplyWithoutReconnectingIsAResumableConnectionError() async throws {
        let device = simulatedDevice()
        let session = Self.session(on: device, reconnect: .never) { LosingActivateReply($0) }
        let error = try await #require(throws: OTAError.self) { try await session.run() }
        #expect(error.code == .connection)
        #expect(error.resumable)
        #expect(error.message.contains("while activating: the image was verified, but activation was not confirmed"), "\(error)")
        #expect(device.activatedImage == Self.image.bytes)
        #expect(device.target?.activationCount == 1)
    }

    @Test func slowFlashTakesLongerAndStillActivatesTheImage() async throws {
        let baseline = try await flash(Self.image, to: simulatedDevice(), config: Self.config, settings: Self.settings).get()
        let device = simulatedDevice(faults: FaultPlan(slowFlashPerKiB: .milliseconds(5)))
        let slow = try await flash(Self.image, to: device, config: Self.config, settings: Self.settings).get()
        #expect(slow.seconds > baseline.seconds)
        #expect(device.activatedImage == Self.image.bytes)
    }

    @Test func flashBitFlipIsCaughtAtVerifyAndNothingIsActivated() async throws {
        let device = simulatedDevice(faults: FaultPlan(flashBitFlipAt: 12_345))
        guard case .failure(let error) = await flash(Self.image, to: device, config: Self.config, settings: Self.settings) else {
            Issue.record("a rotten flash byte was activated")
            return
        }
        #expect(error.code == .verifyFailed)
        #expect(device.activatedImage == nil)
        #expect(device.target?.activationCount == 0)
        #expect(device.firmwareVersion == FirmwareVersion(major: 1, minor: 0, patch: 0))
    }

    // MARK: Determinism

    static let noisy = FaultPlan(seed: 42, dropRate: 0.03, corruptRate: 0.005, gattErrorRate: 0.05)

    @Test func sameSeedGivesTheSameRunTwice() async throws {
        let a = try await flash(Self.image, to: simulatedDevice(faults: Self.noisy), config: Self.config, settings: Self.settings).get()
        let b = try await flash(Self.image, to: simulatedDevice(faults: Self.noisy), config: Self.config, settings: Self.settings).get()
        #expect(a.stats == b.stats)
        #expect(a.seconds == b.seconds)
        #expect(a.stats.bytesResent > 0)
    }

    @Test func differentSeedsDifferUnderDrops() async throws {
        var other = Self.noisy
        other.seed = 43
        let a = try await flash(Self.image, to: simulatedDevice(faults: Self.noisy), config: Self.config, settings: Self.settings).get()
        let b = try await flash(Self.image, to: simulatedDevice(faults: other), config: Self.config, settings: Self.settings).get()
        #expect(a.stats != b.stats)
    }

    // MARK: Resume after a lost link or a reboot

    static let interruptions: [(name: String, plan: FaultPlan)] = [
        ("disconnect at 40000", FaultPlan(disconnectAt: [40_000])),
        ("reboot at 40000", FaultPlan(rebootAt: [40_000])),
        ("disconnect at the last byte", FaultPlan(disconnectAt: [96 * 1024 - 1])),
        ("reboot just after a checkpoint", FaultPlan(rebootAt: [4096 * 5 + 10])),
    ]

    /// The first session ends with a resumable connection error; a second one on the same device
    /// continues where the device stands, sends less than the image, and activates it intact.
    @Test(arguments: interruptions)
    func interruptedTransferResumesOnTheSameDevice(name: String, plan: FaultPlan) async throws {
        let device = simulatedDevice(faults: plan)
        let central = SimulatedCentral(devices: [device], clock: VirtualClock())
        guard case .failure(let error) = await flash(Self.image, to: device, through: central, config: Self.config, settings: Self.settings) else {
            Issue.record("\(name): the first session did not fail")
            return
        }
        #expect(error.code == .connection)
        #expect(error.resumable)
        #expect(device.activatedImage == nil)
        let held = try #require(device.target?.received)
        #expect(held > 0)

        let result = try await flash(Self.image, to: device, through: central, config: Self.config, settings: Self.settings).get()
        #expect(result.stats.resumedFrom.first == held)
        #expect(result.stats.bytesSent < Self.image.size)
        #expect(result.stats.bytesSent == Self.image.size - held)
        #expect(device.activatedImage == Self.image.bytes)
        #expect(device.connectionCount == 2)
    }

    // MARK: Reconnecting on its own

    /// With the default policy the session reconnects after a link loss and resumes on the new
    /// connection, sending again at most what the device had not confirmed.
    @Test(arguments: interruptions)
    func sessionReconnectsByItselfAndResumes(name: String, plan: FaultPlan) async throws {
        let device = simulatedDevice(faults: plan)
        let result = try await flash(Self.image, to: device, config: Self.config, settings: Self.settings, reconnect: ReconnectPolicy()).get()
        #expect(device.connectionCount == 2)
        #expect(result.stats.resumedFrom.count == 2)
        #expect(result.stats.resumedFrom.last ?? 0 > 0)
        #expect(result.stats.bytesSent - Self.image.size <= Self.settings.window)
        #expect(device.activatedImage == Self.image.bytes)
        #expect(device.target?.activationCount == 1)
    }

    /// The device booted the image but its reply to ACTIVATE never arrived. Reconnecting must not
    /// send the whole image again and activate it a second time: the second connection reads the
    /// running image's CRC from the info value and ends there.
    @Test func lostActivateReplyDoesNotFlashTheImageAgain() async throws {
        let device = simulatedDevice()
        let session = Self.session(on: device, reconnect: ReconnectPolicy()) { LosingActivateReply($0) }
        let result = try await session.run()
        #expect(result.activated)
        #expect(device.connectionCount == 2)
        #expect(device.activatedImage == Self.image.bytes)
        #expect(device.target?.activationCount == 1, "the image was activated \(device.target?.activationCount) times")
        #expect(result.stats.bytesSent == Self.image.size, "sent \(result.stats.bytesSent) bytes for a \(Self.image.size)-byte image")
        #expect(result.stats.bytesResent == 0)
        // The second connection sent no BEGIN: the engine started only once.
        #expect(result.stats.resumedFrom == [0])
    }

    // MARK: Skipping a device that already runs the version

    /// `skipIfVersion` matching the device's firmware: the session reads the info value, returns
    /// `skipped`, and writes nothing to the control point or the data characteristic.
    @Test func deviceAlreadyRunningTheVersionIsSkippedWithoutSendingAnything() async throws {
        let device = simulatedDevice()
        var config = Self.config
        config.skipIfVersion = device.firmwareVersion
        let result = try await flash(Self.image, to: device, config: config, settings: Self.settings).get()
        #expect(result.skipped)
        #expect(!result.activated)
        #expect(result.firmwareBefore == device.firmwareVersion)
        #expect(result.stats.bytesSent == 0)
        #expect(result.stats.packets == 0)
        #expect(result.stats.checkpoints == 0)
        #expect(result.stats.resumedFrom.isEmpty, "BEGIN was sent")
        #expect(device.target?.pending == nil)
        #expect(device.target?.received == 0)
        #expect((device.target?.activationCount == 0))
        #expect(device.connectionCount == 1)
    }

    @Test func deviceRunningAnotherVersionIsNotSkipped() async throws {
        let device = simulatedDevice()
        var config = Self.config
        config.skipIfVersion = FirmwareVersion(major: 9, minor: 9, patch: 9)
        let result = try await flash(Self.image, to: device, config: config, settings: Self.settings).get()
        #expect(!result.skipped)
        #expect(result.activated)
        #expect(device.activatedImage == Self.image.bytes)
    }

    // MARK: Another central owns the transfer

    /// ATT application error 0x89 on a control point write is the device saying "busy with another
    /// central's transfer" (docs/PROTOCOL.md): one clear, resumable protocol error, and no data sent.
    @Test func attBusyOnTheControlPointIsAResumableProtocolError() async throws {
        let device = simulatedDevice()
        let session = Self.session(on: device, reconnect: ReconnectPolicy()) { BusyControlPoint($0) }
        let error = try await #require(throws: OTAError.self) { try await session.run() }
        #expect(error.code == .protocolError)
        #expect(error.resumable)
        #expect(error.description == "the device is busy with another central's transfer; wait for it to finish, then run the same command again")
        // It is not a link problem: no reconnect, and nothing reached the device.
        #expect(device.connectionCount == 1)
        #expect(device.target?.pending == nil)
        #expect(device.target?.received == 0)
    }

    /// After a reboot the device keeps only what its last committed checkpoint covered.
    @Test func rebootKeepsOnlyTheCommittedPrefix() async throws {
        let device = simulatedDevice(faults: FaultPlan(rebootAt: [40_000]))
        let central = SimulatedCentral(devices: [device], clock: VirtualClock())
        let first = await flash(Self.image, to: device, through: central, config: Self.config, settings: Self.settings)
        #expect(first.failureKind == .connection, "\(first)")
        let target = try #require(device.target)
        #expect(target.received == target.committed)
        #expect(target.committed > 0 && target.committed <= 40_000)
        // At most one checkpoint window was unconfirmed when the device went down.
        #expect(target.committed > 40_000 - Self.settings.window)
    }

    @Test func restartSendsTheWholeImageEvenWhenTheDeviceHoldsPart() async throws {
        let device = simulatedDevice(faults: FaultPlan(disconnectAt: [40_000]))
        let central = SimulatedCentral(devices: [device], clock: VirtualClock())
        let first = await flash(Self.image, to: device, through: central, config: Self.config, settings: Self.settings)
        #expect(first.failureKind == .connection, "\(first)")
        #expect(try #require(device.target?.received) > 0)
        let restart = EngineConfig(restart: true)
        let result = try await flash(Self.image, to: device, through: central, config: restart, settings: Self.settings).get()
        #expect(result.stats.bytesSent == Self.image.size)
        #expect(device.activatedImage == Self.image.bytes)
    }

    // MARK: Devices that cannot be updated

    @Test func imageLargerThanTheSlotIsRefusedBeforeAnythingIsSent() async {
        let device = simulatedDevice(slot: Self.image.size - 1)
        guard case .failure(let error) = await flash(Self.image, to: device) else {
            Issue.record("an image larger than the slot was accepted")
            return
        }
        #expect(error.code == .imageTooLarge)
        #expect(device.target?.pending == nil)
    }

    @Test func deviceWithoutTheOTAServiceIsIncompatible() async {
        guard case .failure(let error) = await flash(Self.image, to: simulatedDevice(hasOTAService: false)) else {
            Issue.record("a device without the OTA service was flashed")
            return
        }
        #expect(error.code == .incompatibleDevice)
        #expect(error.message.contains(OTAProtocol.serviceUUID.description))
    }

    @Test func dataCharacteristicWithoutWriteWithoutResponseIsIncompatible() async {
        guard case .failure(let error) = await flash(Self.image, to: simulatedDevice(dataProperties: [.write])) else {
            Issue.record("a device without write-without-response was flashed")
            return
        }
        #expect(error.code == .incompatibleDevice)
        #expect(error.message.contains("write-without-response"))
    }

    @Test func unknownAddressIsDeviceNotFound() async {
        let device = simulatedDevice()
        let central = SimulatedCentral(devices: [device], clock: VirtualClock())
        let session = OTASession(central: central, address: DeviceAddress("AA:BB:CC:DD:EE:FF")!, image: Self.image, profile: NativeProfile())
        do {
            _ = try await session.run()
            Issue.record("flashed a device that does not exist")
        } catch {
            #expect(error.code == .deviceNotFound)
        }
    }
}

/// A connection that loses every notification answering ACTIVATE, as a device that reboots into its
/// new image before the reply goes out would.
final class LosingActivateReply: GATTConnection {
    let inner: any GATTConnection
    init(_ inner: any GATTConnection) { self.inner = inner }

    var peer: String { inner.peer }
    var clock: any MonotonicClock { inner.clock }

    private func keep(_ event: GATTEvent?) -> Bool {
        if case .notification(_, let value)? = event, value.starts(with: [ControlNotification.responseCode, OTAOpcode.activate.rawValue]) {
            return false
        }
        return true
    }

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
    func nextEvent(timeout: Duration) async -> GATTEvent? {
        let deadline = inner.clock.now + timeout
        while true {
            let event = await inner.nextEvent(timeout: max(.zero, deadline - inner.clock.now))
            if event == nil || keep(event) { return event }
        }
    }
    func pollEvent() -> GATTEvent? {
        while let event = inner.pollEvent() {
            if keep(event) { return event }
        }
        return nil
    }
    func disconnect() async { await inner.disconnect() }
}

/// A connection whose control point writes fail with ATT error 0x89, as a device busy with another
/// central's transfer answers them through BlueZ's GATT server (docs/PROTOCOL.md): each submitted
/// control point write completes with that error and never reaches the device.
final class BusyControlPoint: GATTConnection {
    let inner: any GATTConnection
    private let refusals = Mutex<(next: UInt64, queued: [GATTEvent])>((UInt64.max, []))
    init(_ inner: any GATTConnection) { self.inner = inner }

    var peer: String { inner.peer }
    var clock: any MonotonicClock { inner.clock }

    private func takeRefusal() -> GATTEvent? {
        refusals.withLock { $0.queued.isEmpty ? nil : $0.queued.removeFirst() }
    }

    func discoverServices() async throws(GATTError) -> [GATTService] { try await inner.discoverServices() }
    func mtu() async throws(GATTError) -> Int { try await inner.mtu() }
    func transportRead(_ c: GATTCharacteristic) async throws(GATTError) -> [UInt8] { try await inner.transportRead(c) }
    func transportWrite(_ value: [UInt8], to c: GATTCharacteristic, type: WriteType) async throws(GATTError) {
        if c.uuid == OTAProtocol.controlPointUUID { throw GATTError.att(ATTError(rawValue: 0x89), "writing the control point") }
        try await inner.transportWrite(value, to: c, type: type)
    }
    func transportTryWriteWithoutResponse(_ value: [UInt8], to c: GATTCharacteristic) throws(GATTError) -> Bool {
        try inner.transportTryWriteWithoutResponse(value, to: c)
    }
    func transportSubmitWrite(_ value: [UInt8], to c: GATTCharacteristic) throws(GATTError) -> WriteTicket {
        guard c.uuid == OTAProtocol.controlPointUUID else { return try inner.transportSubmitWrite(value, to: c) }
        return refusals.withLock {
            let ticket = WriteTicket($0.next)
            $0.next -= 1
            $0.queued.append(.writeCompleted(ticket, GATTError.att(ATTError(rawValue: 0x89), "writing the control point")))
            return ticket
        }
    }
    func transportSetNotifications(_ enabled: Bool, for c: GATTCharacteristic) async throws(GATTError) {
        try await inner.transportSetNotifications(enabled, for: c)
    }
    func nextEvent(timeout: Duration) async -> GATTEvent? {
        if let refusal = takeRefusal() { return refusal }
        return await inner.nextEvent(timeout: timeout)
    }
    func pollEvent() -> GATTEvent? { takeRefusal() ?? inner.pollEvent() }
    func disconnect() async { await inner.disconnect() }
}

extension Result where Success == OTAResult, Failure == OTAError {
    /// The failure's kind; nil for a success.
    var failureKind: OTAError.Code? {
        if case .failure(let error) = self { return error.code }
        return nil
    }
}
