import Foundation
import GRDB
@testable import Ledger
import Testing

/// A fresh folder for one test's ledger files, removed at the end.
final class Folder {
    let path: String
    init() throws {
        path = NSTemporaryDirectory() + "otaflash-ledger-" + UUID().uuidString
        try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
    }
    deinit { try? FileManager.default.removeItem(atPath: path) }
}

/// A small filesystem of its own (tmpfs, as root) at `path`, unmounted at the end; without root,
/// a plain folder whose modes stand in for a read-only mount, and whose "full" is not available.
final class SmallMount {
    let path: String
    private let mounted: Bool

    init(at path: String, bytes: Int) throws {
        self.path = path
        try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
        mounted = getuid() == 0
        if mounted { try Self.run("/bin/mount", ["-t", "tmpfs", "-o", "size=\(bytes)", "tmpfs", path]) }
    }

    func makeReadOnly() throws {
        if mounted {
            try Self.run("/bin/mount", ["-o", "remount,ro", path])
        } else {
            for file in (try? FileManager.default.contentsOfDirectory(atPath: path)) ?? [] { chmod(path + "/" + file, 0o444) }
            chmod(path, 0o555)
        }
    }

    deinit {
        if mounted { try? Self.run("/bin/umount", [path]) } else { chmod(path, 0o755) }
    }

    static func run(_ tool: String, _ arguments: [String]) throws {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: tool)
        process.arguments = arguments
        try process.run()
        process.waitUntilExit()
        guard process.terminationStatus == 0 else {
            throw CocoaError(.fileWriteUnknown, userInfo: [NSLocalizedDescriptionKey: "\(tool) \(arguments.joined(separator: " ")) exited \(process.terminationStatus)"])
        }
    }
}

func record(_ device: String, result: LedgerResult = .ok, at second: Int = 0, seconds: Double = 10, station: String = "st1",
            adapter: String? = "hci0", serial: String? = nil, error: String? = nil) -> LedgerRecord {
    let start = LedgerRecord.timestamp(Date(timeIntervalSince1970: 1_800_000_000 + Double(second)))
    let end = LedgerRecord.timestamp(Date(timeIntervalSince1970: 1_800_000_000 + Double(second) + seconds))
    return LedgerRecord(runID: "run", startedAt: start, endedAt: end, station: station, adapter: adapter, device: device,
                        serialNumber: serial, protocolName: "native", imageName: "app.bin", imageSize: 4096,
                        imageSHA256: String(repeating: "ab", count: 32), bytesSent: 4096, seconds: seconds, rate: 4096 / seconds,
                        result: result, exitCode: result == .ok ? 0 : 8, errorCode: error ?? (result == .ok ? nil : "verify_failed"),
                        message: result == .ok ? nil : "failed", otaflashVersion: "0.1.0", otaflashCommit: "abc1234")
}

@Suite("Ledger: SQLite")
struct SQLiteLedgerTests {
    @Test func aRecordIsReadBackWithEveryField() async throws {
        let folder = try Folder()
        let path = folder.path + "/nested/ledger.sqlite"
        let ledger = try SQLiteLedger(path: path)
        try await ledger.prepare(station: "st1")
        var written = record("AA:BB:CC:DD:EE:01", serial: "SN1")
        written.operator = "ana"
        written.bootloaderAddress = "AA:BB:CC:DD:EE:02"
        written.firmwareBefore = "1.0.0"
        written.firmwareAfter = "2.0.0"
        written.imageVersion = "2.0.0"
        let id = try await ledger.append(written)
        await ledger.close()

        // A new process (a new store on the same file) sees it: it was committed.
        let again = try SQLiteLedger(path: path)
        let rows = try await again.records(LedgerQuery())
        written.id = id
        #expect(rows == [written])
    }

    @Test func timestampsAreUTCWithMilliseconds() {
        let text = LedgerRecord.timestamp(Date(timeIntervalSince1970: 1_800_000_000.25))
        #expect(text == "2027-01-15T08:00:00.250Z")
    }

