/// An image file that cannot be used, in any format (a protocol's package, a signed image…):
/// why, the file, and what to do, in one line. Each format adds its own codes.
public struct ImageFileError: Error, Sendable, Hashable, CustomStringConvertible {
    /// Why, as an open set; each code says which failure class (and exit code) it reports as.
    public struct Code: Hashable, Sendable, CustomStringConvertible {
        public let rawValue: String
        /// The class `otaError` reports: `.image` (exit code 3) unless the code says otherwise.
        public let failure: OTAError.Code

        public init(_ rawValue: String, failure: OTAError.Code = .image) {
            self.rawValue = rawValue
            self.failure = failure
        }

        public static func == (a: Code, b: Code) -> Bool { a.rawValue == b.rawValue }
        public func hash(into hasher: inout Hasher) { hasher.combine(rawValue) }
        public var description: String { rawValue }

        /// The file cannot be read, or is another kind of file.
        public static let unreadable = Code("unreadable")
        /// A hash in the file does not match what it covers.
        public static let hashMismatch = Code("hash-mismatch")
    }

    public let code: Code
    public let path: String
    public let reason: String

    public init(_ code: Code, _ path: String, _ reason: String) {
        self.code = code
        self.path = path
        self.reason = reason
    }

    public var description: String { "\(path): \(reason)" }

    /// The failure the session reports, of the code's class.
    public var otaError: OTAError { OTAError(code.failure, description, cause: self) }
}
