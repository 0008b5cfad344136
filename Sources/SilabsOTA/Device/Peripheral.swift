import GATT
import OTADevice
import OTAWire

/// Which of Silicon Labs' two Bluetooth OTA devices a model is.
public enum SilabsDeviceKind: String, Sendable, Hashable, CaseIterable {
    /// An application with the application OTA DFU component (`sl_bt_app_ota_dfu.c`): the image
    /// goes into bootloader storage slot 0 while it runs; checked once the link closes, installed
    /// by the bootloader at the reboot.
    case app
    /// An application with the in-place OTA DFU component (`sl_bt_in_place_ota_dfu.c`: OTA Control
    /// alone, any write reboots it into its AppLoader), and the AppLoader, which takes the image
    /// in place of the application and checks it at 0x03 (UG489, AN1086).
    case apploader
}

/// Faults of one device at chosen OTA Data writes (counted from 0 since the device booted, write
/// requests and commands alike), beside the random ones of `FaultPlan`.
public struct SilabsDeviceFaults: Sendable, Hashable {
    /// Write commands the stack drops without a word.
    public var dropWriteAt: Set<Int>
    /// Writes whose flash write fails (`bootloader_writeStorage`: ATT 0x83 from the application
    /// component, 0x85 from the AppLoader).
    public var storageErrorAt: Set<Int>
    /// Write requests the device handles but whose response never reaches the central: its ATT
    /// transaction times out and the link drops.
    public var loseResponseAt: Set<Int>
    /// The bootloader refuses the GBL at its check whatever it holds (a rule of its own: another
    /// product, a downgrade, a key it does not trust).
    public var refuseImage: Bool

    public init(dropWriteAt: Set<Int> = [], storageErrorAt: Set<Int> = [], loseResponseAt: Set<Int> = [], refuseImage: Bool = false) {
        self.dropWriteAt = dropWriteAt
        self.storageErrorAt = storageErrorAt
        self.loseResponseAt = loseResponseAt
        self.refuseImage = refuseImage
    }

    public static let none = SilabsDeviceFaults()
}

/// An EFR32 (Series 2) with Silicon Labs' Bluetooth OTA, as the simulator and `otaflash simulate
/// --protocol silabs-ota` serve it, both kinds (`SilabsDeviceKind`), from the components' code and
/// the AppLoader's documentation (docs/SILABS.md has the table and its sources).
///
/// Application OTA DFU (`sl_bt_app_ota_dfu.c`): after a boot the component reads the slot and
/// erases it when it is not blank (INIT, READ_FLASH, ERASE), then is READY. 0x00 is taken only
/// then (otherwise the write response is a success all the same, and the component goes to its
/// error state, whose default handler starts it over: erase, READY); 0x03 sets DOWNLOAD_END in any
/// state; 0x04 sets DISCONNECT; any other value sets UNINIT, where it stays until a reboot. OTA
/// Data from another connection than the one that sent 0x00 (or before any) is not answered at
/// all; outside DOWNLOAD_BEGIN it is 0x81; past the slot 0x82; a failed storage write (a length
/// that is not a whole number of words, a flash error) 0x83; each error leaves the component in
/// its error state, which starts it over. When the link closes in DOWNLOAD_END the slot is
/// checked (`bootloader_initVerifyImage`…), and if it checks out the bootloader installs it at
/// the reboot; otherwise the component starts over, silently. In DOWNLOAD_BEGIN a closed link is
/// UNEXPECTED_CLOSE: it starts over too. Nothing outlives the link: no resume.
///
/// In-place OTA DFU: any write to OTA Control is answered (0x80 when the security it requires,
/// a bond, is missing), and the application then closes the link after a delay and resets into
/// its AppLoader, which advertises its own name ("OTA"). The AppLoader: 0x00 starts over at byte
/// 0; data before it is 0x81; past the flash 0x83; a failed flash write 0x85; the application is
/// overwritten as data arrives; 0x03 checks the GBL (CRC: 0x80, a parse failure: 0x84, a signature
/// secure boot requires: 0x80) before it answers; once the link closes after an accepted 0x03 it
/// boots the new application; with the application overwritten and nothing accepted it stays in
/// the AppLoader; 0x04 closes the link from its side.
///
/// The model's reports ride on writes (the `PeripheralModel` contract), while the application OTA
/// DFU component checks and activates only once the link closes: it reports the activation at
/// 0x03 for a slot that will check out, and reports a later write that cancels it (`activations`
/// holds what really booted).
public struct SilabsOTAPeripheral: PeripheralModel {
    public struct Config: Sendable, Hashable {
        public var kind: SilabsDeviceKind
        /// Storage slot 0 (application OTA DFU), or the application area the AppLoader writes.
        public var slotSize: Int
        /// Whether the version characteristics are served: the AppLoader's four, or the
        /// application's Application version.
        public var versionCharacteristics: Bool
        /// Whether OTA Data is flagged write without response too (the GATT configurator's default).
        public var dataWriteCommands: Bool
        /// Whether the in-place component asks for a bond before it reboots into the AppLoader.
        public var entryRequiresBond: Bool
        /// Whether the bootloader's secure boot requires signed GBLs.
        public var requiresSignature: Bool
        /// The served device starts in its AppLoader (a served device keeps one GATT table).
        public var startsInAppLoader: Bool
        public var appLoaderName: String
        public var pageSize: Int
        public var pageErase: Duration
        public var writePerKiB: Duration
        public var verifyPerKiB: Duration
        /// The bootloader copying the slot over the application, per KiB.
        public var installPerKiB: Duration
        /// The in-place component's delay before it closes the link (SL_BT_IN_PLACE_OTA_DFU_MIN_DELAY_TO_DISCONNECT).
        public var entryDelay: Duration
        public var bootDuration: Duration
        public var faults: SilabsDeviceFaults

