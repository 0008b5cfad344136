import GATT
import OTADevice
import OTAWire

/// An ESP32 running Espressif's BLE OTA example (esp-iot-solution `examples/bluetooth/ble_ota`):
/// the `ble_ota` component on either host, and the application's flash task behind its ring
/// buffer, as the simulator and `otaflash simulate --protocol esp-ota` serve it.
///
/// From the component (`nimble_ota.c`, `ble_ota.c`):
/// - the OTA service 0x8018 with RECV_FW, PROGRESS_BAR, COMMAND and CUSTOMER, flagged write +
///   indicate (the bar read + indicate); writes of either type are taken; answers go out as
///   notifications. NimBLE advertises its name and 0x1811; Bluedroid advertises 0x8018 and
///   serves a Device Information Service.
/// - START takes the length and is answered 0; NimBLE answers every START so, Bluedroid refuses
///   one while an update is started (status 1). Neither reads the command's CRC. STOP clears
///   the started flag and the length.
/// - a packet of another sector than the one collected gets a NACK (status 2, the wanted sector
///   at 4–5) and its bytes are collected all the same, as the component does; a sequence number
///   out of order is only logged. At a sector's last packet (0xFF): NimBLE checks the sector's
///   CRC16 (status 1 and the same sector again on a mismatch), Bluedroid checks nothing
///   (`checksSectorCRC` sets it either way). A sector taken is handed to the application and
///   ACKed; the component's state outlives a link loss.
/// - more than 4098 bytes collected for one sector overrun the component's buffer: the model
///   crashes the device (it reboots; a real one corrupts its heap).
///
/// From the application (`app_main.c`): `esp_ota_begin` once at boot; each sector goes through an
/// 8 KiB ring buffer (two sectors) to a flash task: when it is full, the host task blocks and
/// every answer waits (`FaultPlan.slowFlashPerKiB` on top of `flashTimePerSector`). Once the
/// bytes written reach START's length, the application checks the image (`esp_ota_end`: the
/// checks of `ESPAppImage`, the chip) and restarts into it; a refused image, a write past the
/// partition or a second START on the boot (the application's write offset no longer matches)
/// stop the flash task, silently: every sector is still ACKed, nothing restarts.
public struct ESPOTAPeripheral: PeripheralModel {
    public struct Config: Sendable, Hashable {
        public var host: ESPOTAHost
        public var chip: ESPChip
        /// The OTA partition the application writes.
        public var partitionSize: Int
        public var checksSectorCRC: Bool
        public var flashTimePerSector: Duration
        /// `esp_ota_end`'s read-back and `esp_ota_set_boot_partition` before the restart.
        public var verifyTime: Duration
        public var bootDuration: Duration

        public init(host: ESPOTAHost = .nimble, chip: ESPChip = .esp32, partitionSize: Int = 0x1A0000, checksSectorCRC: Bool? = nil,
                    flashTimePerSector: Duration = .milliseconds(30), verifyTime: Duration = .milliseconds(300),
                    bootDuration: Duration = .milliseconds(500)) {
            self.host = host
            self.chip = chip
            self.partitionSize = partitionSize
            self.checksSectorCRC = checksSectorCRC ?? (host == .nimble)
            self.flashTimePerSector = flashTimePerSector
            self.verifyTime = verifyTime
            self.bootDuration = bootDuration
        }
    }

    /// What the flash task does.
    enum Task: Sendable, Hashable {
        case writing
        /// Stopped for good on this boot (`goto OTA_ERROR`), with why.
        case stopped(String)
        /// The image checked out; the restart is due.
        case restarting
    }

    public let config: Config
    /// The image the device runs.
    public private(set) var running: [UInt8]
    /// Images it restarted into, oldest first.
    public private(set) var activations: [[UInt8]] = []
    /// Why the application refused what it was sent, oldest first.
    public private(set) var refusals: [String] = []
    /// STARTs after the first on one boot, over all boots.
    public private(set) var secondStarts = 0
    /// STARTs on each boot, first boot first.
    public private(set) var startsPerBoot: [Int] = [0]

    private var injector: FaultInjector
    private var awayUntil = Duration.zero
    private var pendingBoot: Duration?
    // The component's state (it survives a link loss).
    private var started = false
    private var totalLength = 0
    private var currentSector = 0
    private var currentPacket = 0
    private var buffer: [UInt8] = []
    // The application's.
    private var task = Task.writing
    private var written: [UInt8] = []
    private var ring: [Duration] = []
    private var hostFreeAt = Duration.zero

