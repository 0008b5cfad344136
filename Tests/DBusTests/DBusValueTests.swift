import DBus
import TestSupport
import Testing

@Suite("DBusValue")
struct DBusValueTests {
    @Test func signatures() {
        #expect(DBusValue.bytes([1, 2]).signature == "ay")
        #expect(DBusValue.vardict(["a": .uint16(1)]).signature == "a{sv}")
        #expect(DBusValue.struct([.unixFD(3), .uint16(23)]).signature == "(hq)")
        #expect(DBusValue.array(elementSignature: "a{sv}", []).signature == "aa{sv}")
        #expect(DBusValue.dictionary(keySignature: "o", valueSignature: "a{sa{sv}}", [:]).signature == "a{oa{sa{sv}}}")
        #expect(DBusValue.variant(.string("x")).signature == "v")
    }

    @Test func accessorsLookThroughVariants() {
        let options = DBusValue.vardict([
            "type": .string("command"), "offset": .uint16(4), "value": .bytes([9, 8]),
        ])
        #expect(options["type"]?.string == "command")
        #expect(options["offset"]?.uint16 == 4)
        #expect(options["offset"]?.integer == 4)
        #expect(options["value"]?.bytes == [9, 8])
        #expect(options["missing"] == nil)
        #expect(options.vardict?["type"] == .string("command"))
        #expect(DBusValue.variant(.variant(.bool(true))).bool == true)
        #expect(DBusValue.strings(["a", "b"]).strings == ["a", "b"])
        #expect(DBusValue.objectPaths(["/a"]).strings == ["/a"])
        #expect(DBusValue.int32(1).string == nil)
    }

    @Test func validationHelpers() throws {
        try DBusValidation.objectPath("/org/bluez/hci0")
        try DBusValidation.interface("org.bluez.GattCharacteristic1")
        try DBusValidation.member("WriteValue")
        try DBusValidation.busName("org.bluez")
        try DBusValidation.busName(":1.42")
        try DBusValidation.errorName("org.bluez.Error.NotPermitted")
        try DBusValidation.signature("a{oa{sa{sv}}}")
        try DBusValidation.string("héllo")

        let invalid: [(String, () throws -> Void)] = [
            ("path", { try DBusValidation.objectPath("org/bluez") }),
            ("path trailing slash", { try DBusValidation.objectPath("/org/") }),
            ("path NUL", { try DBusValidation.objectPath("/a\0b") }),
            ("interface", { try DBusValidation.interface("nodots") }),
            ("member", { try DBusValidation.member("Write.Value") }),
            ("bus name", { try DBusValidation.busName("org..bluez") }),
            ("error name", { try DBusValidation.errorName("NotAnError") }),
            ("signature", { try DBusValidation.signature("a{") }),
            ("single type", { try DBusValidation.singleCompleteType("ss") }),
            ("string", { try DBusValidation.string("a\0b") }),
        ]
        for (kind, check) in invalid {
            #expect(throws: DBusError.self, "\(kind)") { try check() }
            do {
                try check()
            } catch let error as DBusError {
                #expect(error.isInvalidArgument, "\(kind): \(error)")
            } catch {
                Issue.record("\(kind): unexpected \(error)")
            }
        }
    }
}
