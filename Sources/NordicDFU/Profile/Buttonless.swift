import GATT
import OTA

// Buttonless entry: an application that exposes the buttonless characteristic in service 0xFE59
// rather than the control point is asked to reboot into its bootloader first (nRF5 SDK
// `ble_dfu_buttonless.c`; nrfutil `dfu_transport_ble.py`, `jump_from_buttonless_mode_to_bootloader`).

extension NordicDFUProfile {
    /// The name the bootloader is asked to advertise (opcode 0x02), to find it by when nothing
    /// answers at the address + 1: "DFU-" and the application's twelve hex digits (16 bytes of
    /// the 20 allowed), so that two devices entering their bootloaders never share one.
    public static func bootloaderName(for application: DeviceAddress) -> String {
        "DFU-" + application.description.filter { $0 != ":" }
    }

    /// Enables indications on the buttonless characteristic, asks the application to advertise
    /// `bootloaderName` in its bootloader (an application without opcode 0x02 is found by
    /// address alone), writes Enter Bootloader, checks the indication's result and waits, at most
    /// `limits.disconnect`, for the application to drop the link. The unbonded bootloader
    /// answers at the address whose least significant octet is one higher; the bonded one
    /// (8EC90004) at the same address, and only to a central bonded with it.
    ///
    /// - Returns: nil when the device already runs its bootloader (it exposes the control
    ///   point), or exposes neither (`attach` names what is missing).
    /// - Throws: `OTAError` `.permission` when the device needs a bond, `.protocolError` when it
    ///   refuses Enter Bootloader (the result's line), `.timeout` when it does not answer.
    public func enterUpdateMode(on connection: any GATTConnection, services: [GATTService], device: DeviceAddress,
                                limits: UpdateModeLimits) async throws(OTAError) -> UpdateModeEntry? {
        guard let service = services.first(where: { $0.uuid == SecureDFUService.serviceUUID }),
              service.characteristic(SecureDFUService.controlPointUUID) == nil else { return nil }
        let unbonded = service.characteristic(SecureDFUService.buttonlessUUID)
        guard let buttonless = unbonded ?? service.characteristic(SecureDFUService.buttonlessBondedUUID) else { return nil }
        let entry = ButtonlessEntry(connection: connection, characteristic: buttonless, device: device,
                                    bonded: unbonded == nil, reply: limits.reply)
        do {
            try buttonless.require(.write, for: "writing requests to the buttonless DFU characteristic")
            try buttonless.require(.indicate, for: "indications from the buttonless DFU characteristic")
            try await connection.setNotifications(true, for: buttonless)
        } catch {
            throw entry.failure(error)
        }
        let bootloader = entry.bonded ? device : SecureDFUService.bootloaderAddress(for: device.description).flatMap(DeviceAddress.init) ?? device
        let name = Self.bootloaderName(for: device)
        let named = try await entry.send(.setAdvertisingName(name)) == .success
        let result = try await entry.send(.enterBootloader)
        guard result == .success else {
            if result == .notBonded { throw entry.bondRequired(GATTError(.notAuthorized, "\(device) answered Enter Bootloader with \"not bonded\"")) }
            throw OTAError(.protocolError, "\(device) refused Enter Bootloader: \(result)")
        }
        await entry.awaitDisconnect(within: limits.disconnect)
        return UpdateModeEntry(application: device, address: bootloader, name: named ? name : nil,
                               mode: "its bootloader, through buttonless DFU")
    }
}

/// One buttonless exchange: a request written, its indication awaited.
private struct ButtonlessEntry {
    let connection: any GATTConnection
    let characteristic: GATTCharacteristic
    let device: DeviceAddress
    /// The 8EC90004 variant: only a bonded central may enter the bootloader.
    let bonded: Bool
    let reply: Duration

    func bondRequired(_ cause: GATTError) -> OTAError {
        OTAError(.permission, "\(device) enters its bootloader only for a bonded central (buttonless DFU with bonds, 8EC90004)",
                 hint: "pass --pair to bond with it first (add --passkey when it expects one)", cause: cause)
    }

    /// A transport failure as one line; an ATT refusal for want of a bond is `bondRequired`.
    func failure(_ error: GATTError) -> OTAError {
        let insecure: Set<ATTError> = [.insufficientAuthentication, .insufficientEncryption]
        if error.code == .notAuthorized || error.attError.map(insecure.contains) == true { return bondRequired(error) }
        return OTAError.from(error, device: device.description)
    }

    /// Writes `request` and returns the result its indication carries (`20 <op> <result>`).
    func send(_ request: ButtonlessRequest) async throws(OTAError) -> ButtonlessResult {
        let what = request == .enterBootloader ? "Enter Bootloader" : "Set Advertising Name"
        do {
            try await connection.write(request.encoded, to: characteristic, type: .withResponse)
        } catch {
            throw failure(error)
        }
        let clock = connection.clock
        let deadline = clock.now + reply
        while true {
            let left = deadline - clock.now
            guard left > .zero, let event = await connection.nextEvent(timeout: left) else {
                throw OTAError(.timeout, "\(device) did not answer \(what) on the buttonless characteristic within \(reply.seconds) s",
                               hint: "power-cycle it and retry, or raise --reply-timeout")
            }
            switch event {
            case .notification(let id, let value) where id == characteristic.id:
                let response: ButtonlessResponse
                do {
                    response = try ButtonlessResponse(decoding: value)
                } catch {
                    throw OTAError(.protocolError, "\(device) answered \(what) with a malformed indication: \(error)", cause: error)
                }
                if response.opcode == request.opcode { return response.result }
            case .disconnected(let reason):
                throw OTAError(.connection, "\(device) dropped the link (\(reason)) before answering \(what)",
                               hint: "run the same command again", resumable: true)
            default:
                continue
            }
        }
    }

    /// Waits for the application to drop the link as it resets; drops it from this side when it
    /// has not after `limit` (the bootloader is looked for either way, within its own limit).
    func awaitDisconnect(within limit: Duration) async {
        let clock = connection.clock
        let deadline = clock.now + limit
        while true {
            let left = deadline - clock.now
            guard left > .zero, let event = await connection.nextEvent(timeout: left) else { break }
            if case .disconnected = event { return }
        }
        await connection.disconnect()
    }
}

extension NordicDFUProfile {
    /// After the last EXECUTE's answer was lost: the device answers where it runs its
    /// application and exposes no Secure DFU control point, so it left its bootloader, which it
    /// does only into a validated image (nRF5 SDK `nrf_bootloader.c`: a bootloader whose transfer
    /// failed stays in DFU mode until its inactivity timeout, 120 s by default). The buttonless
    /// service, when the application has it, shows that it is the application that answers.
    public func confirmsActivation(on connection: any GATTConnection, services: [GATTService]) async -> Bool {
        !services.isEmpty && !services.contains { $0.uuid == SecureDFUService.serviceUUID && $0.characteristic(SecureDFUService.controlPointUUID) != nil }
    }
}
