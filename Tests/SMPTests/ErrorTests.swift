import OTA
import Testing
@testable import SMP

@Suite struct SMPDeviceErrorTests {
    @Test func noFreeSlotSaysToConfirmOrReset() {
        let e = SMPDeviceError.image(.noFreeSlot)
        #expect(e.description == "no free slot (9): slot 1 is in use (an image waits there for the next reset, or the running test image is not confirmed); confirm the running image (otaflash image confirm) or reset the device (otaflash reset), then retry")
        let ota = e.otaError(device: "AA:BB:CC:DD:EE:FF", request: "image upload")
        #expect(ota.code == .protocolError)
        #expect(ota.description.hasPrefix("AA:BB:CC:DD:EE:FF refused image upload: no free slot (9): "))
        #expect((ota.cause as? SMPDeviceError) == e)
    }

    /// The refusals issue 12 lists (3, 9, 24, 27, 30, 31, busy), each one line with its class.
    @Test(arguments: [
        (SMPDeviceError.image(.noImage), OTAError.Code.protocolError, "no image (3)"),
        (.image(.noFreeSlot), .protocolError, "no free slot (9)"),
        (.image(.invalidHash), .protocolError, "invalid hash (24)"),
        (.image(.currentVersionIsNewer), .incompatibleDevice, "current version is newer (27)"),
        (.image(.imageTooLarge), .imageTooLarge, "image too large (30)"),
        (.image(.dataOverrun), .protocolError, "data overrun (31)"),
        (.image(.invalidImageHeaderMagic), .image, "bad image magic (23)"),
        (.image(.invalidFlashAddress), .incompatibleDevice, "invalid flash address (25)"),
        (.general(.busy), .protocolError, "busy (10)"),
        (.general(.notSupported), .incompatibleDevice, "not supported (8)"),
        (.general(.accessDenied), .permission, "access denied (11)"),
        (.general(.protocolTooNew), .incompatibleDevice, "protocol too new (13)"),
        (SMPDeviceError(group: .os, rc: 4), .protocolError, "OS group (0) error 4"),
        (SMPDeviceError(group: SMPGroup(rawValue: 64), rc: 1), .protocolError, "group 64 error 1"),
        (.general(MCUmgrError(rawValue: 300)), .protocolError, "application error 300"),
        (.general(MCUmgrError(rawValue: 99)), .protocolError, "unknown MCUmgr error 99"),
        (.image(ImageManagementError(rawValue: 99)), .protocolError, "unknown image management error 99"),
    ])
    func refusalsMapToOneLineAndAClass(error: SMPDeviceError, code: OTAError.Code, prefix: String) {
        #expect(error.description.hasPrefix(prefix))
        #expect(!error.description.contains("\n"))
        #expect(error.otaCode == code)
        #expect(error.otaError(device: "d", request: "r").code == code)
    }

    @Test func everyKnownCodeSaysWhatToDo() {
        for code in ImageManagementError.known.dropFirst() {
            let line = code.description
            #expect(line.contains("(\(code.rawValue)): "), "\(line)")
            #expect(!line.hasPrefix("unknown image management error"))
        }
        for raw in Int64(1)...13 {
            let line = MCUmgrError(rawValue: raw).description
            #expect(line.contains("(\(raw)): "), "\(line)")
        }
    }

    @Test func theDevicesReasonIsAppended() {
        let e = SMPDeviceError.general(.badState, reason: "swap in progress")
        #expect(e.description.hasSuffix("(device says: swap in progress)"))
    }

    @Test func resumableIsTheCallersToSay() {
        #expect(SMPDeviceError.general(.busy).otaError(device: "d", request: "r", resumable: true).resumable)
        #expect(!SMPDeviceError.general(.busy).otaError(device: "d", request: "r").resumable)
    }

    static let bodies: [(CBOR, SMPDeviceError?)] = [
        (["rc": 0], nil),
        (["off": 5], nil),
        ([:], nil),
        (["rc": 8], .general(.notSupported)),
        (["rc": 3, "rsn": "bad"], .general(.invalidValue, reason: "bad")),
        (["err": ["group": 1, "rc": 30]], .image(.imageTooLarge)),
        (["err": ["group": 1, "rc": 0]], nil),
        (["rc": .int(-1)], SMPDeviceError(rc: -1)),
    ]

    @Test(arguments: bodies)
    func errorsAreFoundInEitherForm(body: CBOR, expected: SMPDeviceError?) throws {
        #expect(try SMPDeviceError(body: body) == expected)
    }
}
