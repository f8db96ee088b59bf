import NIOConcurrencyHelpers
public import NIOCore

/// Flushes, once an event loop's tick has handled all its reads, the
/// channels whose answers were written during those reads (through the
/// context of the handler that wrote them: a flush from there skips the
/// pipeline's tail and the handlers after it).
///
/// A loop woken for sixteen connections used to write each one's answers as
/// it finished reading it: its client, waiting for any of them, was woken
/// sixteen times, and on one host (a sidecar, a load generator, loopback)
/// each of those wake-ups is paid by the writer's system call. Written back
/// to back after the tick's reads, they find the client awake from the
/// first. The answers leave in the same iteration of the loop, before it
/// waits again, and in the same order per connection.
///
/// A loop serving one connection at a time gains nothing from waiting (no
/// other answers would join) and would pay a task per request, so it
/// flushes at once. "One at a time" is read from the clock: the read began
/// more than `burstGap` after the loop's last flush ended.
///
/// Confined to its event loop: `flushAtEndOfTick` is called on it.
public final class TickFlusher: @unchecked Sendable {
    private let eventLoop: any EventLoop
    private let burstGap: TimeAmount
    private var pending: [ChannelHandlerContext] = []
    private var lastFlushEnded = NIODeadline.distantPast

    /// `burstGap`: reads closer than this to the last flush are taken for
    /// a burst of connections and wait for the tick's end. The default is
    /// under a loopback round trip and over a read's handling.
    public init(eventLoop: any EventLoop, burstGap: TimeAmount = .microseconds(15)) {
        self.eventLoop = eventLoop
        self.burstGap = burstGap
    }

    /// The writes made through `context` are flushed after the reads of
    /// this tick, or at once (outside a burst). On the event loop.
    public func flushAtEndOfTick(_ context: ChannelHandlerContext) {
        if pending.isEmpty, NIODeadline.now() - lastFlushEnded > burstGap {
            context.flush()
            lastFlushEnded = .now()
            return
        }
        pending.append(context)
        // One task per tick, not per channel.
        if pending.count == 1 { eventLoop.execute { self.flushPending() } }
    }

    private func flushPending() {
        // A flush can close a channel, whose handlers may ask for another
        // flush: that one joins a new batch.
        var batch: [ChannelHandlerContext] = []
        swap(&batch, &pending)
        for context in batch { context.flush() }
        lastFlushEnded = .now()
        batch.removeAll(keepingCapacity: true)
        if pending.isEmpty { swap(&batch, &pending) }
    }
}

/// One `TickFlusher` per event loop, made when a loop's first connection
/// asks (once per connection, not per request).
public final class TickFlushers: Sendable {
    private let byLoop = NIOLockedValueBox([ObjectIdentifier: TickFlusher]())

    public init() {}

    public func flusher(for eventLoop: any EventLoop) -> TickFlusher {
        byLoop.withLockedValue { table in
            let key = ObjectIdentifier(eventLoop)
            if let existing = table[key] { return existing }
            let made = TickFlusher(eventLoop: eventLoop)
            table[key] = made
            return made
        }
    }
}
