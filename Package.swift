// swift-tools-version: 6.1
import PackageDescription

let package = Package(
    name: "otaflash",
    platforms: [.macOS(.v15)],
    products: [
        .executable(name: "otaflash", targets: ["otaflash"]),
        .library(name: "OTA", targets: ["OTA"]),
        .library(name: "GATT", targets: ["GATT"]),
        .library(name: "OTAWire", targets: ["OTAWire"]),
        .library(name: "Native", targets: ["Native"]),
        .library(name: "Simulator", targets: ["Simulator"]),
        .library(name: "NordicDFU", targets: ["NordicDFU"]),
        .library(name: "SMP", targets: ["SMP"]),
        .library(name: "ESPOTA", targets: ["ESPOTA"]),
        .library(name: "SilabsOTA", targets: ["SilabsOTA"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-argument-parser", from: "1.8.2"),
        .package(url: "https://github.com/apple/swift-log", from: "1.16.2"),
        .package(url: "https://github.com/weichsel/ZIPFoundation", from: "0.9.20"),
        .package(url: "https://github.com/apple/swift-crypto", "3.12.3"..<"5.0.0"),
        .package(url: "https://github.com/groue/GRDB.swift", from: "7.10.0"),
        .package(url: "https://github.com/vapor/postgres-nio", from: "1.33.2"),
        // `--post-results`: each device's record POSTed to an MES (docs/EVENTS.md, "Results to a server").
        .package(url: "https://github.com/swift-server/async-http-client", from: "1.37.0"),
        // The HTTP listeners of `station --metrics` and `dashboard` (no default traits: neither
        // swift-configuration nor the full-Foundation extras are used).
        .package(url: "https://github.com/hummingbird-project/hummingbird", from: "2.28.1", traits: []),
    ],
    targets: [
        // C shims: the only places C comes in.
        // Named OTAZlib: ZIPFoundation brings a module called CZlib of its own.
        .systemLibrary(name: "OTAZlib", path: "Sources/CZlib", pkgConfig: "zlib", providers: [.apt(["zlib1g-dev"])]),
        .systemLibrary(name: "CDBus", pkgConfig: "dbus-1", providers: [.apt(["libdbus-1-dev"])]),

        // Transport abstraction: value types and the connection protocol. No C.
        .target(name: "GATT"),
        // Wire primitives every protocol shares: little-endian reading, CRC32 (zlib's), versions.
        .target(name: "OTAWire", dependencies: ["OTAZlib", "GATT"]),
        // The device side of protocol version 2 in portable C99 for microcontrollers (docs/PORTING.md),
        // with a NOR flash model for host tests and the fuzzer.
        .target(name: "COTADevice"),
        // The device side every protocol's model stands on: the contract a transport hosts
        // (`PeripheralModel`, in the simulator and in peripheral mode) and the fault plan.
        .target(name: "OTADevice", dependencies: ["OTAWire", "GATT"]),
        // The protocol-neutral core of the central: images, the profile and engine contracts, the
        // session and its reconnect supervisor, batches, the journal, pairing, errors.
        .target(name: "OTA", dependencies: ["GATT", "OTAWire", .product(name: "Logging", package: "swift-log"),
                                    .product(name: "ZIPFoundation", package: "ZIPFoundation")],
                // The session's per-packet loop is generic over the engine, which a protocol module
                // defines: serialized bodies let each protocol's module specialize it (docs/PERFORMANCE.md).
                swiftSettings: [.unsafeFlags(["-cross-module-optimization"], .when(configuration: .release))]),
        // In-process simulated peripheral: link model, virtual clock, fault injection. Hosts any
        // protocol's device model. Also the contract of the soak and bench strategies
        // (Strategies.swift), whose trials hand a session its profile (OTA).
        .target(name: "Simulator", dependencies: ["GATT", "OTAWire", "OTADevice", "OTA"]),
        // The command line's contract with a protocol, which knows none: the value a protocol
        // registers (its loader, the options it takes, its simulated and served devices), its
        // options group, the flash plan, exit codes and failures, and every option's range.
        .target(name: "OTACommandLine", dependencies: [
            "GATT", "OTAWire", "OTADevice", "OTA", "Simulator", .product(name: "ArgumentParser", package: "swift-argument-parser"),
        ]),
        // otaflash's own protocol (docs/PROTOCOL.md): codec, the central's engine and profile, the
        // device (state machine, timing, faults; the C library run in lockstep), its simulated device
        // its soak and bench strategies, and its command line (CommandLine/: options and registration).
        .target(name: "Native", dependencies: [
            "GATT", "OTAWire", "OTA", "OTADevice", "COTADevice", "Simulator", "OTACommandLine",
            .product(name: "ArgumentParser", package: "swift-argument-parser"),
        ]),
        // Nordic Secure DFU (nRF5 SDK bootloaders): wire codec, nrfutil packages, the central's engine
        // and the bootloader's device model, its command line (CommandLine/), each in its own folder.
        .target(name: "NordicDFU", dependencies: [
            "GATT", "OTAWire", "OTA", "OTADevice", "Simulator", "OTACommandLine", "ZIPFoundation", .product(name: "Crypto", package: "swift-crypto"),
            .product(name: "ArgumentParser", package: "swift-argument-parser"),
        ]),
        // MCUmgr/SMP with MCUboot images (Zephyr, nRF Connect SDK): wire codec and CBOR, MCUboot
        // images, the central's engine and the SMP server's device model, its command line
        // (CommandLine/), each in its own folder.
        .target(name: "SMP", dependencies: [
            "GATT", "OTAWire", "OTA", "OTADevice", "Simulator", "OTACommandLine", .product(name: "Crypto", package: "swift-crypto"),
            .product(name: "ArgumentParser", package: "swift-argument-parser"), "ZIPFoundation",
        ]),
        // Espressif's BLE OTA (esp-iot-solution's ble_ota component) with ESP-IDF app images: wire
        // codec, image checks, the central's engine and the device's model, its command line
        // (CommandLine/), each in its own folder.
        .target(name: "ESPOTA", dependencies: [
            "GATT", "OTAWire", "OTA", "OTADevice", "Simulator", "OTACommandLine", .product(name: "Crypto", package: "swift-crypto"),
            .product(name: "ArgumentParser", package: "swift-argument-parser"),
        ]),
        // Silicon Labs' Bluetooth OTA (EFR32: the AppLoader, application and in-place OTA DFU) with
        // GBL files: wire codec, GBL checks, the central's engine and the devices' models, its
        // command line (CommandLine/), each in its own folder.
        .target(name: "SilabsOTA", dependencies: [
            "GATT", "OTAWire", "OTA", "OTADevice", "Simulator", "OTACommandLine", .product(name: "Crypto", package: "swift-crypto"),
            .product(name: "ArgumentParser", package: "swift-argument-parser"),
        ]),
        // The factory line's books: one record per device attempt, committed as it ends (SQLite
        // through GRDB, or PostgreSQL through PostgresNIO for several stations, with claims).
        // Knows no protocol and no transport.
        .target(name: "Ledger", dependencies: [
            .product(name: "GRDB", package: "GRDB.swift"), .product(name: "PostgresNIO", package: "postgres-nio"),
            .product(name: "Logging", package: "swift-log"),
        ]),
        // What the line looks like, from its records and the stations' heartbeats: counts, series and
        // SVG plots, the shift report (HTML) and JUnit XML; the dashboard's page is drawn from the
        // same model. Knows the ledger only: no protocol, no transport, no HTTP.
        .target(name: "LineView", dependencies: ["Ledger"]),
        // The line over HTTP (Hummingbird): the station's Prometheus metrics and the dashboard.
        .target(name: "LineServer", dependencies: [
            "LineView", "Ledger", .product(name: "Hummingbird", package: "hummingbird"),
            .product(name: "Logging", package: "swift-log"),
        ]),
        // libdbus wrapper: the only importer of CDBus.
        .target(name: "DBus", dependencies: ["CDBus"]),
        // BlueZ over D-Bus: the central transport and the peripheral (GATT application) server.
        .target(name: "BlueZ", dependencies: ["GATT", "DBus", "OTAWire", "OTADevice", .product(name: "Logging", package: "swift-log")]),
        // Command implementations (testable in-process); `otaflash` is only its entry point.
        .target(name: "OTAFlashCLI", dependencies: [
            "OTA", "OTACommandLine", "Simulator", "BlueZ", "OTADevice", "Native", "NordicDFU", "SMP", "ESPOTA", "SilabsOTA", "Ledger", "LineView", "LineServer",
            .product(name: "ArgumentParser", package: "swift-argument-parser"),
            .product(name: "Crypto", package: "swift-crypto"),
            .product(name: "Logging", package: "swift-log"),
            .product(name: "AsyncHTTPClient", package: "async-http-client"),
        ], plugins: ["BuildCommit"]),
        // The commit a build is from, for `otaflash --version` (the version itself is in Version.swift).
        .plugin(name: "BuildCommit", capability: .buildTool()),
        .executableTarget(name: "otaflash", dependencies: ["OTAFlashCLI"]),
        // Throughput and CPU figures on the link model (run in release mode): each registered
        // protocol's BenchStrategy (OTAFlashCLI's list), then the ledger.
        .executableTarget(name: "otaflash-bench", dependencies: ["OTA", "GATT", "Simulator", "OTACommandLine", "OTAFlashCLI", "Ledger"]),
        // Fault soak on the simulator (run in release mode): each registered protocol's SoakStrategy.
        .executableTarget(name: "otaflash-soak", dependencies: ["OTA", "GATT", "Simulator", "OTACommandLine", "OTAFlashCLI"]),

        .testTarget(name: "OTAWireTests", dependencies: ["OTAWire"]),
        // The protocol-neutral core (images, registry, session) against a protocol of the tests' own.
        .testTarget(name: "OTATests", dependencies: ["OTA", "OTAWire", "OTADevice", "GATT", "Simulator", "TestSupport"]),
        // otaflash's own protocol: codec, engine, device, sessions with its device, its command line.
        .testTarget(name: "NativeTests", dependencies: ["Native", "OTA", "OTAWire", "OTADevice", "GATT", "Simulator", "TestSupport", "CLITestSupport"]),
        // The C device library and OTATarget held to the same scenarios.
        .testTarget(name: "DeviceConformanceTests", dependencies: ["OTADevice", "OTAWire", "Native"]),
        .testTarget(name: "SimulatorTests", dependencies: ["Simulator", "OTADevice", "OTAWire", "GATT", "Native", "TestSupport"]),
        // Test tools shared by the test targets: child processes, a private dbus-daemon.
        .target(name: "TestSupport", dependencies: ["DBus", "OTA"], path: "Tests/TestSupport"),
        // The command-line tests' tools (otaflash run in-process, docs/EVENTS.md's tables): CLITests
        // and each protocol's command-line tests (Tests/<Protocol>Tests/CommandLine).
        .target(name: "CLITestSupport", dependencies: ["OTAFlashCLI", "OTACommandLine", "OTA", "TestSupport"], path: "Tests/CLITestSupport"),
        .testTarget(name: "DBusTests", dependencies: ["DBus", "TestSupport"]),
        .testTarget(name: "BlueZTests", dependencies: ["TestSupport", "BlueZ", "GATT", "DBus", "OTAWire", "OTADevice", "OTAFlashCLI", "Simulator", "OTA", "Native", "NordicDFU", "SMP", "Ledger"], exclude: ["fake_bluez"]),
        .testTarget(name: "NordicDFUTests", dependencies: ["NordicDFU", "OTA", "OTAWire", "GATT", "ZIPFoundation", "OTADevice", "Simulator", "Native", "CLITestSupport"], exclude: ["FuzzCrashes"]),
        .testTarget(name: "SMPTests", dependencies: [
            "SMP", "OTA", "OTAWire", "GATT", "OTADevice", "Simulator", "Native", "ZIPFoundation", "OTACommandLine", "CLITestSupport", .product(name: "Crypto", package: "swift-crypto"),
        ]),
        .testTarget(name: "ESPOTATests", dependencies: ["ESPOTA", "OTA", "OTAWire", "GATT", "OTADevice", "Simulator", "CLITestSupport", "TestSupport"]),
        .testTarget(name: "SilabsOTATests", dependencies: ["SilabsOTA", "OTA", "OTAWire", "GATT", "OTADevice", "Simulator", "OTACommandLine", "OTAFlashCLI",
                                                         .product(name: "Crypto", package: "swift-crypto")]),
        .testTarget(name: "LedgerTests", dependencies: ["Ledger", "TestSupport", .product(name: "Logging", package: "swift-log"),
                                                        .product(name: "PostgresNIO", package: "postgres-nio"),
                                                        .product(name: "GRDB", package: "GRDB.swift")]),
        .testTarget(name: "LineViewTests", dependencies: ["LineView", "Ledger"]),
        .testTarget(name: "CLITests", dependencies: ["OTAFlashCLI", "OTACommandLine", "OTA", "OTAWire", "TestSupport", "CLITestSupport", "Ledger", "Native", "GATT", "LineView", "LineServer",
                                                     .product(name: "GRDB", package: "GRDB.swift")]),
    ],
    swiftLanguageModes: [.v6]
)
