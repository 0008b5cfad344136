import Foundation
import OTAFlashCLI

/// GBL bytes for the tests, written tag by tag as UG266 lays a GBL file out: each tag is its id
/// and length (LE u32) and its data; the file ends with the end tag, whose value is the CRC-32
/// (IEEE 802.3, reflected, as the bootloader's parser computes it) of every byte before it.
enum TestGBL {
    static let header: [UInt8] = [0xEB, 0x17, 0xA6, 0x03]
    static let application: [UInt8] = [0xF4, 0x0A, 0x0A, 0xF4]
    static let prog: [UInt8] = [0xFE, 0x01, 0x01, 0xFE]
    static let signature: [UInt8] = [0xF7, 0x0A, 0x0A, 0xF7]
    static let end: [UInt8] = [0xFC, 0x04, 0x04, 0xFC]

    static func le(_ v: UInt32) -> [UInt8] { [0, 8, 16, 24].map { UInt8(truncatingIfNeeded: v >> $0) } }

    /// The CRC-32 bit by bit ("123456789" gives 0xCBF43926).
    static func crc32(_ bytes: [UInt8]) -> UInt32 {
        var crc: UInt32 = 0xFFFF_FFFF
        for byte in bytes {
            crc ^= UInt32(byte)
            for _ in 0..<8 { crc = crc & 1 != 0 ? (crc >> 1) ^ 0xEDB8_8320 : crc >> 1 }
        }
        return ~crc
    }

    /// A GBL of an application of `version` whose prog tag holds `body` (whole words), signed
    /// (a signature tag of 64 zero bytes, which only its presence counts for here) or not.
    static func bytes(version: UInt32 = 0x0200_0000, body: [UInt8] = Array(repeating: 0xA5, count: 3000), signed: Bool = false) -> [UInt8] {
        var out = header + le(8) + le(0x0300_0000) + le(signed ? 0x100 : 0)
        out += application + le(28) + le(1 << 5) + le(version) + le(0) + Array(repeating: 0x11, count: 16)
        out += prog + le(UInt32(4 + body.count)) + le(0) + body
        if signed { out += signature + le(64) + Array(repeating: 0, count: 64) }
        out += end + le(4)
        return out + le(crc32(out))
    }

    /// A body of `count` bytes that is not all one value.
    static func body(_ count: Int) -> [UInt8] { (0..<count).map { UInt8(truncatingIfNeeded: $0 &* 37 &+ 11) } }
}

/// Writes `bytes` as `name` in a folder of its own under the temporary directory; its path.
func temporaryFile(_ name: String, _ bytes: [UInt8]) throws -> String {
    let folder = FileManager.default.temporaryDirectory.appendingPathComponent("otaflash-silabs-\(UUID().uuidString)")
    try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
    let path = folder.appendingPathComponent(name).path
    try Data(bytes).write(to: URL(fileURLWithPath: path))
    return path
}

/// `otaflash` in process, its state kept in a folder of the tests' own.
func otaflash(_ arguments: [String]) async -> (code: Int32, stdout: String, stderr: String) {
    setenv("XDG_STATE_HOME", NSTemporaryDirectory() + "otaflash-silabs-tests-state-\(getpid())", 1)
    let output = CapturedOutput()
    let code = await runOtaflash(arguments, output: output)
    return (code, output.stdout, output.stderr)
}
