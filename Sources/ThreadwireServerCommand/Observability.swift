import Foundation
import Synchronization
public import Logging
import Metrics
import OTel
public import ServiceLifecycle
import ThreadwireCore
import Tracing

/// OpenTelemetry traces: off unless the config file's "tracing" enables them
/// or the standard OTEL_* variables name an OTLP exporter or endpoint.
public struct TracingConfig: Sendable, Equatable {
    public var enabled = false
    /// The OTLP/HTTP traces URL (…/v1/traces); OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT wins.
    public var endpoint: String?
    public var sampleRatio = 1.0
    public var serviceName = "threadwire"

    /// Whether the environment turns tracing on (or off: OTEL_SDK_DISABLED).
    func enabled(in environment: [String: String]) -> Bool {
        if environment["OTEL_SDK_DISABLED"]?.lowercased() == "true" { return false }
        if let exporter = environment["OTEL_TRACES_EXPORTER"]?.lowercased() {
            if exporter == "none" { return false }
            if exporter.split(separator: ",").contains("otlp") { return true }
        }
        if environment["OTEL_EXPORTER_OTLP_ENDPOINT"] != nil || environment["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] != nil { return true }
        return enabled
    }

    /// The head sampling: OTEL_TRACES_SAMPLER[_ARG] win over the file's
    /// sample_ratio (parent-based). An unknown sampler or a bad argument is
    /// reported and the file's ratio used, as OpenTelemetry SDKs do.
    func sampling(in environment: [String: String], logger: Logger) -> TraceSampling {
        let fromFile = TraceSampling(ratio: sampleRatio)
        guard let name = environment["OTEL_TRACES_SAMPLER"] else {
            guard let argument = environment["OTEL_TRACES_SAMPLER_ARG"] else { return fromFile }
            return Self.orReport(TraceSampling.named("parentbased_traceidratio", argument: argument), instead: fromFile, logger: logger)
        }
        return Self.orReport(TraceSampling.named(name, argument: environment["OTEL_TRACES_SAMPLER_ARG"]), instead: fromFile, logger: logger)
    }

    private static func orReport(_ result: Result<TraceSampling, TraceSampling.SamplerError>, instead: TraceSampling,
                                 logger: Logger) -> TraceSampling {
        switch result {
        case let .success(sampling): return sampling
        case let .failure(error):
            logger.warning("\(error.description); sampling with \(instead) instead")
            return instead
        }
    }
}

enum Observability {
    /// Installs the OpenTelemetry tracer (OTLP over HTTP, protobuf) as the
    /// process's tracer and returns the service that batches and exports
    /// its spans; nil when tracing is off. Spans end into a bounded queue:
    /// a collector that is down or slow costs dropped spans (counted as
    /// threadwire_trace_spans_dropped_total), never a request's latency.
    static func startTracing(_ config: TracingConfig, logger: Logger) throws -> (any Service)? {
        let environment = ProcessInfo.processInfo.environment
        guard config.enabled(in: environment) else { return nil }
        var otel = OTel.Configuration.default
        otel.serviceName = config.serviceName
        otel.logs.enabled = false
        otel.metrics.enabled = false
        otel.traces.enabled = true
        otel.traces.exporter = .otlp
        if let endpoint = config.endpoint { otel.traces.otlpExporter.endpoint = endpoint }
        otel.traces.otlpExporter.protocol = .httpProtobuf
        let sampling = config.sampling(in: environment, logger: logger)
        // threadwire samples before it asks swift-otel for a span (see
        // TraceSampling), so swift-otel records every span it is asked for.
        otel.traces.sampler = .alwaysOn
        // An export waits at most this long; meanwhile spans queue (bounded).
        otel.traces.otlpExporter.timeout = .seconds(5)
        otel.traces.batchSpanProcessor.exportTimeout = .seconds(5)
        otel.diagnosticLogger = .custom(Logger(label: "threadwire.otel") { label in
            SpanDropCounter(forwardingTo: logger)
        })
        otel.diagnosticLogLevel = .warning
        let (tracer, service) = try withoutSamplerVariables { try OTel.makeTracingBackend(configuration: otel) }
        InstrumentationSystem.bootstrap(tracer)
        ThreadTracing.enable(tracer, sampling: sampling)
        logger.info("tracing on (OpenTelemetry, OTLP/HTTP)", metadata: [
            "tw.sampler": "\(sampling)",
            "tw.endpoint": "\(environment["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] ?? environment["OTEL_EXPORTER_OTLP_ENDPOINT"] ?? config.endpoint ?? "http://localhost:4318")"])
        return service
    }
}

/// swift-otel applies OTEL_TRACES_SAMPLER[_ARG] over its configuration while
/// it builds the tracer; threadwire has applied them already (a second
/// ratio would square the first), so they are hidden from it for that call
/// and put back, for child processes, right after. This runs once, at
/// startup, before any request is served.
private func withoutSamplerVariables<T>(_ body: () throws -> T) rethrows -> T {
    let names = ["OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG"]
    let saved = names.map { name in getenv(name).map { String(cString: $0) } }
    for name in names { unsetenv(name) }
    defer {
        for (name, value) in zip(names, saved) { if let value { setenv(name, value, 1) } }
    }
    return try body()
}

/// swift-otel reports what it drops only in its diagnostic log (a batch that
/// failed to export, spans refused by a full queue): this handler counts
/// them into /metrics and passes the warnings on to the server's log.
struct SpanDropCounter: LogHandler {
    var metadata: Logger.Metadata = [:]
    var logLevel: Logger.Level = .warning
    let forward: Logger
    static let dropped = Counter(label: "threadwire_trace_spans_dropped_total")
    static let failedExports = Counter(label: "threadwire_trace_exports_failed_total")

