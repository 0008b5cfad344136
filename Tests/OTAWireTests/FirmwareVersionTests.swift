import OTAWire
import Testing

@Suite("Firmware versions")
struct FirmwareVersionTests {
    @Test(arguments: [
        ("1", FirmwareVersion(major: 1, minor: 0, patch: 0)),
        ("1.2", FirmwareVersion(major: 1, minor: 2, patch: 0)),
        ("1.2.3", FirmwareVersion(major: 1, minor: 2, patch: 3)),
        ("0.0.0", FirmwareVersion(major: 0, minor: 0, patch: 0)),
        ("255.255.65535", FirmwareVersion(major: 255, minor: 255, patch: 65535)),
    ])
    func parsesOneToThreeComponents(text: String, version: FirmwareVersion) {
        #expect(FirmwareVersion(text) == version)
    }

    @Test(arguments: ["", "256", "1.256", "1.2.65536", "1.2.3.4", "1..2", "1.2.", ".1", "a.b.c", "-1", "1.2.3 ", "v1.2.3"])
    func rejectsMalformedOrOutOfRangeText(text: String) {
        #expect(FirmwareVersion(text) == nil)
    }

    @Test func packsMajorMinorPatchIntoThirtyTwoBits() {
        let v = FirmwareVersion(major: 0x12, minor: 0x34, patch: 0x5678)
        #expect(v.packed == 0x1234_5678)
        #expect(FirmwareVersion(packed: 0x1234_5678) == v)
        #expect(FirmwareVersion(packed: 0xFFFF_FFFF) == FirmwareVersion(major: 255, minor: 255, patch: 65535))
        #expect(v.description == "18.52.22136")
    }

    @Test func ordersNumericallyByComponent() {
        #expect(FirmwareVersion("1.2.3")! < FirmwareVersion("1.10.0")!)
        #expect(FirmwareVersion("1.255.65535")! < FirmwareVersion("2")!)
        #expect(FirmwareVersion("1.2.9")! < FirmwareVersion("1.2.10")!)
        #expect(!(FirmwareVersion("1.2.3")! < FirmwareVersion("1.2.3")!))
    }

    @Test func printsAsDottedTriple() {
        #expect(FirmwareVersion("4.5")!.description == "4.5.0")
    }
}
