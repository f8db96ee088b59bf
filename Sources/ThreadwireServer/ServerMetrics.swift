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

    /// One method's instruments; a counter per status code, made on first use.
    private final class MethodInstruments: Sendable {
        let latency: Metrics.Timer
        private let counters: [Lazy<Counter>]
        private let method: String

        init(method: String) {
            self.method = method
            latency = Metrics.Timer(label: "threadwire_request_duration_seconds", dimensions: [("method", method)])
            counters = (0..<17).map { _ in Lazy() }
        }

        func counter(_ code: StatusCode) -> Counter {
            counters[Int(code.rawValue)].get {
                Counter(label: "threadwire_requests_total", dimensions: [("method", method), ("code", code.name)])
            }
        }
    }

    /// The methods' instruments by `Wire.Request.Params.caseIndex`: found
    /// per request without a lock or a hashed name. Made on first use, so
    /// /metrics lists only the methods that were called.
    private let byCase: [Lazy<MethodInstruments>] = Wire.Request.Params.methodNames.map { _ in Lazy() }
    private static let caseIndexByName = Dictionary(uniqueKeysWithValues: Wire.Request.Params.methodNames.enumerated().map { ($1, $0) })
    /// Names no case has ("unknown": a request that named no method).
    private let others = NIOLockedValueBox([String: MethodInstruments]())
    private let closes = NIOLockedValueBox([String: Counter]())

    func frameOut(bytes: Int) {
        framesOut.increment()
        bytesOut.increment(by: Int64(bytes))
    }

    /// One answered request: its method, status code and time to answer.
    func request(_ spec: MethodSpec, code: StatusCode, duration: Duration) {
        record(instruments(caseIndex: spec.caseIndex, method: spec.name), code: code, duration: duration)
    }

    /// As above, by the method's name (refusals, which may have no table entry).
    func request(method: String, code: StatusCode, duration: Duration) {
        let instruments: MethodInstruments
        if let index = Self.caseIndexByName[method] {
            instruments = self.instruments(caseIndex: index, method: method)
        } else {
            instruments = others.withLockedValue { table in
                if let existing = table[method] { return existing }
                let made = MethodInstruments(method: method)
                table[method] = made
                return made
            }
        }
        record(instruments, code: code, duration: duration)
    }

    private func instruments(caseIndex: Int, method: String) -> MethodInstruments {
        byCase[caseIndex].get { MethodInstruments(method: method) }
    }

    private func record(_ instruments: MethodInstruments, code: StatusCode, duration: Duration) {
        instruments.counter(code).increment()
        instruments.latency.record(duration: duration)
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

/// An instance made on first use, then read without a lock. Two threads
/// that race to make it both make one and one is kept: swift-metrics'
/// factory hands both the same instrument for the same label and dimensions.
final class Lazy<Instance: AnyObject & Sendable>: Sendable {
    private let reference = AtomicLazyReference<Instance>()

    func get(_ make: () -> Instance) -> Instance {
        if let made = reference.load() { return made }
        return reference.storeIfNil(make())
    }
}
