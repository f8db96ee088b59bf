import Logging
import NIOCore
import NIOEmbedded
import Testing
import ThreadwireServerTesting
@testable import ThreadwireServer
import ThreadwireCore
import ThreadwireModels
import ThreadwireNIO
import ThreadwireTesting
import ThreadwireTransport
import ThreadwireWire

/// The connection handler's synchronous paths in an EmbeddedChannel: bytes in,
/// frames out, no sockets.
@Suite("connection handler (EmbeddedChannel)")
struct ConnectionHandlerTests {
    func pipeline(maxFrameBytes: Int = 1024) throws -> EmbeddedChannel {
        let registry = ConnectionRegistry(baseInstructions: { _ in "" })
        let store = InMemoryThreadStore()
        let engine = ThreadEngine(store: store, backend: ScriptedEchoBackend(), settings: ServerSettings(), sink: registry)
        var limits = ServerLimits()
        limits.maxFrameBytes = maxFrameBytes
        limits.handshakeTimeoutMs = 60_000
        let info = ServerInfo(limits: limits, draining: { false })
        let metrics = ServerMetrics()
        let services = ServerServices(engine: engine, registry: registry, info: info, logger: Logger(label: "test"), recorder: nil, metrics: metrics,
                                      idempotency: IdempotentCalls(store: store, settings: .init(), logger: Logger(label: "test")))
        let channel = EmbeddedChannel()
        let flowControl = FlowControlHandler(paused: { metrics.backpressurePauses.increment() })
        let frameLimit = FrameSizeLimit(maxFrameBytes)
        // In the server's order (FramePipeline): flow control after the call layer.
        try channel.pipeline.syncOperations.addHandlers([
            FrameSplitter(limit: frameLimit),
            ConnectionHandler(connectionID: 1, services: services, flowControl: flowControl, frameLimit: frameLimit),
            flowControl,
        ])
        try channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 1)).wait()
        return channel
    }

    func nextResponse(_ channel: EmbeddedChannel) throws -> Wire.Response? {
        guard var frame = try channel.readOutbound(as: ByteBuffer.self) else { return nil }
        let payload = try #require(try FrameDecoder.nextFrame(&frame, maxFrameBytes: 1 << 20))
        guard case let .response(response)? = try Wire.Envelope(serializedBytes: Array(payload.readableBytesView)).kind else { return nil }
        return response
    }

    @Test("a response spliced from an encoded result is byte for byte the packed Response, and too large alike")
    func splicedResponseFrame() throws {
        // A long preview makes the lengths multi-byte varints.
        let thread = Wire.Thread(id: "01a2009d-034d-7cb8-915e-5dcfcfc5f2ae", preview: String(repeating: "p", count: 20_000),
                                 createdAt: 1, updatedAt: 2, status: Wire.ThreadStatus(type: .idle),
                                 multiAgentRuntime: .v2, multiAgentMode: .proactive, model: "gpt-x", cwd: "/work")
        let results: [Wire.Response.Result] = [
            .threadRead(Wire.ThreadReadResult(thread: thread, settings: Wire.ThreadSettings(model: "gpt-x"))),
            .threadRead(Wire.ThreadReadResult()),
            .healthCheck(Wire.HealthCheckResult(status: .serving)),
        ]
        let allocator = ByteBufferAllocator()
        // Framed as the connection frames its answers: in a buffer it reuses.
        var answers = ReusedFrameBuffer()
        for result in results {
            let encoded = Wire.EncodedResult(result)
            for id: UInt64? in [nil, 0, 7, 127, 128, 300, 1 << 40, .max] {
                let packed = Wire.Envelope(kind: .response(Wire.Response(id: id, code: 0, result: result)))
                guard case let .framed(expected) = packed.frame(allocator: allocator, maxPayload: .max),
                      case let .framed(spliced) = answers.frame(allocator: allocator, maxPayload: .max, packing: { encoded.packResponse(id: id, $0) }) else {
                    Issue.record("unbounded frames must fit"); continue
                }
                #expect(Array(spliced.readableBytesView) == Array(expected.readableBytesView), "id \(String(describing: id))")
                let size = expected.readableBytes - Framing.headerSize
                guard case let .tooLarge(refused) = answers.frame(allocator: allocator, maxPayload: size - 1, packing: { encoded.packResponse(id: id, $0) }) else {
                    Issue.record("a frame one byte over the limit was built"); continue
                }
                #expect(refused == size)
            }
        }
    }

    @Test("a notification encoded once and numbered per connection is byte for byte the packed Envelope, and too large alike")
    func splicedNotificationFrame() throws {
        let long = String(repeating: "d", count: 20_000)
        let payloads: [(Wire.Notification.Payload, [Wire.KeyValue])] = [
            (.threadSettingsUpdated(Wire.ThreadSettingsUpdatedNotification(threadId: "t", settings: Wire.ThreadSettings(model: "m"))), []),
            (.itemAgentMessageDelta(Wire.ItemAgentMessageDeltaNotification(threadId: "t", turnId: "u", itemId: "i", delta: long)),
             [Wire.KeyValue(key: "traceparent", value: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
              Wire.KeyValue(key: "trace_id", value: "4bf92f3577b34da6a3ce929d0e0e4736")]),
            (.threadClosed(Wire.ThreadClosedNotification()), []),
        ]
        let allocator = ByteBufferAllocator()
        for (payload, metadata) in payloads {
            let encoded = Wire.EncodedNotification(payload, metadata: metadata)
            #expect(encoded.methodName == payload.methodName)
            for sequence: UInt64 in [0, 1, 127, 128, 300, 1 << 40, .max] {
                let packed = Wire.Envelope(kind: .notification(Wire.Notification(sequence: sequence, metadata: metadata, payload: payload)))
                guard case let .framed(expected) = packed.frame(allocator: allocator, maxPayload: .max),
                      case let .framed(spliced) = encoded.notificationFrame(sequence: sequence, allocator: allocator, maxPayload: .max) else {
                    Issue.record("unbounded frames must fit"); continue
                }
                #expect(Array(spliced.readableBytesView) == Array(expected.readableBytesView), "sequence \(sequence)")
                let size = expected.readableBytes - Framing.headerSize
                guard case let .tooLarge(refused) = encoded.notificationFrame(sequence: sequence, allocator: allocator, maxPayload: size - 1) else {
                    Issue.record("a frame one byte over the limit was built"); continue
                }
                #expect(refused == size)
            }
        }
    }

    @Test("an undecodable payload is answered INVALID_ARGUMENT and the channel stays open")
    func malformedPayload() throws {
        let channel = try pipeline()
        try channel.writeInbound(ByteBuffer(bytes: Framing.frame([0x0A, 0xFF])))
        let response = try #require(try nextResponse(channel))
        #expect(response.code == 3 && response.id == nil)
        #expect(channel.isActive)
    }

    @Test("an envelope that is not a request is refused without closing")
    func notARequest() throws {
        let channel = try pipeline()
        let bytes = Wire.Envelope(kind: .response(Wire.Response(id: 1, code: 0))).serializedBytes()
        try channel.writeInbound(ByteBuffer(bytes: Framing.frame(bytes)))
        #expect(try nextResponse(channel)?.message == "expected an Envelope carrying a request or a server request's answer")
        #expect(channel.isActive)
    }

    @Test("bad flags: one INVALID_ARGUMENT error frame, then the channel closes")
    func badFlags() throws {
        let channel = try pipeline()
        try? channel.writeInbound(ByteBuffer(bytes: [0x01, 0, 0, 0, 0]))
        channel.embeddedEventLoop.run()
        let response = try #require(try nextResponse(channel))
        #expect(response.code == 3)
        #expect(response.message?.contains("closing the connection") == true)
        #expect(!channel.isActive)
    }

    @Test("an oversize length: RESOURCE_EXHAUSTED before any payload, then close")
    func oversize() throws {
        let channel = try pipeline(maxFrameBytes: 16)
        try? channel.writeInbound(ByteBuffer(bytes: [0x00, 0, 0, 0, 17]))
        channel.embeddedEventLoop.run()
        #expect(try nextResponse(channel)?.code == 8)
        #expect(!channel.isActive)
    }

    func flowControlled(_ limits: ServerLimits) throws -> (EmbeddedChannel, ReadCounter, Connection) {
        let channel = EmbeddedChannel()
        let counter = ReadCounter()
        let metrics = ServerMetrics()
        let flow = FlowControlHandler(paused: { metrics.backpressurePauses.increment() })
        try channel.pipeline.syncOperations.addHandlers([counter, flow])
        let loop = channel.embeddedEventLoop
        let connection = Connection(id: 1, channel: channel, limits: limits, metrics: metrics,
                                    resumeReads: { loop.execute { flow.resumeIfAllowed() } })
        flow.gate = connection
        try channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 1)).wait()
        return (channel, counter, connection)
    }

    @Test("reads stop while the request queue is full (count or bytes) and resume when it drains")
    func queueFullHoldsReads() throws {
        var limits = ServerLimits()
        limits.maxQueuedRequests = 2
        limits.maxQueuedRequestBytes = 100
        let (channel, counter, connection) = try flowControlled(limits)
        channel.read()
        #expect(counter.reads == 1)
        #expect(connection.admit(bytes: 10))
        #expect(!connection.admit(bytes: 10))  // second request fills the count
        channel.read()
        #expect(counter.reads == 1)
        connection.finished(bytes: 10)
        channel.embeddedEventLoop.run()
        #expect(counter.reads == 2)  // the held read was issued
        #expect(!connection.admit(bytes: 200))  // one large request fills the bytes
        channel.read()
        #expect(counter.reads == 2)
        connection.finished(bytes: 200)
        channel.embeddedEventLoop.run()
        #expect(counter.reads == 3)
    }

    @Test("reads stop while the channel is not writable and resume when it is")
    func unwritableHoldsReads() throws {
        let (channel, counter, connection) = try flowControlled(ServerLimits())
        channel.isWritable = false
        channel.pipeline.fireChannelWritabilityChanged()
        channel.read()
        #expect(counter.reads == 0)
        #expect(!connection.readsAllowed)
        channel.isWritable = true
        channel.pipeline.fireChannelWritabilityChanged()
        #expect(counter.reads == 1)
    }

    @Test("partial frames share one budget across connections; the one that passes it is refused")
    func partialFrameBudget() throws {
        let budget = PartialFrameBudget(limit: 100)
        func decoderChannel() throws -> EmbeddedChannel {
            let channel = EmbeddedChannel()
            try channel.pipeline.syncOperations.addHandler(FrameSplitter(maxFrameBytes: 1000, budget: budget))
            return channel
        }
        let first = try decoderChannel()
        let second = try decoderChannel()
        // Header announcing 500 bytes, then 55 of them: 60 bytes held.
        let partial = [UInt8(0), 0, 0, 0x01, 0xF4] + [UInt8](repeating: 7, count: 55)
        try first.writeInbound(ByteBuffer(bytes: partial))
        #expect(budget.heldBytes == 60)
        #expect(throws: FrameError.partialFramesOverBudget(limit: 100)) {
            try second.writeInbound(ByteBuffer(bytes: partial))
        }
        #expect(budget.heldBytes == 60)
        // The first connection goes away: its share returns.
        _ = try? first.finish()
        #expect(budget.heldBytes == 0)
        _ = try? second.finish()
    }
}