        public init(kind: SilabsDeviceKind = .app, slotSize: Int = 0x40000, versionCharacteristics: Bool = true, dataWriteCommands: Bool = true,
                    entryRequiresBond: Bool = false, requiresSignature: Bool = false, startsInAppLoader: Bool = false,
                    appLoaderName: String = SilabsOTAService.appLoaderName, pageSize: Int = 8192, pageErase: Duration = .milliseconds(20),
                    writePerKiB: Duration = .milliseconds(4), verifyPerKiB: Duration = .milliseconds(2), installPerKiB: Duration = .milliseconds(8),
                    entryDelay: Duration = .seconds(1), bootDuration: Duration = .milliseconds(300), faults: SilabsDeviceFaults = .none) {
            self.kind = kind
            self.slotSize = slotSize
            self.versionCharacteristics = versionCharacteristics
            self.dataWriteCommands = dataWriteCommands
            self.entryRequiresBond = entryRequiresBond
            self.requiresSignature = requiresSignature
            self.startsInAppLoader = startsInAppLoader
            self.appLoaderName = appLoaderName
            self.pageSize = pageSize
            self.pageErase = pageErase
            self.writePerKiB = writePerKiB
            self.verifyPerKiB = verifyPerKiB
            self.installPerKiB = installPerKiB
            self.entryDelay = entryDelay
            self.bootDuration = bootDuration
            self.faults = faults
        }

        func perKiB(_ d: Duration, _ bytes: Int) -> Duration { d * bytes / 1024 }
        /// READ_FLASH and, for a slot that is not blank, ERASE.
        func prepareTime(dirty: Bool) -> Duration {
            perKiB(.microseconds(100), slotSize) + (dirty ? pageErase * ((slotSize + pageSize - 1) / pageSize) : .zero)
        }
    }

    /// What runs.
    enum Runs: Sendable, Hashable {
        case application
        case appLoader
    }

    /// The application OTA DFU component's state (`sl_bt_app_ota_dfu_status_t`, the ones that matter).
    enum Component: Sendable, Hashable {
        /// INIT, READ_FLASH, ERASE: READY at `readyAt`.
        case preparing(readyAt: Duration)
        case ready
        case downloading
        case downloadEnd
        case disconnectRequested
        /// UNINIT after a control value it does not know: nothing until a reboot.
        case stuck
    }

    public let config: Config
    /// The GBL the device runs (the one it booted last), and its application version.
    public private(set) var running: [UInt8]
    public private(set) var runningVersion: UInt32
    /// GBLs it booted after a check, oldest first.
    public private(set) var activations: [[UInt8]] = []
    /// When each 0x03 reached the device (the bench's end of a transfer).
    public private(set) var endsReceived: [Duration] = []
    /// Why its bootloader (or AppLoader) refused what it was sent, oldest first.
    public private(set) var refusals: [String] = []
    /// Write commands dropped, over all boots.
    public private(set) var droppedWrites = 0
    /// Times the in-place application rebooted into its AppLoader.
    public private(set) var entries = 0

