import Foundation
import FuzzDriver
import NordicDFU

/// Every Secure DFU decoder and the bootloader model take these bytes; none may trap, and what
/// decodes must encode back to bytes that decode the same. The package reader gets them as a zip.
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzNordic(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    let bytes = Array(UnsafeBufferPointer(start: data, count: size))
    if let response = try? DFUResponse(decoding: bytes) {
        precondition((try? DFUResponse(decoding: response.encoded)) == response, "re-encoding changed a response: \(bytes)")
        _ = response.reason
    }
    if let request = try? DFURequest(decoding: bytes) {
        precondition((try? DFURequest(decoding: request.encoded)) == request, "re-encoding changed a request: \(bytes)")
    }
    if let packet = try? DFUInitPacket(decoding: bytes) {
        _ = DFUInitPacket(command: packet.command, signature: packet.signature).bytes
    }
    _ = try? ButtonlessRequest(decoding: bytes)
    var device = NordicDFUBootloader()
    _ = device.handleControl([0x01, 0x01, UInt8(truncatingIfNeeded: size), 0, 0, 0])
    _ = device.handlePacket(bytes)
    _ = device.handleControl([0x04])
    _ = device.handleControl(bytes)
    _ = try? DFUPackage(zip: Data(bytes), source: "fuzz.zip")
    return 0
}

runLibFuzzer(fuzzNordic)
