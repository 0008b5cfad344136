import GATT
import Logging
import OTAWire
import Synchronization

/// What one device is sent: one image, or a package's images in its order (one session each, the
/// device rebooting in between), and the protocol each goes over.
public struct UpdatePlan: Sendable {
    public struct Part: Sendable {
        public let firmware: FirmwareImage
        public let profile: any OTAProfile
        /// What the image is, for notes: "application".
        public let label: String

        public init(firmware: FirmwareImage, profile: any OTAProfile, label: String) {
            self.firmware = firmware
            self.profile = profile
            self.label = label
        }
    }

    /// Never empty.
    public let parts: [Part]
    /// What the image file is: the protocol is checked against the device's services with it.
    /// Nil: sent as it is over the protocol asked for, whatever the file is (SMP's
    /// `--smp-any-image`).
    public let format: ImageFormat.Kind?
    /// Why the protocol was chosen, from the file alone, for one note line.
    public var reason: String
    /// What a package holds, said after the reason: "; the package's image: application"; empty
    /// for a single image.
    public var contents: String

    public init(parts: [Part], format: ImageFormat.Kind?, reason: String, contents: String = "") {
        precondition(!parts.isEmpty, "an update plan sends at least one image")
        self.parts = parts
        self.format = format
        self.reason = reason
        self.contents = contents
    }

    /// One image over one protocol, checked as what it is (a raw binary or Intel HEX image).
    public init(firmware: FirmwareImage, profile: any OTAProfile, reason: String = "") {
        self.init(firmware: firmware, profile: profile, format: firmware.baseAddress == nil ? .rawBinary : .intelHex, reason: reason)
    }

    public init(firmware: FirmwareImage, profile: any OTAProfile, format: ImageFormat.Kind?, reason: String) {
        self.init(parts: [Part(firmware: firmware, profile: profile, label: "image")], format: format, reason: reason)
    }

    /// The first (for a single image, the only) image and its protocol.
    public var firmware: FirmwareImage { parts[0].firmware }
    public var profile: any OTAProfile { parts[0].profile }
    /// Bytes of every image together.
    public var size: Int { parts.reduce(0) { $0 + $1.firmware.size } }
    /// The CRC32 of every image's bytes in order.
    public var crc32: UInt32 {
        parts.count == 1 ? parts[0].firmware.crc32 : CRC32.checksum(parts.flatMap(\.firmware.bytes))
    }
}

/// Updates one device with a plan: a first connection checks the protocol against the services
/// the device exposes and lets the profile move the device into its update mode (Nordic
/// buttonless entry), then one session per image runs, each with its own reconnect supervisor.
/// A single device and every device of a batch go through here.
public struct DeviceUpdater: Sendable {
    public let plan: UpdatePlan
    /// The protocols `protocolName` is resolved among.
    public let registry: ProtocolRegistry
    /// `auto` or a registered name: checked against the device's services.
    public let protocolName: String
    public let config: EngineConfig
    public let timeouts: SessionTimeouts
    public let reconnect: ReconnectPolicy
    public let journal: JournalStore?
    public let logger: Logger
    /// True: sessions and their events carry the address the device was given, even after it
    /// moved to another (a batch keys its rows and logs by it); false: where the sessions go.
    public let namesSessionsByDevice: Bool
    /// Reconnect after activation and read what the device runs now (`Outcome.after`), when its
    /// protocol tells (`OTAProfile.reportsFirmwareVersion`).
    public let readsBack: Bool
    /// Whether the device is paired before its update, and again when it refuses for want of it.
    public let pairing: PairingPolicy
    /// Read the device's Device Information Service on the first connection (`Event.identity`):
    /// what a ledger records of it.
    public var readsIdentity = false

    public init(plan: UpdatePlan, registry: ProtocolRegistry? = nil, protocolName: String = ProtocolRegistry.auto,
                config: EngineConfig = EngineConfig(), timeouts: SessionTimeouts = SessionTimeouts(),
                reconnect: ReconnectPolicy = ReconnectPolicy(), journal: JournalStore? = nil,
                logger: Logger = Logger(label: "otaflash.session"), namesSessionsByDevice: Bool = false, readsBack: Bool = false,
                pairing: PairingPolicy = .none) {
        self.plan = plan
        self.registry = registry ?? ProtocolRegistry(plan.parts.map(\.profile))
        self.protocolName = protocolName
        self.config = config
        self.timeouts = timeouts
        self.reconnect = reconnect
        self.journal = journal
        self.logger = logger
        self.namesSessionsByDevice = namesSessionsByDevice
        self.readsBack = readsBack
        self.pairing = pairing
    }

