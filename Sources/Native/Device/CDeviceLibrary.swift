internal import COTADevice

/// The C device library (Sources/COTADevice) on its NOR flash model, driven from Swift.
///
/// `OTATarget.runCLibraryInLockstep` runs one beside the Swift model: every write, hold expiry,
/// link loss and reboot the model sees goes to the C device too, and each answer and info value
/// must be equal byte for byte. The simulator turns it on with `SimulatedDeviceConfig.runsCLibrary`,
/// so the soak and the session tests hold the library to the same behaviour under every fault they
/// inject; the conformance tests drive it directly (docs/ARCHITECTURE.md, "One set of device rules").
///
/// The C structs point at each other (the flash interface's context is the model), so they live in
/// memory allocated once that never moves. One owner at a time: the simulator mutates its device
/// under a lock, and an instance is never shared between two targets that both write.
public final class CDeviceLibrary: @unchecked Sendable {
    private let slotSize: Int
    private let mem: UnsafeMutablePointer<UInt8>
    private let writable: UnsafeMutablePointer<UInt8>
    private let nor: UnsafeMutablePointer<otafd_nor>
    private let store: UnsafeMutablePointer<otafd_ram_store>
    private let device: UnsafeMutablePointer<otafd_device>
    private var config = otafd_config()
    private var now: UInt32 = 0
    private var tokens: [String: UInt32] = [:]
    /// The first difference between the two devices, if any.
    private(set) var divergence: String?

    /// A device with a `slotSize`-byte slot of `eraseUnit`-byte units. `eraseMicroseconds` and
    /// `wordMicroseconds` are the NOR model's timing (`busyMicroseconds` adds them up); the info
    /// value declares the erase time in whole milliseconds. `holdMs` 0 answers an early CHECKPOINT
    /// `gap` at once. Nil when the C library refuses the configuration.
    public init?(slotSize: Int, eraseUnit: Int, eraseMicroseconds: UInt32, wordMicroseconds: UInt32 = 0,
                 reorderCapacity: Int, reorderRanges: Int, holdMs: UInt16, firmwareVersion: UInt32) {
        guard slotSize > 0, eraseUnit > 0, slotSize % eraseUnit == 0 else { return nil }
        self.slotSize = slotSize
        mem = .allocate(capacity: slotSize)
        writable = .allocate(capacity: slotSize)
        nor = .allocate(capacity: 1)
        store = .allocate(capacity: 1)
        device = .allocate(capacity: 1)
        otafd_nor_init(nor, mem, writable, UInt32(slotSize), UInt32(eraseUnit), eraseMicroseconds, wordMicroseconds)
        store.initialize(to: otafd_ram_store())
        device.initialize(to: otafd_device())
        config.flash = otafd_nor_flash(nor)
        config.store = otafd_ram_store_interface(store)
        config.reorder_capacity = UInt32(clamping: reorderCapacity)
        config.reorder_ranges = UInt8(clamping: reorderRanges)
        config.hold_ms = holdMs
        config.initial_version = firmwareVersion
        guard otafd_init(device, &config) == 0 else { return nil }
    }

    deinit {
        mem.deallocate()
        writable.deallocate()
        nor.deallocate()
        store.deallocate()
        device.deallocate()
    }

    private func token(_ central: String?) -> UInt32 {
        guard let central else { return 0 }
        if let t = tokens[central] { return t }
        let t = UInt32(tokens.count + 1)
        tokens[central] = t
        return t
    }

    private func call(_ body: (UnsafeMutablePointer<UInt8>) -> Int) -> [UInt8] {
        var out = [UInt8](repeating: 0, count: Int(OTAFD_NOTIFY_MAX))
        let n = out.withUnsafeMutableBufferPointer { $0.baseAddress.map(body) ?? 0 }
        return Array(out.prefix(n))
    }

    /// Records the first difference between what the C device did and what the Swift one did.
    func check(_ what: @autoclosure () -> String, c: [UInt8], swift: [UInt8], info: [UInt8]) {
        guard divergence == nil else { return }
        if c != swift {
            divergence = "\(what()): C answered \(hex(c)), Swift \(hex(swift))"
        } else if self.info != info {
            divergence = "\(what()): info differs: C \(hex(self.info)), Swift \(hex(info))"
        } else if nor.pointee.violations > 0 {
            divergence = "\(what()): the C device programmed flash it had not erased, or outside its slot"
        }
    }

    /// A control point write from `central` (nil: a stack that cannot tell centrals apart).
    public func control(_ bytes: [UInt8], from central: String?) -> [UInt8] {
        now &+= 1
        return call { out in otafd_control(device, bytes, bytes.count, token(central), now, out) }
    }

    /// A data write from `central`.
    public func data(_ bytes: [UInt8], from central: String?) -> [UInt8] {
        now &+= 1
        return call { out in otafd_data(device, bytes, bytes.count, token(central), now, out) }
    }

    /// The held CHECKPOINT's deadline passes: its `gap` reply, or nothing when none is held.
    public func expireHold() -> [UInt8] {
        var deadline: UInt32 = 0
        guard otafd_hold_deadline(device, &deadline) != 0 else { return [] }
        now = deadline
        return call { out in otafd_poll(device, now, out) }
    }

    public func linkLost() { otafd_link_lost(device) }

    /// Power cycle: the device starts again from its stored record and flash.
    public func reboot() {
        if otafd_init(device, &config) != 0, divergence == nil { divergence = "the C device did not come back from a reboot" }
    }

    /// Flash rot: flips bits of one slot byte.
    public func flip(at index: Int, mask: UInt8) {
        guard index >= 0, index < slotSize else { return }
        mem[index] ^= mask
    }

    /// Fails the flash operation (program or erase) after `count` more succeed.
    public func failFlash(afterOperations count: Int32) { nor.pointee.fail_after = count }

    public var rebootRequested: Bool { otafd_reboot_requested(device) != 0 }
    /// Flash accesses the NOR model refused: outside the slot, or a program of a byte not erased.
    public var violations: UInt32 { nor.pointee.violations }
    /// The NOR model's flash time so far.
    public var busyMicroseconds: UInt64 { nor.pointee.busy_us }
    public var erases: UInt32 { nor.pointee.erases }
    public var slot: [UInt8] { Array(UnsafeBufferPointer(start: mem, count: slotSize)) }

    public var info: [UInt8] {
        var out = [UInt8](repeating: 0, count: Int(OTAFD_INFO_SIZE))
        let n = otafd_info(device, &out)
        return Array(out.prefix(n))
    }
}

private func hex(_ bytes: [UInt8]) -> String {
    bytes.isEmpty ? "nothing" : bytes.map { ($0 < 16 ? "0" : "") + String($0, radix: 16) }.joined()
}
