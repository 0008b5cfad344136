import Foundation
import GATT
import Native
import OTA
import OTADevice
import OTAWire
import Simulator
import Testing

/// The transfer journal: one JSON file per device and image recording the last confirmed
/// checkpoint, so that running the same command again knows where it stood. A hint, never an
/// authority: a file that cannot be read is ignored, and the device's own reply decides.
@Suite("Transfer journal")
struct JournalTests {
    static let device = "C0:FF:EE:00:00:01"
    static let image = testImage(96 * 1024, seed: 44)
    static let config = EngineConfig()
    static let settings = OTAEngine.Settings(checkpointInterval: 4096)

    /// A store in a fresh folder that does not exist yet (`save` creates it).
    final class TemporaryStore {
        let root: String
        let store: JournalStore
        init() {
            root = FileManager.default.temporaryDirectory.appendingPathComponent("otaflash-journal-\(UUID().uuidString)").path
            store = JournalStore(directory: root + "/state/journal")
        }
        deinit { try? FileManager.default.removeItem(atPath: root) }

        var path: String { store.path(device: JournalTests.device, image: JournalTests.image) }
        var exists: Bool { FileManager.default.fileExists(atPath: path) }
        func write(_ text: String) throws {
            try FileManager.default.createDirectory(atPath: store.directory, withIntermediateDirectories: true)
            try Data(text.utf8).write(to: URL(fileURLWithPath: path))
        }
    }

    /// An entry as the session writes it (the type has no public initializer: it is decoded).
    static func entry(device: String = device, imageSize: Int = image.size, imageCRC: String = hex32(image.crc32),
                      offset: Int = 8192, crc: UInt32? = nil) -> TransferJournal {
        let json = """
            {"device": "\(device)", "imageSize": \(imageSize), "imageCRC": "\(imageCRC)", "confirmedOffset": \(offset),
             "confirmedCRC": \(crc ?? CRC32.checksum(image.bytes[0..<min(offset, image.size)])), "checkpointInterval": 4096,
             "updated": "2027-01-15T08:00:00Z"}
            """
        let decoder = JSONDecoder()
        decoder.dateDecodingStrategy = .iso8601
        // A literal written to match the type: failing to decode it is a bug in this test.
        return try! decoder.decode(TransferJournal.self, from: Data(json.utf8))
    }

    // MARK: The store

    @Test func pathNamesTheDeviceTheImageSizeAndItsCRC() {
        let t = TemporaryStore()
        #expect(t.path == "\(t.store.directory)/C0FFEE000001-\(Self.image.size)-\(hex32(Self.image.crc32)).json")
    }

    @Test func saveCreatesTheFolderAndLoadReadsTheSameEntry() throws {
        let t = TemporaryStore()
        #expect(t.store.load(device: Self.device, image: Self.image) == nil)
        try t.store.save(Self.entry(), image: Self.image)
        #expect(t.exists)
        #expect(t.store.load(device: Self.device, image: Self.image) == Self.entry())
        // A newer checkpoint replaces the entry.
        try t.store.save(Self.entry(offset: 12_288), image: Self.image)
        #expect(t.store.load(device: Self.device, image: Self.image)?.confirmedOffset == 12_288)
    }

    @Test func removeDeletesTheFileAndIsHarmlessWhenThereIsNone() throws {
        let t = TemporaryStore()
        try t.store.save(Self.entry(), image: Self.image)
        t.store.remove(device: Self.device, image: Self.image)
        #expect(!t.exists)
        #expect(t.store.load(device: Self.device, image: Self.image) == nil)
        t.store.remove(device: Self.device, image: Self.image)
        #expect(!t.exists)
    }

