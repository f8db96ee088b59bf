import NIOCore
import NIOEmbedded
import NIOWebSocket
import Testing
import ThreadwireNIO
@testable import ThreadwireWeb

/// The WebSocket's side of a session, event by event and without a socket:
/// what reaches the call layer from each kind of frame, and what leaves for
/// each frame the call layer writes or its close.
@Suite("WebSocket envelopes")
struct WebSocketEnvelopesTests {
    /// What passed the handler toward the call layer.
    final class CallLayer: ChannelInboundHandler, @unchecked Sendable {
        typealias InboundIn = ByteBuffer
        var envelopes: [[UInt8]] = []
        var errors: [any Error] = []
        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            envelopes.append(Array(unwrapInboundIn(data).readableBytesView))
        }
        func errorCaught(context: ChannelHandlerContext, error: any Error) { errors.append(error) }
    }

    let channel = EmbeddedChannel()
    let callLayer = CallLayer()

    init() throws {
        try channel.pipeline.syncOperations.addHandlers([WebSocketEnvelopes(limit: FrameSizeLimit(64)), callLayer])
        try channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 1)).wait()
    }

    /// A frame as a client sends it: masked.
    func fromClient(_ opcode: WebSocketOpcode, _ bytes: [UInt8], fin: Bool = true, masked: Bool = true) throws {
        let key: WebSocketMaskingKey? = masked ? WebSocketMaskingKey([0x11, 0x22, 0x33, 0x44]) : nil
        var data = channel.allocator.buffer(bytes: bytes)
        if let key { data.webSocketMask(key) }
        try channel.writeInbound(WebSocketFrame(fin: fin, opcode: opcode, maskKey: key, data: data))
    }

    func sent() throws -> [WebSocketFrame] {
        var frames: [WebSocketFrame] = []
        while let frame = try channel.readOutbound(as: WebSocketFrame.self) { frames.append(frame) }
        return frames
    }

    func closeCode(_ frame: WebSocketFrame) -> WebSocketErrorCode? {
        var data = frame.data
        return frame.opcode == .connectionClose ? data.readWebSocketErrorCode() : nil
    }

    @Test("a binary message reaches the call layer unmasked, one envelope each; fragments are joined into one")
    func binaryMessages() throws {
        try fromClient(.binary, [1, 2, 3])
        try fromClient(.binary, [4, 5], fin: false)
        try fromClient(.continuation, [6], fin: false)
        try fromClient(.continuation, [7, 8])
        #expect(callLayer.envelopes == [[1, 2, 3], [4, 5, 6, 7, 8]])
        #expect(try sent().isEmpty)
    }

    @Test("a message past the connection's frame limit is the frame error the call layer answers, whole or in fragments, and nothing after it is read")
    func overTheLimit() throws {
        try fromClient(.binary, [UInt8](repeating: 0, count: 65))
        #expect(callLayer.errors.count == 1)
        #expect(callLayer.errors.first as? FrameError == .frameTooLarge(length: 65, limit: 64))
        try fromClient(.binary, [1])
        #expect(callLayer.envelopes.isEmpty)

        let other = try WebSocketEnvelopesTests()
        try other.fromClient(.binary, [UInt8](repeating: 0, count: 40), fin: false)
        try other.fromClient(.continuation, [UInt8](repeating: 0, count: 40))
        #expect(other.callLayer.errors.first as? FrameError == .frameTooLarge(length: 80, limit: 64))
        #expect(other.callLayer.envelopes.isEmpty)
    }

    @Test("the call layer's frames leave as binary messages without their 5-byte header, several in one buffer as several messages")
    func outboundFrames() throws {
        var batch = channel.allocator.buffer(bytes: Framing.frame([9, 8, 7]))
        batch.writeBytes(Framing.frame([]))
        batch.writeBytes(Framing.frame([6]))
        try channel.writeOutbound(batch)
        let frames = try sent()
        #expect(frames.map(\.opcode) == [.binary, .binary, .binary])
        #expect(frames.map { Array($0.data.readableBytesView) } == [[9, 8, 7], [], [6]])
        #expect(frames.allSatisfy { $0.fin && $0.maskKey == nil })
    }

    @Test("a ping is answered with a pong carrying its data; a pong is ignored")
    func pings() throws {
        try fromClient(.ping, [1, 2])
        try fromClient(.pong, [3])
        let frames = try sent()
        #expect(frames.map(\.opcode) == [.pong])
        #expect(Array(frames[0].data.readableBytesView) == [1, 2])
        #expect(callLayer.envelopes.isEmpty)
    }

    @Test("a client's close is answered with its code and the session ends")
    func clientCloses() throws {
        var code = channel.allocator.buffer(capacity: 2)
        code.write(webSocketErrorCode: .normalClosure)
        try fromClient(.connectionClose, Array(code.readableBytesView))
        let frames = try sent()
        #expect(frames.count == 1 && closeCode(frames[0]) == .normalClosure)
        #expect(!channel.isActive)
    }

    @Test("a close with a code that may not be sent on the wire (1005, 1006, 1015) or with none is answered as a normal closure; 4000 is echoed")
    func clientCloseCodes() throws {
        for (sent, expected) in [(1005, 1000), (1006, 1000), (1015, 1000), (nil, 1000), (4000, 4000), (1001, 1001)] as [(Int?, Int)] {
            let session = try WebSocketEnvelopesTests()
            try session.fromClient(.connectionClose, sent.map { [UInt8($0 >> 8), UInt8($0 & 0xff)] } ?? [])
            let frames = try session.sent()
            #expect(frames.count == 1 && session.closeCode(frames[0]) == WebSocketErrorCode(codeNumber: expected), "\(String(describing: sent))")
        }
    }

    @Test("the server's close sends a close frame (going away) before the socket closes")
    func serverCloses() throws {
        try channel.close().wait()
        let frames = try sent()
        #expect(frames.count == 1 && closeCode(frames[0]) == .goingAway)
        #expect(String(buffer: frames[0].data.getSlice(at: frames[0].data.readerIndex + 2, length: frames[0].data.readableBytes - 2)!)
                    == "the server ended this session")
    }

    @Test("refused with a close frame saying why: text (1003), an unmasked frame, reserved bits, a continuation with no message (1002)")
    func refusals() throws {
        let cases: [(WebSocketOpcode, Bool, WebSocketErrorCode)] = [
            (.text, true, .unacceptableData), (.binary, false, .protocolError), (.continuation, true, .protocolError),
        ]
        for (opcode, masked, expected) in cases {
            let session = try WebSocketEnvelopesTests()
            try session.fromClient(opcode, [0x68, 0x69], masked: masked)
            let frames = try session.sent()
            #expect(frames.count == 1 && session.closeCode(frames[0]) == expected, "\(opcode)")
            #expect(!session.channel.isActive)
            #expect(session.callLayer.envelopes.isEmpty)
        }
        let session = try WebSocketEnvelopesTests()
        var data = session.channel.allocator.buffer(bytes: [1])
        let key = WebSocketMaskingKey([1, 2, 3, 4])!
        data.webSocketMask(key)
        try session.channel.writeInbound(WebSocketFrame(fin: true, rsv1: true, opcode: .binary, maskKey: key, data: data))
        #expect(try session.sent().map { session.closeCode($0) } == [.protocolError])
        #expect(session.callLayer.envelopes.isEmpty)
    }
}

