import NIOCore
import NIOEmbedded
import Testing
@testable import ThreadwireWeb

/// A web connection that no request has claimed yet, at the server's
/// graceful shutdown: closed, where nothing else would close it.
@Suite("web connections without a whole request at shutdown")
struct CloseUnclaimedOnQuiesceTests {
    /// Hears the events that pass the handler.
    final class Later: ChannelInboundHandler, @unchecked Sendable {
        typealias InboundIn = NIOAny
        var events: [String] = []
        func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) { events.append("\(event)") }
    }

    @Test("the quiesce event closes the connection; other events pass on and leave it open")
    func quiesceCloses() throws {
        let channel = EmbeddedChannel()
        let later = Later()
        try channel.pipeline.syncOperations.addHandlers([CloseUnclaimedOnQuiesce(), later])
        try channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 1)).wait()

        channel.pipeline.fireUserInboundEventTriggered(ChannelEvent.inputClosed)
        #expect(channel.isActive)
        #expect(later.events == ["\(ChannelEvent.inputClosed)"])

        channel.pipeline.fireUserInboundEventTriggered(ChannelShouldQuiesceEvent())
        #expect(!channel.isActive)
        #expect(later.events.count == 1, "the quiesce event went on past the handler: \(later.events)")
    }

    @Test("once a request claims the connection and the handler is removed, quiescing is the new owner's to handle")
    func removedHandlerLeavesQuiesceToTheOwner() throws {
        let channel = EmbeddedChannel()
        let unclaimed = CloseUnclaimedOnQuiesce()
        let later = Later()
        try channel.pipeline.syncOperations.addHandlers([unclaimed, later])
        try channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 1)).wait()
        channel.pipeline.syncOperations.removeHandler(unclaimed, promise: nil)
        channel.embeddedEventLoop.run()

        channel.pipeline.fireUserInboundEventTriggered(ChannelShouldQuiesceEvent())
        #expect(channel.isActive)
        #expect(later.events.count == 1)
        _ = try? channel.finish()
    }
}
