import NIOCore
import NIOWebSocket
import ThreadwireNIO

/// Between a WebSocket's frames and the call layer, on the socket's own
/// channel: each binary message in is one envelope, held to the
/// connection's frame limit as a frame is (over it, the call layer answers
/// RESOURCE_EXHAUSTED and closes, as on TCP); each frame the call layer
/// writes goes out as one binary message without its 5-byte header
/// (WebSocket delimits). Control frames are answered here, and a close by
/// the server sends a close frame first, so a client always learns the
/// session ended on purpose.
final class WebSocketEnvelopes: ChannelDuplexHandler, RemovableChannelHandler {
    typealias InboundIn = WebSocketFrame
    typealias InboundOut = ByteBuffer
    typealias OutboundIn = ByteBuffer
    typealias OutboundOut = WebSocketFrame

    private let limit: FrameSizeLimit
    /// The fragments of a binary message that is still arriving.
    private var fragments: ByteBuffer?
    /// After a close frame, no other frame may follow it (RFC 6455 5.5.1).
    private var closeSent = false
    /// A message past the frame limit was refused: the call layer is ending
    /// the session, and nothing after it is read.
    private var overLimit = false

    init(limit: FrameSizeLimit) { self.limit = limit }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let frame = unwrapInboundIn(data)
        guard !closeSent && !overLimit else { return }
        guard !(frame.rsv1 || frame.rsv2 || frame.rsv3) else {
            return refuse(context, .protocolError, "reserved bits set, and no extension was negotiated")
        }
        guard let maskKey = frame.maskKey else { return refuse(context, .protocolError, "a client's frames must be masked") }
        var payload = frame.data
        payload.webSocketUnmask(maskKey)
        switch frame.opcode {
        case .binary where fragments == nil:
            if frame.fin { deliver(context, payload) } else { gather(context, payload) }
        case .continuation where fragments != nil:
            gather(context, payload)
            if frame.fin, let message = fragments.take() { deliver(context, message) }
        case .binary, .continuation:
            refuse(context, .protocolError, frame.opcode == .binary ? "a new message began before the last one ended" : "a continuation with no message begun")
        case .text:
            refuse(context, .unacceptableData, "send binary messages, each one serialized threadwire.v1.Envelope")
        case .ping:
            context.writeAndFlush(wrapOutboundOut(WebSocketFrame(fin: true, opcode: .pong, data: payload)), promise: nil)
        case .pong:
            break
        case .connectionClose:
            // Answered with the client's own code, as the protocol asks (a
            // code that may not be sent, or none, as a normal closure); the session then ends.
            let received: UInt16? = payload.getInteger(at: payload.readerIndex)
            let code = received.map(Int.init).flatMap { Self.sendableCloseCodes($0) ? WebSocketErrorCode(codeNumber: $0) : nil }
            closeSaying(context, code ?? .normalClosure, "")
        default:
            refuse(context, .protocolError, "opcode \(frame.opcode) is not defined")
        }
    }

    /// A whole message to the call layer, or past the frame limit, the
    /// error a frame that long gets.
    private func deliver(_ context: ChannelHandlerContext, _ message: ByteBuffer) {
        guard message.readableBytes <= limit.current else {
            overLimit = true
            context.fireErrorCaught(FrameError.frameTooLarge(length: message.readableBytes, limit: limit.current))
            return
        }
        context.fireChannelRead(wrapInboundOut(message))
    }

    /// Fragments are held only up to the frame limit: the length is known
    /// too late to refuse earlier, but never grows past it.
    private func gather(_ context: ChannelHandlerContext, _ fragment: ByteBuffer) {
        var held = fragments ?? context.channel.allocator.buffer(capacity: fragment.readableBytes)
        fragments = nil
        guard held.readableBytes + fragment.readableBytes <= limit.current else {
            overLimit = true
            context.fireErrorCaught(FrameError.frameTooLarge(length: held.readableBytes + fragment.readableBytes, limit: limit.current))
            return
        }
        var fragment = fragment
        held.writeBuffer(&fragment)
        fragments = held
    }

    func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        guard !closeSent else {
            promise?.fail(ChannelError.outputClosed)
            return
        }
        // Whole frames, several in one buffer when a batch was flushed together.
        // Each message goes out as the next is found, so the last one (which
        // carries the promise) is known without collecting them first.
        var frames = unwrapOutboundIn(data)
        var pending: ByteBuffer?
        while let length: UInt32 = frames.getInteger(at: frames.readerIndex + 1),
              frames.readableBytes >= Framing.headerSize + Int(length) {
            frames.moveReaderIndex(forwardBy: Framing.headerSize)
            if let message = pending {
                context.write(wrapOutboundOut(WebSocketFrame(fin: true, opcode: .binary, data: message)), promise: nil)
            }
            pending = frames.readSlice(length: Int(length))!
        }
        assert(frames.readableBytes == 0, "the call layer writes whole frames")
        guard let last = pending else {
            promise?.succeed()
            return
        }
        context.write(wrapOutboundOut(WebSocketFrame(fin: true, opcode: .binary, data: last)), promise: promise)
    }

    /// The call layer ends the session (drain, idle, a failed initialize, a
    /// backlog past its limit) after its last frame said why.
    func close(context: ChannelHandlerContext, mode: CloseMode, promise: EventLoopPromise<Void>?) {
        guard mode == .all && !closeSent else {
            context.close(mode: mode, promise: promise)
            return
        }
        closeSaying(context, .goingAway, "the server ended this session", promise: promise)
    }

    /// How long a close frame may wait for a client that does not read
    /// before the socket closes without it.
    static let closeFrameGrace: TimeAmount = .seconds(2)

    /// A close frame, then the socket closed once it left (or after
    /// `closeFrameGrace`). Closing at once would drop it when the close comes
    /// while the channel is still writing, as when the call layer closes on
    /// its last frame's completion.
    private func closeSaying(_ context: ChannelHandlerContext, _ code: WebSocketErrorCode, _ reason: String,
                             promise: EventLoopPromise<Void>? = nil) {
        closeSent = true
        fragments = nil
        let frame = Self.closeFrame(code, reason, allocator: context.channel.allocator)
        let bound = context.loopBound
        let closed = NIOLoopBoundBox(false, eventLoop: context.eventLoop)
        let closeOnce: @Sendable () -> Void = {
            guard !closed.value else { return }
            closed.value = true
            bound.value.close(mode: .all, promise: promise)
        }
        let grace = context.eventLoop.scheduleTask(in: Self.closeFrameGrace) { closeOnce() }
        context.writeAndFlush(wrapOutboundOut(frame)).whenComplete { _ in
            grace.cancel()
            closeOnce()
        }
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        if error is NIOWebSocketError {
            // WebSocketProtocolErrorHandler has sent its close frame and closes the channel.
            closeSent = true
            return
        }
        context.fireErrorCaught(error)
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        // The client shut its side without a close frame: nothing more can come.
        if case ChannelEvent.inputClosed = event {
            context.close(promise: nil)
            return
        }
        context.fireUserInboundEventTriggered(event)
    }

    private func refuse(_ context: ChannelHandlerContext, _ code: WebSocketErrorCode, _ reason: String) {
        closeSaying(context, code, reason)
    }

    /// Codes a close frame may carry (RFC 6455 7.4): 1004–1006 and 1015 are
    /// reserved, 1016–2999 unassigned.
    static func sendableCloseCodes(_ code: Int) -> Bool {
        (1000...1003).contains(code) || (1007...1014).contains(code) || (3000...4999).contains(code)
    }

    /// A close frame's reason is at most 123 bytes (a control frame carries 125).
    static func closeFrame(_ code: WebSocketErrorCode, _ reason: String, allocator: ByteBufferAllocator) -> WebSocketFrame {
        var data = allocator.buffer(capacity: 125)
        data.write(webSocketErrorCode: code)
        var utf8 = Substring(reason).utf8.prefix(123)
        while String(utf8) == nil { utf8 = utf8.dropLast() }
        data.writeBytes(utf8)
        return WebSocketFrame(fin: true, opcode: .connectionClose, data: data)
    }
}

private extension Optional {
    mutating func take() -> Wrapped? {
        defer { self = nil }
        return self
    }
}
