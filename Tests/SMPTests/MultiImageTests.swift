import Crypto
import Foundation
import GATT
import OTA
import OTACommandLine
import OTAWire
import SMP
import Testing
import ZIPFoundation

private func zip(_ files: [(String, [UInt8])]) throws -> [UInt8] {
    let archive = try Archive(data: Data(), accessMode: .create)
    for (name, bytes) in files {
        let data = Data(bytes)
        try archive.addEntry(with: name, type: .file, uncompressedSize: Int64(data.count), compressionMethod: .deflate) { position, size in
            data.subdata(in: Int(position)..<Int(position) + size)
        }
    }
    return [UInt8](archive.data!)
}

/// Two small MCUboot images: the application core's 2.0.0 and the network core's 2.1.0.
private let application = SMPSlotImage.build(major: 2, minor: 0, revision: 0, body: (0..<9_000).map { UInt8(truncatingIfNeeded: $0 &* 13) })
private let network = SMPSlotImage.build(major: 2, minor: 1, revision: 0, body: (0..<5_000).map { UInt8(truncatingIfNeeded: $0 &* 7 &+ 1) })

private func manifest(_ entries: [String]) -> [UInt8] { Array("{\"format-version\": 0, \"files\": [\(entries.joined(separator: ", "))]}".utf8) }

private func entry(_ file: String, index: String, size: String? = nil, version: String? = nil) -> String {
    var fields = ["\"file\": \"\(file)\"", "\"image_index\": \(index)", "\"load_address\": 65536", "\"board\": \"nrf5340dk\""]
    if let size { fields.append("\"size\": \(size)") }
    if let version { fields.append("\"version_MCUBOOT\": \(version)") }
    return "{\(fields.joined(separator: ", "))}"
}

@Suite("SMP multi-image packages")
struct SMPPackageTests {
    static func package(_ manifestEntries: [String], files: [(String, [UInt8])]? = nil) throws -> [UInt8] {
        try zip([("manifest.json", manifest(manifestEntries))] + (files ?? [("app_update.bin", application), ("net_core_app_update.bin", network)]))
    }

    /// nRF Connect SDK writes numbers as strings ("0"); a hand-made manifest may write numbers.
    @Test(arguments: [("\"0\"", "\"1\"", "\"\(application.count)\""), ("0", "1", "\(application.count)")])
    func theImagesAreReadWhateverTheNumbersAreWrittenAs(app: String, net: String, size: String) throws {
        let bytes = try Self.package([entry("app_update.bin", index: app, size: size, version: "\"2.0.0+0\""),
                                      entry("net_core_app_update.bin", index: net)])
        let package = try SMPPackage(zip: bytes, source: "dfu_application.zip")
        #expect(package.parts.map(\.imageNumber) == [0, 1])
        #expect(package.parts.map(\.image.bytes) == [application, network])
        // The network core's image is marked (and sent) before the application core's.
        #expect(package.markingOrder.map(\.imageNumber) == [1, 0])
    }

    @Test func theShippedSampleHasTheApplicationAndTheNetworkCore() throws {
        let path = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent().appendingPathComponent("firmware-samples/nrf5340/dfu_application.zip").path
        let package = try SMPPackage.load(path: path)
        #expect(package.parts.map(\.imageNumber) == [0, 1])
        #expect(package.parts.map { "\($0.image.version)" } == ["1.3.0", "1.2.3+4"])
        #expect(ImageFormat.detect([UInt8](try Data(contentsOf: URL(fileURLWithPath: path))), using: [.smpFiles]).kind == .mcuboot)
        // Claimed, it is read once, with the package's limit, and parsed from the value.
        guard case .claimed(let claimed) = try FirmwareImage.read(path: path, detecting: [.smpFiles]) else {
            Issue.record("the package was not claimed")
            return
        }
        #expect(claimed.format.limit == ImageFormat.SizeLimit(bytes: SMPPackage.maximumPackageSize, what: "packages"))
        let fromValue = try SMPPackage(claimed)
        #expect(fromValue.parts.map(\.image.bytes) == package.parts.map(\.image.bytes))
    }

