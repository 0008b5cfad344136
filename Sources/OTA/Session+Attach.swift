import Foundation
import GATT
import Logging
import OTAWire

extension OTASession {
    // MARK: Attaching, and what a refusal while setting up means

    /// How long a refused setup step waits to see whether the link drops right after it.
    static let linkLossGrace: Duration = .seconds(2)

    /// A setup step the device refused just before its link dropped (a device that reboots
    /// answers what reaches it with an error, then drops the link) is a link loss: resumable.
    private func linkLossExplaining(_ error: OTAError, on connection: any GATTConnection) async -> OTAError {
        guard error.code == .protocolError, error.cause is GATTError,
              case .disconnected(let reason)? = await connection.nextEvent(timeout: Self.linkLossGrace) else { return error }
        return OTAError(.connection, "\(reason) while setting up (\(error.message))",
                        hint: OTAError.resumeAdvice, resumable: true, cause: error)
    }

    /// Whether setting up failed (or succeeded only) because the device wants pairing: it refused
    /// with ATT 0x05/0x0F, the central's stack paired (or tried to) by itself, or its silence
    /// after a timeout turns out to be that (`probeSecurity`). Nil: something else.
    private func pairingRefusal<Profile: OTAProfile>(on connection: any GATTConnection, after error: OTAError?,
                                                     profile: Profile) async -> OTAError? {
        guard let stack = connection.stackPairing else {
            if let error, error.code == .timeout { return await probeSecurity(on: connection, profile: profile) }
            return nil
        }
        return OTAError.pairingRequired(device: device, stack: stack, cause: error?.cause as? GATTError, stillRefused: error != nil)
    }

    /// A transport event that says the device wants pairing: the stack's own pairing, or a write
    /// request refused with ATT 0x05/0x0F (ended here for every protocol, whatever its engine
    /// makes of a failed write).
    func pairingRefusal(in event: GATTEvent, on connection: any GATTConnection) -> OTAError? {
        switch event {
        case .stackPairing(let stack):
            return OTAError.pairingRequired(device: device, stack: connection.stackPairing ?? stack, cause: nil)
        case .writeCompleted(_, let error?) where error.wantsPairing:
            return OTAError.pairingRequired(device: device, stack: connection.stackPairing, cause: error)
        default:
            return nil
        }
    }

    /// Looks into a device that answered nothing at all: an embedded stack drops a write command
    /// on a link weaker than the characteristic requires, without an answer (ATT has none for a
    /// command: NimBLE `ble_att_svr_rx_write_no_rsp`, Zephyr `att_write_cmd`), so the central
    /// learns nothing. A read of the protocol service's readable characteristics is answered:
    /// refused with 0x05/0x0F (or setting off the stack's own pairing) when security is what
    /// is missing. Nil when the probe says nothing of the kind.
    func probeSecurity<Profile: OTAProfile>(on connection: any GATTConnection, profile: Profile) async -> OTAError? {
        if let stack = connection.stackPairing { return OTAError.pairingRequired(device: device, stack: stack, cause: nil) }
        let services: [GATTService]
        do {
            services = try await withTimeout(config.replyTimeout, clock: connection.clock, "discovering services") { () async throws(GATTError) in
                try await connection.discoverServices()
            }
        } catch {
            return nil
        }
        let readable = services.filter { $0.uuid == profile.serviceUUID }.flatMap(\.characteristics).filter { $0.properties.contains(.read) }
        for characteristic in readable {
            do {
                _ = try await withTimeout(config.replyTimeout, clock: connection.clock, "reading \(characteristic.uuid)") { () async throws(GATTError) in
                    try await connection.read(characteristic)
                }
            } catch where error.wantsPairing {
                logger.debug("the probe read was refused for want of security", metadata: ["device": "\(device)", "error": "\(error)"])
                return OTAError.pairingRequired(device: device, stack: connection.stackPairing, cause: error)
            } catch {
                logger.debug("the probe read failed", metadata: ["device": "\(device)", "error": "\(error)"])
            }
            if let stack = connection.stackPairing { return OTAError.pairingRequired(device: device, stack: stack, cause: nil) }
        }
        return nil
    }

    /// Lets the profile attach and reads the link's MTU; a refusal for want of pairing, or one
    /// that came just before the link dropped, says so.
    func attach<Profile: OTAProfile>(_ profile: Profile, on connection: any GATTConnection) async throws(OTAError)
        -> (AttachedLink<Profile.Engine.Peer>, mtu: Int) {
        let link: AttachedLink<Profile.Engine.Peer>
        do throws(OTAError) {
            link = try await profile.attach(to: connection, device: device, discoveryTimeout: timeouts.discovery)
        } catch {
            if let refusal = await pairingRefusal(on: connection, after: error, profile: profile) { throw refusal }
            throw await linkLossExplaining(error, on: connection)
        }
        if let refusal = await pairingRefusal(on: connection, after: nil, profile: profile) { throw refusal }
        do {
            return (link, try await connection.mtu())
        } catch {
            throw OTAError.from(error, device: device)
        }
    }
}
