/// Checks that every record a zip's directory points to lies inside the bytes, before ZIPFoundation
/// reads them: its in-memory reader traps when it is asked to read past the end (a central directory
/// or local header offset beyond the data), and it leaks the archive when opening fails.
///
/// Layout from APPNOTE.TXT 4.3: local headers (`PK\3\4`, 30 bytes + name + extra, then the data),
/// the central directory (`PK\1\2`, 46 bytes + name + extra + comment per entry) and the end of
/// central directory record (`PK\5\6`, 22 bytes + comment). ZIP64 is refused: packages are small.
public enum ZipLayout {
    /// Nil when the layout is sound; otherwise what is wrong, for the error line.
    public static func problem(in bytes: [UInt8]) -> String? {
        let n = bytes.count
        func u16(_ i: Int) -> Int { Int(bytes[i]) | Int(bytes[i + 1]) << 8 }
        func u32(_ i: Int) -> Int { u16(i) | u16(i + 2) << 16 }
        func signature(_ i: Int, _ third: UInt8, _ fourth: UInt8) -> Bool {
            i >= 0 && i + 4 <= n && bytes[i] == 0x50 && bytes[i + 1] == 0x4B && bytes[i + 2] == third && bytes[i + 3] == fourth
        }
        guard n >= 22 else { return "it is too short to be a zip archive" }
        // The last end record, as ZIPFoundation finds it (scanning back from the end).
        var eocd = n - 22
        while eocd >= 0, !signature(eocd, 5, 6) { eocd -= 1 }
        guard eocd >= 0 else { return "it has no zip end-of-directory record" }
        guard eocd + 22 + u16(eocd + 20) == n else { return "its zip end-of-directory record is damaged" }
        guard !signature(eocd - 20, 6, 7) else { return "it is a ZIP64 archive, which firmware packages never are" }
        let entries = u16(eocd + 10)
        let directorySize = u32(eocd + 12)
        let directoryStart = u32(eocd + 16)
        guard directoryStart <= eocd, directorySize <= eocd - directoryStart else {
            return "its zip directory lies outside the file"
        }
        let directoryEnd = directoryStart + directorySize
        var p = directoryStart
        for _ in 0..<entries {
            guard p + 46 <= directoryEnd, signature(p, 1, 2) else { return "its zip directory is damaged" }
            let p0 = p
            let flags = u16(p + 8)
            let compressed = u32(p + 20)
            let uncompressed = u32(p + 24)
            let local = u32(p + 42)
            guard compressed != 0xFFFF_FFFF, uncompressed != 0xFFFF_FFFF, local != 0xFFFF_FFFF else {
                return "it is a ZIP64 archive, which firmware packages never are"
            }
            p += 46 + u16(p + 28) + u16(p + 30) + u16(p + 32)
            guard p <= directoryEnd else { return "its zip directory is damaged" }
            guard local + 30 <= n, signature(local, 3, 4) else { return "a zip entry's header lies outside the file" }
            let dataStart = local + 30 + u16(local + 26) + u16(local + 28)
            // ZIPFoundation reads a stored entry by its uncompressed size, a deflated one by its
            // compressed size, and finds the data descriptor (flag 8) right after that.
            let stored = u16(p0 + 10) == 0
            let dataSize = stored ? max(compressed, uncompressed) : compressed
            let descriptor = flags & 0x08 != 0 ? 16 : 0
            guard dataStart + dataSize + descriptor <= n else { return "a zip entry's data runs past the end of the file" }
        }
        return nil
    }

    /// True when two entry names name the same file, ignoring leading "./" (`zip` strips it, other
    /// archivers keep what they were given; APPNOTE.TXT 4.4.17 forbids only a leading "/").
    public static func samePath(_ a: String, _ b: String) -> Bool {
        func trimmed(_ s: String) -> Substring {
            var s = Substring(s)
            while s.hasPrefix("./") { s = s.dropFirst(2) }
            return s
        }
        return trimmed(a) == trimmed(b)
    }
}
