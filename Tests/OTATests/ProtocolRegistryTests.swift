import GATT
import OTA
import OTAWire
import Testing

/// A package format of the kind a protocol module registers (the core has none of its own).
private extension ImageFormat.Kind {
    static let nordicDFUPackage = ImageFormat.Kind("nordic-dfu-package")
}

/// Another protocol for the registry to choose from; nothing attaches to it.
struct OtherProfile: OTAProfile {
    let name: String
    let serviceUUID: BluetoothUUID
    let imageFormats: Set<ImageFormat.Kind>

    func attach(to connection: any GATTConnection, device: String,
                discoveryTimeout: Duration) async throws(OTAError) -> AttachedLink<Void> {
        throw OTAError(.incompatibleDevice, "not attachable")
    }
    func chunkSize(mtu: Int) -> Int { mtu - 3 }
    func makeEngine(image: FirmwareImage, config: EngineConfig) -> SinkEngine {
        SinkEngine(image: image, config: config)
    }
}

@Suite struct ProtocolRegistryTests {
    static let nativeService = BluetoothUUID(uint16: 0xFFF0)
    static let native = OtherProfile(name: "native", serviceUUID: nativeService, imageFormats: [.rawBinary, .intelHex])

    /// A protocol named native under its service (raw binaries and Intel HEX); one that sends
    /// packages under Nordic's service; one that also sends raw binaries.
    let registry = ProtocolRegistry([
        Self.native,
        OtherProfile(name: "package", serviceUUID: BluetoothUUID(uint16: 0xFE59), imageFormats: [.nordicDFUPackage]),
        OtherProfile(name: "raw", serviceUUID: BluetoothUUID(uint16: 0x1234), imageFormats: [.rawBinary]),
    ])

    @Test func aRegistryFindsItsProfilesByName() throws {
        #expect(registry.names == ["native", "package", "raw"])
        let profile = try #require(registry.profile(named: "native"))
        #expect(profile.serviceUUID == Self.nativeService)
        #expect(profile.imageFormats == Set<ImageFormat.Kind>([.rawBinary, .intelHex]))
        #expect(registry.profile(named: "nordic") == nil)
    }

    @Test(arguments: [(ImageFormat.Kind.intelHex, "native"), (.nordicDFUPackage, "package"), (.rawBinary, "native")])
    func autoPicksFromTheImageAlone(format: ImageFormat.Kind, expected: String) throws {
        let pick = try registry.resolve("auto", format: format)
        #expect(pick.profile.name == expected)
        #expect(pick.reason.hasPrefix("picked \(expected): "))
        #expect(pick.reason.contains(format.name))
    }

    @Test func autoPicksTheProtocolWhoseServiceTheDeviceExposes() throws {
        let pick = try registry.resolve("auto", format: .rawBinary, services: [BluetoothUUID(uint16: 0x1234), BluetoothUUID(uint16: 0x180A)])
        #expect(pick.profile.name == "raw")
        #expect(pick.reason == "picked raw: the first protocol that sends raw-binary images; the device exposes \(BluetoothUUID(uint16: 0x1234))")

        let native = try registry.resolve("auto", format: .rawBinary, services: [Self.nativeService, BluetoothUUID(uint16: 0x1234)])
        #expect(native.profile.name == "native")
        #expect(native.reason == "picked native: the first protocol that sends raw-binary images; the device exposes \(Self.nativeService)")
    }

    @Test func theImageOutranksTheServices() throws {
        // A device running its application may expose several services; the package decides.
        let pick = try registry.resolve("auto", format: .nordicDFUPackage, services: [Self.nativeService, BluetoothUUID(uint16: 0xFE59)])
        #expect(pick.profile.name == "package")
    }

    @Test func autoWithoutTheImageUsesTheServices() throws {
        let pick = try registry.resolve("auto", services: [BluetoothUUID(uint16: 0xFE59)])
        #expect(pick.profile.name == "package")
    }

    @Test func aDeviceWithoutAFittingServiceIsRefusedNamingWhatWasLookedFor() {
        #expect {
            try registry.resolve("auto", format: .rawBinary, services: [BluetoothUUID(uint16: 0xFE59)])
        } throws: { error in
            guard let error = error as? OTAError else { return false }
            return error.code == .incompatibleDevice && error.message.contains("native (\(Self.nativeService))")
                && error.message.contains("raw (")
        }
    }

    @Test func aDeviceThatSpeaksAnotherProtocolSaysWhichAndWhatItTakes() {
        let nativeOnly = ProtocolRegistry([
            Self.native,
            OtherProfile(name: "package", serviceUUID: BluetoothUUID(uint16: 0xFE59), imageFormats: [.nordicDFUPackage]),
        ])
        #expect {
            try nativeOnly.resolve("auto", format: .rawBinary, services: [BluetoothUUID(uint16: 0xFE59)])
        } throws: { error in
            guard let error = error as? OTAError else { return false }
            return error.code == .incompatibleDevice
                && error.message.hasPrefix("the device exposes \(BluetoothUUID(uint16: 0xFE59)) of package, none of the services of native")
                && error.hint == "give it an image package sends (nordic-dfu-package), or check that it is the device you mean"
        }
    }

    /// A device with no protocol's service: the image decides, and attaching names what is missing.
    @Test func aDeviceWithNoProtocolsServiceKeepsTheImagesChoice() throws {
        let pick = try registry.resolve("auto", format: .intelHex, services: [BluetoothUUID(uint16: 0x180A)])
        #expect(pick.profile.name == "native")
        #expect(pick.reason == "picked native: only native sends intel-hex images; the device exposes no service of a protocol otaflash speaks")
        #expect(throws: OTAError.self) { try registry.resolve("auto", services: [BluetoothUUID(uint16: 0x180A)]) }
    }

    @Test func anImageNoProtocolSendsIsRefused() {
        #expect {
            try registry.resolve("auto", format: .elf)
        } throws: { error in
            (error as? OTAError)?.code == .image && (error as? OTAError)?.message.contains("elf") == true
        }
    }

    @Test func aNamedProtocolIsUsedWhateverTheDeviceExposes() throws {
        let pick = try registry.resolve("native", format: .intelHex, services: [BluetoothUUID(uint16: 0xFE59)])
        #expect(pick.profile.name == "native")
        #expect(pick.reason == "using native: asked for with --protocol")
    }

    @Test func aNamedProtocolMustSendTheImage() {
        #expect {
            try registry.resolve("native", format: .nordicDFUPackage)
        } throws: { error in
            (error as? OTAError)?.code == .image && (error as? OTAError)?.message.contains("nordic-dfu-package") == true
        }
    }

    @Test func anUnknownNameListsTheKnownOnes() {
        #expect {
            try registry.resolve("smp")
        } throws: { error in
            (error as? OTAError)?.message == "unknown protocol 'smp'; otaflash speaks auto, native, package, raw"
        }
    }
}
