import BlueZ
import Crypto
import Foundation
import GATT
import OTAFlashCLI
import OTAWire
import SMP
import TestSupport
import Testing

/// `otaflash simulate --protocol smp` through the stand-in bluetoothd: the command serves the SMP
/// server model with the options' buffers, slots and version, and a central's SMP requests,
/// written as bluetoothd delivers them, get their answers as notifications.
extension ProcessBusSuites.PeripheralTests {
    @Test func simulateServesAnSMPServerWithItsOptions() async throws {
        try await Self.withBus { bus in
            setenv(PeripheralHost.busAddressEnvironment, bus.address, 1)
            defer { unsetenv(PeripheralHost.busAddressEnvironment) }
            let fake = try await FakeBlueZPeripheralSide.start(on: bus, devices: [Self.centralA])
            let output = CapturedOutput()
            let run = Task {
                await runOtaflash(["simulate", "--protocol", "smp", "--buf-size", "2475", "--buf-count", "3", "--slot-size", "20000",
                                   "--firmware-version", "2.3.4", "--json"], output: output)
            }
            try await fake.waitForCall("RegisterAdvertisement /org/otaflash/simulate/advertisement0")
            #expect(try await fake.read(DeviceInformationService.firmwareRevisionUUID, device: Self.centralA) == Array("2.3.4".utf8))

            let smp = SMPService.characteristicUUID
            let notifications = try await fake.startNotify(smp)
            var sequence: UInt8 = 0
            func call(_ request: SMPRequest) async throws -> SMPResponse {
                sequence &+= 1
                for piece in SMPFraming.segments(try request.frame(sequence: sequence).encoded, maxWrite: 244) {
                    try await fake.write(smp, Array(piece), device: Self.centralA)
                }
                var reassembler = SMPReassembler()
                while true {
                    let note = try #require(try await peripheralNext(notifications))
                    if let frame = try reassembler.append(note).first {
                        #expect(frame.header.sequence == sequence)
                        return try SMPResponse(decoding: frame)
                    }
                }
            }

            #expect(try await call(.mcumgrParameters) == .mcumgrParameters(SMPParameters(bufferSize: 2475, bufferCount: 3)))
            let image = SMPSlotImage.build(major: 2, minor: 4, revision: 0, body: (0..<4000).map { UInt8(truncatingIfNeeded: $0) })
            let sha = Array(SHA256.hash(data: image))
            #expect(try await call(.imageUpload(.first(length: 30_000, sha: sha, data: Array(image[0..<100])))) == .error(.image(.imageTooLarge)))
            #expect(try await call(.imageUpload(.first(length: UInt64(image.count), sha: sha, data: Array(image[0..<2000]))))
                    == .upload(SMPUploadStatus(offset: 2000)))
            #expect(try await call(.imageUpload(SMPImageUpload(offset: 2000, data: Array(image[2000...]))))
                    == .upload(SMPUploadStatus(offset: UInt64(image.count), match: true)))
            guard case .imageStates(let states) = try await call(.imageStateRead) else { Issue.record("no image states"); return }
            #expect(states.images.map(\.version) == ["2.3.4", "2.4.0"])
            #expect(states.images.last?.hash == SMPSlotImage(image).hash)
            // The advertisement as bluetoothd read it (by now: it read it before logging its answer).
            let ad = fake.state.withLock { $0.advertisement }
            #expect(ad["ServiceUUIDs"]?.strings == [SMPService.serviceUUID.description])
            #expect(ad["LocalName"]?.string == "otaflash-smp")

            // A reset the central asks for is said as such, not as an injected fault.
            #expect(try await call(.reset(force: false)) == .empty)
            #expect(output.stdout.contains("the device resets (SMP reset request)"), "\(output.stdout)")
            #expect(!output.stdout.contains("injected fault"), "\(output.stdout)")

            // bluetoothd leaving the bus ends the command with its code.
            await fake.connection.close()
            #expect(await run.value == ExitCode.bluetoothUnavailable.rawValue)
            #expect(output.stdout.contains(#""protocol":"smp""#))
            #expect(output.stdout.contains(#""firmware_version":"2.3.4""#) || output.stdout.contains(#""firmwareVersion":"2.3.4""#))
        }
    }
}
