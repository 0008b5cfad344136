import GATT

/// Silicon Labs' Bluetooth OTA service, as the Gecko SDK's and the Simplicity SDK's devices serve
/// it: the AppLoader (its GATT database is in the binary), the application OTA DFU component
/// (`app/bluetooth/common/app_ota_dfu`) and the in-place OTA DFU component
/// (`app/bluetooth/common/in_place_ota_dfu`, OTA Control alone). UUIDs as the NCP host example
/// (`app/bluetooth/example_host/ota_dfu/main.c`) looks for them.
public enum SilabsOTAService {
    public static let serviceUUID: BluetoothUUID = "1d14d6ee-fd63-4fa1-bfa4-8f47b42119f0"
    /// OTA Control: write (with response). One byte, `SilabsControl`.
    public static let controlUUID: BluetoothUUID = "f7bf3564-fb6d-4e53-88a4-5e37e0326063"
    /// OTA Data: write, and write without response where the database flags it. Absent from an
    /// application with the in-place component: that is how the host example tells it must
    /// reboot the device into its AppLoader first.
    public static let dataUUID: BluetoothUUID = "984227f3-34fc-4045-a5d0-2c581f81a153"
    /// The AppLoader's: one byte, the OTA protocol version (3 since Bluetooth SDK 2.7).
    public static let otaVersionUUID: BluetoothUUID = "4cc07bcf-0868-4b32-9dad-ba4cc41e5316"
    /// The AppLoader's: four LE u16 (major, minor, patch, build); the stack's version before OTA version 3.
    public static let apploaderVersionUUID: BluetoothUUID = "4f4a2368-8cca-451e-bfff-cf0e2ee23e9f"
    /// The AppLoader's: LE u32, the Gecko bootloader's version (0: no bootloader).
    public static let bootloaderVersionUUID: BluetoothUUID = "25f05c0a-e917-46e9-b2a5-aa2be1245afe"
    /// LE u32: the application's version (its application properties). The AppLoader serves it;
    /// an application may serve it too.
    public static let applicationVersionUUID: BluetoothUUID = "0d77cc11-4ac1-49f2-bfa9-cd96ac7a92f8"
    /// The name the AppLoader advertises unless the application set another (`sl_bt_ota_set_device_name`).
    public static let appLoaderName = "OTA"
    /// What the host example and EFR Connect put in one OTA Data write: a multiple of four bytes
    /// (`bootloader_writeStorage` takes only whole words), at most ATT MTU − 3.
    public static let wordSize = 4
}
