import Testing
@testable import SMP

/// Bytes from hex text with spaces: "a1 61 64".
func bytes(_ hex: String) -> [UInt8] {
    hex.split(separator: " ").map { UInt8($0, radix: 16)! }
}

@Suite struct CBOREncodingTests {
    /// cbor2 6.x wrote these for the same values.
    @Test(arguments: [
        (CBOR.unsigned(0), "00"), (.unsigned(23), "17"), (.unsigned(24), "18 18"), (.unsigned(255), "18 ff"),
        (.unsigned(256), "19 01 00"), (.unsigned(65535), "19 ff ff"), (.unsigned(65536), "1a 00 01 00 00"),
        (.unsigned(0xFFFF_FFFF), "1a ff ff ff ff"), (.unsigned(0x1_0000_0000), "1b 00 00 00 01 00 00 00 00"),
        (.unsigned(UInt64.max), "1b ff ff ff ff ff ff ff ff"),
        (.int(-1), "20"), (.int(-24), "37"), (.int(-25), "38 18"), (.negative(UInt64.max), "3b ff ff ff ff ff ff ff ff"),
        (.bool(false), "f4"), (.bool(true), "f5"), (.null, "f6"),
        (.bytes([]), "40"), (.bytes([1, 2]), "42 01 02"), (.text(""), "60"), (.text("hi"), "62 68 69"),
        (.text("é"), "62 c3 a9"), (.array([]), "80"), (.array([1, "a"]), "82 01 61 61"), (.map([:]), "a0"),
        (.float(1.0), "f9 3c 00"), (.float(1.5), "f9 3e 00"), (.float(65504), "f9 7b ff"), (.float(-0.0), "f9 80 00"),
        (.float(5.960464477539063e-08), "f9 00 01"), (.float(100000), "fa 47 c3 50 00"),
        (.float(1.1), "fb 3f f1 99 99 99 99 99 9a"), (.float(.nan), "f9 7e 00"), (.float(-.infinity), "f9 fc 00"),
        (.undefined, "f7"), (.simple(0), "e0"), (.simple(19), "f3"), (.simple(32), "f8 20"), (.simple(255), "f8 ff"),
    ])
    func itemsEncodeInTheShortestForm(item: CBOR, hex: String) throws {
        #expect(item.encoded == bytes(hex))
        #expect(try CBORDecoder.decode(bytes(hex)) == item)
    }

    @Test func lengthsTakeTheShortestHeadAtEveryBoundary() {
        for n in [0, 23, 24, 255, 256, 65535, 65536] {
            let encoded = CBOR.bytes(Array(repeating: 7, count: n)).encoded
            #expect(encoded.count == 1 + CBOREncoder.headExtraBytes(UInt64(n)) + n)
        }
        #expect(CBOREncoder.headExtraBytes(23) == 0)
        #expect(CBOREncoder.headExtraBytes(24) == 1)
        #expect(CBOREncoder.headExtraBytes(0x100) == 2)
        #expect(CBOREncoder.headExtraBytes(0x1_0000) == 4)
        #expect(CBOREncoder.headExtraBytes(0x1_0000_0000) == 8)
    }

    /// cbor2 `dumps({"aa": 1, "b": 2, 10: 3, -1: 4, 100: 5, b"x": 6, "a": 7, True: 8}, canonical=True)`.
    @Test func mapKeysSortByEncodedLengthThenBytewiseAsCbor2Canonical() {
        let map: CBOR = .map(["aa": 1, "b": 2, 10: 3, -1: 4, 100: 5, .bytes([0x78]): 6, "a": 7, true: 8])
        #expect(map.encoded == bytes("a8 0a 03 20 04 f5 08 18 64 05 41 78 06 61 61 07 61 62 02 62 61 61 01"))
    }