    public init(config: Config = Config(), firmwareVersion: String = "1.0.0", faults: FaultPlan = .none) {
        self.config = config
        self.running = ESPAppImage.build(chip: config.chip, version: firmwareVersion, body: Array("factory image".utf8))
        self.injector = FaultInjector(faults)
    }

    public var faults: FaultPlan { injector.plan }
    /// What the application wrote to the OTA partition on this boot.
    public var partition: [UInt8] { written }
    /// The version in the running image's `esp_app_desc_t`.
    public var runningVersion: String? { try? ESPAppImage(bytes: running).version }

    public var services: [PeripheralService] {
        var out = [
            PeripheralService(ESPOTAService.serviceUUID, [
                PeripheralCharacteristic(ESPOTAService.receiveFirmwareUUID, [.write, .indicate]),
                PeripheralCharacteristic(ESPOTAService.progressBarUUID, [.read, .indicate]),
                PeripheralCharacteristic(ESPOTAService.commandUUID, [.write, .indicate]),
                PeripheralCharacteristic(ESPOTAService.customerUUID, [.write, .indicate]),
            ]),
        ]
        if config.host == .bluedroid {
            out.append(PeripheralService(DeviceInformationService.serviceUUID, [
                PeripheralCharacteristic(DeviceInformationService.modelNumberUUID, [.read]),
                PeripheralCharacteristic(DeviceInformationService.serialNumberUUID, [.read]),
                PeripheralCharacteristic(DeviceInformationService.firmwareRevisionUUID, [.read]),
            ]))
        }
        return out
    }

    public var advertisedServices: [BluetoothUUID] {
        config.host == .nimble ? [ESPOTAService.nimbleAdvertisedUUID] : [ESPOTAService.serviceUUID]
    }

    public var availableAt: Duration { awayUntil }

    public func refusesConnection(after connections: Int) -> Bool { injector.refusesConnection(after: connections) }

    public func read(_ characteristic: BluetoothUUID) -> [UInt8]? {
        switch characteristic {
        case ESPOTAService.progressBarUUID: [UInt8](repeating: 0, count: 20)
        case DeviceInformationService.modelNumberUUID where config.host == .bluedroid: Array("Espressif".utf8)
        case DeviceInformationService.serialNumberUUID where config.host == .bluedroid: Array("esp-ota".utf8)
        // The component serves a fixed "1.0"; the model serves the running image's version, so a
        // read-back tells which image came up.
        case DeviceInformationService.firmwareRevisionUUID where config.host == .bluedroid: Array((runningVersion ?? "1.0").utf8)
        default: nil
        }
    }

    public mutating func linkDropped(central: String?) {}

    public func describe(_ bytes: [UInt8], to characteristic: BluetoothUUID) -> String {
        if characteristic == ESPOTAService.commandUUID, let command = try? ESPCommand(decoding: bytes) { return "\(command)" }
        if let packet = try? ESPSectorPacket(decoding: bytes) {
            return "sector \(packet.sector) seq \(packet.sequence) +\(packet.payload.count), collecting sector \(currentSector) (\(buffer.count) B)"
        }
        return "\(bytes.count) B"
    }

    public mutating func wake(_ token: UInt64, at now: Duration) -> [PeripheralTimed] {
        bootIfDue(at: now)
        return []
    }

    // MARK: Writes

    public mutating func write(_ bytes: [UInt8], to characteristic: BluetoothUUID, withResponse: Bool,
                               from central: String?, at now: Duration) -> PeripheralWriteResult {
        bootIfDue(at: now)
        guard now >= awayUntil else { return PeripheralWriteResult(reply: .away, outputs: []) }
        switch characteristic {
        case ESPOTAService.commandUUID:
            if withResponse, injector.refusesCommand() {
                return PeripheralWriteResult(reply: .failure(.unlikelyError, "writing COMMAND"), outputs: [], reports: [.note("ATT error fault on COMMAND")])
            }
            if injector.silent { return PeripheralWriteResult(reply: .success(at: now), outputs: []) }
            return command(bytes, at: now)
        case ESPOTAService.receiveFirmwareUUID:
            return data(bytes, at: now)
        case ESPOTAService.customerUUID:
            return PeripheralWriteResult(reply: .success(at: now), outputs: [])
        default:
            return PeripheralWriteResult(reply: .failure(.writeNotPermitted, "writing \(characteristic)"), outputs: [])
        }
    }

