import GATT

/// Espressif's BLE OTA service (esp-iot-solution `components/bluetooth/ble_profiles/esp/ble_ota`):
/// one service, four characteristics, each flagged write + indicate (the progress bar read +
/// indicate) on both hosts; answers go out as notifications all the same.
public enum ESPOTAService {
    public static let serviceUUID = BluetoothUUID(uint16: 0x8018)
    /// RECV_FW: sector packets in (write requests or commands: NimBLE maps both to one
    /// permission), sector ACKs out.
    public static let receiveFirmwareUUID = BluetoothUUID(uint16: 0x8020)
    /// PROGRESS_BAR: read + indicate; neither host writes it.
    public static let progressBarUUID = BluetoothUUID(uint16: 0x8021)
    /// COMMAND: START and STOP in, their ACKs out.
    public static let commandUUID = BluetoothUUID(uint16: 0x8022)
    /// CUSTOMER: the application's own; the component ignores it.
    public static let customerUUID = BluetoothUUID(uint16: 0x8023)
    /// What the NimBLE example advertises instead of 0x8018 (the Alert Notification service), so
    /// a device is found by its name or address, and its OTA service only after connecting.
    public static let nimbleAdvertisedUUID = BluetoothUUID(uint16: 0x1811)
    /// The NimBLE example's GAP name.
    public static let nimbleName = "nimble-ble-ota"
    /// The Bluedroid component's GAP name.
    public static let bluedroidName = "ESP-C919"
    /// Bytes of image data per sector: the unit each ACK covers.
    public static let sectorSize = 4096
}

/// CRC16-CCITT as Espressif's component computes it: polynomial 0x1021, initial value 0, most
/// significant bit first, no final XOR (the XMODEM variant; "123456789" gives 0x31C3).
public enum CRC16 {
    private static let table: [UInt16] = (0..<256).map { i in
        var crc = UInt16(i) << 8
        for _ in 0..<8 { crc = crc & 0x8000 != 0 ? (crc << 1) ^ 0x1021 : crc << 1 }
        return crc
    }

    public static func checksum(_ bytes: some Sequence<UInt8>, seed: UInt16 = 0) -> UInt16 {
        var crc = seed
        for b in bytes { crc = (crc << 8) ^ table[Int(UInt8(truncatingIfNeeded: crc >> 8) ^ b)] }
        return crc
    }
}
