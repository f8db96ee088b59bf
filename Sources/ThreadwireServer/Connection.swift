// Over 400 lines: the I/O of one connection (requests, writes, the outbox,
// notifications, server requests, closing); its state and the decisions on
// it are ConnectionStateMachine's, under one lock here.
import NIOConcurrencyHelpers
import NIOCore
import Synchronization
import ThreadwireNIO
import ThreadwireTransport
import ThreadwireCore
import ThreadwireWire

/// One client connection: its state machine under one lock, and the I/O
/// that carries out what the machine decides. Every frame reaches the
/// socket on the event loop, through the connection handler's context (the
/// channel once that handler has left the pipeline);
/// frames sent from other threads, and notifications, wait in the outbox
/// until the loop drains it. The lock keeps notification sequence numbers
/// in the order the frames are queued.
///
/// Memory a client can make the server hold is bounded by the machine:
/// requests read but not answered (count and bytes: past them reads stop),
/// responses (the request loop starts the next request only while the
/// channel is writable), and notifications (past the backlog limit the
/// connection is closed).
final class Connection: ReadGate, Sendable {
    let id: ConnectionID
    let channel: any Channel
    // Kept apart from the channel: reading them through the existential
    // retains and releases the channel on every notification.
    let eventLoop: any EventLoop
    private let allocator: ByteBufferAllocator
    private let limits: ServerLimits
    private let metrics: ServerMetrics

    /// The machine, and who waits on it. Nothing is written to the channel
    /// under this lock: a write can flush, complete promises and fire
    /// writability events synchronously, and those take the lock again.
    /// Notifications are numbered and queued in the outbox under it, so
    /// their numbers leave in order.
    private struct Shared {
        var machine: ConnectionStateMachine {
            // No `oldValue`: the machine is still changed in place (SE-0268).
            didSet { loopFlags.store(machine.loopFlags) }
        }
        /// The machine's `loopFlags`, read without the lock.
        let loopFlags: LoopFlagsMirror
        /// The shutdown drain, waiting for the queue to empty.
        var drainWaiters: [CheckedContinuation<Void, Never>] = []
        /// Request loops waiting for the channel to take writes.
        var writableWaiters: [CheckedContinuation<Void, Never>] = []
        /// Replays waiting for room in the backlog (`waitForReplayRoom`).
        var roomWaiters: [(bytes: Int, continuation: CheckedContinuation<Void, Never>)] = []
    }
    private let shared: NIOLockedValueBox<Shared>
    private let loopFlags: LoopFlagsMirror
    /// Resumes reads on the channel's event loop once the queue drains.
    private let resumeReads: @Sendable () -> Void
    /// Small until initialize authenticates, then `limits.maxFrameBytes`.
    let frameLimit: FrameSizeLimit
    /// The principal a verified client certificate names (mutual TLS), read
    /// once the handshake is done (before the first request is handled).
    private let certified = NIOLockedValueBox<Principal?>(nil)
    var certificatePrincipal: Principal? { certified.withLockedValue { $0 } }
    func setCertificatePrincipal(_ principal: Principal?) { certified.withLockedValue { $0 = principal } }

    /// Accepted on the peer listener (`--peer-listen`): only other instances belong here.
    let onPeerListener: Bool

    init(id: ConnectionID, channel: any Channel, limits: ServerLimits, metrics: ServerMetrics,
         frameLimit: FrameSizeLimit? = nil, onPeerListener: Bool = false,
         resumeReads: @escaping @Sendable () -> Void) {
        self.id = id
        self.onPeerListener = onPeerListener
        self.channel = channel
        self.eventLoop = channel.eventLoop
        self.allocator = channel.allocator
        self.limits = limits
        self.metrics = metrics
        self.frameLimit = frameLimit ?? FrameSizeLimit(limits.maxFrameBytes)
        self.resumeReads = resumeReads
        let machine = ConnectionStateMachine(bounds: .init(
            maxQueuedRequests: limits.maxQueuedRequests, maxQueuedRequestBytes: limits.maxQueuedRequestBytes,
            maxNotificationBacklogBytes: limits.maxNotificationBacklogBytes))
        loopFlags = LoopFlagsMirror(machine.loopFlags)
        shared = NIOLockedValueBox(Shared(machine: machine, loopFlags: loopFlags))
    }