    /// What happens to one device, beyond its sessions' events.
    public enum Event: Sendable {
        /// The first connection was made (or failed and was left to the sessions): `reason` says
        /// why the protocol was chosen, `entry` where the device answers after being moved into
        /// its update mode. Nil `reason`: the device refused before any session.
        case prepared(device: String, reason: String?, entry: UpdateModeEntry?)
        /// Image `index` of `count` of a package starts.
        case image(device: String, index: Int, count: Int, label: String)
        case session(SessionEvent)
        /// Pairing news for a note line: paired, paired again after a refusal, bond removed.
        case pairing(device: String, note: String)
        /// What the device said of itself on the first connection (`readsIdentity`).
        case identity(device: String, DeviceIdentity)
    }

    /// Where a device stands between two attempts: an attempt after the first goes on from here.
    public struct Progress: Sendable, Hashable {
        /// Where the device answers once it was moved into its update mode.
        public var entry: UpdateModeEntry?
        /// Images of the plan sent, verified and activated.
        public var imagesDone = 0

        public init(entry: UpdateModeEntry? = nil, imagesDone: Int = 0) {
            self.entry = entry
            self.imagesDone = imagesDone
        }
    }

    /// How one attempt ended.
    public struct Outcome: Sendable {
        public var result: Result<OTAResult, OTAError>
        /// Where the attempt left the device: what the next attempt starts from.
        public var progress: Progress
        /// What the device reported when it came back after activation (`readsBack`); nil when
        /// not read or it did not come back within the connect timeout.
        public var after: DeviceSummary?

        public init(result: Result<OTAResult, OTAError>, progress: Progress, after: DeviceSummary? = nil) {
            self.result = result
            self.progress = progress
            self.after = after
        }
    }

    /// The limits on moving the device into its update mode.
    var limits: UpdateModeLimits { UpdateModeLimits(reply: config.replyTimeout, disconnect: config.replyTimeout) }

    /// Runs one attempt at `address` through `central`, going on from `progress` (an earlier
    /// attempt's): a device already moved into its update mode is not asked again, and images
    /// already installed are not sent again.
    public func run(central: any GATTCentral, address: DeviceAddress, from progress: Progress = Progress(),
                    events: @escaping @Sendable (Event) -> Void) async -> Outcome {
        var outcome = await attempt(central: central, address: address, from: progress, events: events)
        // Without --pair no bond may stay: one the stack made by itself goes again at once.
        if !pairing.pair, case .failure(let error) = outcome.result, let stack = error.stackPairing, stack.bonded {
            outcome.result = .failure(await removeStackBond(central: central, address: outcome.progress.entry?.address ?? address,
                                                            device: address.description, error, events: events))
        }
        // A refusal for want of pairing or encryption, with --pair: pair once (again) and go on
        // from where the attempt left the device.
        guard pairing.pair, case .failure(let error) = outcome.result, error.wantsPairing, !Task.isCancelled else { return outcome }
        let target = outcome.progress.entry?.address ?? address
        do throws(OTAError) {
            // A bond the device no longer honours (or one too weak for it) is replaced, not kept:
            // BlueZ answers Pair on a bonded device with AlreadyExists.
            _ = await pairing.unpair(central, [target])
            let connection: any GATTConnection
            do {
                connection = try await central.connect(to: target, timeout: timeouts.connect)
            } catch {
                throw OTAError.from(error, device: target.description)
            }
            do throws(OTAError) {
                _ = try await pairing.pairIfNeeded(connection, device: target.description, force: true)
            } catch {
                await connection.disconnect()
                throw error
            }
            await connection.disconnect()
            events(.pairing(device: address.description,
                            note: "\(target) refused access for want of pairing; paired again (\(pairing.method)), going on"))
        } catch {
            return Outcome(result: .failure(error), progress: outcome.progress)
        }
        var again = await attempt(central: central, address: address, from: outcome.progress, events: events)
        if case .failure(let error) = again.result, error.wantsPairing {
            // Paired, and still refused: the bond is not the kind the device requires.
            again.result = .failure(OTAError(
                .pairingFailed, "\(target) still refuses access after pairing (\(pairing.method)): it requires an authenticated bond",
                hint: "pass --passkey with the passkey it shows or expects, or --confirm-pairing for a numeric comparison", cause: error.cause))
        }
        return again
    }

