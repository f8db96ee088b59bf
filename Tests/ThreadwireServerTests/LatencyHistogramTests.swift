import Prometheus
import Testing
@testable import ThreadwireServer

/// The request latency histograms the server keeps itself, which /metrics
/// and cluster/status read as if the registry had made them.
@Suite("request latency histograms")
struct LatencyHistogramTests {
    /// Bounds included (`le`), one past a bound in the next bucket, past the last in +Inf.
    static let observations: [Duration] = [
        .zero, .microseconds(50), .microseconds(100), .nanoseconds(100_001), .microseconds(900), .milliseconds(3),
        .milliseconds(250), .seconds(10), .seconds(11), .nanoseconds(107_762),
    ]

    @Test("its text is line for line what swift-prometheus writes for the same observations and bounds")
    func sameTextAsTheRegistry() {
        let registry = PrometheusCollectorRegistry()
        let theirs = registry.makeDurationHistogram(name: "threadwire_request_duration_seconds", labels: [("method", "health/check")],
                                                    buckets: LatencyHistogram.bounds.map { .nanoseconds($0) })
        let ours = LatencyHistogram()
        for duration in Self.observations {
            theirs.record(duration)
            ours.record(duration)
        }
        let expected = String(decoding: registry.emitToBuffer(), as: UTF8.self)
        let written = "# TYPE threadwire_request_duration_seconds histogram\n"
            + LatencyHistogram.lines(name: "threadwire_request_duration_seconds", labels: #"method="health/check""#, ours.snapshot())
        #expect(written == expected)
    }

    @Test("each observation lands in the first bucket whose bound it does not pass")
    func buckets() {
        let histogram = LatencyHistogram()
        for duration in Self.observations { histogram.record(duration) }
        let snapshot = histogram.snapshot()
        // 100 µs: 0, 50 µs, 100 µs; 250 µs: 100.001 µs, 107.762 µs; 1 ms: 900 µs; 5 ms: 3 ms; 250 ms; 10 s; +Inf: 11 s.
        #expect(snapshot.counts == [3, 2, 0, 1, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 1])
        #expect(snapshot.count == UInt64(Self.observations.count))
        #expect(snapshot.sumNanoseconds == 21_254_257_763)
    }

    @Test("seconds are written as the registry writes bounds and sums")
    func seconds() {
        #expect(LatencyHistogram.seconds(100_000) == "0.0001")
        #expect(LatencyHistogram.seconds(2_500_000_000) == "2.5")
        #expect(LatencyHistogram.seconds(10_000_000_000) == "10.0")
        #expect(LatencyHistogram.seconds(107_762) == "0.000107762")
        #expect(LatencyHistogram.seconds(0) == "0.0")
    }

    @Test("the server's exposition lists only methods that were called, with escaped labels, and counts concurrent recorders exactly")
    func exposition() async {
        let metrics = ServerMetrics()
        #expect(metrics.requestLatencyExposition() == "", "nothing before the first request")
        await withTaskGroup(of: Void.self) { group in
            for _ in 0..<8 {
                group.addTask {
                    for _ in 0..<1000 { metrics.request(method: "health/check", code: .ok, duration: .microseconds(20)) }
                }
            }
        }
        metrics.request(method: "weird\"name\\", code: .unimplemented, duration: .milliseconds(1))
        let text = metrics.requestLatencyExposition()
        #expect(text.hasPrefix("# TYPE threadwire_request_duration_seconds histogram\n"))
        #expect(text.contains(#"threadwire_request_duration_seconds_count{method="health/check"} 8000"#))
        #expect(text.contains(#"threadwire_request_duration_seconds_bucket{method="health/check",le="0.0001"} 8000"#))
        #expect(text.contains(#"threadwire_request_duration_seconds_count{method="weird\"name\\"} 1"#))
        #expect(!text.contains(#"method="thread/read""#), "a method never called is not listed")
    }
}