    var isInitialized: Bool { shared.withLockedValue { $0.machine.isInitialized } }

    /// Whether a request may start now; the refusal otherwise.
    func admits(requiresHandshake: Bool, method: String) -> RequestError? {
        // A method without the handshake (health/check) is admitted in any state.
        if !requiresHandshake || loopFlags.load().contains(.admitsAll) { return nil }
        return shared.withLockedValue { $0.machine.admits(requiresHandshake: requiresHandshake, method: method) }
    }

    /// Who this connection acts as (`Principal.standalone` until initialize,
    /// and always on a server without authentication).
    var principal: Principal { shared.withLockedValue { $0.machine.session?.principal ?? .standalone } }

    /// Whether this is another instance relaying requests (never relayed again).
    var isPeer: Bool { shared.withLockedValue { $0.machine.session?.peer ?? false } }

    /// The notification methods the client opted out of.
    var optedOut: [String] { shared.withLockedValue { Array($0.machine.session?.optOut ?? []) } }

    /// Requests relayed to other instances for this client (set by the
    /// forwarder; closed with the connection).
    let upstreams = NIOLockedValueBox<[String: Upstream]>([:])

    func markInitialized(optOut: [String], principal: Principal = .standalone, credential: [UInt8]? = nil, peer: Bool = false,
                         capabilities: Set<ClientCapability> = []) -> Bool {
        let session = ConnectionStateMachine.Session(principal: principal, optOut: Set(optOut), credential: credential, peer: peer,
                                                     capabilities: capabilities)
        let done = shared.withLockedValue { $0.machine.initialized(session) }
        if done { frameLimit.raise(to: limits.maxFrameBytes) }
        return done
    }

    /// After the tokens were reloaded: false if this connection authenticated
    /// with a token that no longer names its principal.
    func credentialStillValid(_ authenticator: Authenticator) -> Bool {
        guard let session = shared.withLockedValue({ $0.machine.session }), let credential = session.credential else { return true }
        return authenticator.principal(presenting: credential) == session.principal
    }

    // MARK: Inbound queue

    /// Counts a request of `bytes` in. Returns false when the queue is now
    /// full, so reads stop until `finished` drains it.
    func admit(bytes: Int) -> Bool {
        shared.withLockedValue { $0.machine.requestQueued(bytes: bytes) }
    }

    func finished(bytes: Int) {
        let (finished, drained) = shared.withLockedValue { shared -> (ConnectionStateMachine.Finished, [CheckedContinuation<Void, Never>]) in
            let finished = shared.machine.requestFinished(bytes: bytes)
            var drained: [CheckedContinuation<Void, Never>] = []
            if finished.queueEmpty { swap(&drained, &shared.drainWaiters) }
            return (finished, drained)
        }
        for waiter in drained { waiter.resume() }
        if finished.resumeReads { resumeReads() }
    }

