import Native
import OTADevice
import OTAWire
import Testing

/// One set of device rules: the C library (what a microcontroller runs) and `OTATarget` (what the
/// simulator and `otaflash simulate` run) get the same writes and must answer with the same
/// notifications and the same info value after every step. The C device runs on the NOR flash
/// model, which refuses a program of any byte not erased since it was last programmed, so every
/// scenario also proves that the rules never rewrite flash without an erase.
/// (docs/ARCHITECTURE.md, "One set of device rules".)
struct ConformanceTests {
    static let eraseUnit = 4096
    static let image: [UInt8] = (0..<20_000).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ $0 >> 7) }
    static let imageCRC = CRC32.checksum(image)
    static let newVersion = FirmwareVersion(major: 2, minor: 1, patch: 7)

    /// A write, or something that happens to the device.
    enum Step: CustomStringConvertible {
        case control([UInt8], central: Int = 1)
        case data(offset: Int, count: Int, central: Int = 1)
        /// Data whose bytes differ from the image's (corrupted on the way).
        case corruptData(offset: Int, count: Int)
        case raw([UInt8])
        case expireHold
        case linkLost
        case reboot

        var description: String {
            switch self {
            case .control(let b, let c): "control \(b.prefix(1).map { String($0) }) from \(c)"
            case .data(let o, let n, let c): "data \(o)+\(n) from \(c)"
            case .corruptData(let o, let n): "corrupt data \(o)+\(n)"
            case .raw(let b): "data write of \(b.count) bytes"
            case .expireHold: "hold expires"
            case .linkLost: "link lost"
            case .reboot: "reboot"
            }
        }
    }

    static func begin(size: Int = image.count, crc: UInt32 = imageCRC, version: UInt8 = 2, restart: Bool = false, central: Int = 1) -> Step {
        .control(ControlRequest.begin(.init(protocolVersion: version, imageSize: UInt32(size), imageCRC: crc,
                                            version: newVersion, restart: restart)).encoded, central: central)
    }

    static func checkpoint(_ offset: Int, crc: UInt32? = nil, central: Int = 1) -> Step {
        .control(ControlRequest.checkpoint(offset: UInt32(offset), crc: crc ?? CRC32.checksum(image[0..<offset])).encoded,
                 central: central)
    }

    static func command(_ r: ControlRequest, central: Int = 1) -> Step { .control(r.encoded, central: central) }

    /// In-order packets of `chunk` bytes over `range`.
    static func stream(_ range: Range<Int>, chunk: Int = 240) -> [Step] {
        stride(from: range.lowerBound, to: range.upperBound, by: chunk).map { .data(offset: $0, count: min(chunk, range.upperBound - $0)) }
    }

    /// The whole image in order with a checkpoint every 8 KiB, then the final one and VERIFY.
    static var wholeTransfer: [Step] {
        var steps = [begin()]
        for start in stride(from: 0, to: image.count, by: 8192) {
            let end = min(image.count, start + 8192)
            steps += stream(start..<end)
            steps.append(checkpoint(end))
        }
        return steps + [command(.verify)]
    }

    static let scenarios: [(String, [Step])] = [
        ("happy path: stream, checkpoints, verify, activate", wholeTransfer + [command(.activate), command(.status)]),
        ("out of order within the reorder capacity, a CHECKPOINT held until its data arrives", {
            var steps = [begin()] + stream(0..<960)
            // Pairs swapped, and one packet 10 KiB early (EATT bearers).
            steps += [.data(offset: 11_200, count: 240), .data(offset: 1200, count: 240), .data(offset: 960, count: 240)]
            steps += [checkpoint(4800)]  // overtakes its data: held
            steps += stream(1440..<4800)
            steps += stream(4800..<11_200) + stream(11_440..<12_288) + [checkpoint(12_288), command(.status)]
            return steps
        }()),
        ("a packet beyond the reorder capacity is dropped: GAP once, then a held CHECKPOINT answers gap", {
            [begin()] + stream(0..<480) + [
                .data(offset: 600, count: 240), .data(offset: 17_000, count: 240), .data(offset: 17_240, count: 240),
                checkpoint(2400), .data(offset: 18_000, count: 240), command(.status),
            ] + stream(480..<4096) + [checkpoint(4096)]
        }()),
        ("more ranges beyond a hole than the device holds", {
            [begin()] + stride(from: 480, to: 480 * 12, by: 480).map { .data(offset: $0, count: 240) } + [command(.status)]
        }()),
        ("rollback: corrupted data is caught at the checkpoint and rewritten after an erase", {
            [begin()] + stream(0..<8192) + [checkpoint(8192), .corruptData(offset: 8192, count: 240)] + stream(8432..<12_000) +
                [checkpoint(12_000)] + stream(8192..<12_288) + [checkpoint(12_288), command(.status)]
        }()),
        ("a checkpoint between erase units commits the boundary below it; a reboot resumes there", {
            [begin()] + stream(0..<6000) + [checkpoint(6000)] + stream(6000..<7200) +
                [command(.status), .reboot, command(.status), begin(central: 2)] + stream(4096..<8192) + [checkpoint(8192)]
        }()),
        ("reboot with a verified transfer: receiving at the image size, VERIFY runs again", wholeTransfer + [
            .reboot, command(.status), command(.activate), begin(), command(.verify), command(.activate),
        ]),
        ("bad image CRC: VERIFY refuses, nothing is activated", [begin(crc: imageCRC ^ 1)] + stream(0..<image.count) + [
            checkpoint(image.count), command(.verify), command(.activate), command(.status),
        ]),
        ("busy: another central gets busy except for STATUS and a BEGIN that resumes", [begin()] + stream(0..<2400) + [
            checkpoint(2400, central: 2), command(.verify, central: 2), command(.abort, central: 2), command(.status, central: 2),
            begin(size: 100, central: 2), begin(restart: true, central: 2), .data(offset: 2400, count: 240, central: 2),
            begin(central: 2), .data(offset: 2400, count: 240, central: 2), command(.status, central: 1),
            command(.abort, central: 1), command(.abort, central: 2), begin(size: 100, central: 1),
        ]),
        ("malformed writes and refused BEGINs", [
            .control([]), .control([0x00]), .control([0x07]), .control([0x01, 0x02]), .control([0x03, 0x00]),
            .control([0x02] + [UInt8](repeating: 0, count: 9)), begin(version: 1), begin(size: 0), begin(size: 64 * 1024 + 1),
            command(.verify), command(.activate), checkpoint(0), .raw([0, 0, 0, 0, 1]),
            begin(), .raw([]), .raw([0, 0, 0, 0]), .raw([0xFF, 0xFF, 0xFF, 0xFF, 1]), .raw([0x10, 0x4E, 0, 0, 1, 2]),
            command(.status),
        ]),
        ("held CHECKPOINTs: expiry answers gap, a link loss or a new command forgets one", [begin()] + stream(0..<960) + [
            checkpoint(2400), .expireHold, checkpoint(2400), .linkLost, .expireHold, checkpoint(2400), command(.status),
        ] + stream(960..<2400) + [checkpoint(2400), checkpoint(1000), checkpoint(0), command(.status)]),
        ("a CHECKPOINT below the committed offset changes nothing", [begin()] + stream(0..<9000) + [
            checkpoint(8192), checkpoint(4096), checkpoint(4096, crc: 1), checkpoint(9000), command(.status),
        ]),
        ("ABORT discards; the next BEGIN starts anew and erases before it writes", [begin()] + stream(0..<5000) + [
            checkpoint(4096), command(.abort), begin(),
        ] + stream(0..<4096) + [checkpoint(4096)]),
    ]

    @Test(arguments: scenarios.indices)
    func cAndSwiftDevicesAnswerAlike(_ index: Int) throws {
        let (name, steps) = Self.scenarios[index]
        let c = try #require(CDeviceSetup(slotSize: 64 * 1024, eraseUnit: Self.eraseUnit, reorderCapacity: 16 * 1024, reorderRanges: 8).make())
        var swift = OTATarget(slotSize: 64 * 1024, firmwareVersion: FirmwareVersion(packed: 0x0100_0000),
                              version2: .init(eraseUnit: Self.eraseUnit, reorderCapacity: 16 * 1024, reorderRanges: 8, eraseTimeMs: 85))
        swift.deferEarlyCheckpoints = true
        var answered = 0
        for (i, step) in steps.enumerated() {
            let (fromC, fromSwift) = Self.run(step, c: c, swift: &swift)
            #expect(fromC == fromSwift, "\(name), step \(i) (\(step)): C \(hex(fromC)), Swift \(hex(fromSwift))")
            #expect(c.info == swift.info.encoded, "\(name), step \(i) (\(step)): info differs")
            answered += fromC.isEmpty ? 0 : 1
        }
        #expect(c.violations == 0, "\(name): the C device wrote flash it had not erased, or outside the slot")
        #expect(answered > 0)
    }

    static func run(_ step: Step, c: CDeviceLibrary, swift: inout OTATarget) -> ([UInt8], [UInt8]) {
        func name(_ n: Int) -> String { central(n) }
        switch step {
        case .control(let bytes, let central):
            return (c.control(bytes, from: name(central)), swift.handleControl(bytes, from: name(central)))
        case .data(let offset, let count, let central):
            let packet = DataPacket.encode(offset: UInt32(offset), payload: image[offset..<(offset + count)])
            return (c.data(packet, from: name(central)), swift.handleData(packet, from: name(central)) ?? [])
        case .corruptData(let offset, let count):
            let packet = DataPacket.encode(offset: UInt32(offset), payload: image[offset..<(offset + count)].map { $0 ^ 0x5A }[...])
            return (c.data(packet, from: name(1)), swift.handleData(packet, from: name(1)) ?? [])
        case .raw(let bytes):
            return (c.data(bytes, from: name(1)), swift.handleData(bytes, from: name(1)) ?? [])
        case .expireHold:
            return (c.expireHold(), swift.expireDeferredCheckpoint() ?? [])
        case .linkLost:
            c.linkLost()
            swift.cancelDeferredCheckpoint()
            return ([], [])
        case .reboot:
            c.reboot()
            swift.reboot()
            return ([], [])
        }
    }
}

func hex(_ bytes: [UInt8]) -> String {
    bytes.map { ($0 < 16 ? "0" : "") + String($0, radix: 16) }.joined()
}