    private var injector: FaultInjector
    private var deviceFaults: SilabsDeviceFaults
    private var runs: Runs
    private var awayUntil = Duration.zero
    private var pendingBoot: (at: Duration, runs: Runs, image: [UInt8]?, version: UInt32?)?
    private var lastNow = Duration.zero
    private var encrypted = false
    private var writesThisBoot = 0
    // Application OTA DFU.
    private var component = Component.ready
    /// The connection that sent 0x00 (`app_ota.connection`): `taken`, and its central where the
    /// transport names it.
    private var taken = false
    private var owner: String?
    private var slot: [UInt8] = []
    private var reportedActivation = false
    // AppLoader.
    private var started = false
    private var received: [UInt8] = []
    private var accepted: (image: [UInt8], version: UInt32?)?
    private var applicationIntact = true

    public init(config: Config = Config(), firmwareVersion: UInt32 = 0x0100_0000, faults: FaultPlan = .none) {
        self.config = config
        self.runningVersion = firmwareVersion
        self.running = []
        self.injector = FaultInjector(faults)
        self.deviceFaults = config.faults
        self.runs = config.kind == .apploader && config.startsInAppLoader ? .appLoader : .application
        self.applicationIntact = true
    }

    public var faults: FaultPlan { injector.plan }
    /// Whether the AppLoader answers now (else the application).
    public var inAppLoader: Bool { runs == .appLoader }
    /// What the storage slot holds (application OTA DFU).
    public var slotContents: [UInt8] { slot }
    /// Whether the application component waits in DOWNLOAD_END for the link to close.
    public var awaitsClose: Bool { component == .downloadEnd }

    public var services: [PeripheralService] {
        let data: CharacteristicProperties = config.dataWriteCommands ? [.write, .writeWithoutResponse] : [.write]
        var characteristics = [PeripheralCharacteristic(SilabsOTAService.controlUUID, [.write])]
        switch (effective.runs, config.kind) {
        case (.appLoader, _):
            characteristics.append(PeripheralCharacteristic(SilabsOTAService.dataUUID, data))
            if config.versionCharacteristics {
                characteristics += [SilabsOTAService.otaVersionUUID, SilabsOTAService.apploaderVersionUUID, SilabsOTAService.bootloaderVersionUUID,
                                    SilabsOTAService.applicationVersionUUID].map { PeripheralCharacteristic($0, [.read]) }
            }
        case (.application, .app):
            characteristics.append(PeripheralCharacteristic(SilabsOTAService.dataUUID, data))
            if config.versionCharacteristics { characteristics.append(PeripheralCharacteristic(SilabsOTAService.applicationVersionUUID, [.read])) }
        case (.application, .apploader):
            if config.versionCharacteristics { characteristics.append(PeripheralCharacteristic(SilabsOTAService.applicationVersionUUID, [.read])) }
        }
        return [PeripheralService(SilabsOTAService.serviceUUID, characteristics)]
    }

    public var advertisedServices: [BluetoothUUID] { [SilabsOTAService.serviceUUID] }
    public var advertisedName: String? { effective.runs == .appLoader ? config.appLoaderName : nil }

    /// What runs, with a reboot that is due applied: a central connects, discovers and reads only
    /// once the device is back (`availableAt`), which is after it.
    private var effective: (runs: Runs, version: UInt32) {
        guard let boot = pendingBoot else { return (runs, runningVersion) }
        return (boot.runs, boot.version ?? runningVersion)
    }
    public var availableAt: Duration { awayUntil }

    public func refusesConnection(after connections: Int) -> Bool { injector.refusesConnection(after: connections) }

    public func read(_ characteristic: BluetoothUUID) -> [UInt8]? {
        guard config.versionCharacteristics else { return nil }
        let (runs, version) = effective
        switch (characteristic, runs) {
        case (SilabsOTAService.applicationVersionUUID, _): return SilabsVersions.encode(word: version)
        case (SilabsOTAService.otaVersionUUID, .appLoader): return [3]
        case (SilabsOTAService.apploaderVersionUUID, .appLoader): return SilabsVersions.encode(apploader: [2, 4, 0, 0])
        case (SilabsOTAService.bootloaderVersionUUID, .appLoader): return SilabsVersions.encode(word: 0x0200_0000)
        default: return nil
        }
    }