    /// Returns once nothing of this connection is queued or running, or once
    /// it cannot finish its queue: its client takes no answers (the channel
    /// is not writable) or it closed. Resumed by the events that change
    /// that, never by polling (the shutdown drain waits on it).
    func waitUntilRequestsDone() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let done = shared.withLockedValue { shared -> Bool in
                if shared.machine.drainDone(channelWritable: channel.isWritable, channelActive: channel.isActive) { return true }
                shared.drainWaiters.append(continuation)
                return false
            }
            if done { continuation.resume() }
        }
    }

    var hasRequestsInFlight: Bool { loopFlags.load().contains(.requestsInFlight) }

    /// Whether the socket may be read now (checked by `FlowControlHandler`
    /// before every read, hence from the mirror, without the lock).
    var readsAllowed: Bool {
        !loopFlags.load().contains(.readsHeld) && channel.isWritable
    }

    // MARK: Outbound

    /// Returns once a replay may queue `bytes` more notification bytes
    /// (`ConnectionStateMachine.hasReplayRoom`) or the connection closes;
    /// false when it closed. A resume far behind thus sends its catch-up
    /// as fast as the client reads it, never past the backlog limit.
    func waitForReplayRoom(_ bytes: Int) async -> Bool {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let ready = shared.withLockedValue { shared -> Bool in
                if shared.machine.hasReplayRoom(for: bytes) || !channel.isActive { return true }
                shared.roomWaiters.append((bytes, continuation))
                return false
            }
            if ready { continuation.resume() }
        }
        return shared.withLockedValue { !$0.machine.isClosing } && channel.isActive
    }

    /// Returns once the channel takes more writes (at once when it does), so
    /// a client that does not read its answers stops its own requests.
    func waitUntilWritable() async {
        if channel.isWritable { return }
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let ready = shared.withLockedValue { shared -> Bool in
                // Checked again under the lock that `writabilityChanged` takes,
                // so a change between the two checks is never missed.
                if channel.isWritable || shared.machine.isClosing || !channel.isActive { return true }
                shared.writableWaiters.append(continuation)
                return false
            }
            if ready { continuation.resume() }
        }
    }

    /// Called on the event loop when writability flips (or the channel closes).
    func writabilityChanged() {
        let writable = channel.isWritable
        // A client that stops taking answers cannot finish its queue: the
        // drain does not wait for it. Once writable, the request loop goes on.
        let waiters = shared.withLockedValue { shared -> [CheckedContinuation<Void, Never>] in
            var waiters: [CheckedContinuation<Void, Never>] = []
            if !writable { swap(&waiters, &shared.drainWaiters) }
            if writable || !channel.isActive { waiters += shared.writableWaiters; shared.writableWaiters.removeAll() }
            return waiters
        }
        for waiter in waiters { waiter.resume() }
    }

    func closed() {
        let waiters = shared.withLockedValue { shared -> [CheckedContinuation<Void, Never>] in
            shared.machine.channelClosed()
            defer { shared.writableWaiters.removeAll(); shared.drainWaiters.removeAll(); shared.roomWaiters.removeAll() }
            return shared.writableWaiters + shared.drainWaiters + shared.roomWaiters.map(\.continuation)
        }
        let relays = upstreams.withLockedValue { table in
            defer { table.removeAll() }
            return Array(table.values)
        }
        for relay in relays { relay.close() }
        for waiter in waiters { waiter.resume() }
    }

    /// `flush: false` only on the event loop within a read batch; the
    /// connection handler flushes at the batch's end.
    func send(_ response: Wire.Response, flush: Bool = true) {
        let envelope = Wire.Envelope(kind: .response(response))
        write(answerFrame { envelope.pack($0) }, id: response.id, flush: flush)
    }

    /// An OK response whose result was encoded before.
    func send(id: UInt64?, encoded: Wire.EncodedResult, flush: Bool = true) {
        write(answerFrame { encoded.packResponse(id: id, $0) }, id: id, flush: flush)
    }

    /// On the event loop: small answers are framed in `answerFrames`.
    nonisolated(unsafe) private var answerFrames = ReusedFrameBuffer()

    /// An answer's frame: on the event loop in the buffer the connection
    /// reuses, elsewhere in one of its own.
    private func answerFrame(_ pack: ((_ size: Int, _ write: (UnsafeMutableRawPointer) -> Void) -> FrameResult) -> FrameResult) -> FrameResult {
        guard eventLoop.inEventLoop else { return allocator.frame(maxPayload: limits.maxFrameBytes, packing: pack) }
        return answerFrames.frame(allocator: allocator, maxPayload: limits.maxFrameBytes, packing: pack)
    }

    private func write(_ framed: FrameResult, id: UInt64?, flush: Bool) {
        let frame: ByteBuffer
        switch framed {
        case let .framed(buffer):
            frame = buffer
        case let .tooLarge(size):
            // Never a frame larger than the limit the client was told.
            let refused = Wire.Response(id: id, code: StatusCode.resourceExhausted.rawValue, message:
                "the response is \(size) bytes, over max_frame_bytes (\(limits.maxFrameBytes)); page through turns with thread/turns/list")
            frame = Wire.Envelope(kind: .response(refused)).framed(allocator: allocator)
        }
        metrics.frameOut(bytes: frame.readableBytes)
        emit(frame, flush: flush)
    }

    func notify(_ payload: Wire.Notification.Payload, metadata: [Wire.KeyValue] = []) {
        notify(Wire.EncodedNotification(payload, metadata: metadata))
    }

    /// Sends a notification encoded once for all its subscribers: only the
    /// sequence number is written per connection.
    func notify(_ encoded: Wire.EncodedNotification) {
        if enqueueNotification(encoded) { scheduleDrain() }
    }

    /// Numbers `encoded` for this connection and queues its frame in the
    /// outbox (or refuses it, or cuts off a subscriber over its backlog);
    /// true when the caller must schedule the outbox's drain
    /// (`ConnectionRegistry.deliver` sends one task per event loop for all
    /// its subscribers).
    func enqueueNotification(_ encoded: Wire.EncodedNotification) -> Bool {
        let method = encoded.methodName
        let (overLimit, needsDrain) = shared.withLockedValue { state -> (ConnectionStateMachine.Action, Bool) in
            guard case let .number(sequence) = state.machine.notificationNumber(method: method) else { return (.none, false) }
            let frame: ByteBuffer
            switch encoded.notificationFrame(sequence: sequence, allocator: allocator, maxPayload: limits.maxFrameBytes) {
            case let .framed(buffer):
                frame = buffer
            case let .tooLarge(size):
                // The sequence number is spent, so the client sees the gap
                // and the reason, and can read the item with thread/turns/list.
                state.machine.notificationSkipped()
                let refused = Wire.Response(code: StatusCode.resourceExhausted.rawValue, message:
                    "notification \(sequence) (\(method)) is \(size) bytes, over max_frame_bytes (\(limits.maxFrameBytes)); not sent")
                let refusal = Wire.Envelope(kind: .response(refused)).framed(allocator: allocator)
                metrics.frameOut(bytes: refusal.readableBytes)
                return (.none, enqueue(refusal))
            }
            let count = frame.readableBytes
            // Counted from the moment it is queued until the socket took it.
            switch state.machine.notificationQueued(bytes: count) {
            case .drop:
                return (.none, false)
            case let .close(code, message, reason):
                return (.close(code, message, reason: reason), false)
            case .send:
                metrics.frameOut(bytes: count)
                return (.none, enqueue(frame, notificationBytes: count))
            }
        }
        if case .close = overLimit {
            metrics.slowSubscriberDisconnects.increment()
            perform(overLimit)
        }
        return needsDrain
    }

    // MARK: Outbox

    /// Frames sent from off the event loop, in the order they were sent.
    /// One task writes all that are waiting and flushes once, so a
    /// subscriber behind a busy loop gets many notifications in one write
    /// (one syscall) rather than a task and a syscall each.
    private struct Outbox {
        var frames: [(ByteBuffer, EventLoopPromise<Void>?)] = []
        var notificationBytes = 0
        var drainScheduled = false
    }
    private let outbox = NIOLockedValueBox(Outbox())

    /// Whether the outbox may hold frames: set under its lock when one is
    /// queued, so the event loop, writing its own frames (every inline
    /// answer), takes the lock only when another thread queued some.
    private let outboxFilled = Atomic(false)

    /// True when the caller must schedule a drain (none is pending).
    private func enqueue(_ frame: ByteBuffer, notificationBytes: Int = 0, promise: EventLoopPromise<Void>? = nil) -> Bool {
        outbox.withLockedValue { box in
            outboxFilled.store(true, ordering: .releasing)
            box.frames.append((frame, promise))
            box.notificationBytes += notificationBytes
            if box.drainScheduled { return false }
            box.drainScheduled = true
            return true
        }
    }

    private func scheduleDrain() {
        eventLoop.execute { self.drainOutbox() }
    }

    /// On the event loop: every queued frame, in order; flushed unless the
    /// caller flushes after its own write.
    func drainOutbox(flush: Bool = true) {
        guard outboxFilled.load(ordering: .acquiring) else { return }
        let taken = outbox.withLockedValue { box -> Outbox? in
            outboxFilled.store(false, ordering: .relaxed)
            if box.frames.isEmpty {
                box.drainScheduled = false
                return nil
            }
            defer { box = Outbox() }
            return box
        }
        guard let taken else { return }
        var promises = taken.frames.compactMap(\.1)
        let batch: ByteBuffer
        if taken.frames.count == 1 {
            batch = taken.frames[0].0
        } else {
            // One buffer through the pipeline rather than one per frame: the
            // handlers' per-write cost is paid once per batch.
            var combined = allocator.buffer(capacity: taken.frames.reduce(0) { $0 + $1.0.readableBytes })
            for (frame, _) in taken.frames { combined.writeImmutableBuffer(frame) }
            batch = combined
        }
        if taken.notificationBytes == 0 && promises.count <= 1 {
            write(batch, promise: promises.first)
        } else {
            // One completion gives the backlog its bytes back and completes the frames' own promises.
            let written = eventLoop.makePromise(of: Void.self)
            let notificationBytes = taken.notificationBytes
            written.futureResult.whenComplete { [self, promises] result in
                let roomy = shared.withLockedValue { shared -> [CheckedContinuation<Void, Never>] in
                    shared.machine.notificationBytesWritten(notificationBytes)
                    guard !shared.roomWaiters.isEmpty else { return [] }
                    let machine = shared.machine
                    let ready = shared.roomWaiters.filter { machine.hasReplayRoom(for: $0.bytes) }
                    shared.roomWaiters.removeAll { machine.hasReplayRoom(for: $0.bytes) }
                    return ready.map(\.continuation)
                }
                for waiter in roomy { waiter.resume() }
                for promise in promises { promise.completeWith(result) }
            }
            promises.removeAll()
            write(batch, promise: written)
        }
        if flush { self.flush() }
    }

    /// On the event loop: what the outbox holds, then one flush for it and
    /// for the frames written before without one.
    func flushOutbox() {
        drainOutbox(flush: false)
        flush()
    }

    /// Every write to the socket goes through here or the outbox, so frames
    /// leave in the order they were sent from any thread: on the event loop
    /// at once, after whatever the outbox still holds; elsewhere queued.
    private func emit(_ frame: ByteBuffer, flush: Bool, promise: EventLoopPromise<Void>? = nil) {
        if eventLoop.inEventLoop {
            drainOutbox(flush: false)
            write(frame, promise: promise)
            if flush { self.flush() }
        } else if enqueue(frame, promise: promise) {
            scheduleDrain()
        }
    }

    /// On the event loop: through the connection handler's context while it
    /// is in the pipeline, so a write or flush skips the channel's
    /// existential, the pipeline's tail and that handler's own hop (a share
    /// of every request's CPU, issue 54); through the channel otherwise.
    nonisolated(unsafe) private var handlerContext: ChannelHandlerContext?

    /// On the event loop: the connection handler's context, from when it
    /// serves this connection until it leaves the pipeline (nil).
    func attach(_ context: ChannelHandlerContext?) {
        handlerContext = context
    }

    private func write(_ frame: ByteBuffer, promise: EventLoopPromise<Void>?) {
        if let handlerContext {
            handlerContext.write(NIOAny(frame), promise: promise)
        } else {
            channel.write(frame, promise: promise)
        }
    }

    private func flush() {
        if let handlerContext { handlerContext.flush() } else { channel.flush() }
    }

    // MARK: Server requests

    /// Requests sent to this connection and not resolved yet (id → thread):
    /// only these may be answered from here. Bounded by the threads it
    /// subscribes to (one pending request per running turn).
    private let offered = NIOLockedValueBox<[String: ThreadID]>([:])

    /// Sends `request` if this connection declared its capability (relaying
    /// peers are never asked: their clients are asked by the owner directly).
    func offer(_ request: ServerRequestRecord) {
        let eligible = shared.withLockedValue { state -> Bool in
            guard let session = state.machine.session, !state.machine.isClosing, !session.peer else { return false }
            return session.capabilities.contains(request.capability)
        }
        // Once per connection, however many paths offer it (a live request and a new subscription can meet).
        guard eligible, offered.withLockedValue({ $0.updateValue(request.threadID, forKey: request.id) == nil }) else { return }
        let envelope = Wire.Envelope(kind: .serverRequest(request.wire(now: nowMillis())))
        switch envelope.frame(allocator: allocator, maxPayload: limits.maxFrameBytes) {
        case let .framed(frame):
            metrics.frameOut(bytes: frame.readableBytes)
            emit(frame, flush: true)
        case .tooLarge:
            // Arguments are bounded by the model's output, frames by the limit: the request waits for its deadline.
            offered.withLockedValue { _ = $0.removeValue(forKey: request.id) }
        }
    }

    /// Request `requestID` is resolved: it can no longer be answered from
    /// here, and the connection hears so (a kept event of the thread, sent
    /// to its every subscriber, whether or not it was sent the request).
    func resolved(_ threadID: ThreadID, requestID: String, _ outcome: ServerRequestOutcome, threadSequence: UInt64? = nil) {
        offered.withLockedValue { _ = $0.removeValue(forKey: requestID) }
        notify(Wire.EncodedNotification(
            .serverRequestResolved(Wire.ServerRequestResolvedNotification(threadId: threadID, requestId: requestID, outcome: outcome.wire)),
            threadSequence: threadSequence))
    }

    /// The thread of a request this connection was sent and may answer.
    func offeredThread(_ requestID: String) -> ThreadID? {
        offered.withLockedValue { $0[requestID] }
    }

    /// An answer from this connection that was not taken, and why.
    func refuseAnswer(_ requestID: String, threadID: ThreadID?, _ refusal: AnswerRefusal) {
        notify(.serverRequestResolved(Wire.ServerRequestResolvedNotification(
            threadId: threadID, requestId: requestID, outcome: refusal.outcome?.wire ?? .unspecified, answerRefused: refusal.description)))
    }

    /// A last response (a refusal that ends the connection), then close.
    func sendThenClose(_ response: Wire.Response) {
        shared.withLockedValue { $0.machine.closingAfterLastResponse() }
        writeLastFrame(response)
    }

    /// How long a last frame may take to leave before the connection is
    /// closed anyway: long enough for a client that reads slowly to reach it.
    static let lastFrameGrace: TimeAmount = .seconds(5)

    /// The one way the server ends a connection: a last frame, then close
    /// once it is written, or after `lastFrameGrace`.
    private func writeLastFrame(_ response: Wire.Response) {
        let frame = Wire.Envelope(kind: .response(response)).framed(allocator: allocator)
        let channel = self.channel
        metrics.frameOut(bytes: frame.readableBytes)
        let written = eventLoop.makePromise(of: Void.self)
        written.futureResult.whenComplete { _ in channel.close(promise: nil) }
        emit(frame, flush: true, promise: written)
        eventLoop.scheduleTask(in: Self.lastFrameGrace) { channel.close(promise: nil) }
    }

    /// A last error frame (a Response without id), then close; nothing if
    /// the connection is already closing. The action, for the caller's log.
    @discardableResult
    func close(code: StatusCode, message: String, reason: CloseReason) -> ConnectionStateMachine.Action {
        let action = shared.withLockedValue { $0.machine.close(code, message, reason: reason) }
        perform(action)
        return action
    }

    /// Closes the connection if initialize has not completed by now.
    func handshakeDeadlinePassed() -> ConnectionStateMachine.Action {
        let action = shared.withLockedValue { $0.machine.handshakeDeadlinePassed(timeoutMs: limits.handshakeTimeoutMs) }
        perform(action)
        return action
    }

    /// Closes the connection if it has been quiet for the idle timeout with
    /// nothing in flight and no subscription.
    func idleTimeoutPassed(subscribed: Bool) -> ConnectionStateMachine.Action {
        let inFlight = hasRequestsInFlight
        let action = shared.withLockedValue {
            $0.machine.idleTimeoutPassed(timeoutMs: limits.idleTimeoutMs, requestsInFlight: inFlight, subscribed: subscribed)
        }
        perform(action)
        return action
    }

    /// The server is shutting down: requests that need the handshake are refused.
    func serverDraining() { shared.withLockedValue { $0.machine.serverDraining() } }

    private func perform(_ action: ConnectionStateMachine.Action) {
        guard case let .close(code, message, _) = action else { return }
        writeLastFrame(Wire.Response(code: code.rawValue, message: message))
    }
}


/// A state machine's `loopFlags`, stored under the connection's lock each
/// time the machine changes and loaded without it: the event loop asks them
/// for every request, and the lock would answer no better (the state may
/// change the moment it is released either way).
final class LoopFlagsMirror: Sendable {
    private let bits: Synchronization.Atomic<UInt8>

    init(_ flags: ConnectionStateMachine.LoopFlags) { bits = Synchronization.Atomic(flags.rawValue) }

    func store(_ flags: ConnectionStateMachine.LoopFlags) { bits.store(flags.rawValue, ordering: .releasing) }

    func load() -> ConnectionStateMachine.LoopFlags { .init(rawValue: bits.load(ordering: .acquiring)) }
}
