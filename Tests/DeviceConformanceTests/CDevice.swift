import COTADevice

/// The C device library (Sources/COTADevice) over the NOR flash model, driven from Swift.
///
/// The C structs hold pointers to each other (the flash interface's context is the model), so they
/// live in manually allocated memory that does not move.
final class CDevice {
    let slotSize: Int
    private let mem: UnsafeMutablePointer<UInt8>
    private let writable: UnsafeMutablePointer<UInt8>
    let nor: UnsafeMutablePointer<otafd_nor>
    let store: UnsafeMutablePointer<otafd_ram_store>
    let device: UnsafeMutablePointer<otafd_device>
    private var config = otafd_config()
    /// The device's millisecond clock; `expireHold` moves it past the hold.
    private(set) var now: UInt32 = 0

    struct Setup {
        var slotSize = 64 * 1024
        var eraseUnit = 4096
        var reorderCapacity = 16 * 1024
        var reorderRanges = 8
        var holdMs: UInt16 = 300
        var eraseMicroseconds: UInt32 = 85_000
        var wordMicroseconds: UInt32 = 40
        var initialVersion: UInt32 = 0x0100_0000
    }

    init(_ setup: Setup) {
        slotSize = setup.slotSize
        mem = .allocate(capacity: setup.slotSize)
        writable = .allocate(capacity: setup.slotSize)
        nor = .allocate(capacity: 1)
        store = .allocate(capacity: 1)
        device = .allocate(capacity: 1)
        otafd_nor_init(nor, mem, writable, UInt32(setup.slotSize), UInt32(setup.eraseUnit),
                       setup.eraseMicroseconds, setup.wordMicroseconds)
        store.initialize(to: otafd_ram_store())
        device.initialize(to: otafd_device())
        config.flash = otafd_nor_flash(nor)
        config.store = otafd_ram_store_interface(store)
        config.reorder_capacity = UInt32(setup.reorderCapacity)
        config.reorder_ranges = UInt8(setup.reorderRanges)
        config.hold_ms = setup.holdMs
        config.initial_version = setup.initialVersion
        precondition(otafd_init(device, &config) == 0, "the test's configuration is valid")
    }

    deinit {
        mem.deallocate()
        writable.deallocate()
        nor.deallocate()
        store.deallocate()
        device.deallocate()
    }

    func control(_ bytes: [UInt8], from central: UInt32) -> [UInt8] {
        now += 1
        return call { out in otafd_control(device, bytes, bytes.count, central, now, out) }
    }

    func data(_ bytes: [UInt8], from central: UInt32) -> [UInt8] {
        now += 1
        return call { out in otafd_data(device, bytes, bytes.count, central, now, out) }
    }

    /// The held CHECKPOINT's deadline passes.
    func expireHold() -> [UInt8] {
        var deadline: UInt32 = 0
        guard otafd_hold_deadline(device, &deadline) != 0 else { return [] }
        now = deadline
        return call { out in otafd_poll(device, now, out) }
    }

    func linkLost() { otafd_link_lost(device) }

    /// Power cycle: the device starts again from its stored record and flash.
    func reboot() {
        precondition(otafd_init(device, &config) == 0)
    }

    var info: [UInt8] {
        var out = [UInt8](repeating: 0, count: Int(OTAFD_INFO_SIZE))
        let n = otafd_info(device, &out)
        return Array(out.prefix(n))
    }

    var rebootRequested: Bool { otafd_reboot_requested(device) != 0 }
    var violations: UInt32 { nor.pointee.violations }
    var busyMicroseconds: UInt64 { nor.pointee.busy_us }
    var erases: UInt32 { nor.pointee.erases }
    var slot: [UInt8] { Array(UnsafeBufferPointer(start: mem, count: slotSize)) }

    private func call(_ body: (UnsafeMutablePointer<UInt8>) -> Int) -> [UInt8] {
        var out = [UInt8](repeating: 0, count: Int(OTAFD_NOTIFY_MAX))
        let n = out.withUnsafeMutableBufferPointer { $0.baseAddress.map(body) ?? 0 }
        return Array(out.prefix(n))
    }
}
