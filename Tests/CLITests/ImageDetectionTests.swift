import Foundation
import OTA
import OTACommandLine
@testable import OTAFlashCLI
import Testing

/// `flash`'s file, read once and routed once: detection returns a value naming the protocol and
/// carrying the bytes read, and that protocol's loader makes the plan from the value alone.
@Suite("Image detection returns a value")
struct ImageDetectionTests {
    static let own: [(sample: String, protocolName: String, parts: Int)] = [
        ("nordic/blinky-app.zip", "nordic-dfu", 1),
        ("nordic/blinky-sd-bl-app.zip", "nordic-dfu", 2),
        ("mcuboot/blinky-ec256-v1.3.0.bin", "smp", 1),
        ("mcuboot/blinky-ed25519-v1.2.3+4.hex", "smp", 1),
        ("nrf5340/dfu_application.zip", "smp", 1),
        ("esp32/blink-esp32.bin", "esp-ota", 1),
        ("esp32/blink-esp32-enc.bin", "esp-ota", 1),
    ]

    /// The sample copied into `scratch`, so that the copy can be deleted.
    static func copy(_ sample: String, into scratch: Scratch) throws -> String {
        let path = scratch.url.appendingPathComponent(URL(fileURLWithPath: sample).lastPathComponent).path
        try FileManager.default.copyItem(atPath: samplePath(sample), toPath: path)
        return path
    }

    static var request: FlashRequest { FlashRequest(protocolName: ProtocolRegistry.auto, registry: .cli) }

    @Test(arguments: own)
    func aProtocolsOwnFileIsDetectedAsAValueItsLoaderTakesWithoutTheFile(sample: String, protocolName: String, parts: Int) throws {
        let scratch = try Scratch()
        let path = try Self.copy(sample, into: scratch)
        let detection = try ImageDetection.detect(path: path, among: ProtocolCommandLine.all)
        guard case .own(let registration, let claimed) = detection else {
            Issue.record("\(sample) was not claimed: \(detection)")
            return
        }
        #expect(registration.name == protocolName)
        #expect(claimed.path == path)
        #expect(claimed.format.kind == registration.loader?.detector.kind)
        // The bytes were read: the loader makes the plan with the file gone.
        try FileManager.default.removeItem(atPath: path)
        #expect(!FileManager.default.fileExists(atPath: path))
        let plan = try registration.load(claimed, Self.request)
        #expect(plan.profile.name == protocolName)
        #expect(plan.parts.count == parts)
        #expect(plan.update.reason.contains(protocolName), "\(plan.update.reason)")
    }

    /// The same file through `FlashPlan.load` and through the value give the same plan.
    @Test(arguments: own)
    func theValueGivesThePlanTheFileGives(sample: String, protocolName: String, parts: Int) throws {
        let viaFile = try FlashPlan.load(path: samplePath(sample), Self.request)
        guard case .own(let registration, let claimed) = try ImageDetection.detect(path: samplePath(sample), among: ProtocolCommandLine.all) else {
            Issue.record("\(sample) was not claimed")
            return
        }
        let viaValue = try registration.load(claimed, Self.request)
        #expect(viaValue.parts.map(\.firmware.bytes) == viaFile.parts.map(\.firmware.bytes))
        #expect(viaValue.parts.map(\.profile.name) == viaFile.parts.map(\.profile.name))
        #expect(viaValue.update.reason == viaFile.update.reason)
        #expect(viaValue.update.contents == viaFile.update.contents)
    }

    @Test(arguments: ["seeded-4k.bin", "seeded-256k.hex"])
    func aRawOrHEXImageIsDetectedAsAnImageForTheRegistry(sample: String) throws {
        let detection = try ImageDetection.detect(path: samplePath(sample), among: ProtocolCommandLine.all)
        guard case .image(let image) = detection else {
            Issue.record("\(sample) was claimed: \(detection)")
            return
        }
        #expect(image.source == samplePath(sample))
        #expect(image.size > 0)
        #expect(try FlashPlan.load(path: samplePath(sample), Self.request).profile.name == "native")
    }

    /// A protocol's own file the protocol asked for does not send: the loader's refusal, exit 3,
    /// from the value.
    @Test func theLoaderRefusesAFileForAnotherProtocolFromTheValue() throws {
        let scratch = try Scratch()
        let path = try Self.copy("nordic/blinky-app.zip", into: scratch)
        guard case .own(let registration, let claimed) = try ImageDetection.detect(path: path, among: ProtocolCommandLine.all) else {
            Issue.record("not claimed")
            return
        }
        try FileManager.default.removeItem(atPath: path)
        let native = FlashRequest(protocolName: "native", registry: .cli)
        #expect {
            try registration.load(claimed, native)
        } throws: { error in
            guard let failure = error as? CLIFailure else { return false }
            return failure.code == .imageFile && failure.message.hasPrefix("\(path): the native protocol does not send nordic-dfu-package images")
        }
    }

    /// Each registered file hint speaks through detection: the lines that were OTA core's.
    @Test func theRegisteredFileHintsGiveTheirLines() throws {
        let scratch = try Scratch()
        // An Xtensa ELF executable: e_type 2 at 16, e_machine 94 at 18, little-endian.
        var elf: [UInt8] = [0x7F, 0x45, 0x4C, 0x46, 1, 1, 1] + [UInt8](repeating: 0, count: 57)
        elf[16] = 2
        elf[18] = 94
        let elfPath = scratch.url.appendingPathComponent("blink.elf").path
        try Data(elf).write(to: URL(fileURLWithPath: elfPath))
        #expect {
            try ImageDetection.detect(path: elfPath, among: ProtocolCommandLine.all)
        } throws: { error in
            (error as? CLIFailure)?.message == "\(elfPath): is an Xtensa ELF executable (an ESP-IDF build's linker output), not a firmware image; "
                + "pass the app image ESP-IDF builds beside it: build/blink.bin (or make one with `esptool elf2image blink.elf`)"
        }
        #expect(ProtocolCommandLine.all.contains { !$0.fileHints.isEmpty })
        #expect(ProtocolCommandLine.named("esp-ota")?.fileHints.isEmpty == false)
        #expect(ProtocolCommandLine.named("nordic-dfu")?.fileHints.isEmpty == false)
    }
}
