import Foundation
import Testing

/// What ArgumentParser checks of a command's declaration only in a debug build of itself (the
/// tests build in release: scripts/test), checked here from the built binary's own description
/// of its commands (`--experimental-dump-help`): no name taken twice in a command, every
/// argument reachable by a name or a position.
@Suite("Command declarations")
struct DeclarationTests {
    struct Command {
        let path: String
        let names: [String]
        let arguments: Int
        let positionals: Int
    }

    static func commands() throws -> [Command] {
        let outcome = try ExecutableTests().run(["--experimental-dump-help"])
        try #require(outcome.status == 0, "--experimental-dump-help exited \(outcome.status): \(outcome.stderr)")
        let root = try #require(try JSONSerialization.jsonObject(with: Data(outcome.stdout.utf8)) as? [String: Any])
        let command = try #require(root["command"] as? [String: Any])
        var found: [Command] = []
        func walk(_ command: [String: Any], _ path: String) {
            let arguments = command["arguments"] as? [[String: Any]] ?? []
            let names = arguments.flatMap { ($0["names"] as? [[String: Any]] ?? []).compactMap { name in
                (name["kind"] as? String).flatMap { kind in (name["name"] as? String).map { kind == "long" ? "--\($0)" : "-\($0)" } }
            } }
            found.append(Command(path: path, names: names, arguments: arguments.count,
                                 positionals: arguments.filter { $0["kind"] as? String == "positional" }.count))
            for sub in command["subcommands"] as? [[String: Any]] ?? [] {
                walk(sub, path + " " + (sub["commandName"] as? String ?? "?"))
            }
        }
        walk(command, "otaflash")
        return found
    }

    @Test func everyNameIsTakenOnceInItsCommand() throws {
        let commands = try Self.commands()
        #expect(commands.count > 10, "\(commands.map(\.path))")
        for command in commands {
            let repeated = Dictionary(grouping: command.names, by: { $0 }).filter { $0.value.count > 1 }.keys.sorted()
            #expect(repeated.isEmpty, "\(command.path) declares \(repeated) more than once")
        }
    }

    @Test func theLargestCommandsDeclareWhatTheirHelpTeaches() throws {
        let commands = try Self.commands()
        let flash = try #require(commands.first { $0.path == "otaflash flash" })
        let station = try #require(commands.first { $0.path == "otaflash station" })
        #expect(flash.names.contains("--device") && flash.names.contains("--simulator") && flash.positionals == 1)
        #expect(station.names.contains("--ledger") && station.names.contains("--station"))
    }
}
