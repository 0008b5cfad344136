import BlueZ
import Foundation
import GATT
import Native
import OTAFlashCLI
import OTAWire
import TestSupport
import Testing

/// The BlueZ central against a fake `org.bluez` (Tests/BlueZTests/fake_bluez) on a private
/// dbus-daemon. Serialized: the CLI tests point otaflash at the bus through the process-wide
/// `OTAFLASH_DBUS_ADDRESS`.
extension ProcessBusSuites {
@Suite(.serialized)
struct CentralTests {
    static let device = "C0:FF:EE:00:00:01"
    static let address = DeviceAddress(device)!
    static let sample4k = "\(centralTestPackageRoot)/firmware-samples/seeded-4k.bin"
    static let sample256k = "\(centralTestPackageRoot)/firmware-samples/seeded-256k.bin"

    static func contents(_ path: String) -> [UInt8] { [UInt8](FileManager.default.contents(atPath: path) ?? Data()) }

    /// Runs the CLI in process; returns (exit code, stdout, stderr).
    static func otaflash(_ arguments: [String]) async -> (Int32, String, String) {
        let output = CapturedOutput()
        let code = await runOtaflash(arguments, output: output)
        return (code, output.stdout, output.stderr)
    }

    static func flashArguments(_ fake: FakeBlueZ, image: String, _ extra: [String] = []) -> [String] {
        ["flash", "--device", device, "--journal-dir", "\(fake.directory)/journal", "--connect-timeout", "5"]
            + (extra.contains("--no-ledger") ? [] : ["--ledger", "\(fake.directory)/ledger.sqlite"]) + extra + [image]
    }

    static func count(_ needle: String, in text: String) -> Int {
        text.split(separator: "\n").filter { $0.contains(needle) }.count
    }

    // MARK: Scan

    @Test func scanListsTheDeviceWithOTA() async throws {
        try await withFake { fake in
            let (code, out, err) = await Self.otaflash(["scan", "--timeout", "0.4", "--json"])
            #expect(code == 0, "stderr: \(err)")
            let lines = out.split(separator: "\n").map(String.init)
            let ours = lines.first { $0.contains(Self.device) }
            #expect(ours?.contains(#""ota":true"#) == true, "\(out)")
            #expect(ours?.contains("OTA-Fake") == true)
            #expect(lines.contains { $0.contains("11:22:33:44:55:66") && $0.contains(#""ota":false"#) })
            // Discovery was started with an LE filter and always stopped.
            #expect(fake.log.contains("filter transport=le"))
            let started = Self.count("StartDiscovery", in: fake.log)
            #expect(started >= 1)
            #expect(Self.count("StopDiscovery", in: fake.log) == started, "fake log:\n\(fake.log)")
        }
    }

    @Test func scanFiltersAndSortsStrongestFirst() async throws {
        try await withFake { fake in
            let central = BlueZCentral(busAddress: fake.address)
            let all = try await central.scan(filter: ScanFilter(), timeout: .milliseconds(800))
            #expect(all.map(\.address.description) == [Self.device, "11:22:33:44:55:66"])
            // The RSSI update sent during discovery was seen.
            #expect(all.first?.rssi == -42)
            let ota = try await central.scan(filter: ScanFilter(serviceUUIDs: [OTAProtocol.serviceUUID]), timeout: .milliseconds(300))
            #expect(ota.map(\.address) == [Self.address])
            #expect(fake.log.contains("uuids=\(OTAProtocol.serviceUUID)"))
            let named = try await central.scan(filter: ScanFilter(namePrefix: "Other", minimumRSSI: -90), timeout: .milliseconds(200))
            #expect(named.map(\.address.description) == ["11:22:33:44:55:66"])
            #expect(try await central.scan(filter: ScanFilter(minimumRSSI: -60), timeout: .milliseconds(200)).count == 1)
        }
    }

