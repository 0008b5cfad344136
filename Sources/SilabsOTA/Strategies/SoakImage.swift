import OTAWire

/// The GBL files the soak and the bench send: a header tag (GBL version 3), an application tag
/// with `version`, one prog tag holding `body` padded to whole words, and the end tag with the
/// CRC-32 of every byte before its value, as `commander gbl create` lays a plain GBL out.
public enum SilabsSoakImage {
    public static func gbl(version: UInt32, body: [UInt8]) -> [UInt8] {
        var out: [UInt8] = []
        func tag(_ id: UInt32, _ data: [UInt8]) {
            out.appendLE(id)
            out.appendLE(UInt32(data.count))
            out += data
        }
        var header: [UInt8] = []
        header.appendLE(UInt32(0x0300_0000))
        header.appendLE(UInt32(0))
        tag(0x03A6_17EB, header)
        var application: [UInt8] = []
        application.appendLE(UInt32(1 << 5))
        application.appendLE(version)
        application.appendLE(UInt32(0))
        application += [UInt8](repeating: 0x5A, count: 16)
        tag(0xF40A_0AF4, application)
        var prog: [UInt8] = []
        prog.appendLE(UInt32(0))
        prog += body + [UInt8](repeating: 0xFF, count: (4 - body.count % 4) % 4)
        tag(0xFE01_01FE, prog)
        out.appendLE(UInt32(0xFC04_04FC))
        out.appendLE(UInt32(4))
        out.appendLE(CRC32.checksum(out))
        return out
    }
}