    private mutating func command(_ bytes: [UInt8], at now: Duration) -> PeripheralWriteResult {
        let at = max(now, hostFreeAt)
        guard let command = try? ESPCommand(decoding: bytes) else { return PeripheralWriteResult(reply: .success(at: now), outputs: []) }
        var reports: [PeripheralReport] = []
        var status: UInt16 = 0
        switch command {
        case .start(let length):
            startsPerBoot[startsPerBoot.count - 1] += 1
            if started, config.host == .bluedroid {
                status = 1
                secondStarts += 1
                reports.append(.note("second START on this boot refused (Bluedroid)"))
            } else {
                if startsPerBoot[startsPerBoot.count - 1] > 1 {
                    secondStarts += 1
                    // The component starts over; the application's write offset does not: the
                    // image it writes is corrupt and its flash task stops. Wedged until a reset.
                    stopTask("a second START on this boot: the application's write offset no longer matches the component's; wedged until a reset", reports: &reports)
                }
                started = true
                totalLength = Int(length)
                buffer = []
                currentPacket = 0
                reports.append(.begin(size: Int(length), crc: nil, offset: 0))
            }
        case .stop:
            if !started, config.host == .bluedroid { status = 1 }
            started = false
            totalLength = 0
        case .other:
            return PeripheralWriteResult(reply: .success(at: now), outputs: [])
        }
        var outputs: [PeripheralTimed] = []
        if !injector.losesNotification() {
            outputs.append(PeripheralTimed(at: at, .notify(ESPOTAService.commandUUID, ESPCommandAck(command: command.id, status: status).encoded)))
        }
        return PeripheralWriteResult(reply: .success(at: now), outputs: outputs, reports: reports)
    }

    private mutating func data(_ bytes: [UInt8], at now: Duration) -> PeripheralWriteResult {
        guard started, var packet = try? ESPSectorPacket(decoding: bytes) else {
            return PeripheralWriteResult(reply: .success(at: now), outputs: [])
        }
        let offset = Int(packet.sector) * ESPOTAService.sectorSize + buffer.count
        switch injector.packet(at: offset, count: packet.payload.count) {
        case .dropped:
            return PeripheralWriteResult(reply: .success(at: now), outputs: [])
        case .disconnect(let reason):
            return PeripheralWriteResult(reply: .success(at: now), outputs: [PeripheralTimed(at: now, .dropLink(reason: reason))],
                                         reports: [.note(reason)])
        case .corrupt(let index, let mask):
            if index < packet.payload.count { packet.payload[index] ^= mask }
        case .deliver:
            break
        }
        var at = max(now, hostFreeAt)
        var outputs: [PeripheralTimed] = []
        var reports: [PeripheralReport] = []
        let sector = Int(packet.sector)
        if sector != currentSector, packet.sector != 0xFFFF {
            notify(ESPSectorAck(sector: packet.sector, status: .sectorIndexError, expected: UInt16(truncatingIfNeeded: currentSector)), at: at, &outputs)
        }
        buffer += packet.payload
        if buffer.count > ESPOTAService.sectorSize + 2 {
            reboot(at: at, until: at + config.bootDuration, image: nil, reason: "sector buffer overrun (\(buffer.count) bytes): the device crashed", &outputs)
            return PeripheralWriteResult(reply: .success(at: now), outputs: outputs, reports: [.note("sector buffer overrun: crashed")])
        }
        guard packet.isLast else {
            currentPacket += 1
            return finish(now: now, offset: offset, count: packet.payload.count, outputs: outputs, reports: reports)
        }
        currentPacket = 0
        let collected = buffer
        buffer = []
        if config.checksSectorCRC {
            let crc = collected.count >= 2 ? UInt16(collected[collected.count - 2]) | UInt16(collected[collected.count - 1]) << 8 : 0
            guard collected.count >= 2, CRC16.checksum(collected.dropLast(2)) == crc else {
                notify(ESPSectorAck(sector: packet.sector, status: .crcError, expected: UInt16(truncatingIfNeeded: currentSector)), at: at, &outputs)
                return finish(now: now, offset: offset, count: packet.payload.count, outputs: outputs, reports: reports)
            }
        }
        currentSector += 1
        // NimBLE hands over what it collected (the CRC bytes too, for a short last sector),
        // Bluedroid always 4096 bytes of its zeroed buffer.
        var item = config.host == .bluedroid
            ? Array(collected.prefix(ESPOTAService.sectorSize)) + [UInt8](repeating: 0, count: max(0, ESPOTAService.sectorSize - collected.count))
            : (collected.count < ESPOTAService.sectorSize + 2 ? collected : Array(collected.prefix(ESPOTAService.sectorSize)))
        // The ring buffer holds two sectors: the host task waits for room.
        ring.removeAll { $0 <= at }
        if ring.count >= 2 { at = max(at, ring.removeFirst()) }
        hostFreeAt = at
        let done = max(at, ring.last ?? at) + config.flashTimePerSector + injector.flashTime(bytes: item.count)
        ring.append(done)
        if case .writing = task {
            if written.count + item.count > config.partitionSize {
                stopTask("esp_ota_write past the end of the \(config.partitionSize)-byte OTA partition", reports: &reports)
            } else {
                if let flip = injector.plan.flashBitFlipAt, (written.count..<(written.count + item.count)).contains(flip) {
                    item[flip - written.count] ^= 0x01
                }
                written += item
                reports.append(.progress(received: min(written.count, totalLength), total: totalLength))
                if written.count >= totalLength { endOTA(at: done, &outputs, &reports) }
            }
        }
        notify(ESPSectorAck(sector: packet.sector, status: .success,
                            expected: config.host == .bluedroid ? UInt16(truncatingIfNeeded: currentSector) : nil), at: at, &outputs)
        return finish(now: now, offset: offset, count: packet.payload.count, outputs: outputs, reports: reports)
    }