    /// A controller that filters duplicate reports reports an advertiser once per scan enable;
    /// a scan enables it again every `rediscoverEvery`, with its filter set again each time: at
    /// about 2 s through a second client's short discovery (Transport auto), which restarts the
    /// scan while otaflash's own goes on, at about 4 s by stopping and starting its own.
    @Test func aLongScanRestartsDiscoveryWithItsFilter() async throws {
        try await withFake { fake in
            let central = BlueZCentral(busAddress: fake.address)
            let uuids = [OTAProtocol.serviceUUID, BluetoothUUID(uint16: 0xFE59)]
            let found = try await central.scan(filter: ScanFilter(serviceUUIDs: uuids), timeout: BlueZCentral.rediscoverEvery * 2 + .milliseconds(500))
            #expect(found.map(\.address) == [Self.address])
            // Started at 0 s, by the second client at about 2 s and again at about 4 s (a slow
            // machine may push the last restart past the window's end); each start has its
            // filter, each one is stopped, and the second client's is the one with Transport auto.
            let started = Self.count("StartDiscovery", in: fake.log)
            #expect((2...3).contains(started), "fake log:\n\(fake.log)")
            #expect(Self.count("StopDiscovery", in: fake.log) == started)
            #expect(Self.count("uuids=\(uuids.map(\.description).joined(separator: ","))", in: fake.log) == started)
            #expect(Self.count("filter transport=auto", in: fake.log) == 1, "fake log:\n\(fake.log)")
        }
    }

    @Test func scanUsesTheChosenAdapter() async throws {
        try await withFake { fake in
            let (code, _, err) = await Self.otaflash(["scan", "--adapter", "hci1", "--timeout", "0.2"])
            #expect(code == 11, "\(err)")
            #expect(err.contains("adapter hci1 is powered off"), "\(err)")
            #expect(!fake.log.contains("StartDiscovery"))
        }
    }

    @Test func writePathOptionIsChecked() async {
        let (code, _, err) = await Self.otaflash(["flash", "--device", Self.device, "--write-path", "carrier-pigeon", Self.sample4k])
        #expect(code == 2)
        #expect(err.contains("write-path"), "\(err)")
    }

    // MARK: Flash

    @Test(arguments: ["write-value", "acquire-write"])
    func flashes4KiB(writePath: String) async throws {
        try await withFake { fake in
            let (code, out, err) = await Self.otaflash(Self.flashArguments(fake, image: Self.sample4k, ["--write-path", writePath]))
            #expect(code == 0, "stdout: \(out) stderr: \(err) fake: \(fake.log)")
            #expect(fake.activatedImage == Self.contents(Self.sample4k))
            let activated = fake.log.split(separator: "\n").first { $0.hasPrefix("ACTIVATED") }.map(String.init) ?? ""
            if writePath == "acquire-write" {
                #expect(activated.contains("writevalue_packets=0"), "\(activated)")
                #expect(!activated.contains("socket_packets=0 "), "\(activated)")
            } else {
                #expect(activated.contains("socket_packets=0 "), "\(activated)")
                #expect(!fake.log.contains("AcquireWrite"))
            }
        }
    }

    @Test(arguments: ["write-value", "acquire-write"])
    func flashes256KiB(writePath: String) async throws {
        try await withFake { fake in
            let started = ContinuousClock.now
            let (code, out, err) = await Self.otaflash(Self.flashArguments(fake, image: Self.sample256k, ["--write-path", writePath, "--json"]))
            #expect(code == 0, "stdout: \(out.suffix(2000)) stderr: \(err)")
            #expect(fake.activatedImage == Self.contents(Self.sample256k))
            print("256 KiB through the fake via \(writePath): \(ContinuousClock.now - started)")
        }
    }

    @Test(arguments: ["NotSupported", "NotPermitted", "Failed"])
    func acquireWriteFallsBackToWriteValue(refusal: String) async throws {
        try await withFake(["--no-acquire-write", refusal]) { fake in
            let (code, _, err) = await Self.otaflash(Self.flashArguments(fake, image: Self.sample4k))
            #expect(code == 0, "\(err)")
            #expect(fake.activatedImage == Self.contents(Self.sample4k))
            #expect(fake.log.contains("AcquireWrite"))
            #expect(fake.log.contains("socket_packets=0 "))
        }
    }

    @Test func linkLossMidTransferResumesOnReconnect() async throws {
        try await withFake(["--disconnect-after", "100000"]) { fake in
            let (code, _, err) = await Self.otaflash(Self.flashArguments(fake, image: Self.sample256k))
            #expect(code == 0, "\(err)")
            #expect(fake.log.contains("link down after"))
            #expect(Self.count("Connect /org/bluez", in: fake.log) >= 2)
            #expect(fake.activatedImage == Self.contents(Self.sample256k))
        }
    }

