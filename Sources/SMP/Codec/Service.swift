import GATT

/// MCUmgr's SMP over BLE (Zephyr `smp_bt.c`; smpclient `transport/ble.py`): one characteristic
/// carries requests (write without response) and responses (notifications).
public enum SMPService {
    /// The SMP service, advertised by a Zephyr or nRF Connect SDK device with MCUmgr.
    public static let serviceUUID: BluetoothUUID = "8d53dc1d-1db7-4cd3-868b-8a527460aa84"
    /// The SMP characteristic: write without response + notify.
    public static let characteristicUUID: BluetoothUUID = "da2e7828-fbce-4e01-ae9e-261174997c48"
}
