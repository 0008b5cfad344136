// swift-tools-version: 6.1
// libFuzzer harnesses, kept out of the main package's build: they have no `main` of their own
// (libFuzzer provides it), so they link only with `-sanitize=fuzzer`. Run them with scripts/fuzz.
import PackageDescription

let package = Package(
    name: "otaflash-fuzz",
    dependencies: [.package(name: "otaflash", path: "..")],
    targets: [
        // libFuzzer's driver, entered from each harness's own main.
        .target(name: "FuzzDriver"),
        .executableTarget(name: "fuzz-replies", dependencies: ["FuzzDriver", .product(name: "Native", package: "otaflash")]),
        .executableTarget(name: "fuzz-hex", dependencies: ["FuzzDriver", .product(name: "OTA", package: "otaflash")]),
        .executableTarget(name: "fuzz-nordic", dependencies: ["FuzzDriver", .product(name: "NordicDFU", package: "otaflash")]),
        .executableTarget(name: "fuzz-smp", dependencies: ["FuzzDriver", .product(name: "SMP", package: "otaflash")]),
        .executableTarget(name: "fuzz-mcuboot", dependencies: [
            "FuzzDriver", .product(name: "SMP", package: "otaflash"), .product(name: "OTA", package: "otaflash"),
        ]),
    ],
    swiftLanguageModes: [.v6]
)
