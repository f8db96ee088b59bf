import NIOCore
import NIOEmbedded
import Testing
import ThreadwireNIO

/// `TickFlusher`: channels of one event loop, flushed together once the
/// loop's tick has run its reads, each in its own order. `burstGap` is
/// given, not timed: `.always` takes every read for part of a burst,
/// `.never` none.
@Suite("tick flusher (EmbeddedEventLoop)")
struct TickFlushTests {
    /// The context a connection's handler would pass: one added to `channel`.
    func entry(_ channel: EmbeddedChannel) throws -> ChannelHandlerContext {
        try channel.pipeline.syncOperations.addHandler(Writer())
        return try channel.pipeline.syncOperations.context(handlerType: Writer.self)
    }

    final class Writer: ChannelInboundHandler {
        typealias InboundIn = ByteBuffer
    }

    func written(_ channel: EmbeddedChannel) throws -> [String] {
        var out: [String] = []
        while let buffer = try channel.readOutbound(as: ByteBuffer.self) {
            out.append(String(buffer: buffer))
        }
        return out
    }

    @Test("two channels' writes are held until the tick's tasks run, then both leave in order")
    func flushedAfterTheTick() throws {
        let loop = EmbeddedEventLoop()
        let first = EmbeddedChannel(loop: loop)
        let firstEntry = try entry(first)
        let second = EmbeddedChannel(loop: loop)
        let secondEntry = try entry(second)
        let flusher = TickFlusher(eventLoop: loop, burstGap: .always)

        first.write(ByteBuffer(string: "a1"), promise: nil)
        first.write(ByteBuffer(string: "a2"), promise: nil)
        flusher.flushAtEndOfTick(firstEntry)
        second.write(ByteBuffer(string: "b1"), promise: nil)
        flusher.flushAtEndOfTick(secondEntry)
        #expect(try written(first).isEmpty)
        #expect(try written(second).isEmpty)

        loop.run()
        #expect(try written(first) == ["a1", "a2"])
        #expect(try written(second) == ["b1"])
    }

    @Test("a channel asked for in the next tick is flushed in that tick")
    func secondTick() throws {
        let loop = EmbeddedEventLoop()
        let channel = EmbeddedChannel(loop: loop)
        let channelEntry = try entry(channel)
        let flusher = TickFlusher(eventLoop: loop, burstGap: .always)

        channel.write(ByteBuffer(string: "one"), promise: nil)
        flusher.flushAtEndOfTick(channelEntry)
        loop.run()
        #expect(try written(channel) == ["one"])

        channel.write(ByteBuffer(string: "two"), promise: nil)
        flusher.flushAtEndOfTick(channelEntry)
        #expect(try written(channel).isEmpty)
        loop.run()
        #expect(try written(channel) == ["two"])
    }

    @Test("a channel closed before the tick ends is passed over; the others are flushed")
    func closedBeforeTheTickEnds() throws {
        let loop = EmbeddedEventLoop()
        let closing = EmbeddedChannel(loop: loop)
        let closingEntry = try entry(closing)
        let open = EmbeddedChannel(loop: loop)
        let openEntry = try entry(open)
        let flusher = TickFlusher(eventLoop: loop, burstGap: .always)

        closing.write(ByteBuffer(string: "lost"), promise: nil)
        flusher.flushAtEndOfTick(closingEntry)
        open.write(ByteBuffer(string: "kept"), promise: nil)
        flusher.flushAtEndOfTick(openEntry)
        _ = try? closing.finish()

        loop.run()
        #expect(try written(open) == ["kept"])
    }

    @Test("outside a burst a channel is flushed at once, with no task left for the tick")
    func outsideABurst() throws {
        let loop = EmbeddedEventLoop()
        let first = EmbeddedChannel(loop: loop)
        let firstEntry = try entry(first)
        let second = EmbeddedChannel(loop: loop)
        let secondEntry = try entry(second)
        let flusher = TickFlusher(eventLoop: loop, burstGap: .never)

        first.write(ByteBuffer(string: "a"), promise: nil)
        flusher.flushAtEndOfTick(firstEntry)
        #expect(try written(first) == ["a"])
        second.write(ByteBuffer(string: "b"), promise: nil)
        flusher.flushAtEndOfTick(secondEntry)
        #expect(try written(second) == ["b"])
    }
}

extension TimeAmount {
    /// Longer than the time since boot: every read is within it.
    static let always = TimeAmount.hours(1_000_000)
    /// Any gap is longer.
    static let never = TimeAmount.nanoseconds(-1)
}
