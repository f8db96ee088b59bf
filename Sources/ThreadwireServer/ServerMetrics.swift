import Metrics
import NIOConcurrencyHelpers
import Synchronization
import ThreadwireCore
import ThreadwireWire

/// The server's swift-metrics instruments. Labels and dimensions follow
/// Prometheus naming (the admin endpoint exports them); dimensions are closed
/// sets (methods, status codes, reasons), never ids.
final class ServerMetrics: Sendable {
    let connectionsOpen = Meter(label: "threadwire_connections_open")
    let framesIn = Counter(label: "threadwire_frames_in_total")
    let bytesIn = Counter(label: "threadwire_bytes_in_total")
    let framesOut = Counter(label: "threadwire_frames_out_total")
    let bytesOut = Counter(label: "threadwire_bytes_out_total")
    let backpressurePauses = Counter(label: "threadwire_backpressure_pauses_total")
    let slowSubscriberDisconnects = Counter(label: "threadwire_slow_subscriber_disconnects_total")
    /// Answers of server requests that counted (client tools).
    let serverRequestAnswers = Counter(label: "threadwire_server_request_answers_total")
    /// Repeats of keyed requests answered with the first attempt's answer.
    let idempotentReplays = Counter(label: "threadwire_idempotent_replays_total")
    let acceptBackoffs = Counter(label: "threadwire_accept_backoffs_total")
    let runningTurns = Gauge(label: "threadwire_running_turns")
    let loadedThreads = Gauge(label: "threadwire_loaded_threads")
    let storeHealthy = Gauge(label: "threadwire_store_healthy")
    /// What the file limit leaves connections (DescriptorBudget), set at startup.
    let connectionDescriptorCapacity = Gauge(label: "threadwire_connection_descriptors_capacity")

    /// One method's instruments: its latency histogram (exported once it
    /// holds a request, so /metrics lists only the methods that were called)
    /// and a counter per status code, made on its first use.
    private final class MethodInstruments: Sendable {
        let method: String
        let latency = LatencyHistogram()
        private let counters = NIOLockedValueBox([Counter?](repeating: nil, count: 17))
        /// The OK counter, the most used: written once, under the lock,
        /// before `okMade` is set, and read only after `okMade` is seen set,
        /// so without the lock. (`AtomicLazyReference` would do the same, but
        /// its unspecialized `load` instantiated generic metadata each time.)
        nonisolated(unsafe) private var okCounter: Counter?
        private let okMade = Atomic(false)

        init(method: String) {
            self.method = method
        }

        func record(code: StatusCode, duration: Duration) {
            latency.record(duration)
            counter(code).increment()
        }

        private func counter(_ code: StatusCode) -> Counter {
            if code == .ok, okMade.load(ordering: .acquiring), let okCounter { return okCounter }
            let method = method
            return counters.withLockedValue { counters in
                let index = Int(code.rawValue)
                let counter = counters[index] ?? Counter(label: "threadwire_requests_total", dimensions: [("method", method), ("code", code.name)])
                counters[index] = counter
                if code == .ok, okCounter == nil {
                    okCounter = counter
                    okMade.store(true, ordering: .releasing)
                }
                return counter
            }
        }
    }

    /// The methods' instruments by `Wire.Request.Params.caseIndex`: found
    /// per request without hashing a name.
    private let byCase: [MethodInstruments] = Wire.Request.Params.methodNames.map(MethodInstruments.init(method:))
    private static let caseIndexByName = Dictionary(uniqueKeysWithValues: Wire.Request.Params.methodNames.enumerated().map { ($1, $0) })
    /// Names no case has ("unknown": a request that named no method).
    private let others = NIOLockedValueBox([String: MethodInstruments]())
    private let closes = NIOLockedValueBox([String: Counter]())

    /// `threadwire_request_duration_seconds` in the Prometheus text format,
    /// for /metrics and cluster/status: the server keeps these histograms
    /// itself (`LatencyHistogram`), beside the registry's metrics.
    func requestLatencyExposition() -> String {
        let name = "threadwire_request_duration_seconds"
        let all = byCase + others.withLockedValue { Array($0.values) }
        var text = ""
        for instruments in all.sorted(by: { $0.method < $1.method }) {
            let snapshot = instruments.latency.snapshot()
            guard snapshot.count > 0 else { continue }
            text += LatencyHistogram.lines(name: name, labels: "method=\"\(Self.escapedLabel(instruments.method))\"", snapshot)
        }
        return text.isEmpty ? "" : "# TYPE \(name) histogram\n" + text
    }

    /// A label value as the text format wants it: backslash, quote and newline escaped.
    static func escapedLabel(_ value: String) -> String {
        var escaped = ""
        for character in value {
            switch character {
            case "\\": escaped += "\\\\"
            case "\"": escaped += "\\\""
            case "\n": escaped += "\\n"
            default: escaped.append(character)
            }
        }
        return escaped
    }

    func frameOut(bytes: Int) {
        framesOut.increment()
        bytesOut.increment(by: Int64(bytes))
    }

    /// One answered request: its method, status code and time to answer.
    func request(_ spec: MethodSpec, code: StatusCode, duration: Duration) {
        byCase[spec.caseIndex].record(code: code, duration: duration)
    }

    /// As above, by the method's name (refusals, which may have no table entry).
    func request(method: String, code: StatusCode, duration: Duration) {
        let instruments: MethodInstruments
        if let index = Self.caseIndexByName[method] {
            instruments = byCase[index]
        } else {
            instruments = others.withLockedValue { table in
                if let existing = table[method] { return existing }
                let made = MethodInstruments(method: method)
                table[method] = made
                return made
            }
        }
        instruments.record(code: code, duration: duration)
    }

    private let relays = NIOLockedValueBox([String: Counter]())

    /// A request relayed to the instance owning its thread, by method and
    /// the owner's status code (also counted in threadwire_requests_total).
    func forwarded(method: String, code: StatusCode, duration: Duration) {
        let key = "\(method) \(code.name)"
        let counter = relays.withLockedValue { table in
            table[key] ?? {
                let made = Counter(label: "threadwire_forwarded_requests_total", dimensions: [("method", method), ("code", code.name)])
                table[key] = made
                return made
            }()
        }
        counter.increment()
    }

    /// A connection the server closed, by reason.
    func serverClosed(reason: CloseReason) {
        let counter = closes.withLockedValue { table in
            table[reason.rawValue] ?? {
                let made = Counter(label: "threadwire_connections_closed_by_server_total", dimensions: [("reason", reason.rawValue)])
                table[reason.rawValue] = made
                return made
            }()
        }
        counter.increment()
    }
}

/// Requests one method had answered, as cluster/status reports them.
public struct RequestLoad: Sendable, Equatable {
    public var method: String
    public var requests: UInt64
    /// The latency histogram bucket's upper bound that holds the 99th
    /// percentile; nil when it is over the largest bucket.
    public var p99Ms: Double?
    public init(method: String, requests: UInt64, p99Ms: Double?) {
        self.method = method
        self.requests = requests
        self.p99Ms = p99Ms
    }
}
