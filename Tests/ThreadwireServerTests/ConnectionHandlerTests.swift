import Logging
import NIOCore
import NIOEmbedded
import Testing
@testable import ThreadwireServer
import ThreadwireCore
import ThreadwireNIO
import ThreadwireTesting
import ThreadwireWire

/// The connection handler's synchronous paths in an EmbeddedChannel: bytes in,
/// frames out, no sockets.
@Suite("connection handler (EmbeddedChannel)")
struct ConnectionHandlerTests {
    func pipeline(maxFrameBytes: Int = 1024) throws -> EmbeddedChannel {
        let registry = ConnectionRegistry(baseInstructions: { _ in "" })
        let engine = ThreadEngine(store: InMemoryThreadStore(), backend: ScriptedEchoBackend(), settings: ServerSettings(), sink: registry)
        let info = ServerInfo(maxFrameBytes: maxFrameBytes, maxQueuedRequests: 8, handshakeTimeoutMs: 60_000, draining: { false })
        let services = ServerServices(engine: engine, registry: registry, info: info, logger: Logger(label: "test"), recorder: nil)
        let channel = EmbeddedChannel()
        try channel.pipeline.syncOperations.addHandlers([
            ByteToMessageHandler(FrameDecoder(maxFrameBytes: maxFrameBytes)),
            MessageToByteHandler(FrameEncoder()),
            ConnectionHandler(connectionID: 1, services: services),
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
        #expect(try nextResponse(channel)?.message == "expected an Envelope carrying a request")
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
}
