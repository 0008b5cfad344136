import Foundation
#if canImport(Glibc)
import Glibc
#endif
import Hummingbird
import Ledger
import LineView
import Synchronization

/// `otaflash dashboard`: the line's live page and its JSON, read from the ledger (never written).
/// The ledger is read at most once a second, whatever the number of viewers; the page asks for
/// its content every second, so it is at most two seconds behind the ledger (docs/LINE.md).
public final class Dashboard: Sendable {
    /// How old a reading of the ledger may be before a request reads it again.
    public static let freshness: Duration = .seconds(1)
    /// `/api/devices`' `limit`: its default and its range.
    public static let deviceLimit = 100
    public static let deviceLimitRange = 1...1000
    /// The longest `q` of `/api/devices`.
    public static let queryLength = 64

    let reader: LedgerReader
    /// The token requests must carry (`Authorization: Bearer …`); nil on loopback without `--token`.
    let token: String?
    let title: String

    public init(location: String, token: String?, title: String = "otaflash line") {
        reader = LedgerReader(location: location)
        self.token = token
        self.title = title
    }

    /// A reading of the ledger: the model, and the last attempt of each device (for the search).
    struct Snapshot: Sendable {
        let model: LineModel
        let devices: [DeviceRow]
        let heartbeats: [StationHeartbeat]
        let readAt: String
    }

    /// A device as `/api/devices` lists it: its last attempt.
    struct DeviceRow: Sendable, Codable {
        var device: String
        var serialNumber: String?
        var station: String
        var result: String
        var errorCode: String?
        var attempts: Int
        var startedAt: String
        var endedAt: String
        var firmwareAfter: String?
        var message: String?
    }