    @Test func smpFieldNamesSortAsSmpclientSendsThem() {
        let body: CBOR = ["upgrade": false, "image": 0, "data": .bytes([]), "sha": .bytes([]), "off": 0, "len": 1]
        let keys = CBOREncoder.canonicalOrder(body.map!).map { String(decoding: $0.encodedKey.dropFirst(), as: UTF8.self) }
        #expect(keys == ["len", "off", "sha", "data", "image", "upgrade"])
    }

    @Test func intConvenienceCoversBothSigns() {
        #expect(CBOR.int(Int64.min) == .negative(UInt64(Int64.max)))
        #expect(CBOR.int(Int64.min).int64 == Int64.min)
        #expect(CBOR.int(-1) == .negative(0))
        #expect(CBOR.int(UInt64.max) == .unsigned(UInt64.max))
        #expect(CBOR.unsigned(UInt64.max).int64 == nil)
        #expect(CBOR.negative(UInt64.max).int64 == nil)
        #expect(CBOR.negative(UInt64.max).description == "-18446744073709551616")
    }

    @Test func diagnosticNotationShowsMapsInCanonicalOrder() {
        let item: CBOR = ["off": 2392, "data": .bytes([0xAB, 0x01]), "ok": true, "n": nil, "a": [-2, "x"]]
        #expect(item.description == #"{"a": [-2, "x"], "n": null, "ok": true, "off": 2392, "data": h'ab01'}"#)
    }
}

@Suite struct CBORDecodingTests {
    @Test(arguments: [
        ("18 05", CBOR.unsigned(5)), ("19 00 05", .unsigned(5)), ("1a 00 00 00 05", .unsigned(5)),
        ("1b 00 00 00 00 00 00 00 05", .unsigned(5)), ("38 00", .int(-1)), ("59 00 01 aa", .bytes([0xAA])),
        ("79 00 01 61", .text("a")), ("98 01 00", .array([0])), ("b8 01 61 61 00", .map(["a": 0])),
    ])
    func longerThanNeededHeadsDecodeAndReencodeShortest(hex: String, item: CBOR) throws {
        let decoded = try CBORDecoder.decode(bytes(hex))
        #expect(decoded == item)
        #expect(decoded.encoded.count < bytes(hex).count)
    }

    @Test func mapsInAnyOrderDecodeToTheSameValue() throws {
        // Zephyr writes fields in source order: "slot" before "hash".
        let zephyrOrder = try CBORDecoder.decode(bytes("a2 64 73 6c 6f 74 01 64 68 61 73 68 41 aa"))
        #expect(zephyrOrder == ["hash": .bytes([0xAA]), "slot": 1])
        #expect(zephyrOrder.encoded == bytes("a2 64 68 61 73 68 41 aa 64 73 6c 6f 74 01"))
    }

    @Test func nestedItemsDecode() throws {
        let item = try CBORDecoder.decode(bytes("a1 61 61 82 a1 61 62 f6 80"))
        #expect(item == ["a": [["b": nil], []]])
        #expect(item["a"]?.array?.count == 2)
        #expect(item["missing"] == nil)
    }

