import Foundation
import Hummingbird
import Logging
import Synchronization

/// A `--metrics` or `--listen` value: `HOST:PORT`, an IPv4 address, `localhost` or `[IPv6]`, and a
/// port 1 to 65535.
public struct ListenAddress: Sendable, Hashable, CustomStringConvertible {
    public var host: String
    public var port: Int

    public static let portRange = 1...65_535

    /// Parses `text`; the error is one line naming `option`.
    public init(_ text: String, option: String) throws(ListenerError) {
        let host: Substring
        let port: Substring
        if text.hasPrefix("[") {
            guard let close = text.firstIndex(of: "]"), text[close...].hasPrefix("]:") else {
                throw ListenerError("\(option) \(text): give [IPv6]:PORT, e.g. [::1]:8080")
            }
            host = text[text.index(after: text.startIndex)..<close]
            port = text[text.index(close, offsetBy: 2)...]
        } else {
            guard let colon = text.lastIndex(of: ":"), !text[..<colon].contains(":") else {
                throw ListenerError("\(option) \(text): give HOST:PORT, e.g. 127.0.0.1:8080")
            }
            host = text[..<colon]
            port = text[text.index(after: colon)...]
        }
        guard let number = Int(port), Self.portRange.contains(number) else {
            throw ListenerError("\(option) \(text): the port must be \(Self.portRange.lowerBound) to \(Self.portRange.upperBound)")
        }
        let name = String(host)
        guard name == "localhost" || Self.isIPv4(name) || (name.contains(":") && name.allSatisfy { $0.isHexDigit || $0 == ":" || $0 == "." }) else {
            throw ListenerError("\(option) \(text): the host must be an IP address (127.0.0.1, 0.0.0.0, [::1]) or localhost")
        }
        self.host = name == "localhost" ? "127.0.0.1" : name
        self.port = number
    }

    static func isIPv4(_ s: String) -> Bool {
        let parts = s.split(separator: ".", omittingEmptySubsequences: false)
        return parts.count == 4 && parts.allSatisfy { p in !p.isEmpty && p.count <= 3 && p.allSatisfy(\.isNumber) && Int(p)! <= 255 }
    }

    /// Only this machine can connect: 127.0.0.0/8 or ::1.
    public var isLoopback: Bool { host.hasPrefix("127.") || host == "::1" }

    public var description: String { host.contains(":") ? "[\(host)]:\(port)" : "\(host):\(port)" }
}

/// A listener that could not start, or an address that is not one: one line.
public struct ListenerError: Error, Sendable, CustomStringConvertible {
    public let message: String
    public init(_ message: String) { self.message = message }
    public var description: String { message }
}

/// An HTTP server on one address, running until `stop()`: started only once it listens, so a port
/// in use is an error before anything else happens.
public final class HTTPListener: Sendable {
    /// The longest the socket may take to be bound (a loaded machine takes seconds to start the server).
    public static let startTimeout: Duration = .seconds(30)

    private let task: Task<Void, Never>
    /// The port it listens on (the one asked for).
    public let address: ListenAddress

    private init(task: Task<Void, Never>, address: ListenAddress) {
        self.task = task
        self.address = address
    }

    /// Starts `router` on `address`; returns once the socket is bound, or throws why it could not
    /// be (`option` names it: "--metrics 127.0.0.1:9464: the port is in use …").
    public static func start(_ router: Router<BasicRequestContext>, on address: ListenAddress, option: String) async throws(ListenerError) -> HTTPListener {
        let outcome = Outcome()
        // Nothing otaflash serves is written through: any other method than GET (or HEAD) is one line, 405.
        let routes = router.buildResponder()
        let readOnly = CallbackResponder<BasicRequestContext> { request, context in
            guard request.method == .get || request.method == .head else { return Self.methodNotAllowed }
            return try await routes.respond(to: request, context: context)
        }
        let app = Application(responder: readOnly, configuration: .init(address: .hostname(address.host, port: address.port), serverName: "otaflash"),
                              onServerRunning: { _ in outcome.settle(nil) },
                              logger: Logger(label: "otaflash.http", factory: { _ in SwiftLogNoOpLogHandler() }))
        let task = Task {
            do {
                try await app.run()
                outcome.settle("stopped before it listened")
            } catch {
                outcome.settle(Self.explain(error, address: address))
            }
        }
        if let failure = await outcome.wait(timeout: startTimeout) {
            task.cancel()
            throw ListenerError("\(option) \(address): \(failure)")
        }
        return HTTPListener(task: task, address: address)
    }

    static var methodNotAllowed: Response {
        Response(status: .methodNotAllowed, headers: [.contentType: "application/json", .allow: "GET"],
                 body: ResponseBody(byteBuffer: ByteBuffer(string: #"{"error":"otaflash serves this for reading only: it has no write endpoint (GET only)"}"#)))
    }

    /// How long `stop()` waits for the connections in progress to close.
    public static let stopTimeout: Duration = .seconds(5)

    /// Stops listening; connections in progress are closed (waited for up to `stopTimeout`).
    public func stop() async {
        task.cancel()
        let stopped = Outcome()
        let task = task
        Task {
            await task.value
            stopped.settle(nil)
        }
        _ = await stopped.wait(timeout: Self.stopTimeout)
    }

    static func explain(_ error: any Error, address: ListenAddress) -> String {
        let text = "\(error)"
        if text.contains("Address already in use") || text.contains("EADDRINUSE") {
            return "the port \(address.port) is in use by another program; choose another port, or stop that program"
        }
        if text.contains("Cannot assign requested address") || text.contains("EADDRNOTAVAIL") {
            return "this machine has no address \(address.host); give one of its addresses, 127.0.0.1, or 0.0.0.0"
        }
        if text.contains("Permission denied") || text.contains("EACCES") {
            return "not allowed to listen on port \(address.port) (below 1024 needs privileges); choose a port from 1024"
        }
        return "cannot listen: \(text)"
    }

    /// The listener's start: nil once it listens, else why not. The first answer counts.
    final class Outcome: Sendable {
        private struct State {
            var result: String??
            var waiter: CheckedContinuation<String?, Never>?
        }

        private let state = Mutex(State())

        func settle(_ failure: String?) {
            let waiter = state.withLock { s -> CheckedContinuation<String?, Never>? in
                guard s.result == nil else { return nil }
                s.result = .some(failure)
                defer { s.waiter = nil }
                return s.waiter
            }
            waiter?.resume(returning: failure)
        }

        func wait(timeout: Duration) async -> String? {
            let timer = Task {
                try? await Task.sleep(for: timeout)
                settle("the socket was not bound within \(Int(timeout.components.seconds)) s")
            }
            defer { timer.cancel() }
            return await withCheckedContinuation { c in
                let ready = state.withLock { s -> String?? in
                    if let result = s.result { return .some(result) }
                    s.waiter = c
                    return nil
                }
                if let ready { c.resume(returning: ready) }
            }
        }
    }
}

extension HTTPListener {
    /// `station --metrics`: `GET /metrics` answers the exposition; anything else is 404.
    public static func metrics(_ registry: StationMetrics, on address: ListenAddress) async throws(ListenerError) -> HTTPListener {
        let router = Router()
        router.get("/metrics") { _, _ -> Response in
            let text = await registry.exposition()
            return Response(status: .ok, headers: [.contentType: "text/plain; version=0.0.4; charset=utf-8"],
                            body: ResponseBody(byteBuffer: ByteBuffer(string: text)))
        }
        return try await start(router, on: address, option: "--metrics")
    }
}