    @Test func linkLossWithoutReconnectIsAConnectionError() async throws {
        try await withFake(["--disconnect-after", "20000"]) { fake in
            let (code, _, err) = await Self.otaflash(Self.flashArguments(fake, image: Self.sample256k, ["--reconnect-window", "0"]))
            #expect(code == 6, "\(err)")
            // One line: the link loss and how to resume. (Which of the write socket's hangup and
            // the D-Bus disconnection is seen first decides the words in between.)
            let lines = err.split(separator: "\n").filter { $0.hasPrefix("otaflash: error:") }
            #expect(lines.count == 1, "\(err)")
            let line = String(lines.first ?? "")
            #expect(line.hasPrefix("otaflash: error: link lost: "), "\(line)")
            #expect(line.hasSuffix("; run the same command again to resume"), "\(line)")
            #expect(fake.activatedImage == nil)
        }
    }

    // MARK: Info and connect paths

    @Test func infoPrintsTheFirmwareRevision() async throws {
        try await withFake(["--firmware-revision", "4.2.0"]) { _ in
            let (code, out, err) = await Self.otaflash(["info", "--device", Self.device, "--connect-timeout", "5"])
            #expect(code == 0, "\(err)")
            #expect(out.contains("firmware_revision: 4.2.0"), "\(out)")
            #expect(out.contains("manufacturer: otaflash fake devices"))
            #expect(out.contains("ota_protocol: 1"))
        }
    }

    @Test(arguments: [["--device-hidden-until-scan"], ["--resolve-before-export"], ["--never-resolve"], ["--emit-connected"]])
    func connectCopesWithBlueZTiming(_ mode: [String]) async throws {
        try await withFake(mode) { fake in
            let (code, out, err) = await Self.otaflash(["info", "--device", Self.device, "--connect-timeout", "3"])
            #expect(code == 0, "\(mode): \(err)")
            #expect(out.contains("firmware_revision: 1.0.0"), "\(out)")
            if mode == ["--device-hidden-until-scan"] {
                #expect(fake.log.contains("StartDiscovery") && fake.log.contains("StopDiscovery"))
            }
        }
    }

    @Test func flashAfterActivationShowsTheNewRevision() async throws {
        try await withFake { fake in
            let (code, _, err) = await Self.otaflash(Self.flashArguments(fake, image: Self.sample4k))
            #expect(code == 0, "\(err)")
            let (infoCode, out, _) = await Self.otaflash(["info", "--device", Self.device])
            #expect(infoCode == 0)
            // A .bin carries no version (BEGIN sends 0), so the revision stays; the slot is idle again.
            #expect(out.contains("firmware_revision: 1.0.0"), "\(out)")
            #expect(out.contains("ota_received: 0"), "\(out)")
            #expect(fake.log.contains("ACTIVATED"))
        }
    }

    // MARK: The connection itself