    public mutating func linkEncrypted(_ encrypted: Bool) { self.encrypted = encrypted }

    public func describe(_ bytes: [UInt8], to characteristic: BluetoothUUID) -> String {
        if characteristic == SilabsOTAService.controlUUID, let control = SilabsControl(decoding: bytes) { return "OTA Control \(control)" }
        return runs == .appLoader ? "OTA Data +\(bytes.count), AppLoader holds \(received.count)" : "OTA Data +\(bytes.count), slot holds \(slot.count) (\(component))"
    }

    public mutating func wake(_ token: UInt64, at now: Duration) -> [PeripheralTimed] {
        advance(to: now)
        return []
    }

    // MARK: Time

    /// A reboot that came due, and the component's preparation that ended.
    private mutating func advance(to now: Duration) {
        lastNow = max(lastNow, now)
        if let boot = pendingBoot, now >= boot.at {
            pendingBoot = nil
            runs = boot.runs
            if let image = boot.image {
                running = image
                runningVersion = boot.version ?? runningVersion
            }
            writesThisBoot = 0
            taken = false
            owner = nil
            started = false
            received = []
            accepted = nil
            reportedActivation = false
            if runs == .application {
                applicationIntact = true
                // A slot that held an image is erased at the start (READ_FLASH finds it dirty).
                let dirty = !slot.isEmpty
                component = .preparing(readyAt: boot.at + config.bootDuration + config.prepareTime(dirty: dirty))
            }
        }
        if case .preparing(let readyAt) = component, now >= readyAt {
            component = .ready
            slot = []
        }
    }

    private mutating func reboot(at: Duration, into runs: Runs, image: [UInt8]? = nil, version: UInt32? = nil, boot: Duration) {
        pendingBoot = (at, runs, image, version)
        awayUntil = max(awayUntil, at + boot)
    }

    // MARK: Writes

    public mutating func write(_ bytes: [UInt8], to characteristic: BluetoothUUID, withResponse: Bool,
                               from central: String?, at now: Duration) -> PeripheralWriteResult {
        advance(to: now)
        guard now >= awayUntil else { return PeripheralWriteResult(reply: .away, outputs: []) }
        if injector.silent {
            // Hung (`stopAnsweringAt`): nothing is answered.
            return Self.unanswered(withResponse, at: now, note: "hung: not answered")
        }
        if characteristic == SilabsOTAService.controlUUID {
            if withResponse, injector.refusesCommand() {
                return PeripheralWriteResult(reply: .failure(.unlikelyError, "writing OTA Control"), outputs: [], reports: [.note("ATT error fault on OTA Control")])
            }
            var result = switch (runs, config.kind) {
            case (.appLoader, _): appLoaderControl(bytes, from: central, at: now)
            case (.application, .app): applicationControl(bytes, from: central, at: now)
            case (.application, .apploader): inPlaceEntry(at: now)
            }
            if withResponse, case .success = result.reply, injector.losesNotification() {
                result.outputs.append(PeripheralTimed(at: now, .dropLink(reason: "the response to OTA Control 0x\(String(bytes.first ?? 0, radix: 16)) was lost: the central's ATT transaction timed out")))
                result.reports.append(.note("response to OTA Control lost (fault)"))
            }
            return result
        }
        guard characteristic == SilabsOTAService.dataUUID, runs == .appLoader || config.kind == .app else {
            return PeripheralWriteResult(reply: .failure(.writeNotPermitted, "writing \(characteristic)"), outputs: [])
        }
        let index = writesThisBoot
        writesThisBoot += 1
        var bytes = bytes
        let offset = runs == .appLoader ? received.count : slot.count
        if !withResponse, deviceFaults.dropWriteAt.remove(index) != nil {
            droppedWrites += 1
            return PeripheralWriteResult(reply: .success(at: now), outputs: [], reports: [.note("OTA Data write command \(index) dropped (fault)")])
        }
        switch injector.packet(at: offset, count: bytes.count) {
        case .dropped where !withResponse:
            droppedWrites += 1
            return PeripheralWriteResult(reply: .success(at: now), outputs: [])
        case .dropped:
            // A write request that never arrives is never answered: the central's ATT
            // transaction times out and the link goes.
            return Self.unanswered(true, at: now, note: "OTA Data write request \(index) lost (fault)")
        case .corrupt(let i, let mask) where i < bytes.count:
            // Bytes changed on the way reach the storage as they are, answered or not: only the
            // bootloader's check of the whole GBL finds them.
            bytes[i] ^= mask
        case .disconnect(let reason):
            return PeripheralWriteResult(reply: .success(at: now), outputs: [PeripheralTimed(at: now, .dropLink(reason: reason))], reports: [.note(reason)])
        default:
            break
        }
        var result = runs == .appLoader ? appLoaderData(bytes, index: index, withResponse: withResponse, at: now)
            : applicationData(bytes, index: index, withResponse: withResponse, from: central, at: now)
        if withResponse, case .success = result.reply, deviceFaults.loseResponseAt.remove(index) != nil {
            result.outputs.append(PeripheralTimed(at: now, .dropLink(reason: "the response to OTA Data write \(index) was lost: the central's ATT transaction timed out")))
            result.reports.append(.note("response to OTA Data write \(index) lost (fault)"))
        }
        if injector.rebootsAfterPacket(at: offset, count: bytes.count) {
            let back: Runs = runs == .appLoader && !applicationIntact ? .appLoader : .application
            reboot(at: now, into: back, boot: config.bootDuration)
            taken = false
            owner = nil
            result.outputs.append(PeripheralTimed(at: now, .reboot(until: now + config.bootDuration, reason: "reboot fault at offset \(offset)", injected: true)))
        }
        return result
    }