    /// Reads the ledger (at most once per `freshness`; concurrent requests share one reading):
    /// only the records it has not read (`LineFollower`); the model is drawn again only when
    /// one came, the stations every time.
    actor LedgerReader {
        let location: String
        private var store: (any LedgerStore)?
        private var follower = LineFollower()
        /// The model and the device rows of `follower`'s records.
        private var drawn: (model: LineModel, devices: [DeviceRow])?
        private var last: (at: ContinuousClock.Instant, result: Result<Snapshot, LedgerError>)?
        private var reading: Task<Result<Snapshot, LedgerError>, Never>?

        init(location: String) {
            self.location = location
            Self.mapLargeBlocks()
        }

        func snapshot() async -> Result<Snapshot, LedgerError> {
            if let last, ContinuousClock.now - last.at < Dashboard.freshness { return last.result }
            if let reading { return await reading.value }
            let task = Task { await read() }
            reading = task
            let result = await task.value
            reading = nil
            last = (ContinuousClock.now, result)
            return result
        }

        private func read() async -> Result<Snapshot, LedgerError> {
            // A file deleted or moved under the dashboard: SQLite would go on reading the old one.
            if !Ledger.isServer(location), !FileManager.default.fileExists(atPath: location) {
                await forget()
                return .failure(LedgerError(.cannotOpen, "the ledger \(location) is gone (deleted or moved); the page shows the line again once it is back"))
            }
            do throws(LedgerError) {
                let store: any LedgerStore
                if let open = self.store {
                    store = open
                } else {
                    // A ledger opened again may be another one (a file put back, a server restored):
                    // it is read from its start.
                    store = try Ledger.open(location)
                    self.store = store
                    follower = LineFollower()
                    drawn = nil
                }
                let new = try await store.records(follower.query)
                let heartbeats = try await store.heartbeats()
                if follower.take(new) || drawn == nil {
                    drawn = Self.draw(follower.records)
                    Self.giveBackFreedMemory()
                }
                let stations = heartbeats.map { beat in
                    LineModel.Station(name: beat.station, alive: beat.alive, lastBeatSeconds: beat.age, adapters: beat.adapters,
                                      inProgress: beat.inProgress, claimsHeld: beat.claimsHeld)
                }
                let drawn = self.drawn ?? Self.draw([])
                return .success(Snapshot(model: drawn.model.with(stations: stations), devices: drawn.devices, heartbeats: heartbeats,
                                         readAt: LedgerRecord.timestamp(Date())))
            } catch {
                if error.kind == .unreachable || error.kind == .corrupt || error.kind == .cannotOpen { await forget() }
                return .failure(error)
            }
        }

        /// The model of `records` and their devices, each by its last attempt, the newest first.
        static func draw(_ records: [LedgerRecord]) -> (model: LineModel, devices: [DeviceRow]) {
            var last: [String: Int] = [:]
            for (i, r) in records.enumerated() where !r.isEncounter {
                let key = r.device.uppercased()
                if let seen = last[key], LedgerSummary.chronological(r, records[seen]) { continue }
                last[key] = i
            }
            let devices = last.values.sorted { records[$0].endedAt > records[$1].endedAt }.map { i in
                let r = records[i]
                return DeviceRow(device: r.device, serialNumber: r.serialNumber, station: r.station, result: r.result.rawValue, errorCode: r.errorCode,
                                 attempts: r.attempts, startedAt: r.startedAt, endedAt: r.endedAt, firmwareAfter: r.firmwareAfter, message: r.message)
            }
            return (LineModel(records: records), devices)
        }

        /// Drawing a model allocates and frees several times the records' size; left to glibc, the
        /// dashboard's resident size follows the largest drawing, not what it holds
        /// (scripts/dashboard-bench --shift). glibc serves a block over its mmap threshold from a
        /// mapping of its own, given back when freed, but raises the threshold to the largest block
        /// freed (up to 32 MiB), after which a drawing's arrays come from the heap and stay there.
        /// A fixed threshold of 1 MiB keeps them mapped (mallopt(M_MMAP_THRESHOLD = -3, …), malloc.h).
        static func mapLargeBlocks() {
            #if canImport(Glibc)
            if let mallopt = dlsym(nil, "mallopt") {
                _ = unsafeBitCast(mallopt, to: (@convention(c) (Int32, Int32) -> Int32).self)(-3, 1 << 20)
            }
            #endif
        }

        /// Gives back to the system what a drawing freed below the threshold (malloc_trim).
        static func giveBackFreedMemory() {
            #if canImport(Glibc)
            // malloc.h is not in the Glibc module: found by name (RTLD_DEFAULT is 0).
            if let trim = dlsym(nil, "malloc_trim") {
                _ = unsafeBitCast(trim, to: (@convention(c) (Int) -> Int32).self)(0)
            }
            #endif
        }

        /// Closes the ledger and forgets what was read of it.
        private func forget() async {
            await store?.close()
            store = nil
            follower = LineFollower()
            drawn = nil
        }

        func close() async { await forget() }
    }

    // MARK: - HTTP

