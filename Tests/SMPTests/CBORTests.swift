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
        ("00 00", .trailingBytes), ("a0 ff", .trailingBytes),
        ("5f 41 00 ff", .indefiniteLength), ("7f ff", .indefiniteLength), ("9f ff", .indefiniteLength),
        ("bf ff", .indefiniteLength), ("ff", .indefiniteLength), ("1f", .indefiniteLength), ("3f", .indefiniteLength),
        ("1c", .reservedAdditionalInfo), ("5d", .reservedAdditionalInfo), ("9e", .reservedAdditionalInfo),
        ("fc", .reservedAdditionalInfo),
        ("f9 3c 00", .float), ("fa 3f 80 00 00", .float), ("fb 3f f0 00 00 00 00 00 00", .float),
        ("c0 60", .tag), ("d8 20 60", .tag), ("c2 41 01", .tag),
        ("f7", .unsupportedSimpleValue), ("f0", .unsupportedSimpleValue), ("f8 20", .unsupportedSimpleValue),
        ("e0", .unsupportedSimpleValue),
        ("61 ff", .invalidUTF8), ("62 c3 28", .invalidUTF8), ("63 ed a0 80", .invalidUTF8), ("61 80", .invalidUTF8),
        ("a2 61 61 00 61 61 01", .duplicateMapKey), ("a2 01 00 18 01 00", .duplicateMapKey),
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
            _ = try CBORDecoder.decode(bytes("a1 61 61 f9 3c 00"))
            Issue.record("a float decoded")
        } catch {
            #expect(error.offset == 3)
            #expect(error.description.contains("floating-point"))
        }
        do {
            _ = try CBORDecoder.decode(bytes("a1 61 61 f7"))
            Issue.record("undefined decoded")
        } catch {
            #expect(error.description.contains("undefined"))
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
