import DBus
import GATT

/// Error names BlueZ and the bus send back (doc/org.bluez.*.rst list each method's possible
/// errors; the bus's own names are in the D-Bus specification, "Message Bus Messages").
enum BlueZErrorName {
    static let failed = "org.bluez.Error.Failed"
    static let inProgress = "org.bluez.Error.InProgress"
    static let notPermitted = "org.bluez.Error.NotPermitted"
    static let notAuthorized = "org.bluez.Error.NotAuthorized"
    static let notSupported = "org.bluez.Error.NotSupported"
    static let notReady = "org.bluez.Error.NotReady"
    static let notConnected = "org.bluez.Error.NotConnected"
    static let alreadyConnected = "org.bluez.Error.AlreadyConnected"
    static let doesNotExist = "org.bluez.Error.DoesNotExist"
    static let invalidValueLength = "org.bluez.Error.InvalidValueLength"
    static let invalidArguments = "org.bluez.Error.InvalidArguments"
    static let accessDenied = "org.freedesktop.DBus.Error.AccessDenied"
}

/// Turns D-Bus and BlueZ failures into one `GATTError` each, with a one-line message that says
/// what failed, on which device or adapter, and what to do about it.
enum BlueZErrors {
    /// The line for a bluetoothd that is not running or cannot be started, with what the bus said.
    ///
    /// A systemd unit error means the unit is missing its D-Bus alias, which only exists while
    /// bluetooth.service is enabled, so the fix enables it too.
    static func stackMessage(_ error: DBusError) -> String {
        let detail = error.message.isEmpty ? shortName(error.name) : "\(shortName(error.name)): \(error.message)"
        let fix = error.name.hasPrefix(DBusError.Name.systemdPrefix) || error.message.contains("unknown unit")
            ? "systemctl enable --now bluetooth" : "systemctl start bluetooth"
        return "bluetoothd is not running (org.bluez: \(detail)); start it with `\(fix)`"
    }

    static func powerOnHint(_ adapter: String) -> String {
        "power it on with `bluetoothctl power on` (or `bluetoothctl select \(adapter)` first when there are several adapters)"
    }

    /// True when the error says nothing owns `org.bluez` and the bus could not start it either
    /// (bluetoothd not running): `ServiceUnknown` and `NameHasNoOwner`, or a failed activation
    /// (`Spawn.ChildExited` and the rest of `Spawn.*`, a systemd unit error, an activation timeout).
    static func isStackMissing(_ error: DBusError) -> Bool {
        error.name == DBusError.Name.serviceUnknown || error.name == DBusError.Name.nameHasNoOwner || error.isActivationFailure
    }

