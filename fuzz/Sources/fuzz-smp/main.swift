import Foundation
import FuzzDriver
import SMP

/// The SMP codec's decoders take these bytes: the CBOR decoder, the header and whole frames, the
/// request and response decoders, and the reassembler fed in pieces. None may trap; what decodes
/// must encode back to bytes that decode the same, and canonical output must be a fixed point.
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzSMP(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    let bytes = Array(UnsafeBufferPointer(start: data, count: size))
    if let item = try? CBORDecoder.decode(bytes) {
        let canonical = item.encoded
        let again = try? CBORDecoder.decode(canonical)
        precondition(again == item, "re-encoding changed a CBOR item: \(bytes)")
        precondition(again?.encoded == canonical, "canonical encoding is not a fixed point: \(bytes)")
        _ = item.description
        _ = try? SMPDeviceError(body: item)
    }
    if let header = try? SMPHeader(decoding: bytes) {
        precondition((try? SMPHeader(decoding: header.encoded)) == header, "re-encoding changed a header: \(bytes)")
    }
    if let frame = try? SMPFrame(decoding: bytes) {
        if let response = try? SMPResponse(decoding: frame) {
            // Answered as v2: a v1 answer writes a group's error as a bare rc, by design.
            var header = frame.header
            header.version = .v2
            let back = (try? response.frame(replyingTo: header)).flatMap { try? SMPResponse(decoding: $0) }
            precondition(back == response, "re-encoding changed a response: \(bytes)")
            if case .error(let e) = response { _ = e.description; _ = e.otaCode }
        }
        if let request = try? SMPRequest(decoding: frame) {
            let back = (try? request.frame(sequence: frame.header.sequence)).flatMap { try? SMPRequest(decoding: $0) }
            precondition(back == request, "re-encoding changed a request: \(bytes)")
            if case .imageUpload(let upload) = request { _ = upload.maxDataSize(frameLimit: Int(frame.header.length)) }
        }
    }
    // The reassembler, fed in pieces whose sizes come from the input itself.
    var reassembler = SMPReassembler(maxFrameSize: 64 + Int(bytes.first ?? 0) * 8)
    var index = 0
    var total = 0
    while index < bytes.count {
        let step = 1 + Int(bytes[index] % 23)
        let piece = bytes[index..<min(index + step, bytes.count)]
        index += step
        do {
            for frame in try reassembler.append(piece) {
                total += frame.encoded.count
                precondition(frame.encoded.count <= reassembler.maxFrameSize, "a frame over the bound came out")
            }
        } catch {
            precondition(reassembler.pendingBytes == 0, "a failed append kept bytes")
        }
        precondition(reassembler.pendingBytes < reassembler.maxFrameSize, "the reassembler holds more than one frame")
    }
    precondition(total <= bytes.count, "the reassembler made up bytes")
    return 0
}

runLibFuzzer(fuzzSMP)
