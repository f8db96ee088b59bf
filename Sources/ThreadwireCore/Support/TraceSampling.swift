public import Tracing
import Synchronization

/// Which requests' traces are recorded: the OpenTelemetry samplers by their
/// standard names (`OTEL_TRACES_SAMPLER`). threadwire decides before it asks
/// the tracer for a span (head sampling), because swift-otel creates a trace
/// id from the system's random source under a lock for every span it is
/// asked for, even one its sampler then drops: an unsampled request costs a
/// fast id and a parse here instead.
public struct TraceSampling: Sendable, Equatable, CustomStringConvertible {
    /// Probability of recording a trace this instance starts (and, when not
    /// `followsParent`, one a caller started).
    public var ratio: Double
    /// A caller's trace is recorded exactly when the caller recorded it.
    public var followsParent: Bool

    public init(ratio: Double, followsParent: Bool = true) {
        self.ratio = min(1, max(0, ratio.isNaN ? 1 : ratio))
        self.followsParent = followsParent
    }

    public static let parentBasedAlwaysOn = TraceSampling(ratio: 1)

    /// A sampler by its OpenTelemetry name and argument, or why not.
    public static func named(_ name: String, argument: String?) -> Result<TraceSampling, SamplerError> {
        let name = trimmed(name).lowercased()
        func ratio() -> Result<Double, SamplerError> {
            guard let argument else { return .success(1) }
            guard let value = Double(trimmed(argument)), value >= 0, value <= 1 else {
                return .failure(SamplerError(description: "OTEL_TRACES_SAMPLER_ARG must be a ratio from 0 to 1 (got \"\(argument)\")"))
            }
            return .success(value)
        }
        switch name {
        case "always_on": return .success(TraceSampling(ratio: 1, followsParent: false))
        case "always_off": return .success(TraceSampling(ratio: 0, followsParent: false))
        case "traceidratio": return ratio().map { TraceSampling(ratio: $0, followsParent: false) }
        case "parentbased_always_on": return .success(TraceSampling(ratio: 1))
        case "parentbased_always_off": return .success(TraceSampling(ratio: 0))
        case "parentbased_traceidratio": return ratio().map { TraceSampling(ratio: $0) }
        default:
            return .failure(SamplerError(description: "OTEL_TRACES_SAMPLER \"\(name)\" is not supported (always_on, always_off, traceidratio, parentbased_always_on, parentbased_always_off, parentbased_traceidratio)"))
        }
    }

    private static func trimmed(_ text: String) -> String {
        String(text.drop(while: \.isWhitespace).reversed().drop(while: \.isWhitespace).reversed())
    }

    public struct SamplerError: Error, Sendable, Equatable, CustomStringConvertible {
        public let description: String
    }

    public var description: String {
        switch (followsParent, ratio) {
        case (true, 1): "parentbased_always_on"
        case (true, 0): "parentbased_always_off"
        case (true, _): "parentbased_traceidratio \(ratio)"
        case (false, 1): "always_on"
        case (false, 0): "always_off"
        case (false, _): "traceidratio \(ratio)"
        }
    }

    /// For a trace this instance starts.
    func samplesRoot() -> Bool {
        if ratio >= 1 { return true }
        if ratio <= 0 { return false }
        return TraceIDs.next() < UInt64(ratio * Double(UInt64.max))
    }

    /// For a caller's trace: its flag, or (not following the parent) the
    /// trace id's low half against the ratio, as OpenTelemetry's
    /// TraceIdRatioBased computes it, so instances agree.
    func samples(caller: TraceParent) -> Bool {
        if followsParent { return caller.sampled }
        if ratio >= 1 { return true }
        if ratio <= 0 { return false }
        return caller.traceIDLow < UInt64(ratio * Double(UInt64.max))
    }
}