/// What a socket holds of a message not yet complete counts in the server's
/// budget for partial frames, as a TCP connection's frame decoder counts it.
@Suite("WebSocket decoder and the partial-frame budget")
struct BudgetedWebSocketDecoderTests {
    final class Sink: ChannelInboundHandler, @unchecked Sendable {
        typealias InboundIn = WebSocketFrame
        var frames: [WebSocketFrame] = []
        var errors: [any Error] = []
        func channelRead(context: ChannelHandlerContext, data: NIOAny) { frames.append(unwrapInboundIn(data)) }
        func errorCaught(context: ChannelHandlerContext, error: any Error) { errors.append(error) }
    }

    static func socket(_ budget: PartialFrameBudget) throws -> (EmbeddedChannel, Sink) {
        let channel = EmbeddedChannel()
        let sink = Sink()
        try channel.pipeline.syncOperations.addHandlers([
            ByteToMessageHandler(BudgetedWebSocketDecoder(maxFrameSize: 4096, budget: budget)), sink,
        ])
        return (channel, sink)
    }

    /// A masked binary frame's header announcing `length` bytes, then `sent` of them.
    static func partialFrame(length: Int, sent: Int) -> ByteBuffer {
        var bytes = ByteBuffer(bytes: [0x82, 0x80 | 126, UInt8(length >> 8), UInt8(length & 0xff), 0, 0, 0, 0])
        bytes.writeBytes([UInt8](repeating: 7, count: sent))
        return bytes
    }

    @Test("sockets share the budget: one holding a partial message within it goes on, one that would pass it is refused; a finished message gives its share back")
    func sharedBudget() throws {
        let budget = PartialFrameBudget(limit: 100)
        let (first, firstSink) = try Self.socket(budget)
        let (second, secondSink) = try Self.socket(budget)
        try first.writeInbound(Self.partialFrame(length: 1000, sent: 60))
        #expect(budget.heldBytes == 60 && firstSink.errors.isEmpty)
        try second.writeInbound(Self.partialFrame(length: 1000, sent: 60))
        #expect(secondSink.errors.map { $0 as? FrameError } == [.partialFramesOverBudget(limit: 100)])
        #expect(secondSink.frames.isEmpty && budget.heldBytes == 60)
        try first.writeInbound(ByteBuffer(bytes: [UInt8](repeating: 7, count: 940)))
        #expect(firstSink.frames.count == 1 && firstSink.frames[0].length == 1000)
        #expect(budget.heldBytes == 0)
        _ = try? second.finish()
        _ = try first.finish()
        #expect(budget.heldBytes == 0)
    }

    @Test("a socket that closes with a partial message gives its share back")
    func closingReleases() throws {
        let budget = PartialFrameBudget(limit: 100)
        let (socket, _) = try Self.socket(budget)
        try socket.writeInbound(Self.partialFrame(length: 1000, sent: 50))
        #expect(budget.heldBytes == 50)
        _ = try? socket.finish()
        #expect(budget.heldBytes == 0)
    }
}
