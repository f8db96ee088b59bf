import ThreadwireServer

/// This instance's requests by method, read back from the text the metrics
/// registry exports (what /metrics serves): the request counters summed over
/// status codes, and the 99th percentile from the latency histogram's
/// cumulative buckets. Read only when an operator asks (cluster/status), so
/// serving pays nothing for it.
enum RequestLoadReading {
    static func read(_ exposition: String) -> [RequestLoad] {
        var requests: [String: UInt64] = [:]
        var buckets: [String: [(bound: Double, count: Double)]] = [:]
        for line in exposition.split(separator: "\n") where !line.hasPrefix("#") {
            if line.hasPrefix("threadwire_requests_total{") {
                guard let method = label("method", in: line), let value = sample(line) else { continue }
                requests[method, default: 0] += UInt64(max(0, value))
            } else if line.hasPrefix("threadwire_request_duration_seconds_bucket{") {
                guard let method = label("method", in: line), let le = label("le", in: line), let value = sample(line) else { continue }
                buckets[method, default: []].append((le == "+Inf" ? .infinity : Double(le) ?? .infinity, value))
            }
        }
        return requests.keys.sorted().map { method in
            RequestLoad(method: method, requests: requests[method] ?? 0, p99Ms: p99(buckets[method] ?? []))
        }
    }

    /// The upper bound (ms) of the first cumulative bucket holding 99 % of
    /// the observations; nil with none, or when only +Inf does.
    static func p99(_ buckets: [(bound: Double, count: Double)]) -> Double? {
        let sorted = buckets.sorted { $0.bound < $1.bound }
        guard let total = sorted.last?.count, total > 0 else { return nil }
        guard let bucket = sorted.first(where: { $0.count >= 0.99 * total }), bucket.bound.isFinite else { return nil }
        return bucket.bound * 1000
    }

    private static func label(_ name: String, in line: Substring) -> String? {
        guard let start = line.range(of: "\(name)=\"") else { return nil }
        let rest = line[start.upperBound...]
        guard let end = rest.firstIndex(of: "\"") else { return nil }
        return String(rest[..<end])
    }

    private static func sample(_ line: Substring) -> Double? {
        guard let space = line.lastIndex(of: " ") else { return nil }
        return Double(line[line.index(after: space)...])
    }
}
