import Foundation
import GATT
import OTAWire

/// What a device says of itself in its Device Information Service (Bluetooth SIG DIS 1.1): each
/// field nil when the device lacks the characteristic or its read failed.
public struct DeviceIdentity: Sendable, Hashable {
    public var manufacturer: String?
    public var model: String?
    public var serialNumber: String?
    public var hardwareRevision: String?
    public var firmwareRevision: String?

    public init(manufacturer: String? = nil, model: String? = nil, serialNumber: String? = nil,
                hardwareRevision: String? = nil, firmwareRevision: String? = nil) {
        self.manufacturer = manufacturer
        self.model = model
        self.serialNumber = serialNumber
        self.hardwareRevision = hardwareRevision
        self.firmwareRevision = firmwareRevision
    }

    /// Reads the Device Information Service among `services`, each read within `timeout`. A device
    /// may expose more than one DIS (bluetoothd adds its own, with only a PnP ID, beside an
    /// application's): each characteristic comes from whichever instance has it. Never throws: a
    /// field that cannot be read is nil, and the update goes on.
    public static func read(from connection: any GATTConnection, services: [GATTService], timeout: Duration) async -> DeviceIdentity {
        let instances = services.filter { $0.uuid == DeviceInformationService.serviceUUID }
        guard !instances.isEmpty else { return DeviceIdentity() }
        func text(_ uuid: BluetoothUUID) async -> String? {
            guard let c = instances.lazy.compactMap({ $0.characteristic(uuid) }).first(where: { $0.properties.contains(.read) }) else {
                return nil
            }
            guard let bytes = try? await withTimeout(timeout, clock: connection.clock, "reading \(uuid)", {
                () async throws(GATTError) -> [UInt8] in try await connection.read(c)
            }) else { return nil }
            // UTF-8 strings, often padded with NULs by devices that use fixed-size buffers.
            let value = String(decoding: bytes, as: UTF8.self).trimmingCharacters(in: CharacterSet(charactersIn: "\0 "))
            return value.isEmpty ? nil : value
        }
        return DeviceIdentity(manufacturer: await text(DeviceInformationService.manufacturerNameUUID),
                              model: await text(DeviceInformationService.modelNumberUUID),
                              serialNumber: await text(DeviceInformationService.serialNumberUUID),
                              hardwareRevision: await text(DeviceInformationService.hardwareRevisionUUID),
                              firmwareRevision: await text(DeviceInformationService.firmwareRevisionUUID))
    }
}
