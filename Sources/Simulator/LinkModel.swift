/// Timing of a BLE LE-ACL link, for the simulator and for the capacity figures of the benchmarks.
///
/// The model (docs/PERFORMANCE.md, "Link model"): a connection event opens every
/// `connectionInterval`. In an event, the central sends link-layer (LL) packets, each answered by
/// the peripheral after T_IFS = 150 µs, until the next packet pair would not fit before the next
/// event or `packetsPerEvent` is reached. A packet's air time is its bits over the PHY rate:
/// (preamble + access address 4 + header 2 + payload + CRC 3) bytes, preamble 1 byte on the 1M PHY
/// and 2 on the 2M PHY. An ATT PDU of `n` bytes travels as an L2CAP PDU of `n + 4` bytes, split
/// into LL payloads of at most 251 bytes (27 without Data Length Extension). A packet the
/// peripheral sends back (a notification, a write response) takes the place of an empty
/// acknowledgement and costs its extra air time.
public struct LinkModel: Sendable, Hashable, CustomStringConvertible {
    public enum PHY: String, Sendable, Hashable, CaseIterable {
        case le1M = "1M"
        case le2M = "2M"

        /// Microseconds per byte on air.
        var microsecondsPerByte: Double { self == .le1M ? 8 : 4 }
        var preambleBytes: Int { self == .le1M ? 1 : 2 }
    }

    /// Negotiated ATT MTU.
    public var mtu: Int
    public var phy: PHY
    public var connectionInterval: Duration
    /// Most LL packets the central sends in one connection event; nil when only time limits it.
    public var packetsPerEvent: Int?
    public var dataLengthExtension: Bool
    /// Write commands the central's stack (host and controller buffers) holds before `write` waits.
    /// At least one long event's worth, so the model never idles an event for want of data.
    public var txQueueDepth: Int
    /// Time from a link loss until the central hears of it.
    public var supervisionTimeout: Duration
    /// When false, nothing takes time: writes are delivered at once (for CPU measurements).
    public var timed: Bool

    public init(mtu: Int = 247, phy: PHY = .le2M, connectionInterval: Duration = .milliseconds(15),
                packetsPerEvent: Int? = nil, dataLengthExtension: Bool = true, txQueueDepth: Int = 64,
                supervisionTimeout: Duration = .milliseconds(420), timed: Bool = true) {
        self.mtu = mtu
        self.phy = phy
        self.connectionInterval = connectionInterval
        self.packetsPerEvent = packetsPerEvent
        self.dataLengthExtension = dataLengthExtension
        self.txQueueDepth = txQueueDepth
        self.supervisionTimeout = supervisionTimeout
        self.timed = timed
    }

    /// MTU 247, 2M PHY, 15 ms: a modern phone or Linux central talking to an nRF52-class device.
    public static let `default` = LinkModel()
    /// No timing at all: measures the CPU cost of the engine and the device logic.
    public static let unlimited = LinkModel(mtu: 517, timed: false)

    public static let tIFS: Double = 150

    /// Largest LL payload.
    public var maxLLPayload: Int { dataLengthExtension ? 251 : 27 }

    /// Air time of one LL packet with `payload` bytes, in microseconds.
    public func airTime(payload: Int) -> Double {
        Double(phy.preambleBytes + 4 + 2 + payload + 3) * phy.microsecondsPerByte
    }

    /// Central packet + T_IFS + empty peripheral packet + T_IFS, in microseconds.
    public func pairTime(payload: Int) -> Double {
        airTime(payload: payload) + Self.tIFS + airTime(payload: 0) + Self.tIFS
    }

    /// LL payload sizes for one ATT PDU of `attBytes` bytes (L2CAP adds a 4-byte header).
    public func fragments(attBytes: Int) -> [Int] {
        var left = attBytes + 4
        var out: [Int] = []
        while left > 0 {
            let n = min(left, maxLLPayload)
            out.append(n)
            left -= n
        }
        return out
    }

    /// The model's capacity in ATT-value bytes per second: back-to-back write commands of
    /// `mtu - 3` bytes, every byte counted as payload, nothing else on the link. No strategy can
    /// carry more image bytes than this on the same model.
    public var capacityBytesPerSecond: Double {
        let value = mtu - 3
        let frags = fragments(attBytes: value + 3)
        let ci = connectionInterval.seconds * 1e6
        // Fill many events greedily with an endless stream of fragments; a PDU may span events.
        var sentFragments = 0
        let events = 1000
        for _ in 0..<events {
            var used = 0.0
            var count = 0
            while true {
                let f = frags[sentFragments % frags.count]
                let t = pairTime(payload: f)
                if used + t > ci { break }
                if let limit = packetsPerEvent, count >= limit { break }
                used += t
                count += 1
                sentFragments += 1
            }
        }
        let pdus = Double(sentFragments) / Double(frags.count)
        return pdus * Double(value) / (Double(events) * ci / 1e6)
    }

    public var description: String {
        timed
            ? "MTU \(mtu), \(phy.rawValue) PHY, \(connectionInterval.seconds * 1000) ms interval"
                + (packetsPerEvent.map { ", \($0) packets/event" } ?? "")
            : "MTU \(mtu), untimed"
    }
}