    /// Removes the bond the central's stack made by itself when the device refused for want of
    /// pairing (without --pair, which is no consent to one), and says so; `error` says it too.
    private func removeStackBond(central: any GATTCentral, address: DeviceAddress, device: String, _ error: OTAError,
                                 events: @Sendable (Event) -> Void) async -> OTAError {
        let failures = await pairing.unpair(central, [address])
        guard !failures.isEmpty else {
            events(.pairing(device: device, note: "\(address): the Bluetooth stack bonded with it by itself (no --pair); bond removed"))
            return error
        }
        events(.pairing(device: device, note: "\(address): the Bluetooth stack bonded with it by itself (no --pair) and the bond could not be removed: "
                        + failures.joined(separator: "; ")))
        return OTAError(error.code, "\(error.message); the bond the stack made could not be removed (\(failures.joined(separator: "; ")))",
                        hint: "\(error.hint ?? "pass --pair"); remove the bond with `otaflash unpair --device \(address)`", cause: error.cause)
    }

    /// Removes the bonds with the device and with where its bootloader answered, when
    /// `pairing.unpairAfter` says so, whatever the update's result; says how it went in events.
    ///
    /// - Returns: the `bondLeft` failure when a bond could not be removed (the transport tried
    ///   again once its stack was back, `GATTBondStore.removeBond`); nil when none is left.
    @discardableResult
    public func removeBonds(central: any GATTCentral, address: DeviceAddress, updateModeAddress: DeviceAddress?,
                            events: @Sendable (Event) -> Void) async -> OTAError? {
        guard pairing.unpairAfter else { return nil }
        let failures = await pairing.unpair(central, [address] + (updateModeAddress.map { [$0] } ?? []))
        let device = address.description
        events(.pairing(device: device, note: failures.isEmpty ? "\(device): bond removed (--unpair-after)"
                        : "\(device): the bond could not be removed: " + failures.joined(separator: "; ")))
        guard !failures.isEmpty else { return nil }
        return OTAError(.bondLeft, "\(device): the bond could not be removed (--unpair-after): " + failures.joined(separator: "; "),
                        hint: "remove it with `otaflash unpair --device \(device)` once bluetoothd runs")
    }

    private func attempt(central: any GATTCentral, address: DeviceAddress, from progress: Progress,
                         events: @escaping @Sendable (Event) -> Void) async -> Outcome {
        var progress = progress
        let device = address.description
        let handoff = Mutex<(any GATTConnection)?>(nil)
        var unreachedSince: Duration?
        if progress.entry == nil, progress.imagesDone == 0 {
            do throws(OTAError) {
                let prepared = try await prepare(central: central, address: address, events: events)
                progress.entry = prepared.entry
                unreachedSince = prepared.unreachedSince
                handoff.withLock { $0 = prepared.connection }
                events(.prepared(device: device, reason: prepared.reason, entry: prepared.entry))
            } catch {
                events(.prepared(device: device, reason: nil, entry: nil))
                return Outcome(result: .failure(error), progress: progress)
            }
        }
        let entry = progress.entry
        let name = namesSessionsByDevice ? device : (entry?.address ?? address).description
        let timeouts = timeouts
        let connect = { @Sendable (limit: Duration) async throws(GATTError) -> any GATTConnection in
            if let connection = handoff.withLock({ c in defer { c = nil }; return c }) { return connection }
            if let entry { return try await central.connect(to: entry, timeout: limit) }
            return try await central.connect(to: address, timeout: limit)
        }
        let home = entry?.application ?? address
        var total: OTAResult?
        let (size, crc32) = (plan.size, plan.crc32)
        let firstImage = progress.imagesDone
        for (index, part) in plan.parts.enumerated().dropFirst(progress.imagesDone) {
            if plan.parts.count > 1 {
                events(.image(device: device, index: index, count: plan.parts.count, label: part.label))
            }
            let profile = part.profile
            let confirm = { @Sendable () async -> Bool in
                await Self.confirmActivation(profile, central: central, at: home, timeouts: timeouts)
            }
            let session = OTASession(device: name, image: part.firmware, config: config, profile: part.profile,
                                     timeouts: timeouts, reconnect: reconnect, journal: journal, clock: central.clock,
                                     logger: logger, confirmActivation: confirm, unreachedSince: index == firstImage ? unreachedSince : nil,
                                     connectWithin: connect)
            do throws(OTAError) {
                let result = try await session.run { events(.session($0)) }
                progress.imagesDone = index + 1
                total = total.map { $0.followed(by: result, size: size, crc32: crc32) } ?? result
            } catch {
                if let unused = handoff.withLock({ c in defer { c = nil }; return c }) { await unused.disconnect() }
                return Outcome(result: .failure(error), progress: progress)
            }
        }
        // The images an earlier attempt sent count as this one's too.
        guard var total else {
            return Outcome(result: .failure(OTAError(.internalError, "\(device): the plan had no image left to send")), progress: progress)
        }
        total.device = device
        if plan.parts.count > 1 { (total.bytes, total.crc32) = (size, crc32) }
        let after = readsBack && !total.skipped && total.activated ? await readBack(central: central, address: address) : nil
        return Outcome(result: .success(total), progress: progress, after: after)
    }

