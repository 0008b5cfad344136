import GATT
import OTADevice
import OTAWire

/// Which of Espressif's BLE OTA components a device runs (esp-iot-solution
/// `components/bluetooth/ble_profiles/esp/`): what it does with each packet differs, error paths
/// above all.
public enum ESPOTAComponent: String, Sendable, Hashable, CaseIterable {
    /// `ble_ota` on NimBLE (`nimble_ota.c`, newest revision): sequence errors reset the sector, no
    /// sector CRC is checked.
    case nimble
    /// `ble_ota` on Bluedroid (`ble_ota.c`): collects whatever comes, checks nothing.
    case bluedroid
    /// `ble_ota_raw` 0.2.0 (`esp_ble_ota_raw.c`): checks the sector CRC, and announces in START's
    /// ACK (byte 6) how many sectors its ring buffer holds.
    case raw

    /// What the GATT table tells a central: `ble_ota_raw` serves a Device Information Service, as
    /// Bluedroid's `ble_ota` does.
    public var host: ESPOTAHost { self == .nimble ? .nimble : .bluedroid }
}

/// Faults of one device's Bluetooth host, by the index of the write command on RECV_FW since the
/// boot (0: the first sector packet): what `--sim-drop-rate` does at random, at a chosen packet.
public struct ESPDeviceFaults: Sendable, Hashable {
    /// Write commands the host drops without a word (out of buffers).
    public var dropWriteAt: Set<Int>
    /// Write commands that reach the component twice (the second a sequence error).
    public var duplicateAt: Set<Int>
    /// Write commands that reach the component naming the next sector (a wrong-sector packet).
    public var wrongSectorAt: Set<Int>
    /// Sectors whose ACK (the first) never reaches the central.
    public var loseACKOfSector: Set<Int>

    public init(dropWriteAt: Set<Int> = [], duplicateAt: Set<Int> = [], wrongSectorAt: Set<Int> = [], loseACKOfSector: Set<Int> = []) {
        self.dropWriteAt = dropWriteAt
        self.duplicateAt = duplicateAt
        self.wrongSectorAt = wrongSectorAt
        self.loseACKOfSector = loseACKOfSector
    }

    public static let none = ESPDeviceFaults()
}

