// otaflash-bench: throughput and CPU figures on the simulator's link model.
//
//   swift run -c release otaflash-bench [--interval-sweep] [--grid] [--v2] [--batch] [--engine-cpu] [--nordic] [--smp] [--ledger]
//                                       [--image-kib N] [--json FILE]
//
// Every figure comes from one run of this program, so ratios are measured side by side. Each
// protocol's figures come from its strategy (`BenchStrategy`, listed in Strategies.swift); the
// ledger knows no protocol. docs/PERFORMANCE.md explains the link model and each figure.

import Foundation
import GATT
import OTA
import Simulator

/// The sections no protocol owns.
let neutralFlags = ["--ledger"]
let sections = benchStrategies.flatMap(\.sections)

func fail(_ message: String) -> Never {
    FileHandle.standardError.write(Data("otaflash-bench: \(message)\n".utf8))
    exit(2)
}

struct Options {
    var selected: Set<String> = []
    /// A PostgreSQL ledger to measure too (a database the bench may fill): scripts/pg-server.
    var ledgerURL: String?
    var json: String?
    var imageSize = 256 * 1024

    init(_ args: [String]) {
        let flags = sections.map(\.flag) + neutralFlags
        var i = 0
        func value() -> String {
            i += 1
            guard i < args.count else { fail("\(args[i - 1]) needs a value") }
            return args[i]
        }
        while i < args.count {
            switch args[i] {
            case let flag where flags.contains(flag): selected.insert(flag)
            case "--json": json = value()
            case "--ledger-url":
                ledgerURL = value()
                selected.insert("--ledger")
            case "--image-kib":
                guard let kib = Int(value()), kib > 0 else { fail("--image-kib takes a positive whole number") }
                imageSize = kib * 1024
            case "--help", "-h":
                print("usage: otaflash-bench " + flags.map { "[\($0)]" }.joined(separator: " ") + " [--ledger-url postgres://…] [--image-kib N] [--json FILE]")
                exit(0)
            default: fail("unknown argument \(args[i])")
            }
            i += 1
        }
        if selected.isEmpty { selected = Set(flags) }
    }
}

// swift-argument-parser's generate-manual plugin (scripts/package) asks every executable of the
// package that links ArgumentParser, as this one does through the protocol modules, for its help
// as JSON; this program parses its own arguments, so it answers with its name and purpose.
if CommandLine.arguments.dropFirst().first == "--experimental-dump-help" {
    print(#"{"serializationVersion":0,"command":{"commandName":"otaflash-bench","abstract":"Throughput and CPU figures on the simulator's link model (docs/PERFORMANCE.md).","shouldDisplay":true}}"#)
    exit(0)
}
let options = Options(Array(CommandLine.arguments.dropFirst()))
var rng = SeededGenerator(seed: 2024)
let image = FirmwareImage(bytes: (0..<options.imageSize).map { _ in UInt8.random(in: 0...255, using: &rng) })
var report: [(key: String, value: Any)] = []
var notes: [String] = []

for section in sections where options.selected.contains(section.flag) {
    report += try await section.measure(image)
}

// MARK: Ledger

if options.selected.contains("--ledger") {
    for count in [100, 10_000] {
        let (perRecord, queryMs, bytes) = try await ledgerFigures(count: count)
        print(String(format: "Ledger (SQLite, WAL, synchronous FULL): %d records, %.0f µs per committed record, summary of all in %.1f ms, %.1f KiB on disk",
                     count, perRecord, queryMs, Double(bytes) / 1024))
        report.append(("ledger_\(count)_microseconds_per_record", perRecord))
    }
    if let url = options.ledgerURL {
        for (count, claims) in [(100, false), (10_000, false), (1000, true)] {
            let (perRecord, queryMs, _) = try await ledgerFigures(count: count, url: url, claims: claims)
            let server = url.replacing(/:[^:@\/]*@/, with: "@")
            print("Ledger (PostgreSQL, \(server)): \(count) records\(claims ? ", each after its device's claim" : "")"
                  + String(format: ", %.0f µs per committed record, summary of all in %.1f ms", perRecord, queryMs))
            report.append(("ledger_postgres_\(count)\(claims ? "_claimed" : "")_microseconds_per_record", perRecord))
        }
        let count = 2000
        let o = try await outboxFigures(count: count, url: url)
        print(String(format: "Outbox (%d records each, µs per record): PostgreSQL append %.0f; through a station's outbox, server up %.0f; kept in the outbox (SQLite), server away %.0f; sent from the outbox when it answers %.0f",
                     count, o.plain, o.through, o.kept, o.replayed))
        report.append(("outbox_postgres_append_microseconds_per_record", o.plain))
        report.append(("outbox_through_station_microseconds_per_record", o.through))
        report.append(("outbox_kept_sqlite_microseconds_per_record", o.kept))
        report.append(("outbox_replayed_microseconds_per_record", o.replayed))
    }
}

if let path = options.json {
    var object: [String: Any] = [:]
    for (k, v) in report { object[k] = v }
    for key in ["link_efficiency_default", "link_efficiency_grid_min_excluding_mtu23", "stop_and_wait_efficiency_default", "engine_mib_per_s", "bluez_vs_bleak_ratio"] where object[key] == nil {
        object[key] = NSNull()
        notes.append("\(key): not measured by this run of otaflash-bench" + (key == "bluez_vs_bleak_ratio" ? " (needs the BlueZ VM harness: scripts/bench)" : ""))
    }
    object["notes"] = notes
    let data = try JSONSerialization.data(withJSONObject: object, options: [.prettyPrinted, .sortedKeys])
    try data.write(to: URL(fileURLWithPath: path))
    print("wrote \(path)")
}
