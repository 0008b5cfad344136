import Foundation
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

/// SwiftPM gives an executable its own entry point; from there, hand control to libFuzzer's driver
/// (the documented way to run libFuzzer from a custom main).
@_silgen_name("LLVMFuzzerRunDriver")
func runFuzzerDriver(_ argc: UnsafeMutablePointer<CInt>,
                     _ argv: UnsafeMutablePointer<UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?>,
                     _ callback: @convention(c) (UnsafePointer<UInt8>, Int) -> CInt) -> CInt

var argc = CommandLine.argc
var argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>? = CommandLine.unsafeArgv
exit(runFuzzerDriver(&argc, &argv, fuzzHex))