/// A parsed W3C `traceparent` (version 00 layout; later versions are read
/// by the same prefix, as the spec asks).
struct TraceParent: Equatable {
    /// 32 lowercase hex digits.
    var traceID: Substring
    var sampled: Bool
    /// The trace id's bytes 8…15, little-endian (swift-otel's ratio input).
    var traceIDLow: UInt64

    init?(_ header: String) {
        let utf8 = Array(header.utf8)
        guard utf8.count >= 55, utf8[2] == UInt8(ascii: "-"), utf8[35] == UInt8(ascii: "-"), utf8[52] == UInt8(ascii: "-"),
              utf8.count == 55 || (utf8.count > 55 && utf8[55] == UInt8(ascii: "-")),
              let version = Self.hexValue(utf8[0..<2]), version != 0xFF, !(version == 0 && utf8.count != 55),
              utf8[3..<35].allSatisfy(Self.isHex), utf8[36..<52].allSatisfy(Self.isHex),
              !utf8[3..<35].allSatisfy({ $0 == UInt8(ascii: "0") }), !utf8[36..<52].allSatisfy({ $0 == UInt8(ascii: "0") }),
              let flags = Self.hexValue(utf8[53..<55])
        else { return nil }
        let start = header.utf8.index(header.utf8.startIndex, offsetBy: 3)
        traceID = header[start..<header.utf8.index(start, offsetBy: 32)]
        sampled = flags & 1 == 1
        var low: UInt64 = 0
        for byte in stride(from: 15, through: 8, by: -1) {
            low = low << 8 | UInt64(Self.hexValue(utf8[(3 + 2 * byte)..<(5 + 2 * byte)])!)
        }
        traceIDLow = low
    }

    private static func isHex(_ c: UInt8) -> Bool {
        (c >= UInt8(ascii: "0") && c <= UInt8(ascii: "9")) || (c >= UInt8(ascii: "a") && c <= UInt8(ascii: "f"))
    }

    private static func hexValue(_ pair: ArraySlice<UInt8>) -> UInt8? {
        var value: UInt8 = 0
        for c in pair {
            guard isHex(c) else { return nil }
            value = value << 4 | (c <= UInt8(ascii: "9") ? c - UInt8(ascii: "0") : c - UInt8(ascii: "a") + 10)
        }
        return value
    }
}

/// Ids for traces that are not recorded: they still need a trace id (logs,
/// notifications and relayed requests carry it) but not the system's random
/// source under a lock. SplitMix64 over one atomic counter, seeded from the
/// system once: lock-free and unique per draw.
enum TraceIDs {
    private static let state = Atomic<UInt64>(UInt64.random(in: .min ... .max))

    static func next() -> UInt64 {
        let (_, new) = state.wrappingAdd(0x9E37_79B9_7F4A_7C15, ordering: .relaxed)
        var z = new
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }

    /// `00-<trace id>-<new span id>-00`, the trace id new unless given.
    static func unsampledTraceparent(traceID: Substring? = nil) -> String {
        var text = "00-"
        text.reserveCapacity(55)
        if let traceID { text += traceID } else {
            var high = next(), low = next()
            if high == 0 && low == 0 { high = 1 }
            text += hex(high); text += hex(low)
        }
        var span = next()
        if span == 0 { span = 1 }
        text += "-"; text += hex(span); text += "-00"
        return text
    }

    private static let digits = Array("0123456789abcdef".utf8)

    private static func hex(_ value: UInt64) -> String {
        String(unsafeUninitializedCapacity: 16) { buffer in
            for i in 0..<16 { buffer[i] = digits[Int((value >> (60 - 4 * UInt64(i))) & 0xF)] }
            return 16
        }
    }
}

/// Whether the trace of a context is recorded, as decided by threadwire
/// when the trace reached it (absent: nothing decided yet, a root).
enum TraceDecisionKey: ServiceContextKey {
    typealias Value = Bool
    static let nameOverride: String? = "threadwire.trace.sampled"
}
