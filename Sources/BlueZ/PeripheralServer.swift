import DBus
import GATT
import Logging
import OTADevice
import Synchronization

/// A device model served through BlueZ from set-up to teardown (peripheral mode, `otaflash
/// simulate`): the GATT application and its advertisement on one adapter, the device's own agent
/// when it requires a secured link, and for a device that resets into a bootloader at another
/// address (Nordic's buttonless DFU), the bootloader's application on a second adapter, advertised
/// while the device runs it.
///
/// `open` first (the model may need the adapter's address), then `serve` once: it returns when the
/// caller's `until` returns or bluetoothd leaves the bus, after a teardown in which every step is
/// bounded by its own call timeout. It knows no protocol: the model says what it exposes.
public final class PeripheralServer: Sendable {
    /// Where the application, its advertisements and the agent are exported.
    public static let applicationRoot = "/org/otaflash/simulate"

    /// The adapter the device answers on, and the one its bootloader answers on (if any).
    public let hosts: [PeripheralHost]

    /// The adapter the device answers on.
    public var host: PeripheralHost { hosts[0] }

    private init(hosts: [PeripheralHost]) { self.hosts = hosts }

    /// Opens `adapter` (nil: bluetoothd's default) and, for a device whose bootloader answers at
    /// another address, `bootloaderAdapter`.
    public static func open(adapter: String?, bootloaderAdapter: String? = nil) async throws(PeripheralError) -> PeripheralServer {
        var hosts: [PeripheralHost] = []
        do {
            for name in [adapter] + (bootloaderAdapter.map { [$0] } ?? []) {
                hosts.append(try await PeripheralHost.open(adapter: name))
            }
        } catch {
            for host in hosts { await host.close() }
            throw PeripheralError.from(error, "")
        }
        return PeripheralServer(hosts: hosts)
    }

    /// Closes the adapters without serving (`serve` closes them itself).
    public func close() async {
        for host in hosts { await host.close() }
    }

    /// What is served, and how.
    public struct Device: Sendable {
        public var model: any PeripheralModel
        /// The name the device advertises.
        public var name: String
        /// Where the device answers once it reset into its bootloader, and the bootloader's GATT
        /// table (served on the second adapter); nil for a device that stays where it is.
        public var bootloaderAddress: DeviceAddress?
        public var bootloaderServices: [OTADevice.PeripheralService]?
        /// What the characteristics require of the link; with `.authenticate` and no passkey, the
        /// device's agent confirms numeric comparison.
        public var security: LinkSecurity
        public var passkey: UInt32?
        /// Where activated images are written as `<crc32>.bin`; nil keeps none.
        public var storeDirectory: String?

        public init(model: any PeripheralModel, name: String, bootloaderAddress: DeviceAddress? = nil,
                    bootloaderServices: [OTADevice.PeripheralService]? = nil, security: LinkSecurity = .none,
                    passkey: UInt32? = nil, storeDirectory: String? = nil) {
            self.model = model
            self.name = name
            self.bootloaderAddress = bootloaderAddress
            self.bootloaderServices = bootloaderServices
            self.security = security
            self.passkey = passkey
            self.storeDirectory = storeDirectory
        }
    }

    /// Where a device that resets into its bootloader answers now.
    public enum Mode: String, Sendable, Hashable {
        case application, bootloader
    }

    public enum Event: Sendable {
        /// What the served device did.
        case device(OTAPeripheralEvent)
        /// Everything is registered: centrals can find and connect to the device.
        case serving(bootloaderAdapter: String?)
        /// The device reset into `mode`, answering at `address` on `adapter` under `name`.
        case moved(address: DeviceAddress?, adapter: String, mode: Mode, name: String?)
        /// Something went wrong that does not end serving (advertising the bootloader failed).
        case problem(String)
    }

    /// How serving ended.
    public enum Ending: Sendable, Hashable {
        /// `until` returned.
        case stopped
        /// bluetoothd left the bus.
        case stackGone
    }