    /// `esp_ota_end`, `esp_ota_set_boot_partition`, `esp_restart`: or the task's silent end.
    private mutating func endOTA(at done: Duration, _ outputs: inout [PeripheralTimed], _ reports: inout [PeripheralReport]) {
        do {
            let image = try ESPAppImage(bytes: written, source: "the OTA partition")
            try image.check(chip: config.chip)
            let booted = Array(written.prefix(image.imageLength))
            task = .restarting
            reports.append(.verified(crc: nil))
            reports.append(.activated(image: booted, version: image.version))
            activations.append(booted)
            running = booted
            reboot(at: done + config.verifyTime, until: done + config.verifyTime + config.bootDuration, image: booted,
                   reason: "restarting into the new image", &outputs)
        } catch {
            stopTask("esp_ota_end refused the image: \(error)", reports: &reports)
        }
    }

    private mutating func stopTask(_ why: String, reports: inout [PeripheralReport]) {
        guard case .writing = task else { return }
        task = .stopped(why)
        refusals.append(why)
        reports.append(.note("OTA failed (the device says nothing and does not restart): \(why)"))
    }

    private mutating func notify(_ ack: ESPSectorAck, at: Duration, _ outputs: inout [PeripheralTimed]) {
        if injector.losesNotification() { return }
        outputs.append(PeripheralTimed(at: at, .notify(ESPOTAService.receiveFirmwareUUID, ack.encoded)))
    }

    private mutating func finish(now: Duration, offset: Int, count: Int, outputs: [PeripheralTimed], reports: [PeripheralReport]) -> PeripheralWriteResult {
        var outputs = outputs
        if injector.rebootsAfterPacket(at: offset, count: count) {
            reboot(at: now, until: now + injector.plan.rebootDuration, image: nil, reason: "reboot fault at offset \(offset)", &outputs, injected: true)
        }
        return PeripheralWriteResult(reply: .success(at: now), outputs: outputs, reports: reports)
    }

    private mutating func reboot(at: Duration, until: Duration, image: [UInt8]?, reason: String, _ outputs: inout [PeripheralTimed],
                                 injected: Bool = false) {
        outputs.append(PeripheralTimed(at: at, .reboot(until: until, reason: reason, injected: injected)))
        awayUntil = max(awayUntil, until)
        pendingBoot = at
    }

    /// A reboot that came due: a new boot, with the new image if the restart was an update's.
    private mutating func bootIfDue(at now: Duration) {
        guard let boot = pendingBoot, now >= boot else { return }
        pendingBoot = nil
        started = false
        totalLength = 0
        currentSector = 0
        currentPacket = 0
        buffer = []
        task = .writing
        written = []
        ring = []
        hostFreeAt = .zero
        startsPerBoot.append(0)
    }
}
