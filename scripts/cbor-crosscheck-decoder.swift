// The decoder side of scripts/cbor-crosscheck, compiled with Sources/SMP/Codec/CBOR.swift alone:
// reads one item in hex a line, decodes it with SMP's limits, and prints its canonical encoding
// in hex, or "error: " and the decoder's refusal.
@main
enum CBORCrossCheckDecoder {
    static func main() {
        var out = ""
        while let line = readLine() {
            let utf8 = Array(line.utf8)
            var input: [UInt8] = []
            input.reserveCapacity(utf8.count / 2)
            for i in stride(from: 0, to: utf8.count - 1, by: 2) {
                input.append(UInt8(String(decoding: utf8[i...i + 1], as: UTF8.self), radix: 16) ?? 0)
            }
            do {
                out += try CBORDecoder.decode(input).encoded.map(hex).joined()
            } catch {
                out += "error: \(error)"
            }
            out += "\n"
        }
        print(out, terminator: "")
    }
}