    public struct Result: Sendable {
        public var ending: Ending
        /// Images the device activated while served.
        public var activations: Int
        /// Whether a second implementation of the model ran beside it in lockstep, and the first
        /// point where the two differed (nil: none).
        public var runsLockstep: Bool
        public var lockstepDivergence: String?
    }

    /// Serves `device` until `until` returns or bluetoothd goes away, then tears everything down
    /// and closes the adapters.
    ///
    /// - Throws: `PeripheralError` when the application, its advertisement or the agent cannot be
    ///   registered (after the teardown).
    public func serve(_ device: Device, trace: (@Sendable (String) -> Void)? = nil, logger: Logger,
                      until stop: @escaping @Sendable () async -> Void,
                      events: @escaping @Sendable (Event) -> Void) async throws(PeripheralError) -> Result {
        let host = self.host
        let endings = AsyncStream.makeStream(of: Ending.self)
        // The device's address changes (a buttonless reset), for the task that moves the bootloader's advertising.
        let moves = AsyncStream.makeStream(of: DeviceAddress?.self)
        let peripheral = OTAPeripheral(model: device.model, storeDirectory: device.storeDirectory, trace: trace,
                                       security: device.security, events: { event in
            if case .moved(let address) = event { moves.continuation.yield(address) }
            events(.device(event))
        })
        let application = PeripheralApplication(connection: host.connection, root: Self.applicationRoot,
                                                services: peripheral.services)
        let advertisement = PeripheralAdvertisement(connection: host.connection, path: Self.applicationRoot + "/advertisement0",
                                                    localName: device.name, serviceUUIDs: device.model.advertisedServices)
        // The bootloader's GATT application on the second adapter, registered throughout and
        // advertised only while the device runs its bootloader. The application's advertisement
        // stays registered meanwhile, as through a reboot (withdrawing and registering it again on
        // BlueZ 5.66 left it unseen by other controllers' scans), and its table answers nothing then.
        var bootloader: BootloaderSite?
        if let table = device.bootloaderServices, hosts.count > 1 {
            bootloader = BootloaderSite(host: hosts[1], application: PeripheralApplication(
                connection: hosts[1].connection, root: Self.applicationRoot, services: peripheral.services(for: table)))
        }
        // The device's own agent, bluetoothd's default, answers the pairings centrals start.
        let agent = device.security == .none ? nil : BlueZAgent(
            bus: host.connection, path: Self.applicationRoot + "/agent",
            policy: BlueZAgent.Policy(credentials: PairingCredentials(passkey: device.passkey,
                                                                confirmsComparison: device.security == .authenticate && device.passkey == nil),
                                      servesPeripheral: true),
            logger: logger)

        var mover: Task<Void, Never>?
        var waiter: Task<Void, Never>?
        var failure: PeripheralError?
        var ending = Ending.stopped
        do {
            if let agent {
                do {
                    try await agent.register()
                } catch {
                    throw PeripheralError(.bluetoothUnavailable, error.message)
                }
            }
            try await application.export()
            try await advertisement.export()
            if let bootloader {
                try await bootloader.application.export()
                let applications = [application, bootloader.application]
                try await peripheral.attach(link: AdapterLinks(hosts)) { uuid, value in
                    let holder = applications.first { $0.characteristicPaths[uuid] != nil } ?? application
                    try await holder.notify(uuid, value)
                }
            } else {
                try await peripheral.attach(link: host, application: application)
            }
            try await host.connection.subscribe(DBusMatchRule(
                sender: "org.freedesktop.DBus", path: "/org/freedesktop/DBus", interface: "org.freedesktop.DBus",
                member: "NameOwnerChanged", arg0: "org.bluez")) { signal in
                if signal.arguments.count == 3, signal.arguments[2].string?.isEmpty == true { endings.continuation.yield(.stackGone) }
            }
            for (served, on) in [(application, host)] + (bootloader.map { [($0.application, $0.host)] } ?? []) {
                do {
                    try await served.register(on: on.adapterPath)
                } catch {
                    throw PeripheralError.from(error, "registering the GATT application on \(on.adapter) (GattManager1.RegisterApplication)")
                }
            }
            do {
                try await advertisement.register(on: host.adapterPath)
            } catch {
                throw PeripheralError.from(error, "registering the advertisement on \(host.adapter) (LEAdvertisingManager1.RegisterAdvertisement)")
            }
            if let bootloader {
                mover = Task {
                    for await address in moves.stream {
                        await Self.move(to: address, device: device, bootloader: bootloader, home: host.adapter,
                                        peripheral: peripheral, events: events)
                    }
                }
            }
            events(.serving(bootloaderAdapter: bootloader?.host.adapter))
            waiter = Task {
                await stop()
                endings.continuation.yield(.stopped)
            }
            for await first in endings.stream {
                ending = first
                break
            }
        } catch {
            failure = PeripheralError.from(error, "setting up the GATT application")
        }

        // Teardown, each step bounded by its own call timeout.
        waiter?.cancel()
        await peripheral.stop()
        moves.continuation.finish()
        endings.continuation.finish()
        mover?.cancel()
        await mover?.value
        try? await advertisement.unregister()
        try? await application.unregister()
        await advertisement.unexport()
        await application.unexport()
        if let bootloader {
            await bootloader.withdraw()
            try? await bootloader.application.unregister()
            await bootloader.application.unexport()
        }
        await agent?.unregister()
        await close()
        if let failure { throw failure }
        return Result(ending: ending, activations: await peripheral.activations,
                      runsLockstep: await peripheral.runsLockstep, lockstepDivergence: await peripheral.lockstepDivergence)
    }