    /// Maps any error thrown by the D-Bus layer during `operation` (e.g. "writing characteristic
    /// b0e60002-... of AA:BB:...").
    ///
    /// - Parameter timeout: the timeout the call had, for the message of an expired call.
    static func map(_ error: any Error, _ operation: String, timeout: Duration? = nil) -> GATTError {
        if let error = error as? GATTError { return error }
        if error is CancellationError { return GATTError(.failed, "\(operation) was cancelled") }
        guard let error = error as? DBusError else { return GATTError(.failed, "\(operation) failed: \(error)") }
        if isStackMissing(error) { return GATTError(.stackUnavailable, stackMessage(error)) }
        let detail = error.message.isEmpty ? shortName(error.name) : "\(shortName(error.name)): \(error.message)"
        switch error.name {
        case BlueZErrorName.accessDenied:
            // The bus's message lists the whole rule that matched; its name says enough.
            return GATTError(.permissionDenied, "D-Bus denied access to org.bluez (AccessDenied) while \(operation): run otaflash as root or add your user to the bluetooth group (`sudo usermod -aG bluetooth $USER`, then log in again)")
        case BlueZErrorName.notPermitted, BlueZErrorName.notAuthorized:
            // doc/org.bluez.GattCharacteristic.rst: ReadValue/WriteValue/StartNotify return these
            // when the attribute needs authentication or encryption (src/gatt-client.c maps ATT
            // insufficient authentication/encryption to NotPermitted "Not paired").
            return GATTError(.notAuthorized, "\(operation) was refused (\(detail)): the device wants pairing or encryption first")
        case BlueZErrorName.inProgress:
            return GATTError(.inProgress, "\(operation) failed: BlueZ is still busy with a previous request (\(detail)); wait for it to finish and retry")
        case BlueZErrorName.notReady:
            return GATTError(.adapterUnavailable, "\(operation) failed: the adapter is not ready (\(detail)); \(powerOnHint("hciN"))")
        case BlueZErrorName.notConnected:
            return GATTError(.notConnected, "\(operation) failed: the device is not connected")
        case BlueZErrorName.invalidValueLength:
            return .att(.invalidAttributeValueLength, operation)
        default:
            break
        }
        if error.name == DBusError.Name.noReply, error.message.contains("disconnected") {
            // The bus's own answer when bluetoothd dies during the call.
            return GATTError(.stackUnavailable, "\(operation): bluetoothd left the bus without answering (it stopped or crashed)")
        }
        if error.isTimeout {
            let after = timeout.map { " within \(formatSeconds($0))" } ?? ""
            return GATTError(.timeout, "\(operation): bluetoothd did not answer\(after)")
        }
        if error.isDisconnected {
            return GATTError(.notConnected, "\(operation) failed: the D-Bus connection to bluetoothd was closed")
        }
        if let att = attError(in: error) { return .att(att, operation) }
        return GATTError(.failed, "\(operation) failed: \(detail)")
    }

    /// The ATT error code inside a `Failed` message such as
    /// "Operation failed with ATT error: 0x0e" (src/gatt-client.c, create_gatt_dbus_error).
    static func attError(in error: DBusError) -> ATTError? {
        guard error.name == BlueZErrorName.failed, let range = error.message.firstRange(of: "ATT error: 0x") else { return nil }
        let hex = error.message[range.upperBound...].prefix { $0.isHexDigit }
        guard let code = UInt8(hex, radix: 16) else { return nil }
        return ATTError(rawValue: code)
    }

    /// Maps a failure of `Device1.Connect` (doc/org.bluez.Device.rst, "Connect"): anything that is
    /// not the stack, permissions or a timeout is `connectFailed`.
    static func mapConnect(_ error: any Error, device: String, adapter: String, timeout: Duration) -> GATTError {
        let mapped = map(error, "connecting to \(device) on \(adapter)", timeout: timeout)
        switch mapped.code {
        case .stackUnavailable, .permissionDenied, .inProgress, .adapterUnavailable:
            return mapped
        case .timeout:
            return GATTError(.timeout, "connecting to \(device) on \(adapter) timed out after \(formatSeconds(timeout))")
        default:
            let detail = (error as? DBusError).map { $0.message.isEmpty ? shortName($0.name) : "\(shortName($0.name)): \($0.message)" } ?? mapped.message
            return GATTError(.connectFailed, "connecting to \(device) on \(adapter) failed (\(detail))")
        }
    }

    /// Maps a failure to reach the bus itself.
    static func mapBusConnect(_ error: any Error, address: String) -> GATTError {
        if let error = error as? DBusError, error.name == BlueZErrorName.accessDenied {
            return map(error, "connecting to the D-Bus bus at \(address)")
        }
        return GATTError(.stackUnavailable, "cannot connect to the D-Bus system bus at \(address) (\(error)): is the dbus service running? (`systemctl start dbus`)")
    }

    /// `org.bluez.Error.NotPermitted` → `NotPermitted`.
    static func shortName(_ name: String) -> String {
        for prefix in ["org.bluez.Error.", "org.freedesktop.DBus.Error.", DBusError.Name.systemdPrefix] where name.hasPrefix(prefix) {
            return String(name.dropFirst(prefix.count))
        }
        return name
    }
}

func formatSeconds(_ duration: Duration) -> String { duration.secondsText }
