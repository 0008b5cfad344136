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
        .library(name: "Simulator", targets: ["Simulator"]),
        .library(name: "NordicDFU", targets: ["NordicDFU"]),
        .library(name: "SMP", targets: ["SMP"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-argument-parser", from: "1.8.2"),
        .package(url: "https://github.com/apple/swift-log", from: "1.16.2"),
        .package(url: "https://github.com/weichsel/ZIPFoundation", from: "0.9.20"),
        .package(url: "https://github.com/apple/swift-crypto", "3.12.3"..<"5.0.0"),
        .package(url: "https://github.com/groue/GRDB.swift", from: "7.10.0"),
    ],
    targets: [
        // C shims: the only places C comes in.
        // Named OTAZlib: ZIPFoundation brings a module called CZlib of its own.
        .systemLibrary(name: "OTAZlib", path: "Sources/CZlib", pkgConfig: "zlib", providers: [.apt(["zlib1g-dev"])]),
        .systemLibrary(name: "CDBus", pkgConfig: "dbus-1", providers: [.apt(["libdbus-1-dev"])]),

        // Transport abstraction: value types and the connection protocol. No C.
        .target(name: "GATT"),
        // The OTA wire format shared by both ends of the link: messages, status codes, CRC32.
        .target(name: "OTAWire", dependencies: ["OTAZlib", "GATT"]),
        // The device side of protocol version 2 in portable C99 for microcontrollers (docs/PORTING.md),
        // with a NOR flash model for host tests and the fuzzer.
        .target(name: "COTADevice"),
        // Device side of the protocol: flash slot and target state machine (simulator and peripheral mode).
        .target(name: "OTADevice", dependencies: ["OTAWire", "GATT", "COTADevice"]),
        // Central side: images, the engine state machine, the session driver, progress.
        .target(name: "OTA", dependencies: ["GATT", "OTAWire", .product(name: "Logging", package: "swift-log")]),
        // In-process simulated peripheral: link model, virtual clock, fault injection; and the soak and
        // bench strategies' contract (Strategies.swift), whose trials hand a session its profile (OTA).
        .target(name: "Simulator", dependencies: ["GATT", "OTAWire", "OTADevice", "OTA"]),
        // Nordic Secure DFU (nRF5 SDK bootloaders): wire codec, nrfutil packages, the central's engine
        // and the bootloader's device model, each in its own folder.
        .target(name: "NordicDFU", dependencies: [
            "GATT", "OTAWire", "OTA", "OTADevice", "Simulator", "ZIPFoundation", .product(name: "Crypto", package: "swift-crypto"),
        ]),
        // MCUmgr/SMP with MCUboot images (Zephyr, nRF Connect SDK): wire codec and CBOR, MCUboot
        // images, the central's engine and the SMP server's device model, each in its own folder.
        .target(name: "SMP", dependencies: [
            "GATT", "OTAWire", "OTA", "OTADevice", "Simulator", .product(name: "Crypto", package: "swift-crypto"),
        ]),
        // The factory line's books: one record per device attempt, committed as it ends (SQLite
        // through GRDB). Knows no protocol and no transport.
        .target(name: "Ledger", dependencies: [.product(name: "GRDB", package: "GRDB.swift")]),
        // libdbus wrapper: the only importer of CDBus.
        .target(name: "DBus", dependencies: ["CDBus"]),
        // BlueZ over D-Bus: the central transport and the peripheral (GATT application) server.
        .target(name: "BlueZ", dependencies: ["GATT", "DBus", "OTAWire", "OTADevice", .product(name: "Logging", package: "swift-log")]),
        // Command implementations (testable in-process); `otaflash` is only its entry point.
        .target(name: "OTAFlashCLI", dependencies: [
            "OTA", "Simulator", "BlueZ", "OTADevice", "NordicDFU", "SMP", "Ledger",
            .product(name: "ArgumentParser", package: "swift-argument-parser"),
            .product(name: "Crypto", package: "swift-crypto"),
            .product(name: "Logging", package: "swift-log"),
        ], plugins: ["BuildCommit"]),
        // The commit a build is from, for `otaflash --version` (the version itself is in Version.swift).
        .plugin(name: "BuildCommit", capability: .buildTool()),
        .executableTarget(name: "otaflash", dependencies: ["OTAFlashCLI"]),
        // Throughput and CPU figures on the link model (run in release mode): each protocol's
        // BenchStrategy, then the batch and the ledger.
        .executableTarget(name: "otaflash-bench", dependencies: ["OTA", "GATT", "Simulator", "NordicDFU", "SMP", "Ledger"]),
        // Fault soak on the simulator (run in release mode): each protocol's SoakStrategy.
        .executableTarget(name: "otaflash-soak", dependencies: ["OTA", "GATT", "Simulator", "NordicDFU", "SMP"]),

        .testTarget(name: "OTAWireTests", dependencies: ["OTAWire"]),
        .testTarget(name: "OTATests", dependencies: ["OTA", "OTAWire", "OTADevice", "GATT", "Simulator"]),
        // The C device library and OTATarget held to the same scenarios.
        .testTarget(name: "DeviceConformanceTests", dependencies: ["OTADevice", "OTAWire"]),
        .testTarget(name: "SimulatorTests", dependencies: ["Simulator", "OTADevice", "OTAWire", "GATT"]),
        // Test tools shared by the test targets: child processes, a private dbus-daemon.
        .target(name: "TestSupport", dependencies: ["DBus"], path: "Tests/TestSupport"),
        .testTarget(name: "DBusTests", dependencies: ["DBus", "TestSupport"]),
        .testTarget(name: "BlueZTests", dependencies: ["TestSupport", "BlueZ", "GATT", "DBus", "OTAWire", "OTADevice", "OTAFlashCLI", "Simulator", "OTA", "NordicDFU", "SMP", "Ledger"], exclude: ["fake_bluez"]),
        .testTarget(name: "NordicDFUTests", dependencies: ["NordicDFU", "OTA", "OTAWire", "GATT", "ZIPFoundation", "OTADevice", "Simulator"], exclude: ["FuzzCrashes"]),
        .testTarget(name: "SMPTests", dependencies: [
            "SMP", "OTA", "OTAWire", "GATT", "OTADevice", "Simulator", .product(name: "Crypto", package: "swift-crypto"),
        ]),
        .testTarget(name: "LedgerTests", dependencies: ["Ledger"]),
        .testTarget(name: "CLITests", dependencies: ["OTAFlashCLI", "OTA", "OTAWire", "TestSupport", "Ledger"]),
    ],
    swiftLanguageModes: [.v6]
)
