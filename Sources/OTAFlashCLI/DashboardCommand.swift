import ArgumentParser
import Foundation
import Ledger
import LineServer
import OTACommandLine

/// `otaflash dashboard`: the line's live page, read from the ledger (docs/LINE.md).
struct DashboardCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "dashboard",
        abstract: "Serve the line's live page and its JSON, read from the ledger (docs/LINE.md).",
        usage: "otaflash dashboard [--ledger <path|url>] [<options>]",
        discussion: """
            Reads the ledger (never writes it) at most once a second; the page follows it every second, with no \
            internet: every asset is served here. JSON for scripts: /api/summary, /api/stations, \
            /api/devices?q=ADDRESS-OR-SERIAL&limit=N (N 1 to 1000, default 100). It listens on loopback unless told \
            otherwise; another address needs --token or --token-file, which the page then asks for. Ctrl-C, \
            SIGTERM or SIGHUP stop it (exit 0). Exit 2: a bad option, or an address it cannot listen on (a port \
            in use); 18: the ledger cannot be read when it starts. A ledger that goes away later is a line on \
            the page (and 503 from the JSON endpoints) until it is back.

            Examples:
              otaflash dashboard --ledger shift.sqlite
              otaflash dashboard --ledger 'postgres://line@db/otaflash' \\
                  --listen 0.0.0.0:8080 --token-file /etc/otaflash/dashboard.token
            """
    )

    static let tokenLength = Bounds("the token's length", 8...256, unit: " characters")

    @Option(name: .customLong("ledger"), help: ArgumentHelp("The ledger to show (default: $XDG_STATE_HOME/otaflash/ledger.sqlite).", valueName: "path|url"),
            completion: .file(extensions: ["sqlite"]))
    var ledger: String?

    @Option(help: ArgumentHelp("Where to listen: HOST:PORT, port 1-65535 (default 127.0.0.1:8080); an address other than loopback needs --token.", valueName: "host:port"))
    var listen: String = "127.0.0.1:8080"

    @Option(help: ArgumentHelp("The token the page and the JSON endpoints ask for (Authorization: Bearer TOKEN), 8 to 256 printable characters; --token-file keeps it out of ps.", valueName: "token"))
    var token: String?

    @Option(name: .customLong("token-file"), help: ArgumentHelp("A file whose first line is the token.", valueName: "file"), completion: .file())
    var tokenFile: String?

    mutating func validate() throws {
        if let ledger {
            do { try Ledger.check(ledger) } catch { throw ValidationError(error.message) }
        }
        let address: ListenAddress
        do { address = try ListenAddress(listen, option: "--listen") } catch { throw ValidationError(error.message) }
        if token != nil, tokenFile != nil { throw ValidationError("--token and --token-file both give the token: keep one") }
        if let tokenFile {
            guard let text = try? String(contentsOfFile: tokenFile, encoding: .utf8) else {
                throw ValidationError("--token-file \(tokenFile): cannot be read")
            }
            token = text.split(separator: "\n", omittingEmptySubsequences: false).first.map { $0.trimmingCharacters(in: .whitespaces) } ?? ""
        }
        if let token {
            try Self.tokenLength.check(token.count)
            if !token.unicodeScalars.allSatisfy({ (0x21...0x7E).contains($0.value) }) {
                throw ValidationError("the token must be printable ASCII without spaces")
            }
        } else if !address.isLoopback {
            throw ValidationError("--listen \(listen) is reachable from other machines: give --token or --token-file (the page then asks for it)")
        }
    }

    func run() async throws {
        let path = ledger ?? Ledger.defaultPath()
        guard Ledger.isServer(path) || FileManager.default.fileExists(atPath: path) else {
            throw CLIFailure(.ledgerFailed, "no ledger at \(path): nothing was recorded there yet (a station records to it; --ledger PATH names another)")
        }
        let dashboard = Dashboard(location: path, token: token)
        do throws(LedgerError) {
            try await dashboard.read()
        } catch {
            await dashboard.close()
            throw CLIFailure(error)
        }
        let address = try ListenAddress(listen, option: "--listen")
        let listener: HTTPListener
        do throws(ListenerError) {
            listener = try await HTTPListener.start(dashboard.router(), on: address, option: "--listen")
        } catch {
            await dashboard.close()
            throw CLIFailure(.usage, error.message)
        }
        let out = CLIContext.output
        let host = address.host == "0.0.0.0" || address.host == "::" ? "HOST" : address.description
        out.out("http://\(host == "HOST" ? "HOST:\(address.port)" : host)/\n")
        out.err("otaflash dashboard: the ledger \(path.redactingPassword) at http://\(host == "HOST" ? "HOST:\(address.port)" : host)/ \(token == nil ? "" : "(token required) ")(Ctrl-C stops it)\n")
        let stop = AsyncStream<Void>.makeStream()
        let interrupts = InterruptHandler { _ in stop.continuation.finish() }
        for await _ in stop.stream {}
        interrupts.cancel()
        await listener.stop()
        await dashboard.close()
    }
}
