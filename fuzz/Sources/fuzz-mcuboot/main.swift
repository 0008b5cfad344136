import FuzzDriver
import OTA
import SMP

/// A test key of each kind, so that signature checking runs on whatever the fuzzer puts in the
/// signature TLVs (firmware-samples/mcuboot/*-public.pem). Kept as text and parsed per use: a
/// parsed key held in a global is reported as a leak at exit (the enum's tag bits hide the pointer
/// from LeakSanitizer).
private let keys = [
    """
    -----BEGIN PUBLIC KEY-----
    MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEIRK97twQHcJxkBb7gbjMM3PmNHWW
    8jHpVCjhhoXJlzk2sMWZVe2hrEgaEhelXN+ixq7QMG1scLhzk4aseq6ocQ==
    -----END PUBLIC KEY-----
    """,
    """
    -----BEGIN PUBLIC KEY-----
    MCowBQYDK2VwAyEAcOSsTaY1h60HkvnMWYmnMhLdrABGEv66k83KqOWyA5M=
    -----END PUBLIC KEY-----
    """,
]

/// An accepted image must say what its bytes say: its hash TLV is the digest of its hashed
/// region, it uploads the bytes it was given, and its version prints back to itself.
private func checkAccepted(_ image: MCUbootImage, _ bytes: [UInt8]) {
    precondition(image.bytes == bytes)
    precondition(image.imageHash == image.hashAlgorithm.digest(bytes[0..<image.hashedSize]))
    precondition(image.hashedSize + 4 <= image.tlvAreaEnd && image.tlvAreaEnd <= bytes.count)
    precondition(MCUbootImage.Version(image.version.description) == image.version)
    for pem in keys {
        guard let key = try? MCUbootImage.PublicKey(pem: pem) else { preconditionFailure("a sample key does not parse") }
        _ = try? image.verifySignature(with: key)
    }
}

/// The MCUboot image reader takes files from anywhere: no input may trap it. Every input is also
/// tried with its hash TLV made to match, so the checks after the hash (flags, signatures,
/// padding) see fuzzed bytes too.
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzMCUboot(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    let bytes = Array(UnsafeBufferPointer(start: data, count: size))
    if let image = try? MCUbootImage(bytes: bytes) { checkAccepted(image, bytes) }
    _ = MCUbootImage.Version(String(decoding: bytes.prefix(32), as: UTF8.self))

    guard let layout = try? MCUbootImage.Layout(parsing: bytes) else { return 0 }
    let hashes = (layout.protectedTLVs + layout.tlvs).filter { MCUbootImage.HashAlgorithm(tlv: $0.type) != nil }
    guard hashes.count == 1, let tlv = layout.tlvs.first(where: { $0 == hashes[0] }),
          let algorithm = MCUbootImage.HashAlgorithm(tlv: tlv.type), tlv.value.count == algorithm.digestSize else { return 0 }
    let h = layout.header
    var repaired = bytes
    let hashed = Int(h.headerSize) + Int(h.imageSize) + Int(h.protectedTLVSize)
    repaired.replaceSubrange(tlv.offset..<(tlv.offset + tlv.value.count), with: algorithm.digest(bytes[0..<hashed]))
    do {
        checkAccepted(try MCUbootImage(bytes: repaired), repaired)
    } catch {
        precondition(error.code == .encrypted || error.code == .nonBootable, "a repaired image was refused: \(error)")
    }
    return 0
}

runLibFuzzer(fuzzMCUboot)
