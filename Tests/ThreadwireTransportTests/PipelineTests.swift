import NIOCore
import NIOEmbedded
import Synchronization
import Testing
import ThreadwireNIO
import ThreadwireServerTesting
@testable import ThreadwireTransport

/// The transport half of a connection's pipeline as `FramePipeline` builds
/// it, around a stand-in for the call layer.
@Suite("a connection's transport pipeline")
struct PipelineTests {
    /// Ends every read event, as the call layer does, and writes through its own context.
    final class CallLayer: ChannelInboundHandler, @unchecked Sendable {
        typealias InboundIn = ByteBuffer
        typealias OutboundOut = ByteBuffer
        var frames: [ByteBuffer] = []
        var context: ChannelHandlerContext?
        func handlerAdded(context: ChannelHandlerContext) { self.context = context }
        func channelRead(context: ChannelHandlerContext, data: NIOAny) { frames.append(unwrapInboundIn(data)) }
        func channelReadComplete(context: ChannelHandlerContext) {}
    }

    final class Gate: ReadGate, @unchecked Sendable {
        var allowed = true
        var writabilityChanges = 0
        var readsAllowed: Bool { allowed }
        func writabilityChanged() { writabilityChanges += 1 }
    }

    @Test("framing, then the call layer, then flow control: reads from the tail are held, the call layer's own go straight out")
    func flowControlComesLast() throws {
        let channel = EmbeddedChannel()
        let socketEnd = ReadCounter()  // next to the socket
        try channel.pipeline.syncOperations.addHandler(socketEnd)
        let callLayer = CallLayer()
        let flowControl = Mutex<FlowControlHandler?>(nil)
        let settings = ConnectionSettings(initialMaxFrameBytes: 1024, maxPartialFrameBytes: 4096, outboundHighWaterBytes: 4096)
        try FramePipeline.configure(channel, settings: settings, budget: PartialFrameBudget(limit: 4096), tls: nil) { accepted in
            flowControl.withLock { $0 = accepted.flowControl }
            try accepted.channel.pipeline.syncOperations.addHandler(callLayer)
        }
        let gate = Gate()
        try #require(flowControl.withLock { $0 }).gate = gate
        try channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 1)).wait()

        // The framing is before the call layer: it gets frame payloads.
        var frame = ByteBuffer(bytes: [0, 0, 0, 0, 3, 1, 2, 3])
        try channel.writeInbound(frame)
        #expect(callLayer.frames.map { Array($0.readableBytesView) } == [[1, 2, 3]])

        let before = socketEnd.reads
        gate.allowed = false
        channel.read()  // the channel's own read starts at the tail
        #expect(socketEnd.reads == before, "a read from the tail passes flow control, which holds it")
        // Issued from the call layer's place, a read meets no flow control
        // on its way out: flow control is not between the call layer and the socket.
        try #require(callLayer.context).read()
        #expect(socketEnd.reads == before + 1)

        // Writability passes the call layer on to flow control, which issues the held read.
        gate.allowed = true
        channel.pipeline.fireChannelWritabilityChanged()
        #expect(gate.writabilityChanges == 1)
        #expect(socketEnd.reads == before + 2)

        // The call layer's writes reach the socket.
        frame = ByteBuffer(bytes: [0, 0, 0, 0, 1, 9])
        try #require(callLayer.context).writeAndFlush(NIOAny(frame), promise: nil)
        #expect(try channel.readOutbound(as: ByteBuffer.self) == frame)
        _ = try channel.finish()
    }
}
