public import NIOCore

/// Counts the reads that reach its place in a pipeline (put next to the
/// socket: the reads that flow control and the gates before it let through).
public final class ReadCounter: ChannelOutboundHandler, @unchecked Sendable {
    public typealias OutboundIn = NIOAny
    public private(set) var reads = 0

    public init() {}

    public func read(context: ChannelHandlerContext) {
        reads += 1
        context.read()
    }
}