    @Test func connectionEventsAndDisconnect() async throws {
        try await withFake { fake in
            let central = BlueZCentral(writePath: .acquireWrite, busAddress: fake.address)
            let connection = try await central.connect(to: Self.address, timeout: .seconds(5))
            let services = try await connection.discoverServices()
            #expect(Set(services.map(\.uuid)) == [OTAProtocol.serviceUUID, DeviceInformationService.serviceUUID])
            let ota = try #require(services.first { $0.uuid == OTAProtocol.serviceUUID })
            let cp = try #require(ota.characteristic(OTAProtocol.controlPointUUID))
            #expect(cp.properties == [.write, .notify])
            #expect(cp.id.hasPrefix("/org/bluez/hci0/dev_C0_FF_EE_00_00_01/"))
            #expect(try await connection.mtu() == 247)

            // Nothing queued: nextEvent times out close to its deadline, without polling.
            let before = ContinuousClock.now
            #expect(await connection.nextEvent(timeout: .milliseconds(150)) == nil)
            let waited = ContinuousClock.now - before
            #expect(waited >= .milliseconds(140) && waited < .seconds(2))
            #expect(connection.pollEvent() == nil)

            try await connection.setNotifications(true, for: cp)
            // STATUS then ABORT: two submitted writes, each completing and answered in order.
            let t1 = try connection.submitWrite([0x03], to: cp)
            let t2 = try connection.submitWrite([0x06], to: cp)
            var seen: [String] = []
            while seen.count < 4, let event = await connection.nextEvent(timeout: .seconds(3)) {
                switch event {
                case .notification(let id, let value):
                    #expect(id == cp.id)
                    seen.append("n\(value[1])")
                case .writeCompleted(let ticket, let error):
                    #expect(error == nil)
                    seen.append(ticket == t1 ? "w1" : ticket == t2 ? "w2" : "w?")
                case .disconnected(let reason):
                    Issue.record("unexpected disconnect: \(reason)")
                case .stackPairing(let attempt):
                    Issue.record("unexpected pairing by the stack: \(attempt)")
                }
            }
            #expect(seen.filter { $0.hasPrefix("n") } == ["n3", "n6"])
            #expect(seen.filter { $0.hasPrefix("w") }.sorted() == ["w1", "w2"])

            await connection.disconnect()
            await connection.disconnect()
            guard case .disconnected(.local)? = await connection.nextEvent(timeout: .seconds(1)) else {
                Issue.record("expected .disconnected(.local)")
                return
            }
            #expect(await connection.nextEvent(timeout: .milliseconds(50)) == nil)
            #expect(throws: GATTError.self) { try connection.submitWrite([0x03], to: cp) }
            #expect(fake.log.contains("Disconnect /org/bluez/hci0/dev_C0_FF_EE_00_00_01"))
        }
    }

    @Test func bluetoothdLeavingIsALinkLoss() async throws {
        try await withFake { fake in
            let central = BlueZCentral(busAddress: fake.address)
            let connection = try await central.connect(to: Self.address, timeout: .seconds(5))
            fake.killFake()
            guard case .disconnected(.linkLost(let why))? = await connection.nextEvent(timeout: .seconds(5)) else {
                Issue.record("expected a link loss")
                return
            }
            #expect(why.contains("bluetoothd"), "\(why)")
            await connection.disconnect()
            #expect(connection.pollEvent() == nil)
        }
    }

    @Test func writeSocketHangupIsALinkLoss() async throws {
        try await withFake(["--disconnect-after", "1"]) { fake in
            let central = BlueZCentral(busAddress: fake.address)
            let connection = try await central.connect(to: Self.address, timeout: .seconds(5))
            let data = try #require(try await connection.discoverServices().first { $0.uuid == OTAProtocol.serviceUUID }?
                .characteristic(OTAProtocol.dataUUID))
            // The first write acquires the socket; the fake drops the link after it.
            try await connection.write([0, 0, 0, 0, 1, 2, 3], to: data, type: .withoutResponse)
            guard case .disconnected(.linkLost)? = await connection.nextEvent(timeout: .seconds(5)) else {
                Issue.record("expected a link loss")
                return
            }
            #expect(throws: GATTError.self) { _ = try connection.tryWriteWithoutResponse([0, 0, 0, 0, 1], to: data) }
            #expect(connection.pollEvent() == nil, "exactly one disconnect event")
            await connection.disconnect()
        }
    }

    @Test(arguments: [("NotAuthorized", GATTError.Code.notAuthorized), ("NotPermitted", .notAuthorized), ("InProgress", .inProgress)])
    func gattErrorsMapToCodes(name: String, code: GATTError.Code) async throws {
        try await withFake(["--gatt-error", name, "--gatt-error-ops", "write"]) { fake in
            let central = BlueZCentral(writePath: .writeValue, busAddress: fake.address)
            let connection = try await central.connect(to: Self.address, timeout: .seconds(5))
            defer { Task { await connection.disconnect() } }
            let cp = try #require(try await connection.discoverServices().first { $0.uuid == OTAProtocol.serviceUUID }?
                .characteristic(OTAProtocol.controlPointUUID))
            do {
                try await connection.write([0x03], to: cp, type: .withResponse)
                Issue.record("the write should fail")
            } catch let error as GATTError {
                #expect(error.code == code, "\(error)")
                #expect(error.message.contains(OTAProtocol.controlPointUUID.description))
                #expect(!error.message.contains("\n"))
                if code == .notAuthorized { #expect(error.message.contains("pairing")) }
            }
            // A submitted write reports the same error as its completion.
            let ticket = try connection.submitWrite([0x03], to: cp)
            guard case .writeCompleted(ticket, let error?)? = await connection.nextEvent(timeout: .seconds(3)) else {
                Issue.record("expected a failed completion")
                return
            }
            #expect(error.code == code)
        }
    }

