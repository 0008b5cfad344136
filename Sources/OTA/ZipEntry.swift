import ZIPFoundation

/// Why an archive's entry could not be read whole (`ZipLayout.read`); each package format says
/// it in its own words.
public enum ZipEntryFailure: Error {
    /// The archive has no entry of that name.
    case missing
    /// The entry is a folder or a link.
    case notAFile
    /// The entry is larger than the limit: by its header (`declared`), or as it inflates (nil).
    case overLimit(declared: UInt64?)
    /// ZIPFoundation could not extract it (a damaged archive).
    case unreadable(any Error)
    /// It inflated to another size than its header says.
    case sizeMismatch(read: Int, header: UInt64)
    /// Its bytes fail the CRC-32 the archive gives.
    case crcMismatch(read: UInt32, header: UInt32)
}

extension ZipLayout {
    private struct SizeLimitExceeded: Error {}

    /// The bytes of entry `name` (a leading "./" on either side ignored), at most `limit`, checked
    /// against the entry's size and CRC-32. The header's size can lie: extraction stops at the
    /// limit whatever it says.
    public static func read(_ name: String, from archive: Archive, limit: Int) -> Result<[UInt8], ZipEntryFailure> {
        guard let entry = archive[name] ?? archive.first(where: { samePath($0.path, name) }) else { return .failure(.missing) }
        guard entry.type == .file else { return .failure(.notAFile) }
        guard entry.uncompressedSize <= UInt64(limit) else { return .failure(.overLimit(declared: entry.uncompressedSize)) }
        var out: [UInt8] = []
        out.reserveCapacity(Int(entry.uncompressedSize))
        let crc: UInt32
        do {
            // ZIPFoundation returns the CRC-32 of what it extracted; comparing it is the caller's job.
            crc = try archive.extract(entry, skipCRC32: false) { chunk in
                guard out.count + chunk.count <= limit else { throw SizeLimitExceeded() }
                out += chunk
            }
        } catch is SizeLimitExceeded {
            return .failure(.overLimit(declared: nil))
        } catch {
            return .failure(.unreadable(error))
        }
        guard out.count == Int(entry.uncompressedSize) else { return .failure(.sizeMismatch(read: out.count, header: entry.uncompressedSize)) }
        guard crc == entry.checksum else { return .failure(.crcMismatch(read: crc, header: entry.checksum)) }
        return .success(out)
    }
}