    /// `FaultPlan.flashBitFlipAt`: a bit of flash that does not hold what was written there.
    private func flipped(_ bytes: [UInt8], at offset: Int) -> [UInt8] {
        guard let flip = injector.plan.flashBitFlipAt, (offset..<(offset + bytes.count)).contains(flip) else { return bytes }
        var out = bytes
        out[flip - offset] ^= 0x01
        return out
    }

    /// A write the device never answers: a request's ATT transaction times out and the central
    /// drops the link.
    private static func unanswered(_ withResponse: Bool, at now: Duration, note: String) -> PeripheralWriteResult {
        guard withResponse else { return PeripheralWriteResult(reply: .success(at: now), outputs: []) }
        return PeripheralWriteResult(reply: .away, outputs: [PeripheralTimed(at: now, .dropLink(reason: "no response: the ATT transaction timed out"))],
                                     reports: [.note(note)])
    }

    private static func refusal(_ code: UInt8, _ what: String) -> PeripheralReply {
        .failure(ATTError(rawValue: code), what)
    }

    // MARK: Application OTA DFU

    private mutating func applicationControl(_ bytes: [UInt8], from central: String?, at now: Duration) -> PeripheralWriteResult {
        guard let control = SilabsControl(decoding: bytes) else { return PeripheralWriteResult(reply: .success(at: now), outputs: []) }
        var reports: [PeripheralReport] = []
        let wasEnd = component == .downloadEnd
        switch control {
        case .begin:
            if component == .ready, !taken || owner == central {
                component = .downloading
                taken = true
                owner = central
                slot = []
                reports.append(.begin(size: config.slotSize, crc: nil, offset: 0))
            } else {
                reports.append(.note("0x00 while \(component): SL_BT_APP_OTA_DFU_ERR_UNEXPECTED_TRANSFER; the error state starts the component over"))
                startOver(at: now)
            }
        case .end:
            endsReceived.append(now)
            component = .downloadEnd
            let outcome = check(slot)
            if case .valid(let length, let version) = outcome, !reportedActivation {
                // Reported now: the check runs once the link closes, and reports ride on writes.
                reportedActivation = true
                reports += [.verified(crc: CRC32.checksum(slot[..<length])), .activated(image: Array(slot[..<length]), version: version.map(Self.versionText)),
                            .note("0x03: the slot holds a GBL that checks out; it is checked again and installed once the link closes")]
            } else if !outcome.isValid {
                reports.append(.note("0x03: the slot holds no GBL that checks out (\(outcome)); it will be refused once the link closes"))
            }
        case .close:
            component = .disconnectRequested
            reports.append(.note("0x04: DISCONNECT"))
        case .other(let value):
            component = .stuck
            reports.append(.note("control value 0x\(String(value, radix: 16)): the component goes to UNINIT and does nothing until a reboot"))
        }
        if wasEnd, component != .downloadEnd, reportedActivation {
            reportedActivation = false
            reports.append(.note("the activation reported at 0x03 is cancelled: the component left DOWNLOAD_END"))
        }
        return PeripheralWriteResult(reply: .success(at: now), outputs: [], reports: reports)
    }

