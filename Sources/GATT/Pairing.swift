/// What the central answers when the peer's pairing asks something of it.
///
/// The Security Manager picks the association model from both sides' IO capabilities (Core Spec
/// Vol 3, Part H, 2.3.5.1): with nothing set the central has no input and no output and pairs
/// Just Works; with a passkey it types that passkey (passkey entry); with `confirmsComparison` it
/// accepts a numeric comparison it cannot show to anyone.
public struct PairingCredentials: Sendable, Hashable {
    /// The six-digit passkey to enter (0–999999), when the device shows or expects one.
    public var passkey: UInt32?
    /// Accept a numeric comparison (LE Secure Connections) without a person comparing the numbers.
    public var confirmsComparison: Bool

    public init(passkey: UInt32? = nil, confirmsComparison: Bool = false) {
        self.passkey = passkey
        self.confirmsComparison = confirmsComparison
    }

    /// The largest passkey the Security Manager carries (six decimal digits).
    public static let maxPasskey: UInt32 = 999_999

    /// The passkey as it is shown: six digits with leading zeros.
    public static func text(_ passkey: UInt32) -> String {
        let digits = String(passkey)
        return String(repeating: "0", count: max(0, 6 - digits.count)) + digits
    }
}

/// A link that can pair and bond with its peer (BlueZ `Device1.Pair`, the simulator's model).
public protocol GATTPairing: Sendable {
    /// True when the central holds a bond with the peer.
    func isBonded() async throws(GATTError) -> Bool

    /// Pairs and bonds with the peer, answering its questions with `credentials`, within `timeout`.
    ///
    /// - Throws: `GATTError` `.authenticationFailed` when the peer rejected the pairing (a wrong
    ///   passkey, a refused comparison), `.timeout`, or a transport failure.
    func pair(_ credentials: PairingCredentials, timeout: Duration) async throws(GATTError)
}

/// A central that keeps bonds and can forget one (BlueZ `Adapter1.RemoveDevice`).
public protocol GATTBondStore: Sendable {
    /// Removes the bond with `address` (and its keys); no error when there is none.
    func removeBond(_ address: DeviceAddress) async throws(GATTError)
}

extension GATTError.Code {
    /// Pairing was rejected: a wrong passkey, a refused comparison, the peer cancelled.
    public static let authenticationFailed = GATTError.Code("authentication-failed")
}

extension GATTError {
    /// True when the peer refused an operation for want of pairing or encryption: BlueZ's
    /// `NotAuthorized`, or ATT insufficient authentication (0x05) / encryption (0x0F).
    public var wantsPairing: Bool {
        code == .notAuthorized || attError == .insufficientAuthentication || attError == .insufficientEncryption
    }
}

/// A pairing the central's Bluetooth stack started with a peer by itself, without the user
/// asking for one: the peer refused an attribute for want of security (ATT insufficient
/// authentication 0x05 or encryption 0x0F, Core Spec Vol 3, Part F, 3.4.1.1) and the stack raised
/// the link's security level to retry (BlueZ: src/shared/att.c, `change_security`; the kernel's
/// Security Manager then pairs).
///
/// Either it bonded (Just Works needs no answer from anyone: a bond the user never asked for), or
/// it asked the central's agent something nobody answered and was abandoned.
public struct StackPairing: Error, Sendable, Hashable, CustomStringConvertible {
    /// What the pairing asked the central for.
    public enum Question: String, Sendable, Hashable {
        /// A passkey to enter, or one to show (passkey entry): the device wants an authenticated bond.
        case passkey
        /// A numeric comparison to confirm: the device wants an authenticated bond.
        case confirmation
        /// Consent to a Just Works pairing.
        case authorization
    }

    /// The stack paired and bonded by itself (Just Works needs no answer; another agent may have
    /// answered the rest): a bond the user did not ask for, which must be removed.
    public var bonded: Bool
    /// What the stack asked the central's agent, which had nothing to give, so that pairing was
    /// abandoned; nil when it asked nothing.
    public var asked: Question?

    public init(bonded: Bool, asked: Question? = nil) {
        self.bonded = bonded
        self.asked = asked
    }

    /// True when the device asked for an authenticated (MITM-protected) pairing.
    public var wantsAuthentication: Bool { asked == .passkey || asked == .confirmation }

    /// Both what `self` and a later report of the same link say.
    public func merged(with later: StackPairing) -> StackPairing {
        StackPairing(bonded: bonded || later.bonded, asked: later.asked ?? asked)
    }

    public var description: String {
        let asking = switch asked {
        case .passkey?: "asked for a passkey, which nobody gave"
        case .confirmation?: "asked to confirm a numeric comparison, which nobody did"
        case .authorization?: "asked to authorize Just Works pairing, which nobody did"
        case nil: "was abandoned"
        }
        return bonded ? "the Bluetooth stack paired with it by itself" + (asked == nil ? "" : ", then pairing again " + asking)
            : "the Bluetooth stack started pairing by itself and it " + asking
    }
}

/// What a peripheral requires of the link before it serves its characteristics (BlueZ's GATT
/// flags `encrypt-write`/`encrypt-read` and `encrypt-authenticated-*`, doc/org.bluez.GattCharacteristic.rst).
public enum LinkSecurity: String, Sendable, Hashable, CaseIterable, Comparable {
    /// An unencrypted link will do.
    case none
    /// An encrypted link: any bond, Just Works included.
    case encrypt
    /// An encrypted link with an authenticated (MITM-protected) key: passkey entry or numeric comparison.
    case authenticate

    private var rank: Int { Self.allCases.firstIndex(of: self) ?? 0 }
    public static func < (a: LinkSecurity, b: LinkSecurity) -> Bool { a.rank < b.rank }
}
