import Testing
@testable import ThreadwireCore

@Suite("head sampling of traces (pure)")
struct TraceSamplingTests {
    @Test("the OpenTelemetry sampler names map to a ratio and whether the caller's flag decides; bad names and arguments are refused with what was wrong")
    func names() throws {
        #expect(try TraceSampling.named("always_on", argument: nil).get() == TraceSampling(ratio: 1, followsParent: false))
        #expect(try TraceSampling.named("always_off", argument: nil).get() == TraceSampling(ratio: 0, followsParent: false))
        #expect(try TraceSampling.named(" TraceIdRatio ", argument: "0.25").get() == TraceSampling(ratio: 0.25, followsParent: false))
        #expect(try TraceSampling.named("parentbased_always_on", argument: nil).get() == TraceSampling(ratio: 1))
        #expect(try TraceSampling.named("parentbased_always_off", argument: nil).get() == TraceSampling(ratio: 0))
        #expect(try TraceSampling.named("parentbased_traceidratio", argument: "0.1").get() == TraceSampling(ratio: 0.1))
        #expect(try TraceSampling.named("parentbased_traceidratio", argument: nil).get() == TraceSampling(ratio: 1), "no argument: 1.0, as the spec says")
        guard case let .failure(error) = TraceSampling.named("jaeger_remote", argument: nil) else { Issue.record("jaeger_remote accepted"); return }
        #expect(error.description.contains("jaeger_remote") && error.description.contains("not supported"))
        for bad in ["1.5", "-0.1", "half", "nan"] {
            guard case let .failure(error) = TraceSampling.named("traceidratio", argument: bad) else { Issue.record("\(bad) accepted"); continue }
            #expect(error.description.contains("from 0 to 1") && error.description.contains(bad))
        }
    }

    @Test("a traceparent is read only when it is valid W3C: version, lengths, lowercase hex, non-zero ids")
    func traceparentParsing() throws {
        let valid = try #require(TraceParent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"))
        #expect(valid.traceID == "4bf92f3577b34da6a3ce929d0e0e4736")
        #expect(valid.sampled)
        #expect(TraceParent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00")?.sampled == false)
        #expect(TraceParent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-03")?.sampled == true, "other flag bits do not hide the sampled bit")
        #expect(TraceParent("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-future") != nil, "a later version may carry more fields")
        for bad in [
            "", "garbage", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",  // version 00 has no more fields
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  // forbidden version
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",  // uppercase
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",  // zero trace id
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",  // zero span id
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",  // short trace id
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0g",
        ] {
            #expect(TraceParent(bad) == nil, "\(bad) is refused")
        }
    }

    @Test("not following the parent, a caller's trace is sampled by the low half of its trace id, as swift-otel's TraceIdRatioBased does, so every instance agrees")
    func ratioByTraceID() throws {
        // Bytes 8…15 of the id, little-endian: 0x00…01 at byte 8 is the value 1.
        let low = try #require(TraceParent("00-ffffffffffffffff0100000000000000-00f067aa0ba902b7-00"))
        #expect(low.traceIDLow == 1)
        let high = try #require(TraceParent("00-0000000000000001000000000000f0ff-00f067aa0ba902b7-01"))
        #expect(high.traceIDLow == 0xFFF0_0000_0000_0000)
        let half = TraceSampling(ratio: 0.5, followsParent: false)
        #expect(half.samples(caller: low), "a small value is under the ratio, whatever the flag")
        #expect(!half.samples(caller: high), "a large value is over it, whatever the flag")
        let follows = TraceSampling(ratio: 0)
        #expect(follows.samples(caller: high), "parent-based: the caller's flag decides")
        #expect(!follows.samples(caller: low))
    }

    @Test("roots are sampled at the ratio (once: not the ratio squared)")
    func rootRatio() {
        let sampling = TraceSampling(ratio: 0.25)
        let draws = 200_000
        let sampled = (0..<draws).count { _ in sampling.samplesRoot() }
        // 0.25 ± 1 % is more than 20 standard deviations wide; 0.0625 is far outside.
        #expect(abs(Double(sampled) / Double(draws) - 0.25) < 0.01, "\(sampled) of \(draws)")
        #expect((0..<1000).allSatisfy { _ in TraceSampling(ratio: 1).samplesRoot() })
        #expect((0..<1000).allSatisfy { _ in !TraceSampling(ratio: 0).samplesRoot() })
    }

    @Test("unrecorded traces get valid, distinct W3C ids flagged not sampled; a caller's trace id is kept")
    func unsampledIDs() throws {
        var traces = Set<Substring>()
        for _ in 0..<10_000 {
            let header = TraceIDs.unsampledTraceparent()
            let parsed = try #require(TraceParent(header), "\(header) is valid")
            #expect(!parsed.sampled)
            traces.insert(parsed.traceID)
        }
        #expect(traces.count == 10_000)
        let kept = TraceIDs.unsampledTraceparent(traceID: "4bf92f3577b34da6a3ce929d0e0e4736")
        #expect(kept.hasPrefix("00-4bf92f3577b34da6a3ce929d0e0e4736-") && kept.hasSuffix("-00"))
        #expect(TraceParent(kept) != nil)
    }
}