    private mutating func applicationData(_ bytes: [UInt8], index: Int, withResponse: Bool, from central: String?, at now: Duration) -> PeripheralWriteResult {
        guard taken, owner == central else {
            // Not the connection that sent 0x00: the write request event is not handled, and
            // no response is sent (the central's ATT transaction times out, and the link with it).
            return Self.unanswered(withResponse, at: now, note: "OTA Data write \(index) before 0x00 or from another connection: not answered")
        }
        func error(_ code: UInt8, _ why: String) -> PeripheralWriteResult {
            let cancelled = reportedActivation
            startOver(at: now)
            return PeripheralWriteResult(reply: withResponse ? Self.refusal(code, "writing OTA Data") : .success(at: now), outputs: [],
                                         reports: [.note("ATT 0x\(String(code, radix: 16)): \(why)" + (cancelled ? "; the activation reported at 0x03 is cancelled" : ""))])
        }
        guard component == .downloading else { return error(0x81, "not in DOWNLOAD_BEGIN (\(component))") }
        guard slot.count < config.slotSize else { return error(0x82, "SL_BT_APP_OTA_DFU_ERR_STORAGE_FULL") }
        if deviceFaults.storageErrorAt.remove(index) != nil { return error(0x83, "bootloader_writeStorage failed (fault)") }
        guard bytes.count % SilabsOTAService.wordSize == 0 else {
            return error(0x83, "bootloader_writeStorage: BOOTLOADER_ERROR_STORAGE_NEEDS_ALIGN, \(bytes.count) bytes")
        }
        guard slot.count + bytes.count <= config.slotSize else { return error(0x83, "bootloader_writeStorage: BOOTLOADER_ERROR_STORAGE_INVALID_ADDRESS") }
        slot += flipped(bytes, at: slot.count)
        let done = now + config.perKiB(config.writePerKiB, bytes.count) + injector.flashTime(bytes: bytes.count)
        return PeripheralWriteResult(reply: .success(at: done), outputs: [], reports: [.progress(received: slot.count, total: config.slotSize)])
    }

    /// The error state's default handler: `sl_bt_app_ota_dfu_restart_progress`, INIT again.
    private mutating func startOver(at now: Duration) {
        taken = false
        owner = nil
        reportedActivation = false
        component = .preparing(readyAt: now + config.prepareTime(dirty: !slot.isEmpty))
    }

    private func check(_ bytes: [UInt8]) -> SilabsBootloaderCheck.Outcome {
        if deviceFaults.refuseImage { return .signature("the bootloader refuses this GBL (fault)") }
        let outcome = SilabsBootloaderCheck.check(bytes, requiresSignature: config.requiresSignature)
        if case .valid(let length, _) = outcome, length > config.slotSize { return .parse("larger than the slot") }
        return outcome
    }

    static func versionText(_ word: UInt32) -> String { SilabsVersions.firmwareVersion(word).description }

    public mutating func linkDropped(central: String?) {
        advance(to: lastNow)
        switch runs {
        case .application where config.kind == .app:
            // Only the connection that sent 0x00 counts (`app_ota.connection`).
            guard taken, central == nil || owner == nil || owner == central else { return }
            if component == .downloadEnd {
                let outcome = check(slot)
                let checked = lastNow + config.perKiB(config.verifyPerKiB, slot.count)
                taken = false
                owner = nil
                if case .valid(let length, let version) = outcome {
                    let image = Array(slot[..<length])
                    activations.append(image)
                    reboot(at: checked, into: .application, image: image, version: version,
                           boot: config.perKiB(config.installPerKiB, length) + config.bootDuration)
                } else {
                    refusals.append("\(outcome)")
                    startOver(at: checked)
                }
                return
            }
            // DOWNLOAD_BEGIN: SL_BT_APP_OTA_DFU_ERR_UNEXPECTED_CLOSE; any other state: INIT again.
            startOver(at: lastNow)
        case .appLoader:
            if let accepted {
                activations.append(accepted.image)
                reboot(at: lastNow, into: .application, image: accepted.image, version: accepted.version, boot: config.bootDuration)
            } else if applicationIntact {
                reboot(at: lastNow, into: .application, boot: config.bootDuration)
            } else {
                started = false
                received = []
            }
        default:
            break
        }
    }