    @Test func queriesFilterAsTheReferenceDoes() async throws {
        let folder = try Folder()
        let ledger = try SQLiteLedger(path: folder.path + "/l.sqlite")
        let all = [record("AA:00:00:00:00:01", at: 0, serial: "S1"),
                   record("AA:00:00:00:00:02", result: .error, at: 60, station: "st2", serial: "S2"),
                   record("aa:00:00:00:00:02", at: 120, station: "st2", serial: "S2"),
                   record("AA:00:00:00:00:03", result: .skipped, at: 180, adapter: nil)]
        var stored: [LedgerRecord] = []
        for var r in all {
            r.id = try await ledger.append(r)
            stored.append(r)
        }
        let queries = [
            LedgerQuery(), LedgerQuery(since: all[1].startedAt), LedgerQuery(until: all[1].startedAt),
            LedgerQuery(device: "AA:00:00:00:00:02"), LedgerQuery(serialNumber: "S2"), LedgerQuery(result: .error),
            LedgerQuery(image: "app.bin"), LedgerQuery(image: "abababab"), LedgerQuery(image: "cdcdcdcd"),
            LedgerQuery(station: "st2"), LedgerQuery(station: "st2", limit: 1), LedgerQuery(limit: 2),
        ]
        for query in queries {
            var expected = stored.filter(query.matches)
            if let limit = query.limit { expected = Array(expected.suffix(limit)) }
            #expect(try await ledger.records(query) == expected, "\(query)")
        }
        #expect(try await ledger.records(LedgerQuery(device: "aa:00:00:00:00:02")).count == 2)
    }

    @Test func aResultOtaflashDoesNotWriteReadsBackAsItsTextAndTheCheckFindsIt() async throws {
        let folder = try Folder()
        let ledger = try SQLiteLedger(path: folder.path + "/l.sqlite")
        var odd = record("AA:00:00:00:00:05", result: LedgerResult(rawValue: "maybe"))
        odd.id = try await ledger.append(odd)
        #expect(try await ledger.records(LedgerQuery()) == [odd])
        let column = try await ledger.queue.read { db in try String.fetchOne(db, sql: "SELECT result FROM attempts") }
        #expect(column == "maybe")
        let json = try JSONEncoder().encode(odd)
        #expect(String(decoding: json, as: UTF8.self).contains(#""result":"maybe""#))
        #expect(try JSONDecoder().decode(LedgerRecord.self, from: json) == odd)
        let check = LedgerCheck(records: [odd], allRecords: [odd], claims: [], now: odd.endedAt)
        #expect(check.findings.map(\.kind) == [.countsDoNotAddUp], "\(check.findings)")
        #expect(check.findings.first?.line.contains("a result other than ok, skipped, error, bond_left") == true)
    }

    @Test func aFileThatIsNoLedgerIsRefusedAsCorrupt() throws {
        let folder = try Folder()
        let path = folder.path + "/junk.sqlite"
        try Data(repeating: 0x41, count: 4096).write(to: URL(fileURLWithPath: path))
        #expect(throws: LedgerError.self) { try SQLiteLedger(path: path) }
        do {
            _ = try SQLiteLedger(path: path)
        } catch {
            #expect(error.kind == .corrupt)
            #expect(error.message.contains(path) && error.message.contains("move it aside"))
        }
    }

    /// Read-only (a remounted tmpfs as root, who writes through file modes; file modes otherwise):
    /// `prepare`, which runs before any flash, fails as `readOnly`.
    @Test func aReadOnlyLedgerFailsItsPrepareBeforeAnyFlash() async throws {
        let folder = try Folder()
        let mount = try SmallMount(at: folder.path + "/m", bytes: 1 << 20)
        let path = mount.path + "/l.sqlite"
        let ledger = try SQLiteLedger(path: path)
        try await ledger.prepare(station: "st")
        await ledger.close()
        try mount.makeReadOnly()
        do {
            let reopened = try SQLiteLedger(path: path)
            try await reopened.prepare(station: "st")
            Issue.record("a read-only ledger took a write")
        } catch {
            #expect(error.kind == .readOnly || error.kind == .cannotOpen, "\(error)")
            #expect(error.message.contains("--ledger"))
        }
    }

    /// A full disk: the record that does not fit fails as `full`, and those before it stay.
    @Test(.enabled(if: getuid() == 0, "a full disk needs a small tmpfs, which only root can mount"))
    func aFullDiskFailsTheRecordThatDoesNotFit() async throws {
        let folder = try Folder()
        let mount = try SmallMount(at: folder.path + "/m", bytes: 256 << 10)
        let ledger = try SQLiteLedger(path: mount.path + "/l.sqlite")
        var written = 0
        var failure: LedgerError?
        var big = record("AA:00:00:00:00:01")
        big.message = String(repeating: "x", count: 8 << 10)
        while failure == nil, written < 1000 {
            do {
                try await ledger.append(big)
                written += 1
            } catch {
                failure = error
            }
        }
        #expect(failure?.kind == .full, "\(String(describing: failure))")
        #expect(written > 0)
        #expect(try await ledger.records(LedgerQuery()).count == written)
    }

