import Foundation
import Histogram
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import ThreadwireNIO
import ThreadwireWire

/// A raw-frame connection: send one frame, read frames until one satisfies the
/// caller. The same generator drives the echo server and threadwire, so the
/// only difference measured is the server.
final class FrameConnection: @unchecked Sendable {
    let channel: any Channel
    private let inbox: Inbox

    final class Inbox: ChannelInboundHandler, @unchecked Sendable {
        typealias InboundIn = ByteBuffer
        private let lock = NIOLock()
        private var frames: [[UInt8]] = []
        private var waiter: CheckedContinuation<[UInt8], any Error>?
        private var closed = false

        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            var buffer = unwrapInboundIn(data)
            let bytes = buffer.readBytes(length: buffer.readableBytes) ?? []
            let waiter: CheckedContinuation<[UInt8], any Error>? = lock.withLock {
                if let waiter = self.waiter { self.waiter = nil; return waiter }
                frames.append(bytes)
                return nil
            }
            waiter?.resume(returning: bytes)
        }

        func channelInactive(context: ChannelHandlerContext) {
            let waiter: CheckedContinuation<[UInt8], any Error>? = lock.withLock {
                closed = true
                defer { self.waiter = nil }
                return self.waiter
            }
            waiter?.resume(throwing: ChannelError.ioOnClosedChannel)
        }

        func next() async throws -> [UInt8] {
            try await withCheckedThrowingContinuation { continuation in
                let ready: [UInt8]?? = lock.withLock {
                    if !frames.isEmpty { return .some(frames.removeFirst()) }
                    if closed { return .some(nil) }
                    waiter = continuation
                    return .none
                }
                switch ready {
                case let .some(.some(frame)): continuation.resume(returning: frame)
                case .some(.none): continuation.resume(throwing: ChannelError.ioOnClosedChannel)
                case .none: break
                }
            }
        }
    }

    static func connect(port: Int) async throws -> FrameConnection {
        let inbox = Inbox()
        let channel = try await ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .channelOption(.socketOption(.tcp_nodelay), value: 1)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandlers([
                        ByteToMessageHandler(FrameDecoder()), MessageToByteHandler(FrameEncoder()), inbox,
                    ])
                }
            }
            .connect(host: "127.0.0.1", port: port).get()
        return FrameConnection(channel: channel, inbox: inbox)
    }

    private init(channel: any Channel, inbox: Inbox) {
        self.channel = channel
        self.inbox = inbox
    }

    /// Sends a payload and returns the first reply payload that `until` accepts.
    func roundTrip(_ payload: [UInt8], until: ([UInt8]) -> Bool = { _ in true }) async throws -> [UInt8] {
        channel.writeAndFlush(payload, promise: nil)
        while true {
            let frame = try await inbox.next()
            if until(frame) { return frame }
        }
    }

    /// The next frame the server sends, whatever it is.
    func next() async throws -> [UInt8] { try await inbox.next() }

    func close() async { try? await channel.close() }
}

struct LoadResult: Sendable {
    var requests: Int
    var seconds: Double
    var p50, p90, p99, p999, max: UInt64
    var throughput: Double { Double(requests) / seconds }
}

/// Closed loop (one request in flight per connection) or paced at a total rate;
/// `perform` sends one request on connection `index` and waits for its answer.
enum ClosedLoop {
    static func run(connections: Int, seconds: Double, totalRate: Double? = nil,
                    perform: @escaping @Sendable (_ index: Int, _ n: Int) async throws -> Void) async throws -> LoadResult {
        let start = ContinuousClock.now
        let end = start + .milliseconds(Int(seconds * 1000))
        let interval = totalRate.map { Duration.nanoseconds(Int64(1e9 * Double(connections) / $0)) }
        let histograms = try await withThrowingTaskGroup(of: (Histogram<UInt64>, Int).self) { group in
            for index in 0..<connections {
                group.addTask {
                    var histogram = Histogram<UInt64>(highestTrackableValue: 60_000_000, numberOfSignificantValueDigits: .three)
                    var n = 0
                    var next = ContinuousClock.now
                    while ContinuousClock.now < end {
                        if let interval {
                            next += interval
                            if next > ContinuousClock.now { try await Task.sleep(until: next) }
                        }
                        let sent = ContinuousClock.now
                        try await perform(index, n)
                        let micros = UInt64(Swift.max(1, (ContinuousClock.now - sent).micros))
                        if let interval {
                            // Coordinated-omission correction when paced.
                            _ = histogram.recordCorrectedValue(micros, expectedInterval: UInt64(interval.micros))
                        } else {
                            _ = histogram.record(micros)
                        }
                        n += 1
                    }
                    return (histogram, n)
                }
            }
            var all: [(Histogram<UInt64>, Int)] = []
            for try await result in group { all.append(result) }
            return all
        }
        var merged = Histogram<UInt64>(highestTrackableValue: 60_000_000, numberOfSignificantValueDigits: .three)
        for (histogram, _) in histograms { merged.add(histogram) }
        return LoadResult(
            requests: histograms.map(\.1).reduce(0, +), seconds: (ContinuousClock.now - start).secondsValue,
            p50: merged.valueAtPercentile(50), p90: merged.valueAtPercentile(90), p99: merged.valueAtPercentile(99),
            p999: merged.valueAtPercentile(99.9), max: merged.max)
    }
}