    static let unusable: [(name: String, text: String)] = [
        ("empty", ""),
        ("not JSON", "{ this is not json"),
        ("truncated", #"{"device":"C0:FF:EE:00:00:01","imageSize":"#),
        ("wrong types", #"{"device":1,"imageSize":"x","imageCRC":2,"confirmedOffset":[],"confirmedCRC":0,"checkpointInterval":0,"updated":"y"}"#),
        ("binary", "\u{0}\u{1}\u{2}\u{FFFD}"),
    ]

    @Test(arguments: unusable)
    func anUnreadableFileIsIgnored(name: String, text: String) throws {
        let t = TemporaryStore()
        try t.write(text)
        #expect(t.store.load(device: Self.device, image: Self.image) == nil, "\(name)")
    }

    static let mismatched: [(name: String, entry: TransferJournal)] = [
        ("another image's CRC", entry(imageCRC: "00000000")),
        ("offset zero", entry(offset: 0, crc: 0)),
        ("offset past the image", entry(offset: image.size + 1, crc: 0)),
        ("another device", entry(device: "AA:BB:CC:DD:EE:FF")),
        ("another size", entry(imageSize: image.size - 1)),
    ]

    /// A well-formed entry that does not describe this device and image is not used.
    @Test(arguments: mismatched)
    func anEntryForAnotherTransferIsIgnored(name: String, entry: TransferJournal) throws {
        let t = TemporaryStore()
        try t.store.save(entry, image: Self.image)
        if name == "another device" {
            // `save` files an entry under its own device; put it where this device's would be.
            try FileManager.default.moveItem(atPath: t.store.path(device: entry.device, image: Self.image), toPath: t.path)
        }
        #expect(t.store.load(device: Self.device, image: Self.image) == nil, "\(name)")
    }

    // MARK: Sessions

    func session(_ device: SimulatedDevice, through central: SimulatedCentral, store: JournalStore,
                 config: EngineConfig = JournalTests.config) -> OTASession {
        OTASession(central: central, address: device.config.address, image: Self.image, config: config,
                   profile: NativeProfile(settings: Self.settings), reconnect: .never, journal: store)
    }

    func run(_ session: OTASession) async -> Result<OTAResult, OTAError> {
        do { return .success(try await session.run()) } catch { return .failure(error) }
    }

    /// A lost link leaves the last confirmed checkpoint in the journal: the device's committed
    /// position and the CRC of the image up to it.
    @Test func aLostLinkLeavesTheDevicesConfirmedPositionInTheJournal() async throws {
        let t = TemporaryStore()
        let device = simulatedDevice(faults: FaultPlan(disconnectAt: [40_000]))
        let central = SimulatedCentral(devices: [device], clock: VirtualClock())
        guard case .failure(let error) = await run(session(device, through: central, store: t.store)) else {
            Issue.record("the session did not lose the link")
            return
        }
        #expect(error.code == .connection)
        let entry = try #require(t.store.load(device: Self.device, image: Self.image))
        #expect(entry.confirmedOffset == device.target?.committed)
        #expect(entry.confirmedOffset > 40_000 - Self.settings.window && entry.confirmedOffset <= 40_000)
        #expect(entry.confirmedCRC == CRC32.checksum(Self.image.bytes[0..<entry.confirmedOffset]))
    }

    /// The next run seeds the engine with the journal's position, but the device's reply decides:
    /// it still holds what it received after that checkpoint, so the run resumes past the
    /// journal's position and sends only the rest. Success removes the journal.
    @Test func theNextRunResumesWhereTheDeviceStandsAndRemovesTheJournalOnSuccess() async throws {
        let t = TemporaryStore()
        let device = simulatedDevice(faults: FaultPlan(disconnectAt: [40_000]))
        let central = SimulatedCentral(devices: [device], clock: VirtualClock())
        _ = await run(session(device, through: central, store: t.store))
        let journaled = try #require(t.store.load(device: Self.device, image: Self.image)).confirmedOffset
        let held = try #require(device.target?.received)
        #expect(held >= journaled)

        let result = try await run(session(device, through: central, store: t.store)).get()
        #expect(result.stats.resumedFrom == [held])
        #expect(result.stats.bytesSent == Self.image.size - held)
        #expect(device.activatedImage == Self.image.bytes)
        #expect(!t.exists)
    }

    /// An unreadable journal is no obstacle: the update runs from what the device reports.
    @Test func aCorruptJournalDoesNotStopTheUpdate() async throws {
        let t = TemporaryStore()
        try t.write("{ corrupt")
        let device = simulatedDevice()
        let central = SimulatedCentral(devices: [device], clock: VirtualClock())
        let result = try await run(session(device, through: central, store: t.store)).get()
        #expect(result.stats.bytesSent == Self.image.size)
        #expect(device.activatedImage == Self.image.bytes)
        #expect(!t.exists)
    }

    /// `restart` (--restart) removes the journal before anything is sent: a run that then fails
    /// before its first checkpoint leaves none behind, where a run without it keeps the old one.
    @Test(arguments: [false, true])
    func restartRemovesTheJournal(restart: Bool) async throws {
        let t = TemporaryStore()
        try t.store.save(Self.entry(), image: Self.image)
        // The device drops the link long before the first checkpoint.
        let device = simulatedDevice(faults: FaultPlan(disconnectAt: [500]))
        let central = SimulatedCentral(devices: [device], clock: VirtualClock())
        var config = Self.config
        config.restart = restart
        guard case .failure(let error) = await run(session(device, through: central, store: t.store, config: config)) else {
            Issue.record("the session did not lose the link")
            return
        }
        #expect(error.code == .connection)
        #expect(device.target?.committed == 0)
        #expect(t.exists == !restart)
    }
}

/// The engine side of the journal: a seeded position is a CRC the engine already knows.
@Suite("Engine: journal seed")
struct EngineJournalSeedTests {
    let image = testImage(20_000, seed: 45)

    /// BEGIN's reply at the journal's position streams on from there: a checkpoint first confirms
    /// that position with the journal's CRC, then data follows from it; nothing before it is sent.
    @Test func aSeededPositionThatTheDeviceReportsIsWhereStreamingResumes() {
        var engine = OTAEngine(image: image, settings: .init(checkpointInterval: 960))
        engine.seed(confirmedOffset: 9600, crc: crc(image, upTo: 9600))
        _ = engine.handle(.connected(info: Device.info(), mtu: 247))
        #expect(engine.handle(Device.begin(offset: 9600, crc: crc(image, upTo: 9600))).isEmpty)
        #expect(engine.phase == .streaming)
        #expect(engine.stats.resumedFrom == [9600])
        #expect(engine.stats.rewinds == 0 && engine.stats.rollbacks == 0 && engine.stats.restarts == 0)
        #expect(engine.nextStreamStep() == .command(.checkpoint(offset: 9600, crc: crc(image, upTo: 9600))))
        #expect(engine.nextStreamStep() == .idle)
        #expect(engine.handle(Device.checkpoint(.success, offset: 9600, crc: crc(image, upTo: 9600))).isEmpty)
        #expect(engine.acked == 9600)
        #expect(engine.nextStreamStep() == .data(offset: 9600, count: 240))
        #expect(engine.stats.bytesSent == 240)
    }
}