    /// The dashboard's routes: the page, its content, and the JSON endpoints. Only GET: nothing is written.
    public func router() -> Router<BasicRequestContext> {
        let router = Router()
        router.get("/") { [self] _, _ -> Response in
            // The page itself holds no data when a token is asked for: its script fetches it with the token.
            if token != nil { return html(LineHTML.document(LineModel(records: []), title: title, subtitle: "a token is needed", script: Self.script)) }
            switch await reader.snapshot() {
            case .success(let s): return html(LineHTML.document(s.model, title: title, subtitle: subtitle(s), script: Self.script))
            case .failure(let e): return html(LineHTML.document(LineModel(records: []), title: title, subtitle: e.message, script: Self.script))
            }
        }
        router.get("/view") { [self] request, _ -> Response in
            if let refused = refuse(request) { return refused }
            switch await reader.snapshot() {
            case .success(let s):
                return html("<p id=\"read-at\" hidden>\(LineHTML.escape(subtitle(s)))</p>" + LineHTML.body(s.model))
            case .failure(let e): return failure(e)
            }
        }
        router.get("/api/summary") { [self] request, _ -> Response in
            if let refused = refuse(request) { return refused }
            switch await reader.snapshot() {
            case .success(let s): return json(Summary(counts: s.model.counts, summary: s.model.summary, from: s.model.from, to: s.model.to, readAt: s.readAt))
            case .failure(let e): return failure(e)
            }
        }
        router.get("/api/stations") { [self] request, _ -> Response in
            if let refused = refuse(request) { return refused }
            switch await reader.snapshot() {
            case .success(let s): return json(s.model.stations)
            case .failure(let e): return failure(e)
            }
        }
        router.get("/api/devices") { [self] request, _ -> Response in
            if let refused = refuse(request) { return refused }
            let q = request.uri.queryParameters.get("q") ?? ""
            let limitText = request.uri.queryParameters.get("limit")
            guard q.count <= Self.queryLength else {
                return problem(.badRequest, "q is at most \(Self.queryLength) characters (an address or a serial number, or part of one)")
            }
            guard let limit = limitText.map({ Int($0) }) ?? Self.deviceLimit, Self.deviceLimitRange.contains(limit) else {
                return problem(.badRequest, "limit must be \(Self.deviceLimitRange.lowerBound) to \(Self.deviceLimitRange.upperBound), got \(limitText ?? "")")
            }
            switch await reader.snapshot() {
            case .success(let s):
                let needle = q.uppercased()
                let matching = needle.isEmpty ? s.devices : s.devices.filter {
                    $0.device.uppercased().contains(needle) || ($0.serialNumber?.uppercased().contains(needle) ?? false)
                }
                return json(Devices(devices: Array(matching.prefix(limit)), total: matching.count, limit: limit))
            case .failure(let e): return failure(e)
            }
        }
        // Anything else: one line that says what there is, never an empty answer.
        router.get("**") { [self] _, _ -> Response in
            problem(.notFound, "no such page: the dashboard serves /, /api/summary, /api/stations and /api/devices?q=…&limit=…")
        }
        return router
    }

    struct Summary: Encodable {
        var counts: LineModel.Counts
        var summary: LedgerSummary
        var from: String?
        var to: String?
        var readAt: String
    }

    struct Devices: Encodable {
        var devices: [DeviceRow]
        /// Devices that match, of which the first `limit` (the newest first) are listed.
        var total: Int
        var limit: Int
    }

    func subtitle(_ s: Snapshot) -> String {
        "\(reader.location.redactingPassword) · read \(s.readAt) · the page follows the ledger every second"
    }

    /// 401 when a token is asked for and the request's is missing or another.
    func refuse(_ request: Request) -> Response? {
        guard let token else { return nil }
        let given = request.headers[.authorization].flatMap { $0.hasPrefix("Bearer ") ? String($0.dropFirst(7)) : nil }
        if let given, Self.same(given, token) { return nil }
        var response = problem(.unauthorized, given == nil ? "a token is needed: send Authorization: Bearer TOKEN (--token of otaflash dashboard)"
                                                            : "the token is not this dashboard's")
        response.headers[.wwwAuthenticate] = "Bearer"
        return response
    }

    /// Compares in time that depends on the lengths only.
    static func same(_ a: String, _ b: String) -> Bool {
        let (x, y) = (Array(a.utf8), Array(b.utf8))
        guard x.count == y.count else { return false }
        return zip(x, y).reduce(0) { $0 | ($1.0 ^ $1.1) } == 0
    }

    func html(_ text: String) -> Response {
        Response(status: .ok, headers: [.contentType: "text/html; charset=utf-8", .cacheControl: "no-store"],
                 body: ResponseBody(byteBuffer: ByteBuffer(string: text)))
    }

    func json<T: Encodable>(_ value: T, status: HTTPResponse.Status = .ok) -> Response {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        encoder.keyEncodingStrategy = .convertToSnakeCase
        let data = (try? encoder.encode(value)) ?? Data("{}".utf8)
        return Response(status: status, headers: [.contentType: "application/json", .cacheControl: "no-store"],
                        body: ResponseBody(byteBuffer: ByteBuffer(string: String(decoding: data, as: UTF8.self))))
    }