    /// After activation the device reboots: what it runs once it is back (nil when it does not
    /// come back within the connect timeout, or when its protocol does not tell).
    private func readBack(central: any GATTCentral, address: DeviceAddress) async -> DeviceSummary? {
        let profile = plan.parts[plan.parts.count - 1].profile
        guard profile.reportsFirmwareVersion else { return nil }
        do {
            let connection = try await central.connect(to: address, timeout: timeouts.connect)
            do throws(OTAError) {
                let summary = try await profile.summary(on: connection, device: address.description, discoveryTimeout: timeouts.discovery)
                await connection.disconnect()
                return summary
            } catch {
                await connection.disconnect()
                throw error
            }
        } catch {
            logger.debug("could not read the version back", metadata: ["device": "\(address)", "error": "\(error)"])
            return nil
        }
    }

    /// Connects once, within the connect timeout, to where the device runs its application and
    /// lets the profile read whether it activated the image (`OTAProfile.confirmsActivation`).
    private static func confirmActivation(_ profile: any OTAProfile, central: any GATTCentral, at address: DeviceAddress,
                                          timeouts: SessionTimeouts) async -> Bool {
        guard let connection = try? await central.connect(to: address, timeout: timeouts.connect) else { return false }
        let services = try? await withTimeout(timeouts.discovery, clock: connection.clock, "discovering services") { () async throws(GATTError) in
            try await connection.discoverServices()
        }
        let confirmed = if let services { await profile.confirmsActivation(on: connection, services: services) } else { false }
        await connection.disconnect()
        return confirmed
    }

    private struct Prepared: Sendable {
        let reason: String
        let entry: UpdateModeEntry?
        /// When the first connection was tried, when it failed to connect (the session's
        /// reconnect window counts from there).
        var unreachedSince: Duration? = nil
        /// Up and discovered, for the first session to go on with; nil after an entry (the link
        /// is gone) and when the first connection failed.
        let connection: (any GATTConnection)?
    }

