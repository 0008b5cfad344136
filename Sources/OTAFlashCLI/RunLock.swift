import Foundation
import GATT
import Ledger

/// This run's mark on the machine (docs/LEDGER.md, "Claims"): a file named by the run's id,
/// locked (flock) by this process for its life, so that a later run of the same station can tell
/// a claim whose process is gone (the lock is free: a kill -9, a crash, a reboot) from one that
/// another live run holds, and take over the first at once instead of waiting for its lease.
/// The kernel releases the lock with the process, however it ends.
final class RunLock: Sendable {
    /// Where runs keep their locks: beside the default ledger (`$XDG_STATE_HOME/otaflash/runs`),
    /// kept across reboots, so that a run from before one is known to be gone.
    static var folder: String { (Ledger.defaultPath() as NSString).deletingLastPathComponent + "/runs" }

    let run: String
    private let fd: Int32

    /// Takes the lock of `run`; nil when the folder cannot be written (claims of this run then
    /// wait for their lease, as other stations' do).
    init?(run: String) {
        let folder = Self.folder
        try? FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
        Self.sweep(folder)
        let fd = open(folder + "/" + run + ".lock", O_RDWR | O_CREAT | O_CLOEXEC, 0o644)
        guard fd >= 0 else { return nil }
        guard flock(fd, LOCK_EX | LOCK_NB) == 0 else {
            close(fd)
            return nil
        }
        let pid = Array("\(getpid())\n".utf8)
        _ = ftruncate(fd, 0)
        _ = pid.withUnsafeBytes { pwrite(fd, $0.baseAddress, $0.count, 0) }
        self.run = run
        self.fd = fd
    }

    deinit { close(fd) }

    enum Holder: Equatable {
        /// A process of this machine runs it now (its pid, as it wrote it).
        case live(pid: Int32?)
        /// Its process has ended.
        case gone
        /// No run of this machine by that id (another machine under the same station name, or
        /// its lock could not be made): its claims wait for their lease.
        case unknown
    }

    /// Whether run `run` of this machine is alive. A lock taken to look is given back at once.
    static func holder(of run: String) -> Holder {
        guard !run.isEmpty, !run.contains("/") else { return .unknown }
        let path = folder + "/" + run + ".lock"
        let fd = open(path, O_RDWR | O_CLOEXEC)
        guard fd >= 0 else { return .unknown }
        defer { close(fd) }
        if flock(fd, LOCK_EX | LOCK_NB) == 0 {
            flock(fd, LOCK_UN)
            return .gone
        }
        var bytes = [UInt8](repeating: 0, count: 16)
        let n = bytes.withUnsafeMutableBytes { pread(fd, $0.baseAddress, $0.count, 0) }
        let pid = n > 0 ? Int32(String(decoding: bytes[..<n], as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)) : nil
        return .live(pid: pid)
    }

    /// Removes the locks of runs that ended over an hour ago (the longest lease): no claim of
    /// theirs can still be held.
    private static func sweep(_ folder: String) {
        guard let names = try? FileManager.default.contentsOfDirectory(atPath: folder) else { return }
        let old = Date().addingTimeInterval(-Ledger.leaseRange.upperBound.seconds - 60)
        for name in names where name.hasSuffix(".lock") {
            let path = folder + "/" + name
            guard let modified = (try? FileManager.default.attributesOfItem(atPath: path))?[.modificationDate] as? Date, modified < old else { continue }
            let fd = open(path, O_RDWR | O_CLOEXEC)
            guard fd >= 0 else { continue }
            if flock(fd, LOCK_EX | LOCK_NB) == 0 { unlink(path) }
            close(fd)
        }
    }
}
