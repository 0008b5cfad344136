import GATT
import OTA
import OTAWire

/// Espressif's BLE OTA (esp-iot-solution's `ble_ota` component, ESP32 devices) as an `OTAProfile`:
/// COMMAND carries START and its answer, RECV_FW the sectors and their ACKs; `ESPOTAEngine`
/// streams and takes the device's restart as the success.
public struct ESPOTAProfile: OTAProfile {
    public typealias Engine = ESPOTAEngine

    /// The name `--protocol` takes.
    public static let name = "esp-ota"

    /// Sectors un-ACKed at most for a device that announces no window (`ESPOTAEngine.window`).
    public let window: Int
    /// Send sector packets as write commands though RECV_FW flags write only (the default): both
    /// hosts take them (the host maps both write types to one permission), bluetoothd sends them
    /// (`WriteValue` with type command), and they are much faster. False: write requests, as the
    /// characteristic flags them (the bench's other column).
    public let writeCommands: Bool

    /// Whether the window a `ble_ota_raw` device announces in START's ACK replaces `window`.
    public let honoursDeviceWindow: Bool

    public init(window: Int = ESPOTAEngine.defaultWindow, writeCommands: Bool = true, honoursDeviceWindow: Bool = true) {
        self.window = window
        self.writeCommands = writeCommands
        self.honoursDeviceWindow = honoursDeviceWindow
    }

    public var name: String { Self.name }
    public var serviceUUID: BluetoothUUID { ESPOTAService.serviceUUID }
    public var imageFormats: Set<ImageFormat.Kind> { [.espAppImage] }
    public var otherFormatHint: String? {
        "an ESP-IDF app image starts with the magic 0xE9: pass build/<app>.bin from `idf.py build`"
    }
    public var imageCheck: String {
        "checks the image itself (esp_ota_end) and restarts into it; a refused image is not reported: the device does not restart"
    }
    /// The new image need not run the OTA service: a batch does not connect again to ask.
    public var reportsFirmwareVersion: Bool { false }
    /// One START per boot, and the component keeps nothing across a reset: a stopped transfer is
    /// sent again whole once the device was reset.
    public var resumesTransfer: Bool { false }

    public func attach(to connection: any GATTConnection, device: String,
                       discoveryTimeout: Duration) async throws(OTAError) -> AttachedLink<ESPOTALink> {
        do {
            return try await withTimeout(discoveryTimeout, clock: connection.clock, "discovering Espressif's BLE OTA service") { () async throws(GATTError) in
                let services = try await connection.discoverServices()
                guard let service = services.first(where: { $0.uuid == ESPOTAService.serviceUUID }) else {
                    throw GATTError(.serviceNotFound, "\(device) does not expose Espressif's BLE OTA service 0x8018; is it running an application built with the ble_ota component (protocomm security variants use another service)?")
                }
                let data = try service.requireCharacteristic(ESPOTAService.receiveFirmwareUUID, name: "RECV_FW")
                let command = try service.requireCharacteristic(ESPOTAService.commandUUID, name: "COMMAND")
                for (c, what) in [(data, "RECV_FW"), (command, "COMMAND")] {
                    guard !c.properties.isDisjoint(with: [.write, .writeWithoutResponse]) else {
                        throw GATTError(.notPermitted, "\(device)'s \(what) characteristic cannot be written (\(c.properties))")
                    }
                    guard !c.properties.isDisjoint(with: [.notify, .indicate]) else {
                        throw GATTError(.notPermitted, "\(device)'s \(what) characteristic sends no answers (\(c.properties))")
                    }
                    try await connection.setNotifications(true, for: c)
                }
                // The example's Bluedroid build serves a Device Information Service of its own, with a
                // firmware revision; NimBLE's serves none. A Bluetooth stack may add one holding its
                // PnP ID only (bluetoothd does), which says nothing of the host.
                let revision = services.filter { $0.uuid == DeviceInformationService.serviceUUID }.flatMap(\.characteristics)
                    .first { $0.uuid == DeviceInformationService.firmwareRevisionUUID }
                var version: FirmwareVersion?
                if let revision, let bytes = try? await connection.read(revision) {
                    version = FirmwareVersion(String(decoding: bytes, as: UTF8.self))
                }
                let host: ESPOTAHost = revision == nil ? .nimble : .bluedroid
                let writes = data.properties.contains(.writeWithoutResponse) || writeCommands ? "write commands" : "write requests"
                let summary = DeviceSummary(protocolName: Self.name, firmwareVersion: version,
                                            state: .idle, stateText: "ready (\(host == .nimble ? "NimBLE host" : "Bluedroid host or ble_ota_raw, told apart by START's answer"), by its GATT table; sectors as \(writes)); one START per boot, no resume")
                // RECV_FW flags write only, yet the device's host takes write commands on it: the
                // session streams commands (with `writeCommands` false, requests).
                let stream = writeCommands
                    ? GATTCharacteristic(uuid: data.uuid, properties: data.properties.union(.writeWithoutResponse), id: data.id) : data
                return AttachedLink(characteristics: [.control: command, .data: stream], peer: ESPOTALink(host: host), summary: summary)
            }
        } catch {
            throw OTAError.from(error, device: device)
        }
    }

    /// Image bytes per sector packet at ATT MTU `mtu`.
    public func chunkSize(mtu: Int) -> Int { ESPOTAEngine.packetData(mtu: mtu) }

    public func makeEngine(image: FirmwareImage, config: EngineConfig) -> ESPOTAEngine {
        ESPOTAEngine(image: image, config: config, window: window, honoursDeviceWindow: honoursDeviceWindow)
    }
}