    /// The device reset and answers at `address`: advertise the bootloader on its adapter once the
    /// reset is over, or withdraw it when the device is back in its application.
    private static func move(to address: DeviceAddress?, device: Device, bootloader: BootloaderSite, home: String,
                             peripheral: OTAPeripheral, events: @Sendable (Event) -> Void) async {
        guard address == device.bootloaderAddress else {
            await bootloader.withdraw()
            events(.moved(address: address, adapter: home, mode: .application, name: nil))
            return
        }
        // Advertised once the reset is over, as the device comes up.
        await peripheral.waitUntilBack()
        let advertised = await peripheral.model.advertisedName ?? "DfuTarg"
        if let problem = await bootloader.advertise(advertised, services: device.model.advertisedServices) {
            events(.problem(problem))
            return
        }
        events(.moved(address: address, adapter: bootloader.host.adapter, mode: .bootloader, name: advertised))
    }
}

/// The adapter a device's bootloader answers on: its GATT application stays registered; its
/// advertisement is there only while the device runs its bootloader.
actor BootloaderSite {
    nonisolated let host: PeripheralHost
    nonisolated let application: PeripheralApplication
    private var advertisement: PeripheralAdvertisement?
    private var count = 0

    init(host: PeripheralHost, application: PeripheralApplication) {
        self.host = host
        self.application = application
    }

    /// Starts advertising `name`; a line saying what failed, or nil.
    func advertise(_ name: String, services: [BluetoothUUID]) async -> String? {
        await withdraw()
        count += 1
        let made = PeripheralAdvertisement(connection: host.connection, path: PeripheralServer.applicationRoot + "/bootloader\(count)",
                                           localName: String(name.utf8.prefix(29)) ?? "DfuTarg", serviceUUIDs: services)
        do {
            try await made.export()
            try await made.register(on: host.adapterPath)
        } catch {
            await made.unexport()
            let reason = PeripheralError.from(error, "LEAdvertisingManager1.RegisterAdvertisement").message
            return "advertising the bootloader on \(host.adapter) failed: \(reason)"
        }
        advertisement = made
        return nil
    }

    /// Stops advertising, if it does.
    func withdraw() async {
        guard let advertisement else { return }
        self.advertisement = nil
        try? await advertisement.unregister()
        await advertisement.unexport()
    }
}