    // MARK: In-place OTA DFU and the AppLoader

    private mutating func inPlaceEntry(at now: Duration) -> PeripheralWriteResult {
        if config.entryRequiresBond, !encrypted {
            return PeripheralWriteResult(reply: Self.refusal(0x80, "writing OTA Control"), outputs: [],
                                         reports: [.note("in-place OTA DFU: no bond, entry refused")])
        }
        entries += 1
        let at = now + config.entryDelay
        reboot(at: at, into: .appLoader, boot: config.bootDuration)
        return PeripheralWriteResult(reply: .success(at: now),
                                     outputs: [PeripheralTimed(at: at, .reboot(until: at + config.bootDuration, reason: "in-place OTA DFU: resetting into the AppLoader", injected: false))],
                                     reports: [.note("in-place OTA DFU: resetting into the AppLoader")])
    }

    private mutating func appLoaderControl(_ bytes: [UInt8], from central: String?, at now: Duration) -> PeripheralWriteResult {
        guard let control = SilabsControl(decoding: bytes) else { return PeripheralWriteResult(reply: .success(at: now), outputs: []) }
        switch control {
        case .begin:
            started = true
            received = []
            accepted = nil
            return PeripheralWriteResult(reply: .success(at: now), outputs: [], reports: [.begin(size: config.slotSize, crc: nil, offset: 0)])
        case .end:
            endsReceived.append(now)
            guard started else { return PeripheralWriteResult(reply: Self.refusal(0x81, "writing OTA Control"), outputs: [], reports: [.note("0x03 before 0x00")]) }
            let outcome = check(received)
            let checked = now + config.perKiB(config.verifyPerKiB, received.count)
            guard case .valid(let length, let version) = outcome else {
                started = false
                refusals.append("\(outcome)")
                let code: UInt8 = if case .parse = outcome { 0x84 } else { 0x80 }
                return PeripheralWriteResult(reply: Self.refusal(code, "writing OTA Control"), outputs: [], reports: [.note("0x03: \(outcome)")])
            }
            let image = Array(received[..<length])
            accepted = (image, version)
            return PeripheralWriteResult(reply: .success(at: checked), outputs: [],
                                         reports: [.verified(crc: CRC32.checksum(image)), .activated(image: image, version: version.map(Self.versionText))])
        case .close:
            return PeripheralWriteResult(reply: .success(at: now), outputs: [PeripheralTimed(at: now, .dropLink(reason: "the AppLoader closes the link (0x04)"))])
        case .other:
            return PeripheralWriteResult(reply: .success(at: now), outputs: [])
        }
    }

    private mutating func appLoaderData(_ bytes: [UInt8], index: Int, withResponse: Bool, at now: Duration) -> PeripheralWriteResult {
        func refuse(_ code: UInt8, _ why: String) -> PeripheralWriteResult {
            PeripheralWriteResult(reply: withResponse ? Self.refusal(code, "writing OTA Data") : .success(at: now), outputs: [],
                                  reports: [.note("ATT 0x\(String(code, radix: 16)): \(why)")])
        }
        guard started else { return refuse(0x81, "data before 0x00") }
        guard received.count + bytes.count <= config.slotSize else {
            started = false
            return refuse(0x83, "past the application area")
        }
        if deviceFaults.storageErrorAt.remove(index) != nil {
            started = false
            return refuse(0x85, "the bootloader could not write flash (fault)")
        }
        applicationIntact = false
        accepted = nil
        received += flipped(bytes, at: received.count)
        let done = now + config.perKiB(config.writePerKiB, bytes.count) + injector.flashTime(bytes: bytes.count)
        return PeripheralWriteResult(reply: .success(at: done), outputs: [], reports: [.progress(received: received.count, total: config.slotSize)])
    }
}