/// An ESP32 running one of Espressif's BLE OTA components and the example application that hands
/// it a flash task (esp-iot-solution `examples/bluetooth/ble_ota`, `.../ble_profiles/ble_ota`), as
/// the simulator and `otaflash simulate --protocol esp-ota` serve it.
///
/// The service 0x8018 with RECV_FW, PROGRESS_BAR, COMMAND and CUSTOMER; answers go out as
/// notifications. NimBLE advertises its name and 0x1811; Bluedroid and `ble_ota_raw` advertise
/// 0x8018 and serve a Device Information Service.
///
/// Commands: NimBLE answers every START (and resets its sector state), Bluedroid refuses one
/// while started; `ble_ota_raw` checks the command's length (20) and CRC, refuses START while
/// running or with length 0, runs the application's begin hook (`esp_ota_begin` with the size:
/// it erases first, so its ACK comes late; an image larger than the partition is refused) and
/// carries its sector window in the ACK's byte 6.
///
/// Sector packets, as each component's write handler does it:
/// - NimBLE (`esp_ble_ota_write_chr`): under 3 bytes refused. A packet of another sector (not
///   0xFFFF) gets a NACK (status 2, the wanted sector at 4–5), resets the packet count and the
///   buffer and clears the sequence error; its bytes are not kept. A sequence number out of order
///   (not 0xFF) sets the sequence error and resets the packet count and buffer, silently. A last
///   packet (0xFF) after a sequence error is NACKed (status 2) and resets; otherwise it is taken
///   whatever the packet count, its last two bytes dropped (no CRC is checked; fewer than two:
///   refused silently), and what the buffer holds is handed to the application, even nothing.
/// - Bluedroid (`esp_ble_ota_process_recv_data`): NACKs a packet of another sector and keeps its
///   bytes all the same; a sequence number out of order is only logged; the last packet hands
///   4096 bytes of its zeroed buffer over. More than 4098 bytes for one sector overrun its buffer:
///   the model crashes the device.
/// - `ble_ota_raw` (`esp_ble_ota_recv_fw_data`): another sector: NACK 2, nothing reset; a sequence
///   number out of order: NACK 3, the packet dropped, nothing reset; the last packet's CRC16 is
///   checked (mismatch: reset, NACK 1); a sector taken is ACKed with the next sector at 4–5.
/// Every component's state outlives a link loss.
///
/// The host (NimBLE or Bluedroid) takes write commands into a few buffers; while its task is
/// blocked on a full ring buffer, more than `hostBufferPackets` waiting are dropped without a
/// word, as `--sim-drop-rate` drops them at random (`FaultPlan.dropRate` applies to every write
/// command, not only sector packets it can place).
///
/// The application: each sector goes through a ring buffer (8 KiB in the `ble_ota` example, 12 KiB
/// in `ble_ota_raw`'s) to a flash task; when it is full, the host task blocks and every answer
/// waits (`FaultPlan.slowFlashPerKiB` on top of `flashTimePerSector`). It writes what it gets,
/// counts the bytes, and once they reach START's length checks the image (`esp_ota_end`: the
/// checks of `ESPAppImage`, the chip) and restarts into it; short sectors leave it waiting for
/// bytes for ever; a refused image, a write past the partition or a second START on the boot
/// (the application's write offset no longer matches) stop the flash task, silently: nothing
/// restarts.
public struct ESPOTAPeripheral: PeripheralModel {
    public struct Config: Sendable, Hashable {
        public var component: ESPOTAComponent
        public var chip: ESPChip
        /// The OTA partition the application writes.
        public var partitionSize: Int
        /// The application's ring buffer between the component and its flash task.
        public var ringBufferBytes: Int
        /// Write commands the host keeps while its task is blocked; more are dropped.
        public var hostBufferPackets: Int
        public var flashTimePerSector: Duration
        /// `esp_ota_begin` erasing the image's size (`ble_ota_raw`'s begin hook), per 64 KiB.
        public var eraseTimePer64KiB: Duration
        /// `esp_ota_end`'s read-back and `esp_ota_set_boot_partition` before the restart.
        public var verifyTime: Duration
        public var bootDuration: Duration
        public var faults: ESPDeviceFaults

        public var host: ESPOTAHost { component.host }
        /// The window `ble_ota_raw` announces: its ring buffer in sectors, 1…64.
        public var sectorWindow: Int { min(64, max(1, ringBufferBytes / ESPOTAService.sectorSize)) }

        public init(component: ESPOTAComponent = .nimble, chip: ESPChip = .esp32, partitionSize: Int = 0x1A0000, ringBufferBytes: Int? = nil,
                    hostBufferPackets: Int = 24, flashTimePerSector: Duration = .milliseconds(30), eraseTimePer64KiB: Duration = .milliseconds(150),
                    verifyTime: Duration = .milliseconds(300), bootDuration: Duration = .milliseconds(500), faults: ESPDeviceFaults = .none) {
            self.component = component
            self.chip = chip
            self.partitionSize = partitionSize
            self.ringBufferBytes = ringBufferBytes ?? (component == .raw ? 12 * 1024 : 8 * 1024)
            self.hostBufferPackets = hostBufferPackets
            self.flashTimePerSector = flashTimePerSector
            self.eraseTimePer64KiB = eraseTimePer64KiB
            self.verifyTime = verifyTime
            self.bootDuration = bootDuration
            self.faults = faults
        }

