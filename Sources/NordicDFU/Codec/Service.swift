import GATT

/// The Secure DFU GATT layout (nRF5 SDK `ble_dfu.h`; nrfutil `dfu_transport_ble.py`).
public enum SecureDFUService {
    /// Service 0xFE59, exposed by the bootloader and, for buttonless entry, by the application.
    public static let serviceUUID = BluetoothUUID(uint16: 0xFE59)
    /// Control Point: write with response + notify.
    public static let controlPointUUID: BluetoothUUID = "8ec90001-f315-4f60-9fb8-838830daea50"
    /// Packet: write without response.
    public static let packetUUID: BluetoothUUID = "8ec90002-f315-4f60-9fb8-838830daea50"
    /// Buttonless DFU without bonds: write + indicate.
    public static let buttonlessUUID: BluetoothUUID = "8ec90003-f315-4f60-9fb8-838830daea50"
    /// Buttonless DFU with bonds: write + indicate (needs pairing).
    public static let buttonlessBondedUUID: BluetoothUUID = "8ec90004-f315-4f60-9fb8-838830daea50"

    /// Where an unbonded bootloader advertises after buttonless entry: the address with its
    /// least significant octet (the last printed pair) one higher, wrapping without carry
    /// (SDK `gap_address_change`: `addr[0] += 1`). Nil when `address` is not `XX:XX:XX:XX:XX:XX`.
    public static func bootloaderAddress(for address: String) -> String? {
        let parts = address.split(separator: ":", omittingEmptySubsequences: false)
        guard parts.count == 6, parts.allSatisfy({ $0.count == 2 }) else { return nil }
        let octets = parts.compactMap { UInt8($0, radix: 16) }
        guard octets.count == 6 else { return nil }
        var out = octets
        out[5] = octets[5] &+ 1
        return out.map { hex2($0) }.joined(separator: ":")
    }
}

/// A request written to the buttonless characteristic.
public enum ButtonlessRequest: Hashable, Sendable {
    /// `01`: reboot into the bootloader.
    case enterBootloader
    /// `02 <len u8> <name>`: the name the bootloader advertises (1...20 bytes).
    case setAdvertisingName(String)

    public var opcode: UInt8 {
        switch self {
        case .enterBootloader: 0x01
        case .setAdvertisingName: 0x02
        }
    }

    public var encoded: [UInt8] {
        switch self {
        case .enterBootloader: return [0x01]
        case .setAdvertisingName(let name):
            let bytes = Array(name.utf8)
            return [0x02, UInt8(clamping: bytes.count)] + bytes
        }
    }

    /// Parses a write; the error carries the result to indicate back.
    public init(decoding bytes: [UInt8]) throws(ButtonlessError) {
        guard let op = bytes.first else { throw ButtonlessError(opcode: 0, result: .opcodeNotSupported) }
        switch op {
        case 0x01 where bytes.count == 1:
            self = .enterBootloader
        case 0x02:
            guard bytes.count >= 2, Int(bytes[1]) == bytes.count - 2, (1...20).contains(bytes.count - 2),
                  let name = String(validating: bytes[2...], as: UTF8.self) else {
                throw ButtonlessError(opcode: op, result: .invalidAdvertisingName)
            }
            self = .setAdvertisingName(name)
        default:
            throw ButtonlessError(opcode: op, result: .opcodeNotSupported)
        }
    }
}

/// The result byte of a buttonless indication `20 <op> <result>`.
public struct ButtonlessResult: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
    public let rawValue: UInt8
    public init(rawValue: UInt8) { self.rawValue = rawValue }

    public static let success = ButtonlessResult(rawValue: 0x01)
    public static let opcodeNotSupported = ButtonlessResult(rawValue: 0x02)
    public static let operationFailed = ButtonlessResult(rawValue: 0x04)
    public static let invalidAdvertisingName = ButtonlessResult(rawValue: 0x05)
    public static let busy = ButtonlessResult(rawValue: 0x06)
    public static let notBonded = ButtonlessResult(rawValue: 0x07)

    public var description: String {
        switch self {
        case .success: "success"
        case .opcodeNotSupported: "opcode not supported: the application's buttonless service lacks this request"
        case .operationFailed: "operation failed: the application could not enter the bootloader; power-cycle it and retry"
        case .invalidAdvertisingName: "invalid advertising name: use 1 to 20 bytes of UTF-8"
        case .busy: "busy: the application is already entering the bootloader; wait for it to disconnect"
        case .notBonded: "not bonded: this device enters the bootloader only for a bonded central; pair it first"
        default: "unknown buttonless result 0x\(hex2(rawValue))"
        }
    }
}

/// The buttonless indication: `20 <request opcode> <result>`.
public struct ButtonlessResponse: Hashable, Sendable {
    public var opcode: UInt8
    public var result: ButtonlessResult

    public init(opcode: UInt8, result: ButtonlessResult) {
        self.opcode = opcode
        self.result = result
    }

    public var encoded: [UInt8] { [0x20, opcode, result.rawValue] }

    public init(decoding bytes: [UInt8]) throws(DFUWireError) {
        // Longer indications are taken, their extra bytes ignored, as Nordic's DFU libraries do
        // (Android `ButtonlessDfuImpl.getStatusCode`, iOS `ButtonlessDFUResponse`).
        guard bytes.count >= 3, bytes[0] == 0x20 else {
            throw DFUWireError("buttonless indication must be at least 3 bytes starting 0x20, got \(bytes.count) bytes")
        }
        opcode = bytes[1]
        result = ButtonlessResult(rawValue: bytes[2])
    }
}

/// A buttonless write that cannot be carried out.
public struct ButtonlessError: Error, Sendable, Hashable {
    public let opcode: UInt8
    public let result: ButtonlessResult
}
