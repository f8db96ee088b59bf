import Logging
import Tracing
import ThreadwireContract
import ThreadwireCore
import ThreadwireWire

/// The server span of each request (tracing on): a child of the caller's
/// W3C trace context when its metadata carries one, else a new trace.
enum RequestTracing {
    static func start(_ request: Wire.Request, spec: MethodSpec, params: Wire.Request.Params, connection: any CallSession) -> (any Span)? {
        guard ThreadTracing.enabled else { return nil }
        var caller = TraceCarrier()
        for pair in request.metadata {
            switch pair.key?.lowercased() {
            case "traceparent": caller.traceparent = caller.traceparent ?? pair.value
            case "tracestate": caller.tracestate = caller.tracestate ?? pair.value
            default: break
            }
        }
        let span = ThreadTracing.startSpan(spec.name, continuing: caller, ofKind: .server)
        guard span.isRecording else { return span }
        // Set at once: each `span.attributes[…] =` would copy the dictionary under the span's lock.
        var attributes: SpanAttributes = [
            "rpc.system": "threadwire", "rpc.method": .string(spec.name),
            "threadwire.connection.id": .int64(Int64(truncatingIfNeeded: connection.id)), "enduser.id": .string(connection.principal),
        ]
        if let id = request.id { attributes["threadwire.request.id"] = Int64(truncatingIfNeeded: id) }
        if let field = spec.thread, let thread = field.read(params) {
            attributes["threadwire.thread.id"] = thread
        }
        if connection.isPeer { attributes["threadwire.relayed"] = true }
        span.attributes = attributes
        return span
    }

    static func finish(_ admitted: AdmittedCall, code: StatusCode, message: String? = nil, logger: Logger) {
        // Most requests have neither a span nor a debug log: nothing to read for them.
        guard admitted.traced || logger.logLevel <= .debug else { return }
        finish(admitted.span, method: admitted.spec.name, id: admitted.request.id, thread: admitted.spec.thread?.read(admitted.params),
               code: code, message: message, received: admitted.received, logger: logger)
    }

    /// Ends the request's span with its status code, and logs the request
    /// at debug level (with the trace it belongs to).
    static func finish(_ span: (any Span)?, method: String, id: UInt64?, thread: String?, code: StatusCode, message: String?,
                       received: ContinuousClock.Instant, logger: Logger) {
        if logger.logLevel <= .debug {
            let elapsed = ContinuousClock.now - received
            let micros = elapsed.components.seconds * 1_000_000 + elapsed.components.attoseconds / 1_000_000_000_000
            var metadata: Logger.Metadata = [
                "tw.request.id": "\(id ?? 0)", "tw.method": "\(method)", "tw.code": "\(code.rawValue)", "tw.duration_us": "\(micros)",
            ]
            if let thread { metadata["tw.thread.id"] = "\(thread)" }
            if let message, code != .ok { metadata["tw.error"] = "\(message)" }
            if let span, let carrier = TraceCarrier(span.context) {
                metadata["trace_id"] = carrier.traceID.map { "\($0)" }
                metadata["span_id"] = carrier.spanID.map { "\($0)" }
            }
            logger.debug("request", metadata: metadata)
        }
        guard let span else { return }
        span.updateAttributes { $0["rpc.threadwire.status_code"] = Int64(code.rawValue) }
        if code != .ok { span.setStatus(SpanStatus(code: .error, message: message ?? "\(code)")) }
        span.end()
    }

    /// The metadata a relayed request carries to the owner: the caller's,
    /// with the trace context replaced by the relay span's.
    static func relayMetadata(_ metadata: [Wire.KeyValue]) -> [Wire.KeyValue] {
        guard let carrier = ThreadTracing.currentContext() else { return metadata }
        var relayed = metadata.filter { !["traceparent", "tracestate"].contains($0.key?.lowercased() ?? "") }
        if let parent = carrier.traceparent { relayed.append(Wire.KeyValue(key: "traceparent", value: parent)) }
        if let state = carrier.tracestate, !state.isEmpty { relayed.append(Wire.KeyValue(key: "tracestate", value: state)) }
        return relayed
    }
}