    @Test(arguments: [
        ("", CBORError.Kind.truncated),
        ("18", .truncated), ("19 01", .truncated), ("1b 00 00 00 00 00 00 00", .truncated),
        ("42 01", .truncated), ("62 61", .truncated), ("82 01", .truncated), ("a1 61 61", .truncated),
        ("5b ff ff ff ff ff ff ff ff 00", .truncated), ("9b 00 00 00 01 00 00 00 00 00", .truncated),
        ("bb 7f ff ff ff ff ff ff ff 00 00", .truncated),
        ("9f", .truncated), ("9f 01", .truncated), ("bf", .truncated), ("bf 61 61", .truncated), ("bf 61 61 00", .truncated),
        ("5f", .truncated), ("5f 41", .truncated), ("5f 42 01", .truncated), ("7f 61 61", .truncated), ("c0", .truncated),
        ("d8", .truncated), ("f8", .truncated), ("f9 3c", .truncated), ("fa 3f 80 00", .truncated), ("fb 00", .truncated),
        ("00 00", .trailingBytes), ("a0 ff", .trailingBytes), ("9f ff 00", .trailingBytes), ("5f ff ff", .trailingBytes),
        ("1f", .indefiniteLength), ("3f", .indefiniteLength), ("df 00", .indefiniteLength), ("9f 3f ff", .indefiniteLength),
        ("ff", .unexpectedBreak), ("81 ff", .unexpectedBreak), ("a1 01 ff", .unexpectedBreak), ("a1 ff 01", .unexpectedBreak),
        ("bf 61 61 ff", .unexpectedBreak), ("bf 00 01 02 ff", .unexpectedBreak), ("c0 ff", .unexpectedBreak),
        ("5f 61 61 ff", .badChunk), ("7f 41 61 ff", .badChunk), ("5f 5f ff ff", .badChunk), ("7f 7f ff ff", .badChunk),
        ("5f 00 ff", .badChunk), ("7f c0 61 61 ff", .badChunk), ("5f 9f ff ff", .badChunk),
        ("1c", .reservedAdditionalInfo), ("5d", .reservedAdditionalInfo), ("9e", .reservedAdditionalInfo),
        ("fc", .reservedAdditionalInfo), ("fd", .reservedAdditionalInfo), ("fe", .reservedAdditionalInfo),
        ("dc 00", .reservedAdditionalInfo), ("5f 5c ff", .reservedAdditionalInfo),
        ("f8 00", .badSimpleValue), ("f8 14", .badSimpleValue), ("f8 17", .badSimpleValue), ("f8 1f", .badSimpleValue),
        ("61 ff", .invalidUTF8), ("62 c3 28", .invalidUTF8), ("63 ed a0 80", .invalidUTF8), ("61 80", .invalidUTF8),
        ("7f 61 61 61 ff ff", .invalidUTF8), ("7f 61 c3 61 a9 ff", .invalidUTF8),
        ("a2 61 61 00 61 61 01", .duplicateMapKey), ("a2 01 00 18 01 00", .duplicateMapKey),
        ("bf 61 61 00 61 61 01 ff", .duplicateMapKey), ("bf 61 61 00 7f 61 61 ff 01 ff", .duplicateMapKey),
        ("a2 01 00 c0 01 00", .duplicateMapKey), ("a2 f9 3c 00 00 fb 3f f0 00 00 00 00 00 00 01", .duplicateMapKey),
        ("a2 f9 7e 00 00 fa 7f c0 00 00 01", .duplicateMapKey), ("a2 80 00 9f ff 01", .duplicateMapKey),
    ])
    func malformedInputIsRefusedWithItsKind(hex: String, kind: CBORError.Kind) {
        let input = hex.isEmpty ? [] : bytes(hex)
        #expect(throws: CBORError.self) { try CBORDecoder.decode(input) }
        do {
            _ = try CBORDecoder.decode(input)
        } catch {
            #expect(error.kind == kind, "\(hex): \(error)")
            #expect(!error.description.isEmpty)
        }
    }

    @Test func errorsSayWhereAndWhat() {
        do {
            _ = try CBORDecoder.decode(bytes("a1 61 61 f8 10"))
            Issue.record("a two-byte simple value below 32 decoded")
        } catch {
            #expect(error.offset == 3)
            #expect(error.description.contains("two-byte"))
        }
        do {
            _ = try CBORDecoder.decode(bytes("bf 61 61 00 62 6f 6b ff"))
            Issue.record("a map without its last value decoded")
        } catch {
            #expect(error.offset == 7)
            #expect(error.description.contains("\"ok\" without its value"))
        }
        do {
            _ = try CBORDecoder.decode(bytes("5f 41 00 61 61 ff"))
            Issue.record("a text chunk in a byte string decoded")
        } catch {
            #expect(error.offset == 3)
            #expect(error.description.contains("not a definite-length byte string"))
        }
    }

