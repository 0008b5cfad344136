import Foundation
import Testing

/// The committed sample images and their manifest.
package enum Samples {
    package struct Entry: Decodable, Sendable, CustomTestStringConvertible {
        package let file: String
        package let format: String
        package let size: Int
        package let crc32: String
        package let base_address: String?
        package var testDescription: String { file }
    }

    package struct Manifest: Decodable {
        package let version: Int
        package let files: [Entry]
    }

    /// The repository root, three levels above this file (Tests/TestSupport/<file>).
    package static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
    package static let directory = root.appendingPathComponent("firmware-samples")

    package static func path(_ file: String) -> String { directory.appendingPathComponent(file).path }

    /// The manifest's entries; empty (and the tests using them fail) when it cannot be read.
    package static let entries: [Entry] = {
        guard let data = FileManager.default.contents(atPath: path("manifest.json")),
              let manifest = try? JSONDecoder().decode(Manifest.self, from: data) else { return [] }
        return manifest.files
    }()
}

