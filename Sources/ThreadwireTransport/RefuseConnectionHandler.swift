public import NIOCore

/// The whole pipeline of a connection the server will not serve: it sends
/// the refusal frame (if any; none through TLS) and closes. Closing with
/// bytes the client sent still unread resets the connection, which can drop
/// the refusal before the client reads it; so while the budget allows a few
/// (`DescriptorBudget.takeLinger`), a refused connection shuts its side down
/// instead, discards what the client sends and closes once the client does
/// or `linger` has passed. Past those few it closes as soon as the refusal is
/// written: a flood of refused connections must not use up the descriptors
/// the reserve keeps free.
public final class RefuseConnectionHandler: ChannelInboundHandler {
    public typealias InboundIn = ByteBuffer
    public typealias OutboundOut = ByteBuffer

    private let refusal: [UInt8]?
    private let budget: DescriptorBudget?
    private let linger: TimeAmount
    private var refused = false
    private var lingers = false
    private var closeLater: Scheduled<Void>?

    public init(refusal: [UInt8]?, budget: DescriptorBudget?, linger: TimeAmount = .milliseconds(100)) {
        self.refusal = refusal
        self.budget = budget
        self.linger = linger
    }

    public func handlerAdded(context: ChannelHandlerContext) {
        if context.channel.isActive { refuse(context: context) }
    }

    public func channelActive(context: ChannelHandlerContext) {
        refuse(context: context)
        context.fireChannelActive()
    }

    private func refuse(context: ChannelHandlerContext) {
        guard !refused else { return }
        refused = true
        guard let refusal else { context.close(promise: nil); return }
        let loopBound = NIOLoopBound(context, eventLoop: context.eventLoop)
        lingers = budget?.takeLinger() ?? true
        if lingers {
            closeLater = context.eventLoop.scheduleTask(in: linger) { loopBound.value.close(promise: nil) }
        }
        let lingers = self.lingers
        context.writeAndFlush(wrapOutboundOut(context.channel.allocator.buffer(bytes: refusal))).whenComplete { _ in
            loopBound.value.close(mode: lingers ? .output : .all, promise: nil)
        }
    }

    public func channelRead(context: ChannelHandlerContext, data: NIOAny) {}

    public func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        // The client closed its side: nothing more to wait for.
        if event as? ChannelEvent == .inputClosed { context.close(promise: nil) }
    }

    public func channelInactive(context: ChannelHandlerContext) {
        closeLater?.cancel()
        if lingers {
            lingers = false
            budget?.giveLinger()
        }
        context.fireChannelInactive()
    }

    public func errorCaught(context: ChannelHandlerContext, error: any Error) {
        context.close(promise: nil)
    }
}
