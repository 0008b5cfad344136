import Foundation
import FuzzDriver
import OTA

/// The Intel HEX parser takes files from anywhere: it must reject malformed input with an error,
/// never trap, never allocate more than the image size limit, and decode the same whether it is
/// fed the text whole or in chunks. Format detection runs on the same bytes.
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzHex(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    let bytes = Array(UnsafeBufferPointer(start: data, count: size))
    let whole = Result { () throws(ImageError) in try IntelHex.parse(bytes, source: "fuzz") }
    if case .success(let decoded) = whole {
        precondition(!decoded.bytes.isEmpty && decoded.bytes.count <= FirmwareImage.maximumSize)
    }
    // Fed in chunks (the file loader reads 1 MiB at a time), the decoder must say the same.
    let chunk = 1 + Int(bytes.first ?? 0) % 64
    var decoder = IntelHex.Decoder(source: "fuzz")
    let chunked = Result { () throws(ImageError) in
        for start in stride(from: 0, to: bytes.count, by: chunk) {
            try decoder.feed(bytes[start..<min(start + chunk, bytes.count)])
        }
        return try decoder.finish()
    }
    switch (whole, chunked) {
    case (.success(let a), .success(let b)): precondition(a.bytes == b.bytes && a.baseAddress == b.baseAddress)
    case (.failure(let a), .failure(let b)): precondition(a == b, "\(a) != \(b)")
    default: preconditionFailure("whole: \(whole), chunked: \(chunked)")
    }
    // What the loader sees first: detection must not trap on any bytes either.
    _ = ImageFormat.detect(bytes)
    return 0
}

runLibFuzzer(fuzzHex)
