import Foundation
import Histogram
import ThreadwireClient
import ThreadwireWire

/// One connection's work: called repeatedly; returns nil when that connection is done.
protocol LoadScript: Sendable {
    /// Sends the next request and waits for what it needs; returns its status code.
    func step(_ client: ThreadwireClient) async throws -> UInt32?
}

struct LoadOptions {
    var connections = 1
    /// Total requests per second across connections; nil = as fast as possible.
    var rate: Double?
    var duration: Double?
}

/// Runs scripts over N connections, records latency in an HdrHistogram (µs)
/// and status codes, and prints a progress line while it runs.
actor LoadRun {
    private var histogram = Histogram<UInt64>(highestTrackableValue: 60_000_000, numberOfSignificantValueDigits: .three)
    private var statuses: [UInt32: Int] = [:]
    private var transportErrors = 0
    private var completed = 0

    func record(micros: UInt64, status: UInt32?, expectedIntervalMicros: UInt64?) {
        if let interval = expectedIntervalMicros {
            // Coordinated-omission correction when running at a fixed rate.
            _ = histogram.recordCorrectedValue(micros, expectedInterval: interval)
        } else {
            _ = histogram.record(micros)
        }
        if let status { statuses[status, default: 0] += 1 } else { transportErrors += 1 }
        completed += 1
    }

    var done: Int { completed }

    struct Report: Sendable {
        var requests: Int
        var seconds: Double
        var statuses: [UInt32: Int]
        var transportErrors: Int
        var p50, p90, p99, p999, max: UInt64
        var errors: Int { statuses.filter { $0.key != 0 }.values.reduce(0, +) + transportErrors }
        var throughput: Double { Double(requests) / seconds }

        var text: String {
            let codes = statuses.keys.sorted().map { "\($0):\(statuses[$0]!)" }.joined(separator: " ")
            return """
                requests   \(requests) in \(String(format: "%.2f", seconds)) s (\(String(format: "%.0f", throughput)) req/s)
                errors     \(errors) (status counts \(codes.isEmpty ? "-" : codes); transport \(transportErrors))
                latency µs p50 \(p50)  p90 \(p90)  p99 \(p99)  p99.9 \(p999)  max \(max)
                """
        }

        var json: JSONValue {
            .object([
                ("requests", .int(Int64(requests))), ("seconds", .double(seconds)), ("throughput_per_second", .double(throughput)),
                ("errors", .int(Int64(errors))), ("transport_errors", .int(Int64(transportErrors))),
                ("status_counts", .object(statuses.keys.sorted().map { ("\($0)", .int(Int64(statuses[$0]!))) })),
                ("latency_us", .object([("p50", .uint(p50)), ("p90", .uint(p90)), ("p99", .uint(p99)), ("p99_9", .uint(p999)), ("max", .uint(max))])),
            ])
        }
    }

    func report(seconds: Double) -> Report {
        Report(requests: completed, seconds: seconds, statuses: statuses, transportErrors: transportErrors,
               p50: histogram.valueAtPercentile(50), p90: histogram.valueAtPercentile(90),
               p99: histogram.valueAtPercentile(99), p999: histogram.valueAtPercentile(99.9), max: histogram.max)
    }

    /// Runs one script per connection until each is done or the duration ends.
    static func run(server: ServerOptions, options: LoadOptions, progress: Bool,
                    makeScript: @escaping @Sendable (Int) -> any LoadScript,
                    setUp: @escaping @Sendable (ThreadwireClient, Int) async throws -> Void = { _, _ in }) async throws -> Report {
        let run = LoadRun()
        let clients = try await (0..<options.connections).asyncMap { _ in try await server.connect() }
        for (index, client) in clients.enumerated() { try await setUp(client, index) }
        let start = ContinuousClock.now
        let deadline = options.duration.map { start + .milliseconds(Int($0 * 1000)) }
        let interval = options.rate.map { Duration.microseconds(Int64(1_000_000 * Double(options.connections) / $0)) }
        let ticker = progress ? Task {
            while !Task.isCancelled {
                try? await Task.sleep(for: .seconds(1))
                let elapsed = (ContinuousClock.now - start).seconds
                let done = await run.done
                FileHandle.standardError.write(Data(String(format: "\r%8d requests  %6.1f s  %8.0f req/s ", done, elapsed, Double(done) / elapsed).utf8))
            }
        } : nil
        await withTaskGroup(of: Void.self) { group in
            for (index, client) in clients.enumerated() {
                let script = makeScript(index)
                group.addTask {
                    var next = ContinuousClock.now
                    while deadline.map({ ContinuousClock.now < $0 }) ?? true {
                        if let interval {
                            next += interval
                            if next > ContinuousClock.now { try? await Task.sleep(until: next) }
                        }
                        let sent = ContinuousClock.now
                        let status: UInt32?
                        do {
                            guard let code = try await script.step(client) else { return }
                            status = code
                        } catch {
                            status = nil
                        }
                        let micros = UInt64(max(1, (ContinuousClock.now - sent).microseconds))
                        await run.record(micros: micros, status: status, expectedIntervalMicros: interval.map { UInt64($0.microseconds) })
                        if status == nil { return }
                    }
                }
            }
        }
        ticker?.cancel()
        if progress { FileHandle.standardError.write(Data("\n".utf8)) }
        for client in clients { await client.close() }
        return await run.report(seconds: (ContinuousClock.now - start).seconds)
    }
}

extension Duration {
    var seconds: Double { Double(components.seconds) + Double(components.attoseconds) / 1e18 }
    var microseconds: Int64 { components.seconds * 1_000_000 + components.attoseconds / 1_000_000_000_000 }
}

extension Sequence {
    func asyncMap<T>(_ transform: (Element) async throws -> T) async rethrows -> [T] {
        var out: [T] = []
        for element in self { out.append(try await transform(element)) }
        return out
    }
}