    // MARK: Errors through the CLI: exit code and one line

    struct ErrorCase: Sendable, CustomTestStringConvertible {
        var name: String
        var fake: [String]?
        var denyBlueZ = false
        var extra: [String] = []
        var command = "info"
        var code: Int32
        var phrases: [String]
        var testDescription: String { name }
    }

    static let errorCases: [ErrorCase] = [
        ErrorCase(name: "bluetoothd not running", fake: nil, code: 11,
                  phrases: ["bluetoothd is not running", "systemctl start bluetooth"]),
        ErrorCase(name: "no adapter", fake: ["--no-adapter"], code: 11,
                  phrases: ["no Bluetooth adapter found"]),
        ErrorCase(name: "adapter powered off", fake: ["--adapter-off"], code: 11,
                  phrases: ["(hci0, hci1) is powered off", "bluetoothctl power on"]),
        ErrorCase(name: "chosen adapter powered off", fake: [], extra: ["--adapter", "hci1"], code: 11,
                  phrases: ["hci1", "powered off", "bluetoothctl power on"]),
        ErrorCase(name: "adapter not found", fake: [], extra: ["--adapter", "hci7"], code: 11,
                  phrases: ["hci7 not found", "hci0, hci1"]),
        ErrorCase(name: "D-Bus access denied", fake: [], denyBlueZ: true, code: 12,
                  phrases: ["D-Bus denied access to org.bluez", "run otaflash as root or add your user to the bluetooth group"]),
        ErrorCase(name: "device not found", fake: ["--no-device"], extra: ["--connect-timeout", "1"], code: 5,
                  phrases: ["device \(device) not found on hci0 within 1 s", "in range"]),
        ErrorCase(name: "connect fails", fake: ["--connect-error", "Failed:le-connection-abort-by-local"], code: 6,
                  phrases: ["connecting to \(device) on hci0 failed", "le-connection-abort-by-local"]),
        ErrorCase(name: "no OTA service", fake: ["--no-ota-service"], command: "flash", code: 7,
                  phrases: ["OTA service"]),
        ErrorCase(name: "NotAuthorized", fake: ["--gatt-error", "NotAuthorized"], command: "flash", code: 12,
                  phrases: ["NotAuthorized", "pairing"]),
        ErrorCase(name: "NotPermitted", fake: ["--gatt-error", "NotPermitted"], command: "flash", code: 12,
                  phrases: ["NotPermitted", "pairing"]),
        ErrorCase(name: "InProgress", fake: ["--gatt-error", "InProgress"], command: "flash", code: 9,
                  phrases: ["InProgress", "busy"]),
        // Another central owns the transfer: the device fails our BEGIN with ATT error 0x89.
        ErrorCase(name: "ATT busy (0x89)", fake: ["--busy-with-another-central"], command: "flash", code: 9,
                  phrases: ["busy with another central's transfer", "wait for it to finish, then run the same command again"]),
    ]

    @Test(arguments: errorCases)
    func mappedErrorsExitWithTheirCodeAndOneLine(_ c: ErrorCase) async throws {
        try await withFake(c.fake ?? [], fake: c.fake != nil, denyBlueZ: c.denyBlueZ) { fake in
            var arguments = c.command == "flash"
                ? Self.flashArguments(fake, image: Self.sample4k, ["--reconnect-window", "0", "--quiet"])
                : ["info", "--device", Self.device]
            arguments.insert(contentsOf: c.extra.isEmpty ? ["--connect-timeout", "5"] : c.extra, at: 1)
            let (code, _, err) = await Self.otaflash(arguments)
            print("\(c.name): exit \(code): \(err.trimmingCharacters(in: .newlines))")
            #expect(code == c.code, "\(c.name): \(err)")
            let lines = err.split(separator: "\n")
            #expect(lines.count == 1, "\(c.name): \(err)")
            for phrase in c.phrases { #expect(err.contains(phrase), "\(c.name): missing '\(phrase)' in \(err)") }
        }
    }
}
}
