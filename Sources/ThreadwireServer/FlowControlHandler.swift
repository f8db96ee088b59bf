import NIOCore

/// Stops reading a connection while its answers are not being taken (the
/// channel is not writable) or its request queue is full, and reads again
/// when both clear: the client's TCP window then pushes back on it.
final class FlowControlHandler: ChannelDuplexHandler, @unchecked Sendable {
    typealias InboundIn = NIOAny
    typealias OutboundIn = NIOAny

    private var context: ChannelHandlerContext?
    private var readPending = false
    var connection: Connection?
    private let metrics: ServerMetrics

    init(metrics: ServerMetrics) { self.metrics = metrics }

    func handlerAdded(context: ChannelHandlerContext) { self.context = context }
    func handlerRemoved(context: ChannelHandlerContext) { self.context = nil }

    func read(context: ChannelHandlerContext) {
        if let connection, !connection.readsAllowed {
            if !readPending { metrics.backpressurePauses.increment() }
            readPending = true
            return
        }
        context.read()
    }

    func channelWritabilityChanged(context: ChannelHandlerContext) {
        connection?.writabilityChanged()
        resumeIfAllowed()
        context.fireChannelWritabilityChanged()
    }

    /// On the event loop: issues the read that was held, if reads may go on.
    func resumeIfAllowed() {
        guard readPending, let context, connection?.readsAllowed ?? true else { return }
        readPending = false
        context.read()
    }
}
