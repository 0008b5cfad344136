import OTACommandLine

/// The texts that list every protocol, each built from the protocols' registrations
/// (`ProtocolCommandLine.texts`), so that a protocol registered is in every one of them. Each takes
/// the protocols to list (the command line's: `ProtocolCommandLine.all`).
enum ProtocolTexts {
    /// `flash`'s description of the image: what each protocol sends, over what, to which devices.
    static func flashImage(_ protocols: [ProtocolCommandLine]) -> String {
        "The image is " + list(protocols.map { "\($0.texts.images), sent over \($0.texts.title) (\($0.name)) to \($0.texts.devices)" }) + "."
    }

    /// `flash`'s description but its last sentence: the images, how `auto` picks, each protocol's
    /// note, how each device checks an image, and which transfers resume.
    static func flashDescription(_ protocols: [ProtocolCommandLine]) -> String {
        let checks = protocols.map { "the \($0.device) \($0.profile.imageCheck)" }.joined(separator: "; ")
        let restarting = protocols.filter { !$0.profile.resumesTransfer }.map(\.name)
        let resumes = "A transfer that stops (link loss, Ctrl-C) resumes where it stopped when the same command runs again"
            + (restarting.isEmpty ? "." : " (\(restarting.joined(separator: ", ")): reset the device first, and the whole image goes again).")
        return ([flashImage(protocols),
                 "--protocol auto picks from the file, checks it against the services the device exposes, and says what it picked."]
                + protocols.compactMap(\.texts.flashNote)
                + ["Nothing is activated before the device checked the whole image: \(checks).", resumes, ""]).joined(separator: " ")
    }

    /// `flash`'s image argument.
    static func imageArgument(_ protocols: [ProtocolCommandLine]) -> String {
        "Firmware image: " + list(protocols.map { "\($0.texts.images) for \($0.texts.devices)" }) + "."
    }

    /// `flash --protocol`.
    static func protocolOption(_ protocols: [ProtocolCommandLine]) -> String {
        "The update protocol: auto (the default) picks it from the image ("
            + protocols.map { "\($0.texts.images): \($0.name)" }.joined(separator: "; ")
            + ") and checks it against the services the device exposes."
    }

    /// `otaflash --help`'s IMAGE section, as one line to wrap.
    static func rootImage(_ protocols: [ProtocolCommandLine]) -> String {
        protocols.map { "\($0.texts.images): \($0.texts.title) (\($0.name))" }.joined(separator: "; ") + "."
    }

    /// The file endings a shell offers for `flash`'s image, each once.
    static func imageExtensions(_ protocols: [ProtocolCommandLine]) -> [String] {
        protocols.flatMap(\.texts.extensions).reduce(into: []) { if !$0.contains($1) { $0.append($1) } }
    }

    /// `scan --ota-only`.
    static func otaOnly(_ protocols: [ProtocolCommandLine]) -> String {
        "Only devices that speak a protocol otaflash updates over (" + protocols.map(\.texts.title).joined(separator: ", ")
            + "); those whose advertisement names no service are counted, not listed (see --probe)."
    }

    /// The help of `option`, which only some protocols take: "native, smp: " and `text`.
    static func owned(_ option: String, _ text: String, _ protocols: [ProtocolCommandLine]) -> String {
        protocols.filter { $0.takes.contains(option) }.map(\.name).joined(separator: ", ") + ": " + text
    }

    /// `--sim-firmware-version` (`flash --simulator`'s and `simulate`'s).
    static func simFirmwareVersion(_ protocols: [ProtocolCommandLine]) -> String {
        owned("--sim-firmware-version", "the firmware version the device runs before an update (default 1.0.0).", protocols)
    }

    /// `flash --no-activate`.
    static func noActivate(_ protocols: [ProtocolCommandLine]) -> String {
        owned("--no-activate", "stop after the device verified the image; do not activate it.", protocols)
    }

    /// `flash --restart`.
    static func restart(_ protocols: [ProtocolCommandLine]) -> String {
        owned("--restart", "ignore any partial transfer the device holds and send the whole image.", protocols)
    }

    /// `--sim-slot-size` (`flash --simulator`'s and `simulate`'s), before its range.
    static func simSlotSize(_ protocols: [ProtocolCommandLine], default value: Int? = nil) -> String {
        let slots = protocols.compactMap { registration in registration.texts.slot.map { "\(registration.name): \($0)" } }
        return "Bytes the device's image slot holds (" + (slots + (value.map { ["default \($0)"] } ?? [])).joined(separator: "; ") + ")"
    }

    /// `simulate --name`: each protocol's served device's own name.
    static func servedName(_ protocols: [ProtocolCommandLine]) -> String {
        "Name to advertise; by default, " + protocols.map { "\($0.name): \($0.texts.servedName)" }.joined(separator: "; ") + "."
    }

    /// `otaflash help simulator`'s simulated devices, one a protocol.
    static func simulatedDevices(_ protocols: [ProtocolCommandLine]) -> String {
        list(protocols.map { "the \($0.device) for \($0.texts.images)" }) + "."
    }

    /// `simulate`'s paragraphs on the devices it serves, one a protocol, the first the default.
    static func served(_ protocols: [ProtocolCommandLine]) -> String {
        protocols.enumerated().map { index, registration in
            "--protocol \(registration.name)" + (index == 0 ? " (the default) " : " ") + registration.texts.served
        }.joined(separator: "\n\n")
    }

    /// Where the images that carry their version carry it, for `--skip-if-version image`:
    /// "an MCUboot image's header or …".
    static func imageVersions(_ protocols: [ProtocolCommandLine]) -> String {
        let carriers = protocols.compactMap(\.texts.imageVersion)
        guard carriers.count > 1, let last = carriers.last else { return carriers.first ?? "no image" }
        return carriers.dropLast().joined(separator: ", ") + " or " + last
    }

    /// `--skip-if-version`.
    static func skipIfVersion(_ protocols: [ProtocolCommandLine]) -> String {
        "Leave devices that already report this firmware version alone; 'image' for the version the image carries (in "
            + imageVersions(protocols) + ")."
    }

    /// "a; b; or c": the items hold commas of their own.
    static func list(_ items: [String]) -> String {
        guard items.count > 1, let last = items.last else { return items.first ?? "" }
        return items.dropLast().joined(separator: "; ") + "; or " + last
    }
}
