import Foundation
import GRPCCore
import GRPCNIOTransportHTTP2
import Histogram
import Logging
import NIOCore
import ThreadwireWire
import WSClient

/// threadwire's other listeners against its frames: gRPC (--grpc-listen)
/// against a grpc-swift-2 service doing the same work, and WebSocket
/// (--web-listen) against TCP frames.
extension Run {
    func listeners() async throws {
        let dir = NSTemporaryDirectory() + "threadwire-bench-" + UUID().uuidString
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let threadwire = try Spawned(serverBin, ["--listen", "127.0.0.1:0", "--grpc-listen", "127.0.0.1:0", "--web-listen", "127.0.0.1:0",
                                                 "--data-dir", dir + "/tw", "--log-level", "error"], lines: 3)
        let peer = try Spawned(CommandLine.arguments[0], ["grpc-server", "--data-dir", dir + "/grpc"])
        defer { threadwire.stop(); peer.stop() }
        guard let grpcPort = threadwire.port(after: "threadwire grpc on "), let webPort = threadwire.port(after: "threadwire web on http://") else {
            throw BenchError("threadwire-server printed no gRPC or web address")
        }
        print("## Listeners: gRPC and WebSocket against TCP frames\n")
        print("Closed loop, one request in flight per connection. gRPC: threadwire's `--grpc-listen` (service threadwire.v1.Threadwire) and a grpc-swift-2 service doing the same work on the same engine and store (Wire messages through grpc-swift-2's serializer protocol), both driven by grpc-swift-2's client, one HTTP/2 connection per client. WebSocket: swift-websocket's client, one socket per connection, against TCP frames from the raw-frame generator.\n")
        print("| workload | connections | TCP frames req/s | gRPC listener req/s | grpc-swift-2 service req/s | gRPC / grpc-swift-2 | WebSocket req/s | WebSocket / TCP |")
        print("|---|---|---|---|---|---|---|---|")
        for workload in ["health/check", "thread/read"] {
            for count in [1, 16, 64] {
                let tcpConnections = try await (0..<count).asyncMap { _ in try await Frames.initialized(port: threadwire.port) }
                let threadIDs = try await tcpConnections.asyncMap { try await Frames.startThread($0) }
                let payloads = threadIDs.map { id -> [UInt8] in
                    workload == "health/check" ? Frames.request(7, .healthCheck(.init())) : Frames.request(7, .threadRead(Wire.ThreadReadParams(threadId: id)))
                }
                progress("\(workload) x\(count): TCP frames")
                let tcp = try await medianLoad {
                    try await FrameLoad.run(connections: tcpConnections, seconds: seconds) { i, _ in
                        .init(payload: payloads[i], until: { Frames.responseID($0) == 7 })
                    }
                }
                for c in tcpConnections { await c.close() }
                progress("\(workload) x\(count): gRPC listener")
                let listener = try await medianLoad {
                    try await grpcLoad(port: grpcPort, connections: count, workload: workload, methods: .threadwire)
                }
                progress("\(workload) x\(count): grpc-swift-2 service")
                let service = try await medianLoad {
                    try await grpcLoad(port: peer.port, connections: count, workload: workload, methods: .peer)
                }
                progress("\(workload) x\(count): WebSocket")
                let web = try await medianLoad {
                    try await WebSocketLoad.run(url: "ws://127.0.0.1:\(webPort)/ws", connections: count, seconds: seconds, workload: workload)
                }
                print(String(format: "| %@ | %d | %.0f | %.0f | %.0f | %.2f× | %.0f | %.0f%% |", workload, count, tcp.throughput,
                             listener.throughput, service.throughput, listener.throughput / service.throughput,
                             web.throughput, 100 * web.throughput / tcp.throughput))
            }
        }
        print("")
    }
}

/// Where a long run is, on stderr (the tables go to stdout).
func progress(_ text: String) {
    FileHandle.standardError.write(Data("[\(Date())] \(text)\n".utf8))
}

/// Closed-loop load over WebSocket sessions: each binary message one Envelope.
enum WebSocketLoad {
    static func run(url: String, connections: Int, seconds: Double, workload: String) async throws -> LoadResult {
        let start = ContinuousClock.now
        let end = start + .milliseconds(Int(seconds * 1000))
        let results = try await withThrowingTaskGroup(of: (Histogram<UInt64>, Int).self) { group in
            for _ in 0..<connections {
                group.addTask {
                    let box = ResultBox()
                    let closed = try await WebSocketClient.connect(url: url, configuration: .init(maxFrameSize: 1 << 22), logger: Logger(label: "bench-ws")) {
                        inbound, outbound, _ in
                        var messages = inbound.messages(maxSize: 1 << 22).makeAsyncIterator()
                        func call(_ payload: [UInt8], id: UInt64) async throws -> [UInt8] {
                            try await outbound.write(.binary(ByteBuffer(bytes: payload)))
                            while true {
                                guard let message = try await messages.next() else { throw BenchError("the WebSocket closed") }
                                guard case let .binary(buffer) = message else { throw BenchError("a text message: \(message)") }
                                let bytes = Array(buffer.readableBytesView)
                                if Frames.responseID(bytes) == id { return bytes }
                            }
                        }
                        var hello = Wire.InitializeParams()
                        hello.clientInfo = Wire.ClientInfo(name: "bench-ws")
                        _ = try await call(Frames.request(1, .initialize(hello)), id: 1)
                        let started = Frames.response(try await call(Frames.request(2, .threadStart(.init())), id: 2))
                        guard case let .threadStart(result)? = started?.result, let thread = result.thread?.id else { throw BenchError("no thread") }
                        let payload = workload == "health/check" ? Frames.request(7, .healthCheck(.init()))
                            : Frames.request(7, .threadRead(Wire.ThreadReadParams(threadId: thread)))
                        var histogram = Histogram<UInt64>(highestTrackableValue: 60_000_000, numberOfSignificantValueDigits: .three)
                        var n = 0
                        while ContinuousClock.now < end {
                            let sent = ContinuousClock.now
                            _ = try await call(payload, id: 7)
                            _ = histogram.record(UInt64(max(1, (ContinuousClock.now - sent).micros)))
                            n += 1
                        }
                        box.set(histogram, n)
                        try await outbound.close(.normalClosure, reason: nil)
                    }
                    guard let result = box.get() else { throw BenchError("a WebSocket session did not finish: \(String(describing: closed))") }
                    return result
                }
            }
            var all: [(Histogram<UInt64>, Int)] = []
            for try await result in group { all.append(result) }
            return all
        }
        var merged = Histogram<UInt64>(highestTrackableValue: 60_000_000, numberOfSignificantValueDigits: .three)
        for (histogram, _) in results { merged.add(histogram) }
        return LoadResult(requests: results.map(\.1).reduce(0, +), seconds: (ContinuousClock.now - start).secondsValue,
                          p50: merged.valueAtPercentile(50), p90: merged.valueAtPercentile(90), p99: merged.valueAtPercentile(99),
                          p999: merged.valueAtPercentile(99.9), max: merged.max)
    }

    final class ResultBox: @unchecked Sendable {
        private let lock = NSLock()
        private var value: (Histogram<UInt64>, Int)?
        func set(_ histogram: Histogram<UInt64>, _ n: Int) { lock.lock(); value = (histogram, n); lock.unlock() }
        func get() -> (Histogram<UInt64>, Int)? { lock.lock(); defer { lock.unlock() }; return value }
    }
}