        /// The `ble_ota` component on `host`.
        public init(host: ESPOTAHost, chip: ESPChip = .esp32, partitionSize: Int = 0x1A0000, flashTimePerSector: Duration = .milliseconds(30),
                    verifyTime: Duration = .milliseconds(300), bootDuration: Duration = .milliseconds(500)) {
            self.init(component: host == .nimble ? .nimble : .bluedroid, chip: chip, partitionSize: partitionSize,
                      flashTimePerSector: flashTimePerSector, verifyTime: verifyTime, bootDuration: bootDuration)
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
    /// Sectors handed to the application with fewer bytes than the image has there (NimBLE), over
    /// all boots.
    public private(set) var shortSectors = 0
    /// Write commands the host dropped, over all boots.
    public private(set) var droppedWrites = 0

    private var injector: FaultInjector
    private var espFaults: ESPDeviceFaults
    private var awayUntil = Duration.zero
    private var pendingBoot: Duration?
    // The component's state (it survives a link loss).
    private var started = false
    private var totalLength = 0
    private var currentSector = 0
    private var currentPacket = 0
    private var sequenceError = false
    private var buffer: [UInt8] = []
    private var writesThisBoot = 0
    // The host's: when each write command waiting for the blocked host task is handled.
    private var waiting: [Duration] = []
    // The application's.
    private var task = Task.writing
    private var written: [UInt8] = []
    private var ring: [Duration] = []
    private var hostFreeAt = Duration.zero

    public init(config: Config = Config(), firmwareVersion: String = "1.0.0", faults: FaultPlan = .none) {
        self.config = config
        self.running = ESPAppImage.build(chip: config.chip, version: firmwareVersion, body: Array("factory image".utf8))
        self.injector = FaultInjector(faults)
        self.espFaults = config.faults
    }

    public var faults: FaultPlan { injector.plan }
    /// What the application wrote to the OTA partition on this boot.
    public var partition: [UInt8] { written }
    /// The bytes the application counted on this boot (its `recv_len`).
    public var received: Int { written.count }
    /// An update started on this boot whose flash task still waits for bytes.
    public var waitingForBytes: Bool {
        guard case .writing = task else { return false }
        return startsPerBoot.last ?? 0 > 0 && written.count < totalLength
    }
    /// The version in the running image's `esp_app_desc_t`.
    public var runningVersion: String? { try? ESPAppImage(bytes: running).version }

    public var services: [PeripheralService] {
        let raw = config.component == .raw
        let commands: CharacteristicProperties = raw ? [.write, .writeWithoutResponse, .notify, .indicate] : [.write, .indicate]
        var out = [
            PeripheralService(ESPOTAService.serviceUUID, [
                PeripheralCharacteristic(ESPOTAService.receiveFirmwareUUID, commands),
                PeripheralCharacteristic(ESPOTAService.progressBarUUID, raw ? [.write, .read, .notify, .indicate] : [.read, .indicate]),
                PeripheralCharacteristic(ESPOTAService.commandUUID, commands),
                PeripheralCharacteristic(ESPOTAService.customerUUID, commands),
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
            return "sector \(packet.sector) seq \(packet.sequence) +\(packet.payload.count), collecting sector \(currentSector) packet \(currentPacket) (\(buffer.count) B)"
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
        var bytes = bytes
        var duplicate = false
        if characteristic == ESPOTAService.receiveFirmwareUUID {
            // The chosen faults, by index (whatever the write's type: a device served through
            // bluetoothd is not told it).
            let index = writesThisBoot
            writesThisBoot += 1
            if espFaults.dropWriteAt.remove(index) != nil {
                droppedWrites += 1
                return PeripheralWriteResult(reply: .success(at: now), outputs: [], reports: [.note("write command \(index) dropped (fault)")])
            }
            duplicate = espFaults.duplicateAt.remove(index) != nil
            if espFaults.wrongSectorAt.remove(index) != nil, bytes.count >= 2 {
                let wrong = (UInt16(bytes[0]) | UInt16(bytes[1]) << 8) &+ 1
                bytes[0] = UInt8(truncatingIfNeeded: wrong)
                bytes[1] = UInt8(truncatingIfNeeded: wrong >> 8)
            }
        }
        if !withResponse {
            // The host's buffers: a write command it cannot take is gone without a word.
            waiting.removeAll { $0 <= now }
            if waiting.count >= config.hostBufferPackets {
                droppedWrites += 1
                return PeripheralWriteResult(reply: .success(at: now), outputs: [], reports: [.note("host out of buffers: write command dropped")])
            }
            let placed = (try? ESPSectorPacket(decoding: bytes)).map { Int($0.sector) * ESPOTAService.sectorSize + buffer.count }
            switch injector.packet(at: characteristic == ESPOTAService.receiveFirmwareUUID ? placed : nil, count: max(0, bytes.count - 3)) {
            case .dropped:
                droppedWrites += 1
                return PeripheralWriteResult(reply: .success(at: now), outputs: [])
            case .disconnect(let reason):
                return PeripheralWriteResult(reply: .success(at: now), outputs: [PeripheralTimed(at: now, .dropLink(reason: reason))],
                                             reports: [.note(reason)])
            case .corrupt(let index, let mask):
                if index + 3 < bytes.count { bytes[index + 3] ^= mask }
            case .deliver:
                break
            }
            if now < hostFreeAt { waiting.append(hostFreeAt) }
        }
        switch characteristic {
        case ESPOTAService.commandUUID:
            if withResponse, injector.refusesCommand() {
                return PeripheralWriteResult(reply: .failure(.unlikelyError, "writing COMMAND"), outputs: [], reports: [.note("ATT error fault on COMMAND")])
            }
            if injector.silent { return PeripheralWriteResult(reply: .success(at: now), outputs: []) }
            return command(bytes, at: now)
        case ESPOTAService.receiveFirmwareUUID:
            var result = data(bytes, withResponse: withResponse, at: now)
            if duplicate {
                let again = data(bytes, withResponse: false, at: now)
                result.outputs += again.outputs
                result.reports += again.reports + [.note("write command delivered twice (fault)")]
            }
            return result
        case ESPOTAService.customerUUID:
            return PeripheralWriteResult(reply: .success(at: now), outputs: [])
        default:
            return PeripheralWriteResult(reply: .failure(.writeNotPermitted, "writing \(characteristic)"), outputs: [])
        }
    }

    private mutating func command(_ bytes: [UInt8], at now: Duration) -> PeripheralWriteResult {
        var at = max(now, hostFreeAt)
        var reports: [PeripheralReport] = []
        var status: UInt16 = 0
        var window: UInt8 = 0
        let id: UInt16
        if config.component == .raw {
            // `esp_ble_ota_recv_cmd_data`: 20 bytes, their CRC, then the command.
            guard bytes.count >= 2 else { return PeripheralWriteResult(reply: .success(at: now), outputs: []) }
            id = UInt16(bytes[0]) | UInt16(bytes[1]) << 8
            let crcOK = bytes.count == ESPCommand.size
                && CRC16.checksum(bytes[0..<18]) == UInt16(bytes[18]) | UInt16(bytes[19]) << 8
            if !crcOK {
                status = 1
                reports.append(.note("command refused: \(bytes.count) bytes or a bad CRC"))
            } else if id == 0x0001 {
                let length = Int(UInt32(bytes[2]) | UInt32(bytes[3]) << 8 | UInt32(bytes[4]) << 16 | UInt32(bytes[5]) << 24)
                if started || length == 0 || length > config.partitionSize {
                    status = 1
                    reports.append(.note(started ? "START while running refused" : "START refused: esp_ota_begin failed for \(length) bytes"))
                    if !started { totalLength = 0 }
                } else {
                    // The begin hook erases what the image will take before the ACK.
                    at += config.eraseTimePer64KiB * ((length + 0xFFFF) / 0x10000)
                    hostFreeAt = at
                    begin(length: length, reports: &reports)
                    window = UInt8(config.sectorWindow)
                }
            } else if id == 0x0002 {
                if started { resetComponent() } else { status = 1 }
            } else {
                status = 1
            }
        } else {
            guard let command = try? ESPCommand(decoding: bytes) else { return PeripheralWriteResult(reply: .success(at: now), outputs: []) }
            id = command.id
            switch command {
            case .start(let length):
                if started, config.component == .bluedroid {
                    startsPerBoot[startsPerBoot.count - 1] += 1
                    status = 1
                    secondStarts += 1
                    reports.append(.note("second START on this boot refused (Bluedroid)"))
                } else {
                    begin(length: Int(length), reports: &reports)
                }
            case .stop:
                if !started, config.component == .bluedroid { status = 1 }
                started = false
                totalLength = 0
            case .other:
                return PeripheralWriteResult(reply: .success(at: now), outputs: [])
            }
        }
        var outputs: [PeripheralTimed] = []
        if !injector.losesNotification() {
            var ack = ESPCommandAck(command: id, status: status).encoded
            if window != 0 {
                ack[6] = window
                let crc = CRC16.checksum(ack[0..<18])
                ack[18] = UInt8(truncatingIfNeeded: crc)
                ack[19] = UInt8(truncatingIfNeeded: crc >> 8)
            }
            outputs.append(PeripheralTimed(at: at, .notify(ESPOTAService.commandUUID, ack)))
        }
        return PeripheralWriteResult(reply: .success(at: now), outputs: outputs, reports: reports)
    }

    /// A START taken: the component starts over at sector 0; the application's write offset does
    /// not (a second START on one boot wedges it until a reset).
    private mutating func begin(length: Int, reports: inout [PeripheralReport]) {
        startsPerBoot[startsPerBoot.count - 1] += 1
        if startsPerBoot[startsPerBoot.count - 1] > 1 {
            secondStarts += 1
            stopTask("a second START on this boot: the application's write offset no longer matches the component's; wedged until a reset", reports: &reports)
        }
        started = true
        totalLength = length
        resetSector()
        currentSector = 0
        reports.append(.begin(size: length, crc: nil, offset: 0))
    }

    private mutating func resetSector() {
        buffer = []
        currentPacket = 0
        sequenceError = false
    }

    private mutating func resetComponent() {
        started = false
        totalLength = 0
        currentSector = 0
        resetSector()
    }

    private mutating func data(_ bytes: [UInt8], withResponse: Bool, at now: Duration) -> PeripheralWriteResult {
        // NimBLE's handler answers a refusal with an ATT error (a write request sees it).
        let refused = PeripheralWriteResult(reply: withResponse && config.component == .nimble ? .failure(.unlikelyError, "RECV_FW") : .success(at: now), outputs: [])
        guard started, !injector.silent, bytes.count >= ESPSectorPacket.headerSize else { return refused }
        let sector = Int(UInt16(bytes[0]) | UInt16(bytes[1]) << 8)
        let sequence = bytes[2]
        let offset = sector * ESPOTAService.sectorSize + buffer.count
        var outputs: [PeripheralTimed] = []
        var reports: [PeripheralReport] = []
        let at = max(now, hostFreeAt)
        func nack(_ status: ESPSectorAck.Status, _ outputs: inout [PeripheralTimed]) {
            notify(ESPSectorAck(sector: UInt16(sector), status: status, expected: UInt16(truncatingIfNeeded: currentSector)), at: at, &outputs)
        }
        var item: [UInt8]
        switch config.component {
        case .nimble:
            if sector != currentSector, sector != 0xFFFF {
                nack(.sectorIndexError, &outputs)
                resetSector()
                return PeripheralWriteResult(reply: refused.reply, outputs: outputs, reports: [.note("sector index error, cur \(currentSector), recv \(sector)")])
            }
            if sequence != UInt8(truncatingIfNeeded: currentPacket) {
                if sequence != ESPSectorPacket.lastSequence {
                    let note = "packet index error, cur: \(currentPacket), recv: \(sequence)"
                    resetSector()
                    sequenceError = true
                    return PeripheralWriteResult(reply: refused.reply, outputs: [], reports: [.note(note)])
                }
                if sequenceError {
                    nack(.sectorIndexError, &outputs)
                    resetSector()
                    return PeripheralWriteResult(reply: refused.reply, outputs: outputs, reports: [.note("sector EOF after packet sequence error, NACK sector \(currentSector)")])
                }
            }
            let last = sequence == ESPSectorPacket.lastSequence
            if !last { sequenceError = false }
            var count = bytes.count - ESPSectorPacket.headerSize
            if last {
                guard count >= 2 else {
                    buffer = []
                    return PeripheralWriteResult(reply: refused.reply, outputs: [], reports: [.note("last packet too short")])
                }
                count -= 2
            }
            guard buffer.count + count <= ESPOTAService.sectorSize + 2 else {
                buffer = []
                return PeripheralWriteResult(reply: refused.reply, outputs: [], reports: [.note("sector ciphertext overflow")])
            }
            buffer += bytes[3..<(3 + count)]
            guard last else {
                currentPacket += 1
                return finish(now: now, offset: offset, count: count, outputs: outputs, reports: reports)
            }
            item = buffer.count < ESPOTAService.sectorSize + 2 ? buffer : Array(buffer.prefix(ESPOTAService.sectorSize))
        case .bluedroid:
            if sector != currentSector, sector != 0xFFFF { nack(.sectorIndexError, &outputs) }
            buffer += bytes[3...]
            if buffer.count > ESPOTAService.sectorSize + 2 {
                reboot(at: at, until: at + config.bootDuration, image: nil, reason: "sector buffer overrun (\(buffer.count) bytes): the device crashed", &outputs)
                return PeripheralWriteResult(reply: .success(at: now), outputs: outputs, reports: [.note("sector buffer overrun: crashed")])
            }
            guard sequence == ESPSectorPacket.lastSequence else {
                currentPacket += 1
                return finish(now: now, offset: offset, count: bytes.count - 3, outputs: outputs, reports: reports)
            }
            item = Array(buffer.prefix(ESPOTAService.sectorSize)) + [UInt8](repeating: 0, count: max(0, ESPOTAService.sectorSize - buffer.count))
        case .raw:
            if sector != currentSector {
                nack(.sectorIndexError, &outputs)
                return PeripheralWriteResult(reply: .success(at: now), outputs: outputs, reports: [.note("sector mismatch, expected \(currentSector) recv \(sector)")])
            }
            let last = sequence == ESPSectorPacket.lastSequence
            if !last, sequence != UInt8(truncatingIfNeeded: currentPacket) {
                nack(.lengthError, &outputs)
                return PeripheralWriteResult(reply: .success(at: now), outputs: outputs, reports: [.note("packet mismatch, expected \(currentPacket) recv \(sequence)")])
            }
            var payload = bytes[3...]
            var crc: UInt16 = 0
            if last {
                guard payload.count >= 2 else {
                    nack(.lengthError, &outputs)
                    return PeripheralWriteResult(reply: .success(at: now), outputs: outputs, reports: [.note("sector end packet too short")])
                }
                crc = UInt16(payload[payload.endIndex - 2]) | UInt16(payload[payload.endIndex - 1]) << 8
                payload = payload.dropLast(2)
            }
            guard buffer.count + payload.count <= ESPOTAService.sectorSize else {
                resetSector()
                nack(.lengthError, &outputs)
                return PeripheralWriteResult(reply: .success(at: now), outputs: outputs, reports: [.note("sector payload overflow")])
            }
            buffer += payload
            guard last else {
                currentPacket = (currentPacket + 1) & 0xFF
                return finish(now: now, offset: offset, count: payload.count, outputs: outputs, reports: reports)
            }
            guard CRC16.checksum(buffer) == crc else {
                resetSector()
                nack(.crcError, &outputs)
                return PeripheralWriteResult(reply: .success(at: now), outputs: outputs, reports: [.note("sector crc mismatch")])
            }
            item = buffer
        }
        let count = bytes.count - 3
        currentSector += 1
        resetSector()
        if config.component == .nimble, sector != 0xFFFF, item.count < min(ESPOTAService.sectorSize, max(0, totalLength - sector * ESPOTAService.sectorSize)) {
            shortSectors += 1
            reports.append(.note("short sector \(sector) handed over: \(item.count) bytes"))
        }
        var handAt = at
        if !item.isEmpty {
            // The ring buffer holds `ringBufferBytes`: the host task waits for room.
            ring.removeAll { $0 <= handAt }
            let slots = max(1, config.ringBufferBytes / ESPOTAService.sectorSize)
            if ring.count >= slots { handAt = max(handAt, ring.removeFirst()) }
            hostFreeAt = handAt
            let done = max(handAt, ring.last ?? handAt) + config.flashTimePerSector + injector.flashTime(bytes: item.count)
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
        }
        // --sim-lose-final-answer: the last sector's ACK never reaches the central (the restart
        // overtakes it, as it does on a real device without a delay before esp_restart).
        let lostFinal = injector.plan.loseFinalAnswer && totalLength > 0 && (sector + 1) * ESPOTAService.sectorSize >= totalLength
        if espFaults.loseACKOfSector.remove(sector) == nil, !lostFinal {
            notify(ESPSectorAck(sector: UInt16(sector), status: .success,
                                expected: config.component == .nimble ? nil : UInt16(truncatingIfNeeded: currentSector)), at: handAt, &outputs)
        }
        return finish(now: now, offset: offset, count: count, outputs: outputs, reports: reports)
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
        resetSector()
        writesThisBoot = 0
        waiting = []
        task = .writing
        written = []
        ring = []
        hostFreeAt = .zero
        startsPerBoot.append(0)
    }
}
