import Foundation

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// A private PostgreSQL server for one test process (scripts/pg-server): a cluster in a temp
/// folder, on a free loopback port, password authentication. Started once, on first use, and
/// stopped when the process ends, however it ends (scripts/pg-server watches it); each test
/// takes a database of its own (`database()`).
public final class PostgresServer: Sendable {
    /// `postgres://otaflash:PASSWORD@127.0.0.1:PORT/otaflash`.
    public let url: String
    public let port: Int
    public let password: String
    private let folder: String

    /// scripts/pg-server in this checkout.
    public static let script = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent().appendingPathComponent("scripts/pg-server").path

    /// The server's bin folder (Debian: /usr/lib/postgresql/VERSION/bin), newest version first.
    public static let bin: Result<String, HarnessError> = {
        let root = "/usr/lib/postgresql"
        let versions = ((try? FileManager.default.contentsOfDirectory(atPath: root)) ?? [])
            .sorted { $0.compare($1, options: .numeric) == .orderedDescending }
        for version in versions where access("\(root)/\(version)/bin/initdb", X_OK) == 0 {
            if getuid() == 0, getpwnam("postgres") == nil {
                return .failure(HarnessError("PostgreSQL refuses to run as root and there is no postgres user (apt-get install postgresql makes one)"))
            }
            return .success("\(root)/\(version)/bin")
        }
        return .failure(HarnessError("the PostgreSQL server is not installed (apt-get install postgresql, or run scripts/deps.sh)"))
    }()

    /// The process's server, started on first use.
    public static let shared: Result<PostgresServer, HarnessError> = {
        do {
            _ = try bin.get()
            return .success(try PostgresServer(password: "pw-" + String(UInt32.random(in: 0...UInt32.max), radix: 16)))
        } catch let error as HarnessError {
            return .failure(error)
        } catch {
            return .failure(HarnessError("\(error)"))
        }
    }()

    /// Starts a server of its own, stopped by `stop()` or when this process ends.
    public init(password: String) throws {
        folder = NSTemporaryDirectory() + "otaflash-pg-" + UUID().uuidString.prefix(8)
        let child = try SpawnedProcess.spawn(["/usr/bin/env", "OTAFLASH_PG_OWNER=\(getpid())", Self.script, "start", folder, password],
                                             stderrPath: folder + ".log")
        let lines = child.remainingLines(timeoutMilliseconds: 120_000)
        if lines == nil { child.stop() }
        let status = child.waitForExit()
        let why = (try? String(contentsOfFile: folder + ".log", encoding: .utf8)) ?? ""
        try? FileManager.default.removeItem(atPath: folder + ".log")
        guard let url = lines?.last, exitCode(ofWaitStatus: status) == 0, let port = URLComponents(string: url)?.port else {
            throw HarnessError("scripts/pg-server start failed: \(why.trimmingCharacters(in: .whitespacesAndNewlines))")
        }
        self.url = url
        self.port = port
        self.password = password
    }

    /// Stops the server (immediately) and removes its folder.
    public func stop() {
        _ = runToCompletion([Self.script, "stop", folder], timeoutMilliseconds: 70_000)
    }

    /// A new, empty database on the server; its URL. Each statement may take `statementTimeout`
    /// seconds (nil: the ledger's default): the tests run hundreds at once on two cores, where an
    /// answer can wait longer for a thread than a factory's would, and they check what is
    /// written, not how fast.
    public func database(_ prefix: String = "t", statementTimeout: Int? = 120) throws -> String {
        let name = prefix + "_" + UUID().uuidString.replacingOccurrences(of: "-", with: "").prefix(12).lowercased()
        try psql("CREATE DATABASE \(name)")
        let base = url.lastIndex(of: "/").map { String(url[..<$0]) } ?? url
        return base + "/" + name + (statementTimeout.map { "?statement_timeout=\($0)" } ?? "")
    }

    /// Runs one SQL command through psql as the cluster's superuser.
    public func psql(_ sql: String, database: String = "postgres") throws {
        let bin = try Self.bin.get()
        let status = runToCompletion(["/usr/bin/env", "PGPASSWORD=" + password, bin + "/psql", "-h", "127.0.0.1", "-p", "\(port)", "-U", "otaflash", "-d", database,
                                      "-v", "ON_ERROR_STOP=1", "-q", "-c", sql])
        guard status == 0 else { throw HarnessError("psql -c \"\(sql)\" exited \(status)") }
    }
}

/// A free loopback port, for "a server that is down": bound at the kernel's choice, then closed.
public func freeLoopbackPort() throws -> Int {
    try SilentListener().port
}

/// A TCP socket listening on loopback that never accepts: connections complete (the kernel's
/// backlog) and nothing is ever answered, as a server that hangs.
public final class SilentListener {
    private let fd: Int32
    public let port: Int

    public init() throws {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, length) == 0 && getsockname(fd, $0, &length) == 0 }
        }
        guard fd >= 0, bound, listen(fd, 8) == 0 else {
            let why = String(cString: strerror(errno))
            if fd >= 0 { close(fd) }
            throw HarnessError("cannot listen on loopback: \(why)")
        }
        self.fd = fd
        port = Int(UInt16(bigEndian: address.sin_port))
    }

    deinit { close(fd) }
}
