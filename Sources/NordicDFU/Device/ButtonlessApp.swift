import GATT

/// An application with the buttonless DFU characteristic (`8EC90003`, or `8EC90004` with bonds,
/// in service 0xFE59) as a pure state machine: writes in, indications out. After a successful
/// Enter Bootloader it disconnects and the bootloader comes up at `bootloaderAddress`.
///
/// Rules (SDK `ble_dfu_buttonless.c`, docs/NORDIC-DFU.md "Buttonless entry"): a write while
/// indications are off is refused with ATT error 0xFD (CCCD improperly configured); the bonded
/// variant needs an encrypted link (ATT insufficient authentication otherwise); each request is
/// answered with the indication `20 <op> <result>`.
public struct NordicButtonlessApp: Sendable {
    public let address: String
    /// The `8EC90004` variant: only a bonded central may enter the bootloader, which keeps the address.
    public let requiresBond: Bool
    public private(set) var indicationsEnabled = false
    /// The name set with opcode 0x02, advertised by the bootloader.
    public private(set) var advertisingName: String?
    /// Enter Bootloader was accepted: the application disconnects and resets.
    public private(set) var enteringBootloader = false
    /// Nil: Enter Bootloader succeeds. Otherwise the result it is answered with (an application
    /// that cannot enter its bootloader now).
    public var refusal: ButtonlessResult?

    public init(address: String, requiresBond: Bool = false) {
        self.address = address
        self.requiresBond = requiresBond
    }

    /// ATT error 0xFD: Client Characteristic Configuration Descriptor improperly configured.
    public static let cccdImproperlyConfigured = ATTError(rawValue: 0xFD)

    public enum WriteOutcome: Sendable, Hashable {
        /// The write succeeds; send this indication.
        case indicate([UInt8])
        /// The write is refused with this ATT error.
        case refuse(ATTError)
    }

    public mutating func setIndications(_ enabled: Bool) {
        indicationsEnabled = enabled
    }

    /// Handles a write to the buttonless characteristic. `encrypted`: the link is encrypted with a bond.
    public mutating func handleWrite(_ bytes: [UInt8], encrypted: Bool = false) -> WriteOutcome {
        if requiresBond, !encrypted { return .refuse(.insufficientAuthentication) }
        guard indicationsEnabled else { return .refuse(Self.cccdImproperlyConfigured) }
        let request: ButtonlessRequest
        do {
            request = try ButtonlessRequest(decoding: bytes)
        } catch {
            return .indicate(ButtonlessResponse(opcode: error.opcode, result: error.result).encoded)
        }
        guard !enteringBootloader else { return .indicate(ButtonlessResponse(opcode: request.opcode, result: .busy).encoded) }
        switch request {
        case .enterBootloader:
            if let refusal { return .indicate(ButtonlessResponse(opcode: request.opcode, result: refusal).encoded) }
            enteringBootloader = true
        case .setAdvertisingName(let name):
            advertisingName = name
        }
        return .indicate(ButtonlessResponse(opcode: request.opcode, result: .success).encoded)
    }

    /// Where the bootloader advertises after the reset: the same address for a bonded device,
    /// otherwise the least significant octet plus one (wrapping).
    public var bootloaderAddress: String? {
        requiresBond ? address : SecureDFUService.bootloaderAddress(for: address)
    }

    /// The buttonless characteristic this application exposes.
    public var characteristicUUID: BluetoothUUID {
        requiresBond ? SecureDFUService.buttonlessBondedUUID : SecureDFUService.buttonlessUUID
    }
}
