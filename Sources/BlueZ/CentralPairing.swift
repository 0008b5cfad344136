import DBus
import GATT

extension BlueZConnection: GATTPairing {
    /// `Device1.Paired` (doc/org.bluez.Device.rst): BlueZ holds keys for the device.
    public func isBonded() async throws(GATTError) -> Bool {
        try await readDeviceFlag("Paired")
    }

    /// `Device1.Pair` with an agent of ours registered on this link's bus connection for the
    /// call: bluetoothd asks the agent of the client that called Pair (doc/org.bluez.Device.rst,
    /// "Pair"; doc/org.bluez.Agent.rst). The agent is unregistered however the call ends.
    public func pair(_ credentials: PairingCredentials, timeout: Duration) async throws(GATTError) {
        consentToPairing()
        let agent = BlueZAgent(bus: bus, path: "/org/otaflash/agent/" + BlueZ.adapterName(devicePath),
                               policy: BlueZAgent.Policy(credentials: credentials), logger: logger)
        let (bus, devicePath, peer) = (bus, devicePath, peer)
        try await agent.withAgent { () async throws(GATTError) in
            do {
                _ = try await bus.call(destination: BlueZ.service, path: devicePath, interface: BlueZ.device,
                                       member: "Pair", timeout: timeout)
            } catch let error as DBusError where error.name == "org.bluez.Error.AlreadyExists" {
                return
            } catch {
                throw Self.mapPair(error, peer: peer, credentials: credentials, asked: agent.requests, timeout: timeout)
            }
        }
        logger.debug("paired", metadata: ["device": "\(peer)", "agent asked": "\(agent.requests)"])
    }

    /// Device1.Pair's errors (doc/org.bluez.Device.rst, "Pair") as one line that says what to change.
    static func mapPair(_ error: any Error, peer: String, credentials: PairingCredentials, asked: [String],
                        timeout: Duration) -> GATTError {
        guard let error = error as? DBusError else { return BlueZErrors.map(error, "pairing with \(peer)") }
        let detail = BlueZErrors.shortName(error.name) + (error.message.isEmpty ? "" : ": \(error.message)")
        switch error.name {
        case "org.bluez.Error.AuthenticationFailed", "org.bluez.Error.AuthenticationRejected",
             "org.bluez.Error.AuthenticationCanceled":
            let why: String
            if let passkey = credentials.passkey {
                why = "the passkey \(PairingCredentials.text(passkey)) was not accepted; check the passkey the device expects"
            } else if asked.contains("passkey") {
                why = "it asked for a passkey; pass --passkey with the one it shows or expects"
            } else if asked.contains("confirmation") {
                why = "it asked to confirm a numeric comparison; pass --confirm-pairing to accept it"
            } else {
                why = "the device refused Just Works pairing; if it shows or expects a passkey, pass --passkey"
            }
            return GATTError(.authenticationFailed, "pairing with \(peer) failed (\(detail)): \(why)")
        case "org.bluez.Error.AuthenticationTimeout":
            return GATTError(.timeout, "pairing with \(peer) timed out (\(detail))")
        case "org.bluez.Error.ConnectionAttemptFailed":
            return GATTError(.connectFailed, "pairing with \(peer) failed: the link could not be made (\(detail))")
        default:
            if error.isTimeout { return GATTError(.timeout, "pairing with \(peer) did not finish within \(formatSeconds(timeout))") }
            return BlueZErrors.map(error, "pairing with \(peer)", timeout: timeout)
        }
    }
}

extension BlueZCentral: GATTBondStore {
    /// How long a failed removal waits for bluetoothd to be back (and its adapter) to try once more.
    public static let stackReturnTimeout: Duration = .seconds(20)

    /// `Adapter1.RemoveDevice` (doc/org.bluez.Adapter.rst): disconnects the device and removes
    /// its keys; a device BlueZ does not know has no bond to remove. A removal that fails (most
    /// often bluetoothd just died, e.g. at the teardown of an encrypted link) is tried once more
    /// when bluetoothd owns its name again and shows the adapter, within `stackReturnTimeout`.
    public func removeBond(_ address: DeviceAddress) async throws(GATTError) {
        do {
            try await removeBondOnce(address)
        } catch {
            logger.debug("RemoveDevice failed; waiting for bluetoothd to try again", metadata: ["device": "\(address)", "error": "\(error)"])
            guard await waitForStack(timeout: Self.stackReturnTimeout) else {
                throw GATTError(error.code, "\(error.message); bluetoothd was not back within \(formatSeconds(Self.stackReturnTimeout)) to try again")
            }
            do {
                try await removeBondOnce(address)
            } catch let again {
                throw GATTError(again.code, "\(again.message) (tried again once bluetoothd was back)")
            }
        }
    }

    private func removeBondOnce(_ address: DeviceAddress) async throws(GATTError) {
        let bus = try await openBus()
        defer { Task { await bus.close() } }
        let adapterPath = try resolveAdapter(try await Self.managedObjects(bus))
        let devicePath = BlueZ.devicePath(adapterPath: adapterPath, address: address)
        do {
            _ = try await bus.call(destination: BlueZ.service, path: adapterPath, interface: BlueZ.adapter,
                                   member: "RemoveDevice", arguments: [.objectPath(devicePath)], timeout: .seconds(10))
        } catch let error as DBusError where error.name == BlueZErrorName.doesNotExist {
            return
        } catch {
            throw BlueZErrors.map(error, "removing the bond with \(address) (Adapter1.RemoveDevice)", timeout: .seconds(10))
        }
    }

    /// Waits until `org.bluez` has an owner and it exports the adapter: signals, subscribed
    /// before the state is read, wake the wait (NameOwnerChanged, InterfacesAdded); no polling.
    /// - Returns: false when that did not happen within `timeout`.
    func waitForStack(timeout: Duration) async -> Bool {
        let deadline = clock.now + timeout
        guard let bus = try? await openBus() else { return false }
        defer { Task { await bus.close() } }
        let changes = Watched(0)
        let bump = { @Sendable (_: DBusSignal) in changes.update { $0 += 1 } }
        do {
            _ = try await bus.subscribe(DBusMatchRule(sender: "org.freedesktop.DBus", path: "/org/freedesktop/DBus", interface: "org.freedesktop.DBus",
                                                      member: "NameOwnerChanged", arg0: BlueZ.service), handler: bump)
            _ = try await bus.subscribe(.objectManager(sender: BlueZ.service, path: "/", member: "InterfacesAdded"), handler: bump)
        } catch {
            return false
        }
        while true {
            let seen = changes.value
            if let objects = try? await Self.managedObjects(bus, timeout: max(.milliseconds(1), min(.seconds(5), deadline - clock.now))),
               (try? resolveAdapter(objects)) != nil {
                return true
            }
            let left = deadline - clock.now
            guard left > .zero, await changes.wait(timeout: left, until: { $0 != seen }) else { return false }
        }
    }
}