    @Test func aLedgerOfANewerSchemaIsRefused() async throws {
        let folder = try Folder()
        let path = folder.path + "/l.sqlite"
        let ledger = try SQLiteLedger(path: path)
        await ledger.close()
        // What a newer otaflash would leave: a migration this one does not know.
        let shell = Process()
        shell.executableURL = URL(fileURLWithPath: "/usr/bin/sqlite3")
        shell.arguments = [path, "INSERT INTO grdb_migrations VALUES ('v\(Ledger.schemaVersion + 1)')"]
        guard FileManager.default.isExecutableFile(atPath: "/usr/bin/sqlite3") else {
            Issue.record("sqlite3 is not installed (scripts/deps.sh installs it)")
            return
        }
        try shell.run()
        shell.waitUntilExit()
        #expect(shell.terminationStatus == 0)
        #expect {
            _ = try SQLiteLedger(path: path)
        } throws: { error in
            (error as? LedgerError)?.kind == .newerSchema
        }
    }
}

@Suite("Ledger: summary")
struct LedgerSummaryTests {
    @Test func yieldsTimesAndFailuresOfAShift() {
        let records = [
            record("D1", at: 0, seconds: 10), record("D2", result: .error, at: 1, seconds: 3, error: "timeout"),
            record("D2", at: 30, seconds: 12, station: "st2"), record("D3", result: .error, at: 2, seconds: 4, adapter: "hci1"),
            record("D4", result: .skipped, at: 3, seconds: 1), record("D5", at: 4, seconds: 20),
        ]
        let summary = LedgerSummary(records)
        #expect(summary.attempts == 6)
        #expect(summary.devices == 5)
        #expect(summary.firstPassYield == 3.0 / 5)   // D1, D4 (skipped counts), D5
        #expect(summary.finalYield == 4.0 / 5)       // D2 recovered; D3 did not
        #expect(summary.medianSeconds == 12)         // ok: 10, 12, 20
        #expect(summary.p95Seconds == 20)
        #expect(summary.failuresByErrorCode.map(\.errorCode) == ["timeout", "verify_failed"])
        #expect(summary.stations.map(\.name) == ["st1", "st2"])
        #expect(summary.stations.first { $0.name == "st2" }?.ok == 1)
        #expect(summary.adapters.first { $0.name == "hci1" }?.failed == 1)
    }

    @Test func anEmptyShiftHasNoTimes() {
        let summary = LedgerSummary([])
        #expect(summary.devices == 0 && summary.medianSeconds == nil && summary.firstPassYield == 0)
    }

    @Test func theDefaultPathFollowsXDG() {
        #expect(Ledger.defaultPath(environment: ["XDG_STATE_HOME": "/s", "HOME": "/h"]) == "/s/otaflash/ledger.sqlite")
        #expect(Ledger.defaultPath(environment: ["XDG_STATE_HOME": "rel", "HOME": "/h"]) == "/h/.local/state/otaflash/ledger.sqlite")
        #expect(Ledger.defaultPath(environment: ["HOME": "/h"]) == "/h/.local/state/otaflash/ledger.sqlite")
    }
}

/// A SQLite ledger on a network filesystem: SQLite's write-ahead log does not work there, and a
/// failure to open one says so (the mount table read as /proc/self/mounts gives it).
@Suite("A ledger on a network filesystem")
struct NetworkFilesystemTests {
    static let mounts = """
        /dev/vda1 / ext4 rw,relatime 0 0
        tmpfs /tmp tmpfs rw 0 0
        host0 /run/otaflash 9p rw,trans=virtio 0 0
        server:/export /mnt/line nfs4 rw 0 0
        //nas/share /mnt/nas\\040box cifs rw 0 0
        """

    @Test(arguments: [("/run/otaflash/results/state/ledger.sqlite", "9p"), ("/mnt/line/ledger.sqlite", "NFS"),
                      ("/mnt/nas box/a/ledger.sqlite", "SMB"), ("/tmp/ledger.sqlite", nil), ("/home/ana/ledger.sqlite", nil),
                      ("/run/otaflashy/ledger.sqlite", nil)] as [(String, String?)])
    func theFilesystemIsFoundFromTheLongestMountAbove(path: String, network: String?) {
        #expect(SQLiteLedger.networkFilesystem(of: path, mounts: Self.mounts) == network)
    }
}