    /// Connects once before the sessions: checks the protocol against the services the device
    /// exposes (`ProtocolRegistry.resolve`) and lets the profile move the device into its update
    /// mode (`OTAProfile.enterUpdateMode`).
    ///
    /// A first connection that fails in a way the session's supervisor retries (a failed connect,
    /// a timeout) is left to the first session; the protocol then goes unchecked against the
    /// services, as before any connection.
    ///
    /// - Throws: `OTAError`: the device was not found (or Bluetooth is unavailable), exposes
    ///   services of another protocol than the image's, or could not be moved into its update mode.
    private func prepare(central: any GATTCentral, address: DeviceAddress,
                         events: @Sendable (Event) -> Void) async throws(OTAError) -> Prepared {
        let unread = Prepared(reason: plan.reason + plan.contents, entry: nil, connection: nil)
        let tried = central.clock.now
        let connection: any GATTConnection
        do {
            connection = try await central.connect(to: address, timeout: timeouts.connect)
        } catch {
            // What the session's supervisor would retry is left to it; the rest ends the run here.
            let failure = OTAError.from(error, device: address.description)
            if Task.isCancelled { throw Self.interrupted(address) }
            guard failure.resumable, failure.code == .connection || failure.code == .timeout else { throw failure }
            var unreached = unread
            unreached.unreachedSince = tried
            return unreached
        }
        if pairing.pair {
            do throws(OTAError) {
                if try await pairing.pairIfNeeded(connection, device: address.description) {
                    events(.pairing(device: address.description, note: "\(address): paired (\(pairing.method))"))
                }
            } catch {
                await connection.disconnect()
                if Task.isCancelled { throw Self.interrupted(address) }
                throw error
            }
        }
        let services: [GATTService]
        do {
            services = try await withTimeout(timeouts.discovery, clock: connection.clock, "discovering services") { () async throws(GATTError) in
                try await connection.discoverServices()
            }
        } catch {
            await connection.disconnect()
            return unread
        }
        if readsIdentity {
            events(.identity(device: address.description,
                             await DeviceIdentity.read(from: connection, services: services, timeout: config.replyTimeout)))
        }
        do throws(OTAError) {
            let resolution = try registry.resolve(protocolName, format: plan.format, services: Set(services.map(\.uuid)))
            let entry = try await plan.profile.enterUpdateMode(on: connection, services: services, device: address, limits: limits)
            if let stack = connection.stackPairing {
                throw OTAError.pairingRequired(device: address.description, stack: stack, cause: nil)
            }
            if entry != nil { await connection.disconnect() }
            return Prepared(reason: resolution.reason + plan.contents, entry: entry, connection: entry == nil ? connection : nil)
        } catch {
            await connection.disconnect()
            if Task.isCancelled { throw Self.interrupted(address) }
            throw OTAError(error.code, error.message.hasPrefix("\(address)") ? error.message : "\(address): \(error.message)",
                           hint: error.hint, resumable: error.resumable, cause: error.cause)
        }
    }

    private static func interrupted(_ address: DeviceAddress) -> OTAError {
        OTAError(.interrupted, "interrupted before anything was sent to \(address)", hint: "run the same command again")
    }
}

extension OTAError {
    /// This failure, or the `bondLeft` one, once removing the bond failed: a success becomes
    /// `bondLeft`; another failure keeps its code (what went wrong first) and says it too.
    public func leaving(_ bond: OTAError) -> OTAError {
        OTAError(code, "\(message); and \(bond.message)", hint: hint.map { "\($0); \(bond.hint ?? "")" } ?? bond.hint,
                 resumable: resumable, cause: cause)
    }
}

extension DeviceUpdater.Outcome {
    /// The outcome once a bond could not be removed (`DeviceUpdater.removeBonds`): never a success.
    public mutating func leave(_ bond: OTAError?) {
        guard let bond else { return }
        switch result {
        case .success: result = .failure(bond)
        case .failure(let error): result = .failure(error.leaving(bond))
        }
    }
}

extension OTAResult {
    /// This result and the next image's, as one: for a package sent image by image.
    func followed(by next: OTAResult, size: Int, crc32: UInt32) -> OTAResult {
        var out = next
        out.bytes = size
        out.crc32 = crc32
        out.seconds = seconds + next.seconds
        out.transferSeconds = transferSeconds + next.transferSeconds
        out.firmwareBefore = firmwareBefore
        out.stats.bytesSent += stats.bytesSent
        out.stats.bytesResent += stats.bytesResent
        out.stats.packets += stats.packets
        out.stats.checkpoints += stats.checkpoints
        out.stats.rewinds += stats.rewinds
        out.stats.rollbacks += stats.rollbacks
        out.stats.restarts += stats.restarts
        out.stats.commandRetries += stats.commandRetries
        out.stats.resumedFrom = stats.resumedFrom + next.stats.resumedFrom
        out.stats.resentPerConnection = stats.resentPerConnection + next.stats.resentPerConnection
        out.stats.resumeResends = stats.resumeResends + next.stats.resumeResends
        return out
    }
}