    /// Each one refused before any radio time, with what is wrong in the line.
    @Test(arguments: [
        ([entry("app_update.bin", index: "0"), entry("missing.bin", index: "1")], "names missing.bin, which the archive lacks"),
        ([entry("app_update.bin", index: "0"), entry("net_core_app_update.bin", index: "0")], "are both for image 0"),
        ([entry("app_update.bin", index: "0"), entry("net_core_app_update.bin", index: "7")], "outside 0–3"),
        ([entry("app_update.bin", index: "\"one\"")], "image_index \"one\", not an image number"),
        ([entry("app_update.bin", index: "0", size: "100")], "gives app_update.bin 100 bytes, the archive holds"),
        ([entry("app_update.bin", index: "0", version: "\"3.0.0\"")], "version 3.0.0, its MCUboot header 2.0.0"),
        ([entry("app_update.bin", index: "0", version: "true")], "not an MCUboot version"),
        (["{\"image_index\": 0}"], "names no \"file\""),
        (["{\"file\": \"app_update.bin\"}"], "no \"image_index\""),
        ([], "lists no files"),
    ])
    func aPackageThatDoesNotCheckOutIsRefused(entries: [String], says: String) throws {
        let bytes = try Self.package(entries)
        #expect {
            try SMPPackage(zip: bytes, source: "dfu_application.zip")
        } throws: { error in
            "\(error)".contains(says) && "\(error)".hasPrefix("dfu_application.zip")
        }
    }

    @Test func aFileThatIsNoMCUbootImageIsRefused() throws {
        let bytes = try Self.package([entry("app_update.bin", index: "0")], files: [("app_update.bin", Array("not an image at all, just text".utf8))])
        #expect(throws: MCUbootImageError.self) { try SMPPackage(zip: bytes, source: "pkg.zip") }
    }

    @Test func aSecureDFUManifestWithoutInitPacketsSaysWhatItIs() throws {
        let bytes = try zip([("manifest.json", Array(#"{"manifest": {"application": {"bin_file": "app.bin", "dat_file": "app.dat"}}}"#.utf8)),
                             ("app.bin", application)])
        #expect { try SMPPackage(zip: bytes, source: "pkg.zip") } throws: { "\($0)".contains("Nordic Secure DFU package") }
    }

    @Test(arguments: ["1=net.bin", "3=a=b.bin"])
    func anImageArgumentIsANumberAndAFile(text: String) {
        let pair = SMPPackage.imageArgument(text)
        #expect(pair?.number == UInt32(text.prefix(1)))
        #expect(pair?.path == String(text.dropFirst(2)))
    }

    @Test(arguments: ["net.bin", "=net.bin", "1=", "x=net.bin", "-1=net.bin"])
    func anImageArgumentWithoutNumberOrFileIsNotOne(text: String) {
        #expect(SMPPackage.imageArgument(text) == nil)
    }
}

/// The device model's second image pair (an nRF5340's network core) and MCUboot's order rule.
@Suite("SMP network core model")
struct SMPNetworkCoreTests {
    /// Uploads `image` to `number` in one request.
    static func upload(_ server: inout SMPServer, _ image: [UInt8], to number: UInt32) {
        let first = SMPImageUpload.first(image: number, length: UInt64(image.count), sha: Array(SHA256.hash(data: image)), data: image)
        guard case .upload(let status) = server.handle(.imageUpload(first)) else { Issue.record("upload refused"); return }
        #expect(status.offset == UInt64(image.count) && status.match == true)
    }

    static func mark(_ server: inout SMPServer, _ image: [UInt8]) {
        guard case .imageStates = server.handle(.imageStateWrite(hash: SMPSlotImage(image).hash, confirm: false)) else {
            Issue.record("mark refused")
            return
        }
    }

    static func twoImageServer() -> SMPServer {
        var config = SMPServer.Config()
        config.networkCore = true
        return SMPServer(config: config)
    }

    @Test func theImageStatesListBothImagesSlots() throws {
        var server = Self.twoImageServer()
        Self.upload(&server, network, to: 1)
        let slots = server.states.images
        #expect(slots.map { $0.image ?? 0 } == [0, 1, 1])
        #expect(slots.filter { $0.image == 1 }.map(\.version) == ["1.0.0", "2.1.0"])
        // Image 0's upload slot is untouched.
        #expect(server.secondary == nil)
    }

    /// The network core's image marked first, then the application's: at the reset both take.
    @Test func networkCoreMarkedFirstIsTakenAtTheApplicationsReset() throws {
        var server = Self.twoImageServer()
        Self.upload(&server, network, to: 1)
        Self.upload(&server, application, to: 0)
        Self.mark(&server, network)
        Self.mark(&server, application)
        #expect(server.boot() == .swapped(permanent: false))
        #expect(server.network?.lastUpdate == .updated)
        #expect(server.network?.running.bytes == network)
        #expect(server.primary.bytes == application)
        let running = server.states.images.filter(\.active).map(\.version)
        #expect(running == ["2.0.0", "2.1.0"])
    }

    /// NCSDK-34106 (sdk-nrf pull request 30274): the application core's image marked before the
    /// network core's makes MCUboot skip the network core's update; the application's is taken.
    @Test func applicationMarkedFirstLosesTheNetworkCoreUpdate() throws {
        var server = Self.twoImageServer()
        Self.upload(&server, network, to: 1)
        Self.upload(&server, application, to: 0)
        Self.mark(&server, application)
        Self.mark(&server, network)
        #expect(server.boot() == .swapped(permanent: false))
        #expect(server.network?.lastUpdate == .skipped)
        #expect(server.network?.running.versionText == "1.0.0")
        // The image stays in its slot, no longer marked.
        let waiting = try #require(server.states.images.first { $0.image == 1 && $0.slot == 1 })
        #expect(waiting.version == "2.1.0" && !waiting.pending)
    }

    @Test func aNetworkCoreImageAloneIsTakenAtTheReset() throws {
        var server = Self.twoImageServer()
        Self.upload(&server, network, to: 1)
        Self.mark(&server, network)
        #expect(server.boot() == .unchanged)
        #expect(server.network?.lastUpdate == .updated)
        #expect(server.network?.secondary == nil)
    }

    @Test func aDeviceWithOneImageRefusesAnUploadToImageOne() throws {
        var server = SMPServer()
        let first = SMPImageUpload.first(image: 1, length: UInt64(network.count), sha: Array(SHA256.hash(data: network)), data: network)
        #expect(server.handle(.imageUpload(first)) == .error(.general(.invalidValue)))
    }
}

/// `SMPMultiImageEngine` driven without I/O: its writes go straight into the server model, the
/// answers straight back, a reset is the model's boot and a new connection.
@Suite("SMP multi-image engine")
struct SMPMultiImageEngineTests {
    static func plans(_ order: [(UInt32, [UInt8])]) -> [SMPImagePlan] {
        order.map { number, bytes in
            SMPImagePlan(imageNumber: number, bytes: bytes, fileSHA256: Array(SHA256.hash(data: bytes)),
                         imageHash: SMPSlotImage(bytes).hash, version: SMPSlotImage(bytes).versionText)
        }
    }

    /// Runs `engine` against `server` until it finishes or fails; returns the last actions and
    /// the requests the server saw, in order.
    static func drive(_ engine: inout SMPMultiImageEngine, _ server: inout SMPServer) throws -> (last: [TransferAction], requests: [SMPRequest]) {
        var reassembler = SMPReassembler()
        var requests: [SMPRequest] = []
        func link() -> SMPLink {
            SMPLink(parameters: SMPParameters(bufferSize: UInt32(server.config.bufferSize), bufferCount: 1), states: server.states)
        }
        var actions = engine.handle(.connected(link(), mtu: 247))
        for _ in 0..<10_000 {
            if actions.contains(where: { if case .failed = $0 { true } else { false } }) || actions.contains(.finished) {
                if case .failed(let error)? = actions.first, error.resumable, engine.awaitsNextConnection {
                    server.boot()
                    actions = engine.handle(.connected(link(), mtu: 247))
                    continue
                }
                return (actions, requests)
            }
            guard case .write(let write) = engine.nextStreamStep() else {
                Issue.record("the engine waits for nothing in \(engine.phase)")
                return (actions, requests)
            }
            actions = []
            for frame in try reassembler.append(write.bytes) {
                let (response, reset) = server.handle(frame)
                requests.append(try SMPRequest(decoding: frame))
                actions += engine.handle(.notification(.data, try response.frame(replyingTo: frame.header).encoded))
                if reset { actions += engine.handle(.disconnected(.linkLost("reset"))) }
            }
        }
        Issue.record("no end after 10000 writes")
        return (actions, requests)
    }

    static func marks(_ requests: [SMPRequest]) -> [[UInt8]] {
        requests.compactMap { if case .imageStateWrite(let hash?, _) = $0 { hash } else { nil } }
    }

    @Test func bothImagesAreUploadedMarkedNetworkCoreFirstResetOnceAndBothRun() throws {
        var server = SMPNetworkCoreTests.twoImageServer()
        var engine = SMPMultiImageEngine(images: Self.plans([(1, network), (0, application)]), config: EngineConfig(),
                                         settings: SMPUploadSettings(fileSHA256: [], imageHash: nil))
        let (last, requests) = try Self.drive(&engine, &server)
        #expect(last == [.finished])
        #expect(engine.phase == .done)
        // Each upload names its image; image 1's goes first.
        let opened = requests.compactMap { if case .imageUpload(let u) = $0, u.offset == 0 { u.image ?? 0 } else { nil } }
        #expect(opened == [1, 0])
        #expect(Self.marks(requests) == [SMPSlotImage(network).hash, SMPSlotImage(application).hash])
        #expect(requests.filter { if case .reset = $0 { true } else { false } }.count == 1)
        #expect(server.primary.bytes == application && server.network?.running.bytes == network)
        #expect(engine.notes.contains { $0.contains("every image runs its new version: network core (image 1) 2.1.0, application core (image 0) 2.0.0") })
        // Progress counts both images, one after the other.
        #expect(engine.acked == application.count + network.count && engine.image.size == engine.acked)
    }

    /// The order swapped in the engine (the application core's image first, so marked first):
    /// the model skips the network core's update, and the run does not report it done.
    @Test func markingTheApplicationFirstLosesTheNetworkCoreAndTheRunSaysSo() throws {
        var server = SMPNetworkCoreTests.twoImageServer()
        var engine = SMPMultiImageEngine(images: Self.plans([(0, application), (1, network)]), config: EngineConfig(maxRecoveries: 0),
                                         settings: SMPUploadSettings(fileSHA256: [], imageHash: nil))
        let (last, requests) = try Self.drive(&engine, &server)
        #expect(Self.marks(requests).first == SMPSlotImage(application).hash)
        #expect(server.network?.lastUpdate == .skipped)
        #expect(server.network?.running.versionText == "1.0.0")
        guard case .failed(let error)? = last.first else { Issue.record("not failed: \(last)"); return }
        #expect(error.code == .verifyFailed, "\(error)")
    }

    @Test func anImageTheDeviceAlreadyHoldsIsNotUploadedAgain() throws {
        var server = SMPNetworkCoreTests.twoImageServer()
        SMPNetworkCoreTests.upload(&server, network, to: 1)
        var engine = SMPMultiImageEngine(images: Self.plans([(1, network), (0, application)]), config: EngineConfig(),
                                         settings: SMPUploadSettings(fileSHA256: [], imageHash: nil))
        let (last, requests) = try Self.drive(&engine, &server)
        #expect(last == [.finished])
        #expect(!requests.contains { if case .imageUpload(let u) = $0 { u.image == 1 } else { false } })
        #expect(server.network?.running.bytes == network)
    }

    @Test func aDeviceWithoutTheNetworkCoreRefusesWithWhatToDo() throws {
        var server = SMPServer()
        var engine = SMPMultiImageEngine(images: Self.plans([(1, network), (0, application)]), config: EngineConfig(),
                                         settings: SMPUploadSettings(fileSHA256: [], imageHash: nil))
        let (last, _) = try Self.drive(&engine, &server)
        guard case .failed(let error)? = last.first else { Issue.record("not failed: \(last)"); return }
        #expect(error.code == .incompatibleDevice)
        #expect(error.message.contains("it has no network core (image 1)"), "\(error.message)")
    }
}

/// `otaflash simulate --protocol smp --sim-smp-network-core`: the served device has image 1.
@Suite("SMP served two-image device")
struct SMPServedNetworkCoreTests {
    @Test(arguments: [false, true])
    func theServedDeviceHasTheNetworkCoreWhenAsked(networkCore: Bool) throws {
        let options = try SMPServedOptions.parse(networkCore ? ["--sim-smp-network-core"] : [])
        let served = try options.served(ServeRequest(slotSize: 1 << 20))
        let model = try #require(served.model as? SMPPeripheral)
        #expect((model.server.network != nil) == networkCore)
        #expect(model.server.states.images.contains { $0.image == 1 } == networkCore)
    }
}