    @Test func nestingDeeperThanTheLimitIsRefused() throws {
        let limits = CBORDecoder.Limits(maxDepth: 3)
        // Three arrays deep holding an integer: depth 3 is allowed.
        _ = try CBORDecoder.decode(bytes("81 81 81 00"), limits: limits)
        #expect(throws: CBORError(.tooDeep, at: 3, "CBOR nests deeper than 3 levels at offset 3")) {
            try CBORDecoder.decode(bytes("81 81 81 81 00"), limits: limits)
        }
        // The default bound stops a deep nest long before the stack would.
        let deep = [UInt8](repeating: 0x81, count: 10_000) + [0x00]
        #expect(throws: CBORError.self) { try CBORDecoder.decode(deep, limits: CBORDecoder.Limits(maxSize: 20_000)) }
        #expect(CBORDecoder.Limits.smp.maxDepth >= 3)
        // A caller's limit above 256 levels is held at 256, where recursion is still safe.
        let huge = CBORDecoder.Limits(maxDepth: 1_000_000, maxSize: 20_000)
        do {
            _ = try CBORDecoder.decode(deep, limits: huge)
            Issue.record("10,000 levels decoded")
        } catch {
            #expect(error.kind == .tooDeep)
            #expect(error.offset == 256)
        }
    }

    @Test func moreItemsThanTheLimitAreRefused() throws {
        let limits = CBORDecoder.Limits(maxItems: 4)
        _ = try CBORDecoder.decode(bytes("83 01 02 03"), limits: limits)
        do {
            _ = try CBORDecoder.decode(bytes("84 01 02 03 04"), limits: limits)
            Issue.record("five items decoded under a limit of four")
        } catch {
            #expect(error.kind == .tooManyItems)
        }
        // Map keys and values count.
        #expect(throws: CBORError.self) { try CBORDecoder.decode(bytes("a2 01 02 03 04"), limits: limits) }
    }

    @Test func inputOverTheSizeLimitIsRefusedBeforeParsing() throws {
        let limits = CBORDecoder.Limits(maxSize: 4)
        _ = try CBORDecoder.decode(bytes("43 01 02 03"), limits: limits)
        do {
            _ = try CBORDecoder.decode(bytes("44 01 02 03 04"), limits: limits)
            Issue.record("five bytes decoded under a limit of four")
        } catch {
            #expect(error.kind == .tooLarge)
            #expect(error.offset == 0)
        }
    }

    @Test func aForgedHugeCountFailsWithoutAllocating() {
        // An array claiming 2^32 elements in 6 bytes.
        do {
            _ = try CBORDecoder.decode(bytes("9a ff ff ff ff 00"))
            Issue.record("decoded")
        } catch {
            #expect(error.kind == .truncated)
        }
    }

    @Test func decodeThenEncodeIsTheIdentityOnCanonicalInput() throws {
        let samples: [CBOR] = [
            ["images": [["slot": 0, "version": "1.2.3", "hash": .bytes(Array(0..<32)), "active": true]]],
            [.int(-100), .unsigned(UInt64.max), .bytes(Array(repeating: 0, count: 300)), "ü", nil, false],
            ["err": ["group": 1, "rc": 9]],
        ]
        for item in samples {
            #expect(try CBORDecoder.decode(item.encoded).encoded == item.encoded)
        }
    }
}

