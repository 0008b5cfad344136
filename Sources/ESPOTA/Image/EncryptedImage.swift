import OTA
import OTAWire

/// A pre-encrypted app image (Espressif's `esp_encrypted_img` component, idf-extra-components;
/// `esp_enc_img_gen.py encrypt`, or the build's `create_esp_enc_img` step, writes it): a 512-byte
/// header (`pre_enc_bin_header`: magic 0x0788b6cf, the AES-256-GCM key encrypted with the device's
/// RSA-3072 public key, or with the ECIES scheme a server key and salt, in 384 bytes; the 16-byte
/// IV; the ciphertext's length, LE u32; the 16-byte GCM tag; 88 reserved bytes), then the
/// ciphertext, as long as the app image it encrypts.
///
/// Only a device whose application decrypts it takes it: esp-iot-solution's `ble_ota` built with
/// `CONFIG_PRE_ENC_OTA` feeds each sector to `esp_encrypted_img_decrypt_data` with its private key,
/// takes START's length as the whole file and subtracts the header (`ENC_HEADER`, 512), so the file
/// is sent as it is. otaflash cannot look inside: the chip, the segments and the checksum are
/// checked by the device once it decrypted the image (the GCM tag at the end, then `esp_ota_end`).
public struct ESPEncryptedImage: Sendable, Hashable {
    /// 0x0788b6cf, little-endian: the first four bytes of the file.
    public static let magic: UInt32 = 0x0788_B6CF
    public static let magicBytes: [UInt8] = [0xCF, 0xB6, 0x88, 0x07]
    /// `esp_encrypted_img_get_header_size()`.
    public static let headerSize = 512
    /// Where the ciphertext's length lies in the header: after the magic (4), the key block (384)
    /// and the IV (16).
    static let lengthOffset = 404

    public let bytes: [UInt8]
    public let source: String
    /// The length of the app image inside (the ciphertext's): what the device writes to its OTA
    /// partition.
    public let appSize: Int

    public var size: Int { bytes.count }
    public var firmware: FirmwareImage { FirmwareImage(bytes: bytes, source: source) }

    /// Whether `bytes` starts with the component's magic.
    public static func isEncrypted(_ bytes: some Collection<UInt8>) -> Bool { bytes.starts(with: magicBytes) }

    /// Checks what can be checked without the device's key: the header is whole and the length it
    /// gives is the rest of the file (the component decrypts exactly that many bytes and the
    /// device waits for START's length).
    public init(bytes: [UInt8], source: String = "image") throws(ESPImageError) {
        guard Self.isEncrypted(bytes) else {
            throw ESPImageError("\(source) does not start with the esp_encrypted_img magic 0x0788b6cf")
        }
        guard bytes.count <= ESPAppImage.maximumSize + Self.headerSize else {
            throw ESPImageError(.imageTooLarge, "\(source) is \(bytes.count) bytes, larger than any ESP32's flash (16 MiB) and its header")
        }
        guard bytes.count > Self.headerSize else {
            throw ESPImageError("\(source) is a damaged pre-encrypted image (esp_encrypted_img): it is \(bytes.count) bytes, no longer than its \(Self.headerSize)-byte header; the file is truncated, copy it again")
        }
        let at = Self.lengthOffset
        let length = Int(UInt32(bytes[at]) | UInt32(bytes[at + 1]) << 8 | UInt32(bytes[at + 2]) << 16 | UInt32(bytes[at + 3]) << 24)
        let carried = bytes.count - Self.headerSize
        guard length == carried else {
            let what = length > carried ? "the file is truncated, copy it again" : "the file is damaged, encrypt the app image again"
            throw ESPImageError("\(source) is a damaged pre-encrypted image (esp_encrypted_img): its header says \(length) bytes of ciphertext follow it, the file holds \(carried); \(what)")
        }
        self.bytes = bytes
        self.source = source
        self.appSize = length
    }

    /// What the user should know before it is sent: what the device must be.
    public var warnings: [String] {
        ["\(source) is a pre-encrypted image (esp_encrypted_img): it is sent as it is, and only a device built with CONFIG_PRE_ENC_OTA "
            + "(ble_ota's pre-encrypted mode, holding the RSA private key the image was encrypted for) decrypts it; "
            + "any other device writes the ciphertext, refuses it and does not restart (exit 8). "
            + "The chip and the app image inside are checked by the device only"]
    }
}
