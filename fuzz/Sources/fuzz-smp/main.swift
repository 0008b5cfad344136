import Foundation
import FuzzDriver
import SMP

/// The SMP codec's decoders take these bytes: the CBOR decoder, the header and whole frames, the
/// request and response decoders, and the reassembler fed in pieces. None may trap; what decodes
/// must encode back to bytes that decode the same (floats compare by their bits, so a NaN does
/// too), canonical output must be a fixed point, and the same item written with indefinite
/// lengths, chunked strings and long heads must decode to it again.
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzSMP(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    let bytes = Array(UnsafeBufferPointer(start: data, count: size))
    if let item = try? CBORDecoder.decode(bytes) {
        let canonical = item.encoded
        let again = try? CBORDecoder.decode(canonical)
        precondition(again == item, "re-encoding changed a CBOR item: \(bytes)")
        precondition(again?.encoded == canonical, "canonical encoding is not a fixed point: \(bytes)")
        var indefinite: [UInt8] = []
        appendIndefinite(item, to: &indefinite)
        let roomy = CBORDecoder.Limits(maxSize: 4 * indefinite.count + 16)
        precondition((try? CBORDecoder.decode(indefinite, limits: roomy)) == item, "the indefinite encoding changed a CBOR item: \(bytes)")
        _ = item.description
        _ = item.kindName
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

/// `item` with indefinite lengths for every array, map and string (strings in two chunks, the
/// first one empty when it is short), integers and lengths in 8-byte heads, and floats as doubles.
func appendIndefinite(_ item: CBOR, to out: inout [UInt8]) {
    func head(_ major: UInt8, _ n: UInt64) {
        out.append(major << 5 | 27)
        for shift in stride(from: 56, through: 0, by: -8) { out.append(UInt8(truncatingIfNeeded: n >> UInt64(shift))) }
    }
    func chunks(_ major: UInt8, _ first: ArraySlice<UInt8>, _ second: ArraySlice<UInt8>) {
        out.append(major << 5 | 31)
        for chunk in [first, second] {
            head(major, UInt64(chunk.count))
            out += chunk
        }
        out.append(0xFF)
    }
    switch item {
    case .unsigned(let n): head(0, n)
    case .negative(let n): head(1, n)
    case .bytes(let b): chunks(2, b[..<(b.count / 2)], b[(b.count / 2)...])
    case .text(let s):
        // Split between characters: a chunk must be UTF-8 on its own.
        let scalars = Array(s.unicodeScalars)
        let first = String(String.UnicodeScalarView(scalars[..<(scalars.count / 2)]))
        let second = String(String.UnicodeScalarView(scalars[(scalars.count / 2)...]))
        chunks(3, Array(first.utf8)[...], Array(second.utf8)[...])
    case .array(let a):
        out.append(0x9F)
        for element in a { appendIndefinite(element, to: &out) }
        out.append(0xFF)
    case .map(let m):
        out.append(0xBF)
        for (key, value) in m {
            appendIndefinite(key, to: &out)
            appendIndefinite(value, to: &out)
        }
        out.append(0xFF)
    case .float(let d): head(7, d.bitPattern)
    case .bool, .null, .simple: out += item.encoded
    }
}

runLibFuzzer(fuzzSMP)
