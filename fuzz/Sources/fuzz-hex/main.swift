import Foundation
import FuzzDriver
import OTA

/// The Intel HEX parser takes files from anywhere: it must reject malformed input with an error,
/// never trap, and never allocate more than the image size limit.
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzHex(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    let bytes = Array(UnsafeBufferPointer(start: data, count: size))
    if let decoded = try? IntelHex.parse(bytes, source: "fuzz") {
        precondition(!decoded.bytes.isEmpty && decoded.bytes.count <= FirmwareImage.maximumSize)
    }
    return 0
}

runLibFuzzer(fuzzHex)
