public import NIOCore

/// What decides whether a connection's socket may be read: the call layer's
/// side of flow control (its request queue, its closing state).
public protocol ReadGate: AnyObject, Sendable {
    /// Whether the socket may be read now.
    var readsAllowed: Bool { get }
    /// On the event loop, when the channel's writability flips or it closes.
    func writabilityChanged()
}

/// Stops reading a connection while its answers are not being taken (the
/// channel is not writable) or its request queue is full, and reads again
/// when both clear: the client's TCP window then pushes back on it.
///
/// Its place is the pipeline's end, after the call layer (`FramePipeline`):
/// the read it gates starts at the tail, and writability reaches it through
/// the call layer, while a request's own events never pass it.
public final class FlowControlHandler: ChannelDuplexHandler, @unchecked Sendable {
    public typealias InboundIn = NIOAny
    public typealias OutboundIn = NIOAny

    private var context: ChannelHandlerContext?
    private var readPending = false
    /// Set once by the call layer when it takes the connection (event loop only).
    public var gate: (any ReadGate)?
    private let paused: @Sendable () -> Void

    /// - Parameter paused: called when a read is first held back (a metric).
    public init(paused: @escaping @Sendable () -> Void = {}) { self.paused = paused }

    public func handlerAdded(context: ChannelHandlerContext) { self.context = context }
    public func handlerRemoved(context: ChannelHandlerContext) { self.context = nil }

    public func read(context: ChannelHandlerContext) {
        if let gate, !gate.readsAllowed {
            if !readPending { paused() }
            readPending = true
            return
        }
        context.read()
    }

    public func channelWritabilityChanged(context: ChannelHandlerContext) {
        gate?.writabilityChanged()
        resumeIfAllowed()
        context.fireChannelWritabilityChanged()
    }

    /// On the event loop: issues the read that was held, if reads may go on.
    public func resumeIfAllowed() {
        guard readPending, let context, gate?.readsAllowed ?? true else { return }
        readPending = false
        context.read()
    }
}
