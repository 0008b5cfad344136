import Foundation
import FuzzDriver
import Native

/// Every control point notification and info value a device can send goes through these
/// decoders; none may trap, and whatever decodes must encode back to bytes that decode the same.
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzReplies(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    let bytes = Array(UnsafeBufferPointer(start: data, count: size))
    if let note = try? ControlNotification(decoding: bytes) {
        let again = try? ControlNotification(decoding: note.encoded)
        precondition(again == note, "re-encoding changed a notification: \(bytes)")
    }
    if let info = try? DeviceInfo(decoding: bytes) {
        precondition((try? DeviceInfo(decoding: info.encoded)) == info, "re-encoding changed an info value: \(bytes)")
    }
    if let request = try? ControlRequest(decoding: bytes) {
        precondition((try? ControlRequest(decoding: request.encoded)) == request, "re-encoding changed a request: \(bytes)")
    }
    _ = DataPacket.decode(bytes)
    _ = OTAStatus(rawValue: bytes.first ?? 0).description
    return 0
}

runLibFuzzer(fuzzReplies)