    func problem(_ status: HTTPResponse.Status, _ message: String) -> Response {
        json(["error": message], status: status)
    }

    /// The ledger cannot be read now: 503 with its line; the dashboard goes on and reads it again.
    func failure(_ error: LedgerError) -> Response {
        problem(.serviceUnavailable, error.message)
    }

    /// Reads the ledger now: throws why it cannot be read (the command's start).
    public func read() async throws(LedgerError) {
        if case .failure(let error) = await reader.snapshot() { throw error }
    }

    /// Closes the ledger.
    public func close() async { await reader.close() }

    /// The page's script: it fetches `/view` every second and replaces the content; asks for the
    /// token when the dashboard wants one (kept for the tab's life, or given as `#token=…`); the
    /// device search asks `/api/devices`. Nothing is fetched from anywhere else.
    static let script = """
        (function () {
          var key = 'otaflash-dashboard-token';
          var token = sessionStorage.getItem(key) || '';
          var m = location.hash.match(/token=([^&]+)/);
          if (m) { token = decodeURIComponent(m[1]); sessionStorage.setItem(key, token); history.replaceState(null, '', location.pathname); }
          var line = document.getElementById('line');
          var header = document.querySelector('header');
          header.insertAdjacentHTML('beforeend',
            '<p id="banner" hidden></p>' +
            '<form id="auth" hidden><label>Token <input id="token" type="password" autocomplete="current-password"></label> <button>Show the line</button></form>' +
            '<form id="search"><label>Device or serial <input id="q" maxlength="64"></label> <button>Find</button></form>' +
            '<table id="devices" hidden><thead><tr><th>device</th><th>serial</th><th>station</th><th>result</th><th>error</th><th>attempts</th><th>ended (UTC)</th></tr></thead><tbody></tbody></table>');
          var banner = document.getElementById('banner'), auth = document.getElementById('auth');
          function headers() { return token ? { 'Authorization': 'Bearer ' + token } : {}; }
          function say(text) { banner.textContent = text; banner.hidden = !text; }
          auth.addEventListener('submit', function (e) {
            e.preventDefault(); token = document.getElementById('token').value; sessionStorage.setItem(key, token); auth.hidden = true; refresh();
          });
          document.getElementById('search').addEventListener('submit', function (e) {
            e.preventDefault();
            var q = document.getElementById('q').value;
            fetch('api/devices?limit=50&q=' + encodeURIComponent(q), { headers: headers(), cache: 'no-store' }).then(function (r) { return r.json(); }).then(function (j) {
              var body = document.querySelector('#devices tbody'); body.textContent = '';
              (j.devices || []).forEach(function (d) {
                var tr = document.createElement('tr');
                [d.device, d.serial_number || '–', d.station, d.result, d.error_code || '–', d.attempts, d.ended_at].forEach(function (v) {
                  var td = document.createElement('td'); td.textContent = String(v); tr.appendChild(td);
                });
                body.appendChild(tr);
              });
              document.getElementById('devices').hidden = false;
              if (j.error) { say(j.error); }
            });
          });
          function refresh() {
            fetch('view', { headers: headers(), cache: 'no-store' }).then(function (r) {
              if (r.status === 401) { auth.hidden = false; say('This dashboard asks for a token.'); return null; }
              return r.text().then(function (text) {
                if (!r.ok) { var j = {}; try { j = JSON.parse(text); } catch (e) {} say(j.error || text); return; }
                say(''); line.innerHTML = text;
                var at = document.getElementById('read-at'); if (at) { document.getElementById('subtitle').textContent = at.textContent; }
                document.body.setAttribute('data-updated', String(Date.now()));
              });
            }).catch(function (e) { say('The dashboard does not answer (' + e + '); trying again every second.'); });
          }
          refresh();
          setInterval(refresh, 1000);
          // The page's own load time (from the navigation's start), for scripts/dashboard-bench.
          window.addEventListener('load', function () { document.body.setAttribute('data-load-ms', String(Math.round(performance.now()))); });
        })();
        """
}
