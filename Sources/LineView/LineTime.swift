import Foundation

/// Ledger timestamps (`2026-11-26T13:21:04.123Z`, UTC) as seconds since 1970, and back, without a
/// date formatter per row: a shift of 10,000 devices is read in one pass.
enum LineTime {
    /// Seconds since 1970 of a ledger timestamp (`YYYY-MM-DDTHH:MM:SS[.fff]Z`); nil when it is not one.
    static func seconds(_ text: String) -> Double? {
        let b = Array(text.utf8)
        guard b.count >= 19, b[4] == 45, b[7] == 45, b[10] == 84, b[13] == 58, b[16] == 58 else { return nil }
        func number(_ range: Range<Int>) -> Int? {
            var n = 0
            for i in range {
                guard (48...57).contains(b[i]) else { return nil }
                n = n * 10 + Int(b[i] - 48)
            }
            return n
        }
        guard let year = number(0..<4), let month = number(5..<7), let day = number(8..<10), let hour = number(11..<13),
              let minute = number(14..<16), let second = number(17..<19), (1...12).contains(month), (1...31).contains(day) else { return nil }
        var fraction = 0.0
        if b.count > 20, b[19] == 46 {
            var scale = 0.1
            for i in 20..<b.count where (48...57).contains(b[i]) {
                fraction += Double(b[i] - 48) * scale
                scale /= 10
            }
        }
        return Double(days(year: year, month: month, day: day) * 86_400 + hour * 3600 + minute * 60 + second) + fraction
    }

    /// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's days_from_civil).
    static func days(year: Int, month: Int, day: Int) -> Int {
        let y = month <= 2 ? year - 1 : year
        let era = (y >= 0 ? y : y - 399) / 400
        let yoe = y - era * 400
        let doy = (153 * (month + (month > 2 ? -3 : 9)) + 2) / 5 + day - 1
        let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy
        return era * 146_097 + doe - 719_468
    }

    /// `HH:MM` (UTC) of `seconds`, with the date (`MM-DD HH:MM`) when `withDate`.
    static func label(_ seconds: Double, withDate: Bool) -> String {
        let date = Date(timeIntervalSince1970: seconds)
        var utc = Calendar(identifier: .gregorian)
        utc.timeZone = TimeZone(identifier: "UTC")!
        let c = utc.dateComponents([.month, .day, .hour, .minute], from: date)
        let time = String(format: "%02d:%02d", c.hour ?? 0, c.minute ?? 0)
        return withDate ? String(format: "%02d-%02d ", c.month ?? 0, c.day ?? 0) + time : time
    }
}
