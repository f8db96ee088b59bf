import Metrics
import NIOConcurrencyHelpers
import ThreadwireCore

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
    let acceptBackoffs = Counter(label: "threadwire_accept_backoffs_total")
    let runningTurns = Gauge(label: "threadwire_running_turns")
    let loadedThreads = Gauge(label: "threadwire_loaded_threads")
    let storeHealthy = Gauge(label: "threadwire_store_healthy")

    private struct Instruments {
        var requests: [String: Counter] = [:]
        var latency: [String: Metrics.Timer] = [:]
        var closes: [String: Counter] = [:]
    }
    private let instruments = NIOLockedValueBox(Instruments())

    func frameIn(bytes: Int) {
        framesIn.increment()
        bytesIn.increment(by: Int64(bytes))
    }

    func frameOut(bytes: Int) {
        framesOut.increment()
        bytesOut.increment(by: Int64(bytes))
    }

    /// One answered request: its method, status code and time to answer.
    func request(method: String, code: StatusCode, duration: Duration) {
        let key = "\(method)|\(code.rawValue)"
        let (counter, timer) = instruments.withLockedValue { table -> (Counter, Metrics.Timer) in
            let counter = table.requests[key] ?? {
                let made = Counter(label: "threadwire_requests_total", dimensions: [("method", method), ("code", "\(code.rawValue)")])
                table.requests[key] = made
                return made
            }()
            let timer = table.latency[method] ?? {
                let made = Metrics.Timer(label: "threadwire_request_duration_seconds", dimensions: [("method", method)])
                table.latency[method] = made
                return made
            }()
            return (counter, timer)
        }
        counter.increment()
        timer.record(duration: duration)
    }

    /// A connection the server closed, by reason (maxConnections, idle,
    /// handshakeTimeout, partialFrames, slowSubscriber, frameError).
    func serverClosed(reason: String) {
        let counter = instruments.withLockedValue { table in
            table.closes[reason] ?? {
                let made = Counter(label: "threadwire_connections_closed_by_server_total", dimensions: [("reason", reason)])
                table.closes[reason] = made
                return made
            }()
        }
        counter.increment()
    }
}
