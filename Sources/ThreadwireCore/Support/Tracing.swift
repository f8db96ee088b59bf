public import Tracing
import Synchronization

/// Spans of the domain (model calls, tool calls) through the
/// swift-distributed-tracing API. Off unless the executable installs a
/// tracer and calls `enable(_:)`: then every span costs one load.
public enum ThreadTracing {
    private static let on = Atomic<Bool>(false)
    /// Written once by `enable(_:)` before `on` is set (release), read only
    /// after `on` was seen set (acquire). Kept here because the global
    /// `startSpan` looks the tracer up under a lock with dynamic casts on
    /// every call.
    nonisolated(unsafe) private static var installed: (any Tracer)?
    /// Written with `installed`.
    nonisolated(unsafe) private static var sampling = TraceSampling.parentBasedAlwaysOn

    public static var enabled: Bool { on.load(ordering: .acquiring) }

    /// Once, at startup, with the tracer just given to
    /// `InstrumentationSystem.bootstrap`. The tracer must record every span
    /// it is asked for: `sampling` decides before it is asked.
    public static func enable(_ tracer: any Tracer, sampling: TraceSampling = .parentBasedAlwaysOn) {
        installed = tracer
        Self.sampling = sampling
        on.store(true, ordering: .releasing)
    }

    /// A span from the installed tracer (tracing on), else from the global
    /// one. A context without a decision starts a trace, recorded or not as
    /// the sampling says; an unrecorded trace gets fast ids and a span that
    /// records nothing, and its children are that same span.
    public static func startSpan(_ name: String, context: ServiceContext, ofKind kind: SpanKind) -> any Span {
        guard enabled, let tracer = installed else { return Tracing.startSpan(name, context: context, ofKind: kind) }
        switch context[TraceDecisionKey.self] {
        case true?:
            return tracer.startSpan(name, context: context, ofKind: kind)
        case false?:
            return NoOpTracer.NoOpSpan(context: context)
        case nil:
            guard sampling.samplesRoot() else {
                return unsampled(tracer, TraceCarrier(traceparent: TraceIDs.unsampledTraceparent()), in: context)
            }
            var root = context
            root[TraceDecisionKey.self] = true
            return tracer.startSpan(name, context: root, ofKind: kind)
        }
    }

    /// A request's span: it continues the caller's trace when `caller`
    /// holds a valid W3C traceparent (recorded as the sampling says of the
    /// caller's), else it starts one.
    public static func startSpan(_ name: String, continuing caller: TraceCarrier, ofKind kind: SpanKind) -> any Span {
        guard enabled, let tracer = installed, let header = caller.traceparent, let parent = TraceParent(header) else {
            return startSpan(name, context: .topLevel, ofKind: kind)
        }
        guard sampling.samples(caller: parent) else {
            let carrier = TraceCarrier(traceparent: TraceIDs.unsampledTraceparent(traceID: parent.traceID), tracestate: caller.tracestate)
            return unsampled(tracer, carrier, in: .topLevel)
        }
        var context = ServiceContext.topLevel
        tracer.extract(caller, into: &context, using: TraceCarrier.Reader())
        context[TraceDecisionKey.self] = true
        return tracer.startSpan(name, context: context, ofKind: kind)
    }

    /// The tracer's own reading of `carrier` (so that logs, notifications
    /// and relayed requests carry it), marked as not recorded.
    private static func unsampled(_ tracer: any Tracer, _ carrier: TraceCarrier, in context: ServiceContext) -> any Span {
        var context = context
        tracer.extract(carrier, into: &context, using: TraceCarrier.Reader())
        context[TraceDecisionKey.self] = false
        return NoOpTracer.NoOpSpan(context: context)
    }

    /// `body` inside a span named `name` (a child of the task's current
    /// span), or with nil when tracing is off.
    /// `attributes` are set once at the start: each later `span.attributes[…] =`
    /// copies the span's whole attribute dictionary under its lock.
    public static func span<T: Sendable>(
        _ name: String, kind: SpanKind = .internal, attributes: @autoclosure () -> SpanAttributes = [:],
        _ body: (inout (any Span)?) async throws -> T
    ) async rethrows -> T {
        guard enabled else {
            var none: (any Span)?
            return try await body(&none)
        }
        let span = Self.startSpan(name, context: ServiceContext.current ?? .topLevel, ofKind: kind)
        if span.isRecording {
            let initial = attributes()
            if !initial.isEmpty { span.attributes = initial }
        }
        var active: (any Span)? = span
        do {
            let value = try await ServiceContext.withValue(span.context) { try await body(&active) }
            span.end()
            return value
        } catch {
            span.recordError(error)
            span.setStatus(SpanStatus(code: .error, message: "\(error)"))
            span.end()
            throw error
        }
    }

    /// The W3C trace context of the task's current span (for the
    /// notifications it causes); nil with tracing off or outside a span.
    public static func currentContext() -> TraceCarrier? {
        guard enabled, let context = ServiceContext.current else { return nil }
        return TraceCarrier(context)
    }
}

/// A W3C trace context as it travels in metadata.
public struct TraceCarrier: Sendable, Equatable {
    public var traceparent: String?
    public var tracestate: String?

    public init(traceparent: String? = nil, tracestate: String? = nil) {
        self.traceparent = traceparent
        self.tracestate = tracestate
    }

    /// The trace context of `context` (a span's), nil when it has none.
    public init?(_ context: ServiceContext) {
        var carrier = TraceCarrier()
        InstrumentationSystem.instrument.inject(context, into: &carrier, using: Writer())
        guard carrier.traceparent != nil else { return nil }
        self = carrier
    }

    /// The 16 hex digits of the span id inside `traceparent`.
    public var spanID: String? {
        guard let fields = traceparent?.split(separator: "-"), fields.count >= 3 else { return nil }
        return String(fields[2])
    }

    /// The 32 hex digits of the trace id inside `traceparent`.
    public var traceID: String? {
        guard let traceparent else { return nil }
        let fields = traceparent.split(separator: "-")
        return fields.count >= 2 ? String(fields[1]) : nil
    }

    /// The pairs as sent in metadata (traceparent, tracestate, trace_id).
    public var metadata: [(key: String, value: String)] {
        var pairs: [(key: String, value: String)] = []
        if let traceparent { pairs.append(("traceparent", traceparent)) }
        if let tracestate, !tracestate.isEmpty { pairs.append(("tracestate", tracestate)) }
        if let traceID { pairs.append(("trace_id", traceID)) }
        return pairs
    }

    public struct Reader: Extractor {
        public init() {}
        public func extract(key: String, from carrier: TraceCarrier) -> String? {
            switch key.lowercased() {
            case "traceparent": carrier.traceparent
            case "tracestate": carrier.tracestate
            default: nil
            }
        }
    }

    public struct Writer: Injector {
        public init() {}
        public func inject(_ value: String, forKey key: String, into carrier: inout TraceCarrier) {
            switch key.lowercased() {
            case "traceparent": carrier.traceparent = value
            case "tracestate": carrier.tracestate = value
            default: break
            }
        }
    }
}