/// The raw-frame generator: the same for the echo server and threadwire.
enum FrameLoad {
    struct Step: Sendable {
        var payload: [UInt8]
        var until: @Sendable ([UInt8]) -> Bool = { _ in true }
    }

    static func run(connections: [FrameConnection], seconds: Double, totalRate: Double? = nil,
                    step: @escaping @Sendable (_ connection: Int, _ n: Int) -> Step) async throws -> LoadResult {
        try await ClosedLoop.run(connections: connections.count, seconds: seconds, totalRate: totalRate) { index, n in
            let s = step(index, n)
            _ = try await connections[index].roundTrip(s.payload, until: s.until)
        }
    }
}

extension Duration {
    var secondsValue: Double { Double(components.seconds) + Double(components.attoseconds) / 1e18 }
    var micros: Int64 { components.seconds * 1_000_000 + components.attoseconds / 1_000_000_000_000 }
    var millis: Double { secondsValue * 1000 }
}

/// Frames of the real protocol.
enum Frames {
    static func request(_ id: UInt64, _ params: Wire.Request.Params) -> [UInt8] {
        Wire.Envelope(kind: .request(Wire.Request(id: id, params: params))).serializedBytes()
    }

    /// The id of a Response, read from the frame's first bytes (Envelope
    /// field 2, its length, then Response field 1, which protobuf-c writes
    /// first) without decoding the rest: the generator shares the cores with
    /// the server, so matching answers must cost it as little as the echo's
    /// does. nil for notifications and anything else.
    static func responseID(_ payload: [UInt8]) -> UInt64? {
        var index = 0
        func varint() -> UInt64? {
            var value: UInt64 = 0
            var shift: UInt64 = 0
            while index < payload.count, shift < 64 {
                let byte = payload[index]
                index += 1
                value |= UInt64(byte & 0x7F) << shift
                if byte & 0x80 == 0 { return value }
                shift += 7
            }
            return nil
        }
        guard payload.first == 0x12 else { return nil }
        index = 1
        guard varint() != nil, index < payload.count, payload[index] == 0x08 else { return nil }
        index += 1
        return varint()
    }

    static func response(_ payload: [UInt8]) -> Wire.Response? {
        guard case let .response(response)? = try? Wire.Envelope(serializedBytes: payload).kind else { return nil }
        return response
    }

    static let initialize = request(1, .initialize(Wire.InitializeParams(clientInfo: Wire.ClientInfo(name: "bench"), protocolVersion: 1)))

    /// A threadwire connection that has initialized.
    static func initialized(port: Int) async throws -> FrameConnection {
        let connection = try await FrameConnection.connect(port: port)
        _ = try await connection.roundTrip(initialize) { response($0)?.id == 1 }
        return connection
    }

    static func startThread(_ connection: FrameConnection) async throws -> String {
        let reply = try await connection.roundTrip(request(2, .threadStart(Wire.ThreadStartParams()))) { response($0)?.id == 2 }
        guard case let .threadStart(started)? = response(reply)?.result, let id = started.thread?.id else {
            throw BenchError("thread/start failed")
        }
        return id
    }
}

struct BenchError: Error, CustomStringConvertible {
    var description: String
    init(_ description: String) { self.description = description }
}
