import NIOCore
import NIOWebSocket
import ThreadwireNIO

/// NIO's WebSocket frame decoder, with what it holds of a frame not yet
/// complete counted in the server's budget for partial frames
/// (`limits.max_partial_frame_bytes`), as a TCP connection's frame decoder
/// counts it: past the budget the call layer answers RESOURCE_EXHAUSTED and
/// closes, so many sockets each trickling a large message cannot hold
/// unbounded memory between them.
struct BudgetedWebSocketDecoder: ByteToMessageDecoder {
    typealias InboundOut = WebSocketFrame

    private var decoder: WebSocketFrameDecoder
    private var share: PartialFrameShare

    init(maxFrameSize: Int, budget: PartialFrameBudget) {
        decoder = WebSocketFrameDecoder(maxFrameSize: maxFrameSize)
        share = PartialFrameShare(budget)
    }

    mutating func decode(context: ChannelHandlerContext, buffer: inout ByteBuffer) throws -> DecodingState {
        let state = try decoder.decode(context: context, buffer: &buffer)
        // After a whole frame too when nothing is left: the handler may not
        // call again on an empty buffer, and the frame's bytes are gone.
        if state == .needMoreData || buffer.readableBytes == 0 { try share.hold(buffer.readableBytes) }
        return state
    }

    mutating func decodeLast(context: ChannelHandlerContext, buffer: inout ByteBuffer, seenEOF: Bool) throws -> DecodingState {
        while try decode(context: context, buffer: &buffer) == .continue {}
        return .needMoreData
    }

    mutating func decoderRemoved(context: ChannelHandlerContext) {
        share.releaseAll()
    }

    /// In place of the decoder NIO's upgrader put on `channel` (the same
    /// position, so its protocol errors still reach the handler that
    /// answers them with a close frame), before any frame was read.
    static func replaceUpgradersDecoder(on channel: any Channel, maxFrameSize: Int, budget: PartialFrameBudget) throws {
        let pipeline = channel.pipeline.syncOperations
        let upgraders = try pipeline.handler(type: ByteToMessageHandler<WebSocketFrameDecoder>.self)
        try pipeline.addHandler(ByteToMessageHandler(BudgetedWebSocketDecoder(maxFrameSize: maxFrameSize, budget: budget)),
                                position: .after(upgraders))
        pipeline.removeHandler(upgraders, promise: nil)
    }
}