/// Encodings a device may choose (RFC 8949) and this codec never writes: each decodes to the value
/// its canonical form has.
@Suite struct CBORLiberalDecodingTests {
    /// Indefinite-length maps and arrays, as tinycbor and zcbor write them.
    static let indefiniteContainers: [(String, CBOR)] = [
        ("bf 62 72 63 08 ff", ["rc": 8]), ("bf ff", [:]), ("9f ff", []), ("9f 01 02 ff", [1, 2]),
        ("bf 61 62 01 61 61 9f 00 ff ff", ["a": [0], "b": 1]), ("82 9f ff bf ff", [[], [:]]),
        ("9f 9f 9f ff ff bf 61 61 bf ff ff ff", [[[]], ["a": [:]]]), ("a1 9f 01 ff bf ff", [[1]: [:]]),
    ]
    /// Chunked strings; a chunk may be empty or take a longer head.
    static let chunkedStrings: [(String, CBOR)] = [
        ("5f ff", .bytes([])), ("5f 41 01 40 42 02 03 ff", .bytes([1, 2, 3])), ("5f 58 01 aa ff", .bytes([0xAA])),
        ("7f ff", ""), ("7f 61 61 60 62 c3 a9 ff", "aé"), ("7f 78 01 7a 64 f0 9f 98 80 ff", "z😀"),
        ("bf 7f 62 72 63 ff 08 ff", ["rc": 8]),
    ]
    /// Tags: the number is dropped, the content kept, wherever the item is.
    static let tagged: [(String, CBOR)] = [
        ("c0 61 61", "a"), ("c2 41 01", .bytes([1])), ("d8 20 60", ""), ("c1 c1 00", 0),
        ("db 00 00 00 00 00 00 00 05 00", 0), ("a1 c0 61 61 01", ["a": 1]), ("9f c0 01 ff", [1]),
        ("d9 d9 f7 bf 62 72 63 08 ff", ["rc": 8]),
    ]
    /// Floats of each precision, and simple values.
    static let floatsAndSimpleValues: [(String, CBOR)] = [
        ("f9 3c 00", .float(1)), ("fa 3f 80 00 00", .float(1)), ("fb 3f f0 00 00 00 00 00 00", .float(1)),
        ("f9 80 00", .float(-0.0)), ("f9 7c 00", .float(.infinity)), ("fa ff 80 00 00", .float(-.infinity)),
        ("f9 00 01", .float(0x1p-24)), ("fa 00 00 00 01", .float(0x1p-149)), ("f9 7b ff", .float(65504)),
        ("f7", .undefined), ("e0", .simple(0)), ("f3", .simple(19)), ("f8 20", .simple(32)), ("f8 ff", .simple(255)),
        ("a2 61 61 f7 61 62 f9 3c 00", .map(["a": .undefined, "b": .float(1)])),
    ]

    @Test(arguments: indefiniteContainers + chunkedStrings + tagged + floatsAndSimpleValues)
    func wellFormedEncodingsDecode(hex: String, item: CBOR) throws {
        #expect(try CBORDecoder.decode(bytes(hex)) == item)
    }

    @Test func floatsCompareByTheirBits() throws {
        #expect(CBOR.float(.nan) == .float(.nan))
        #expect(CBOR.float(0) != .float(-0.0))
        #expect(CBOR.float(1) != .int(1))
        // Keys 0.0 and -0.0 are two keys; NaN keys of two payloads too.
        let map = try CBORDecoder.decode(bytes("a4 f9 00 00 01 f9 80 00 02 f9 7e 00 03 f9 7e 01 04"))
        #expect(map.map?.count == 4)
        #expect(map.map?[.float(.nan)] == 3)
    }

    @Test func textComparesByItsBytesAsCBORDoes() throws {
        // "é" precomposed and "e" with a combining acute are equal Swift strings but two CBOR keys.
        let map = try CBORDecoder.decode(bytes("a2 62 c3 a9 01 63 65 cc 81 02"))
        #expect(map.map?.count == 2)
        #expect(CBOR.text("\u{E9}") != .text("e\u{301}"))
        #expect(Set<CBOR>([.text("\u{E9}"), .text("e\u{301}")]).count == 2)
    }

    /// Every half-precision value, NaN payloads and subnormals included, is its own shortest form.
    @Test func everyHalfFloatIsAFixedPoint() throws {
        for bits in 0...UInt16.max {
            let input: [UInt8] = [0xF9, UInt8(bits >> 8), UInt8(truncatingIfNeeded: bits)]
            let item = try CBORDecoder.decode(input)
            #expect(item.encoded == input, "\(input)")
            #expect(try CBORDecoder.decode(item.encoded) == item)
        }
    }