    init(forwardingTo logger: Logger) { forward = logger }

    subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    func log(event: LogEvent) {
        let all = metadata.merging(event.metadata ?? [:]) { $1 }
        let text = "\(event.message)"
        if text.hasPrefix("Failed to export batch"), let size = all["batch_size"].flatMap({ Int64("\($0)") }) {
            Self.failedExports.increment()
            Self.dropped.increment(by: size)
        } else if text.contains("dropped"), let count = all["dropped_count"].flatMap({ Int64("\($0)") }) {
            Self.dropped.increment(by: count)
        }
        forward.log(level: event.level, "opentelemetry: \(event.message)", metadata: all)
    }
}

/// One JSON object per line on standard error: time, level, label, message,
/// and the metadata (request id, thread id, and with tracing on the
/// trace_id and span_id of the span the line was logged in).
struct JSONLogHandler: LogHandler {
    let label: String
    var logLevel: Logger.Level = .info
    var metadata: Logger.Metadata = [:]
    var metadataProvider: Logger.MetadataProvider?

    init(label: String, metadataProvider: Logger.MetadataProvider?) {
        self.label = label
        self.metadataProvider = metadataProvider
    }

    subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    func log(event: LogEvent) {
        var fields: [String: Any] = [:]
        var all = metadata
        if let provided = metadataProvider?.get() { all.merge(provided) { $1 } }
        if let extra = event.metadata { all.merge(extra) { $1 } }
        for (key, value) in all { fields[key] = Self.json(value) }
        // The common names log pipelines join on.
        if let value = all["tw.request.id"] { fields["request_id"] = Self.json(value) }
        if let value = all["tw.thread.id"] ?? all["tw.thread"] { fields["thread_id"] = Self.json(value) }
        fields["time"] = Self.timestamp()
        fields["level"] = event.level.rawValue
        fields["label"] = label
        fields["message"] = "\(event.message)"
        if event.level >= .error { fields["source"] = "\(event.file):\(event.line)" }
        guard var line = try? JSONSerialization.data(withJSONObject: fields, options: [.sortedKeys, .withoutEscapingSlashes]) else { return }
        line.append(0x0A)
        // One write per line: lines of concurrent loggers never interleave.
        line.withUnsafeBytes { bytes in _ = write(2, bytes.baseAddress, bytes.count) }
    }

    static func json(_ value: Logger.MetadataValue) -> Any {
        switch value {
        case let .string(text): return text
        case let .stringConvertible(convertible): return "\(convertible)"
        case let .array(values): return values.map(json)
        case let .dictionary(entries): return entries.mapValues(json)
        }
    }

    static func timestamp() -> String {
        var now = timespec()
        clock_gettime(CLOCK_REALTIME, &now)
        var seconds = now.tv_sec
        var parts = tm()
        gmtime_r(&seconds, &parts)
        return String(format: "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", Int(parts.tm_year) + 1900, Int(parts.tm_mon) + 1, Int(parts.tm_mday),
                      Int(parts.tm_hour), Int(parts.tm_min), Int(parts.tm_sec), Int(now.tv_nsec / 1_000_000))
    }
}

/// `--log-format`: text (swift-log's stream handler) or json.
public enum LogFormat: String, Sendable, CaseIterable {
    case text, json
}

extension LoggingSystem {
    /// The server's log handlers on standard error, with trace and span ids
    /// (from the task's current span) when tracing is on.
    static func bootstrapServer(format: LogFormat, level: Logger.Level) {
        let provider = OTel.makeLoggingMetadataProvider()
        LiveLogLevel.set(level)
        LoggingSystem.bootstrap({ label, provider in
            switch format {
            case .text:
                var handler = StreamLogHandler.standardError(label: label, metadataProvider: provider)
                handler.logLevel = .trace
                return LiveLevelHandler(inner: handler)
            case .json:
                var handler = JSONLogHandler(label: label, metadataProvider: provider)
                handler.logLevel = .trace
                return LiveLevelHandler(inner: handler)
            }
        }, metadataProvider: provider)
    }
}

/// The process's log level: every handler reads it, so a SIGHUP that
/// re-reads the config file changes it for loggers already made.
enum LiveLogLevel {
    private static let rank = Atomic<UInt8>(rank(of: .info))

    /// Read on every inline answer: a switch, where `allCases[index]` made
    /// a release of the array each time (issue 54).
    static var current: Logger.Level {
        switch rank.load(ordering: .relaxed) {
        case 0: .trace
        case 1: .debug
        case 2: .info
        case 3: .notice
        case 4: .warning
        case 5: .error
        default: .critical
        }
    }

    static func set(_ level: Logger.Level) {
        rank.store(rank(of: level), ordering: .relaxed)
    }

    /// The level's place in severity order, as `current` reads it back.
    private static func rank(of level: Logger.Level) -> UInt8 {
        switch level {
        case .trace: 0
        case .debug: 1
        case .info: 2
        case .notice: 3
        case .warning: 4
        case .error: 5
        case .critical: 6
        }
    }
}

/// A handler whose level is the live one unless a logger set its own.
struct LiveLevelHandler: LogHandler {
    var inner: any LogHandler
    private var own: Logger.Level?

    init(inner: any LogHandler) { self.inner = inner }

    var logLevel: Logger.Level {
        get { own ?? LiveLogLevel.current }
        set { own = newValue }
    }

    var metadata: Logger.Metadata {
        get { inner.metadata }
        set { inner.metadata = newValue }
    }

    subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { inner[metadataKey: key] }
        set { inner[metadataKey: key] = newValue }
    }

    func log(event: LogEvent) { inner.log(event: event) }
}
