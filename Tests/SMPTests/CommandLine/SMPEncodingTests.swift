import Crypto
import Foundation
import Testing

// `--sim-smp-cbor`: the simulated SMP server answers as Zephyr (zcbor, the default), mcumgr
// (tinycbor), canonically (definite) or with indefinite lengths in otaflash's order; otaflash
// lists the slots and updates the device in each.

/// An unsigned MCUboot image as imgtool lays it out: header, `body`, the SHA256 TLV.
private func mcubootImage(version: (UInt8, UInt8), body: [UInt8]) -> [UInt8] {
    func le(_ value: Int, _ count: Int) -> [UInt8] { (0..<count).map { UInt8(truncatingIfNeeded: value >> (8 * $0)) } }
    var header = [0x3D, 0xB8, 0xF3, 0x96] + le(0, 4) + le(32, 2) + le(0, 2) + le(body.count, 4) + le(0, 4)
    header += [version.0, version.1] + le(0, 2) + le(0, 4) + le(0, 4)
    let hashed = header + body
    let digest = Array(SHA256.hash(data: hashed))
    return hashed + [0x07, 0x69] + le(40, 2) + [0x10, 0x00] + le(32, 2) + digest
}

@Suite("otaflash and the simulated SMP server's answer encodings")
struct SMPEncodingTests {
    static let image = samplePath("mcuboot/blinky-ec256-v1.3.0.bin")

    @Test(arguments: ["zcbor", "tinycbor", "indefinite", "definite"])
    func imageListAndAFullUpdateWorkInEachEncoding(encoding: String) async throws {
        let list = await otaflash(["image", "list", "--simulator", "--sim-smp-cbor", encoding, "--json"])
        #expect(list.code == 0, "\(list.stderr)")
        let slots = list.jsonEvents.filter { $0["event"] as? String == "slot" }
        #expect(slots.count == 1, "\(list.stdout)")
        #expect(slots.first?["active"] as? Bool == true)
        #expect((slots.first?["version"] as? String)?.hasPrefix("1.0.0") == true, "\(list.stdout)")

        let run = await otaflash(simulator + ["--json", "--sim-smp-cbor", encoding, Self.image])
        #expect(run.code == 0, "\(run.stderr)")
        let done = try #require(run.jsonEvents.last)
        #expect(done["result"] as? String == "ok")
        #expect(done["firmware_after"] as? String == "1.3.0")
    }

    @Test func anUnknownEncodingIsAUsageError() async {
        expectOneUsageLine(await otaflash(simulator + ["--sim-smp-cbor", "cbor2", Self.image]), saying: ["--sim-smp-cbor", "cbor2"])
        expectOneUsageLine(await otaflash(["simulate", "--cbor", "zcbor"]), saying: ["--cbor", "--protocol smp"])
        let raw = await otaflash(simulator + ["--sim-smp-cbor", "zcbor", samplePath("seeded-4k.bin")])
        #expect(raw.code == 2 && raw.stderr.contains("--sim-smp-cbor applies to smp only"), "\(raw.stderr)")
    }

    /// A 300 KiB image for an mcumgr device's 256 KiB slot: `rc` 1 at offset 0, said to be a size
    /// problem, exit 9, without "reset it and retry".
    @Test func anImageOverAnMcumgrSlotMayNotFit() async throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("otaflash-smp-big-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: dir) }
        let path = dir.appendingPathComponent("big.signed.bin").path
        let bytes = mcubootImage(version: (1, 5), body: (0..<(300 * 1024)).map { UInt8(truncatingIfNeeded: $0 &* 31) })
        try Data(bytes).write(to: URL(fileURLWithPath: path))
        let run = await otaflash(simulator + ["--sim-slot-size", "262144", "--sim-smp-cbor", "tinycbor", path])
        #expect(run.code == 9, "\(run.stderr)")
        #expect(run.errorLines.count == 1, "\(run.stderr)")
        let line = run.errorLines.first ?? ""
        #expect(line.contains("may not fit its slot") && line.contains("\(bytes.count) bytes"), "\(line)")
        #expect(!line.contains("reset it and retry"), "\(line)")
        // Zephyr's own code, to otaflash's SMP v2 request: too large, exit 4.
        let zephyr = await otaflash(simulator + ["--sim-slot-size", "262144", path])
        #expect(zephyr.code == 4, "\(zephyr.stderr)")
    }
}