    @Test(arguments: [
        ("fa 3f c0 00 00", "f9 3e 00"), ("fb 3f f8 00 00 00 00 00 00", "f9 3e 00"), ("fb 40 f8 6a 00 00 00 00 00", "fa 47 c3 50 00"),
        ("fa 7f c0 00 00", "f9 7e 00"), ("fa 7f 80 00 01", "fa 7f 80 00 01"), ("fb 7f f0 00 00 00 00 00 01", "fb 7f f0 00 00 00 00 00 01"),
        ("fb 7f f8 00 00 00 00 00 00", "f9 7e 00"), ("fa 7f 80 20 00", "f9 7c 01"), ("fa 00 00 00 01", "fa 00 00 00 01"),
    ])
    func floatsReencodeInTheShortestPrecisionThatKeepsTheirBits(hex: String, shortest: String) throws {
        let item = try CBORDecoder.decode(bytes(hex))
        #expect(item.encoded == bytes(shortest))
        #expect(try CBORDecoder.decode(item.encoded) == item)
    }

    @Test func diagnosticNotationShowsFloatsAndSimpleValues() throws {
        let item = try CBORDecoder.decode(bytes("86 f9 3e 00 f9 7e 00 f9 fc 00 f7 f8 20 c0 fb 3f f1 99 99 99 99 99 9a"))
        #expect(item.description == "[1.5, NaN, -Infinity, undefined, simple(32), 1.1]")
        #expect(CBOR.undefined.kindName == "undefined")
        #expect(CBOR.float(1).kindName == "a floating-point number")
    }

    @Test func limitsHoldForIndefiniteItemsAndTags() throws {
        // Depth: indefinite arrays nest like definite ones.
        let depth3 = CBORDecoder.Limits(maxDepth: 3)
        _ = try CBORDecoder.decode(bytes("9f 9f 9f 00 ff ff ff"), limits: depth3)
        #expect(throws: CBORError.self) { try CBORDecoder.decode(bytes("9f 9f 9f 9f ff ff ff ff"), limits: depth3) }
        let deep = [UInt8](repeating: 0x9F, count: 10_000) + [UInt8](repeating: 0xFF, count: 10_000)
        do {
            _ = try CBORDecoder.decode(deep, limits: CBORDecoder.Limits(maxDepth: 1_000_000, maxItems: 1_000_000, maxSize: 30_000))
            Issue.record("10,000 indefinite levels decoded")
        } catch {
            #expect(error.kind == .tooDeep)
            #expect(error.offset == 256)
        }
        // Items: elements of an indefinite array, and tags, count.
        let four = CBORDecoder.Limits(maxItems: 4)
        _ = try CBORDecoder.decode(bytes("9f 01 02 03 ff"), limits: four)
        _ = try CBORDecoder.decode(bytes("c0 c0 c0 00"), limits: four)
        for hex in ["9f 01 02 03 04 ff", "c0 c0 c0 c0 00", "bf 01 02 03 04 ff"] {
            do {
                _ = try CBORDecoder.decode(bytes(hex), limits: four)
                Issue.record("\(hex) decoded under a limit of four items")
            } catch {
                #expect(error.kind == .tooManyItems, "\(hex)")
            }
        }
        // A long run of tags is a loop, not a recursion: it ends at the item limit, not the stack.
        let tags = [UInt8](repeating: 0xC0, count: 60_000) + [0x00]
        #expect(throws: CBORError.self) { try CBORDecoder.decode(tags) }
        _ = try CBORDecoder.decode(tags, limits: CBORDecoder.Limits(maxItems: 60_001, maxSize: 60_001))
        // String chunks are not items: 20,000 one-byte chunks make one byte string.
        let chunks = [0x5F] + Array([[UInt8]](repeating: [0x41, 0x07], count: 20_000).joined()) + [0xFF]
        #expect(try CBORDecoder.decode(chunks) == .bytes(Array(repeating: 7, count: 20_000)))
        // Size: the bound holds before anything is parsed.
        #expect(throws: CBORError.self) { try CBORDecoder.decode([0x9F] + Array(repeating: 0x00, count: 65_535) + [0xFF]) }
    }
}
