import GATT

/// The protocols otaflash speaks, by name, and the choice `--protocol auto` makes among them.
///
/// The command line registers every protocol it speaks (docs/ARCHITECTURE.md, "Adding a
/// protocol"); the session, batch, journal, events and exit codes need no change.
public struct ProtocolRegistry: Sendable {
    /// In order of preference: when several fit, `auto` picks the first.
    public let profiles: [any OTAProfile]

    public init(_ profiles: [any OTAProfile]) { self.profiles = profiles }

    /// The name that asks for a choice from the image and the device.
    public static let auto = "auto"

    /// The registered names, in order.
    public var names: [String] { profiles.map(\.name) }

    public func profile(named name: String) -> (any OTAProfile)? {
        profiles.first { $0.name == name }
    }

    /// A chosen profile and why, in one line for the user ("picked native: …").
    public struct Resolution: Sendable {
        public let profile: any OTAProfile
        public let reason: String
    }

    /// Chooses the profile for `name` (`auto` or a registered name).
    ///
    /// `auto` first keeps the protocols that send the image's format, then, when the device's
    /// services are known (advertised or discovered), the one whose service it exposes. A device
    /// that exposes another protocol's service instead contradicts the image and is refused; one
    /// that exposes no protocol's service keeps the image's choice (the profile's attach then
    /// names what is missing). A named protocol must send the image's format.
    ///
    /// - Parameters:
    ///   - format: what the image file is (nil: not known yet).
    ///   - services: the services the device advertises or exposes (nil: not known yet).
    /// - Throws: `OTAError` `.image` when no protocol sends the image, `.incompatibleDevice` when
    ///   the device exposes another protocol's service rather than a fitting one (or, with no
    ///   image, no protocol's service), `.internalError` for an unknown name
    ///   (the CLI checks names against `names` first).
    public func resolve(_ name: String, format: ImageFormat.Kind? = nil,
                        services: Set<BluetoothUUID>? = nil) throws(OTAError) -> Resolution {
        if name != Self.auto {
            guard let profile = profile(named: name) else {
                throw OTAError(.internalError, "unknown protocol '\(name)'; otaflash speaks \(([Self.auto] + names).joined(separator: ", "))")
            }
            if let format, !profile.imageFormats.contains(format) {
                throw OTAError(.image, "the \(name) protocol does not send \(format) images; it sends \(Self.list(profile.imageFormats))",
                               hint: profile.otherFormatHint ?? "use --protocol auto, or give an image of a kind \(name) sends")
            }
            return Resolution(profile: profile, reason: "using \(name): asked for with --protocol")
        }
        let byFormat = format.map { kind in profiles.filter { $0.imageFormats.contains(kind) } } ?? profiles
        guard let first = byFormat.first else {
            throw OTAError(.image, "no protocol otaflash speaks sends \(format.map { "\($0)" } ?? "this") image (it speaks \(names.joined(separator: ", ")))")
        }
        let why = format.map { byFormat.count == 1 ? "only \(first.name) sends \($0) images" : "the first protocol that sends \($0) images" }
        guard let services else {
            return Resolution(profile: first, reason: "picked \(first.name): \(why ?? "the first protocol registered")")
        }
        guard let exposed = byFormat.first(where: { services.contains($0.serviceUUID) }) else {
            let wanted = byFormat.map { "\($0.name) (\($0.serviceUUID))" }.joined(separator: ", ")
            // The device speaks another protocol otaflash knows: the image is the wrong kind for it.
            if let format, let other = profiles.first(where: { services.contains($0.serviceUUID) }) {
                throw OTAError(.incompatibleDevice,
                               "the device exposes \(other.serviceUUID) of \(other.name), none of the services of \(wanted), which send \(format) images",
                               hint: "give it an image \(other.name) sends (\(Self.list(other.imageFormats))), or check that it is the device you mean")
            }
            // No protocol's service at all: the image decides, and the profile's attach names
            // what the device lacks.
            guard format == nil else {
                return Resolution(profile: first, reason: "picked \(first.name): \(why ?? "the first protocol registered"); the device exposes no service of a protocol otaflash speaks")
            }
            throw OTAError(.incompatibleDevice, "the device exposes none of the services of \(wanted)",
                           hint: "is it running firmware that can be updated? name the protocol with --protocol to try anyway")
        }
        let because = why.map { "\($0); " } ?? ""
        return Resolution(profile: exposed, reason: "picked \(exposed.name): \(because)the device exposes \(exposed.serviceUUID)")
    }

    private static func list(_ kinds: Set<ImageFormat.Kind>) -> String {
        kinds.map(\.name).sorted().joined(separator: ", ")
    }
}
