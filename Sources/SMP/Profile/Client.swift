import GATT
import OTA
import Synchronization

/// One SMP request at a time over a connected device's SMP characteristic: what the profile
/// reads when it attaches, and what the `image`, `reset` and `echo` commands send. The upload
/// itself goes through `SMPEngine`, driven by the session.
public struct SMPClient: Sendable {
    public let connection: any GATTConnection
    public let characteristic: GATTCharacteristic
    /// The device's name in messages.
    public let device: String
    /// The notifications towards the next answer, kept across requests for as long as the
    /// connection: the tail of an answer that came after its request timed out completes that
    /// answer (then dropped as a late one), and is never read as the start of the next.
    private let incoming = Incoming()

    public init(connection: any GATTConnection, characteristic: GATTCharacteristic, device: String) {
        self.connection = connection
        self.characteristic = characteristic
        self.device = device
    }

    private final class Incoming: Sendable {
        let frames = Mutex(SMPReassembler())
    }

    /// Finds the SMP service and characteristic, checks their properties and turns notifications on.
    ///
    /// - Throws: `GATTError` naming what the device lacks.
    public static func attach(to connection: any GATTConnection, device: String) async throws(GATTError) -> SMPClient {
        let service = try await connection.discoverService(SMPService.serviceUUID, name: "SMP")
        let smp = try service.requireCharacteristic(SMPService.characteristicUUID, name: "SMP")
        try smp.require(.writeWithoutResponse, for: "writing SMP requests")
        try smp.require(.notify, for: "SMP answers")
        try await connection.setNotifications(true, for: smp)
        return SMPClient(connection: connection, characteristic: smp, device: device)
    }

    /// Sends `request` and waits for its answer (matched by sequence number; others are
    /// dropped). A device's refusal comes back as `.error`, not thrown.
    ///
    /// - Throws: `OTAError`: `.timeout` when no answer came within `timeout`, `.connection` when the
    ///   link dropped, `.protocolError` for an answer otaflash cannot read.
    public func send(_ request: SMPRequest, sequence: UInt8 = 0, timeout: Duration) async throws(OTAError) -> SMPResponse {
        try await write(request, sequence: sequence)
        guard let answer = try await answer(to: [sequence: request], until: connection.clock.now + timeout) else {
            throw OTAError(.timeout, "\(device) did not answer \(request) within \(timeout.seconds) s",
                           hint: "check that the device runs an SMP server (MCUmgr) and is in range", resumable: true)
        }
        return answer.response
    }

    /// Writes `request` as one frame, in writes without response of at most ATT MTU − 3 bytes.
    func write(_ request: SMPRequest, sequence: UInt8) async throws(OTAError) {
        let frame: SMPFrame
        let mtu: Int
        do {
            frame = try request.frame(sequence: sequence)
            mtu = try await connection.mtu()
        } catch let error as SMPWireError {
            throw OTAError(.internalError, "cannot encode \(request): \(error)")
        } catch let error as GATTError {
            throw OTAError.from(error, device: device)
        } catch {
            throw OTAError(.internalError, "\(error)")
        }
        do {
            for segment in SMPFraming.segments(frame.encoded, maxWrite: ATTWriteLimit.value(mtu: mtu)) {
                try await connection.write(Array(segment), to: characteristic, type: .withoutResponse)
            }
        } catch {
            throw OTAError.from(error, device: device)
        }
    }

    /// The next answer to one of `pending` (requests by sequence number, the answer of the same
    /// group, command and operation; others are dropped), or nil when none came by `deadline`. A server notifies each answer on its own,
    /// so what a notification completes after that answer is dropped with the others.
    func answer(to pending: [UInt8: SMPRequest], until deadline: Duration) async throws(OTAError) -> (sequence: UInt8, response: SMPResponse)? {
        while true {
            let left = deadline - connection.clock.now
            guard left > .zero, let event = await connection.nextEvent(timeout: left) else { return nil }
            switch event {
            case .notification(let id, let value) where id == characteristic.id:
                let frames: [SMPFrame]
                do {
                    frames = try incoming.frames.withLock { reassembler throws(SMPWireError) in try reassembler.append(value) }
                } catch {
                    throw OTAError(.protocolError, "\(device) sent an SMP answer otaflash cannot read: \(error)", cause: error)
                }
                for answer in frames where answer.header.operation.isResponse {
                    // An answer of another command is a late one to an earlier request that
                    // reused the sequence number.
                    guard let request = pending[answer.header.sequence], answer.header.group == request.command.group,
                          answer.header.command == request.command.id,
                          answer.header.operation == (request.operation == .read ? .readResponse : .writeResponse) else { continue }
                    do {
                        return (answer.header.sequence, try SMPResponse(decoding: answer))
                    } catch {
                        throw OTAError(.protocolError, "\(device) answered \(request) with a malformed SMP message: \(error)", cause: error)
                    }
                }
            case .disconnected(let reason):
                let what = pending.count == 1 ? "the answer to \(pending.values.first.map { "\($0)" } ?? "")" : "the answers to \(pending.count) requests"
                throw OTAError(.connection, "\(reason) while waiting for \(what)", resumable: true)
            default:
                continue
            }
        }
    }

    /// `send`, with a refusal thrown as the device's error line.
    public func call(_ request: SMPRequest, sequence: UInt8 = 0, timeout: Duration) async throws(OTAError) -> SMPResponse {
        let response = try await send(request, sequence: sequence, timeout: timeout)
        if case .error(let refusal) = response {
            throw refusal.otaError(device: device, request: "\(request)")
        }
        return response
    }
}

extension SMPClient {
    /// A request the device answers with its image states (read, test, confirm).
    public func imageStates(_ request: SMPRequest, timeout: Duration) async throws(OTAError) -> SMPImageStates {
        guard case .imageStates(let states) = try await call(request, timeout: timeout) else {
            throw OTAError(.protocolError, "\(device) answered \(request) without its image states")
        }
        return states
    }
}
