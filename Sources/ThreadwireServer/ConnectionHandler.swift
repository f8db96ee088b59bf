import Logging
import NIOConcurrencyHelpers
import Metrics
import NIOCore
import ThreadwireCore
import ThreadwireNIO
import ThreadwireTransport
import ThreadwireWire

/// Turns decoded frame payloads into requests: answered right here when they
/// need no suspension and nothing of the connection is queued, otherwise
/// handed to the connection's request loop. Protocol violations become one
/// error frame followed by a close.
final class ConnectionHandler: ChannelInboundHandler, @unchecked Sendable {
    typealias InboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    private let connectionID: ConnectionID
    private let services: ServerServices
    private let flowControl: FlowControlHandler
    private let frameLimit: FrameSizeLimit
    /// Reads the client certificate's principal (mutual TLS), nil otherwise.
    private let certificatePrincipal: (@Sendable (any Channel) -> Principal?)?
    /// Accepted on the peer listener (`--peer-listen`).
    private let peerListener: Bool
    private var connection: Connection?
    /// Holds the connection strongly until the handshake deadline or the
    /// close, whichever comes first: a weak reference would give every
    /// Connection a side table, and then each retain and release of it
    /// (several per request and per notification) takes the runtime's slow path.
    private var handshakeTimer: Scheduled<Void>?
    /// When the last frame was read: the clock reading a request is stamped
    /// with anyway, rather than a reading of its own per read.
    private var lastRead = ContinuousClock.now
    private var pendingFrames = 0
    private var pendingBytes = 0
    /// Inline answers written in this read batch, flushed at its end.
    private var flushPending = false
    /// Flushes them with the other connections' answers of this loop tick.
    private var tickFlusher: TickFlusher?
    private var requests: AsyncStream<QueuedRequest>.Continuation?
    private var logger: Logger
    private let dispatcher: CallDispatcher

    init(connectionID: ConnectionID, services: ServerServices, flowControl: FlowControlHandler,
         frameLimit: FrameSizeLimit, certificatePrincipal: (@Sendable (any Channel) -> Principal?)? = nil, peerListener: Bool = false) {
        self.connectionID = connectionID
        self.peerListener = peerListener
        self.services = services
        self.flowControl = flowControl
        self.frameLimit = frameLimit
        self.certificatePrincipal = certificatePrincipal
        var logger = services.logger
        logger[metadataKey: "tw.connection.id"] = "\(connectionID)"
        self.logger = logger
        dispatcher = CallDispatcher(services: services, logger: logger)
    }

    func channelActive(context: ChannelHandlerContext) {
        let limits = services.info.limits
        let loopBound = NIOLoopBound(flowControl, eventLoop: context.eventLoop)
        let eventLoop = context.eventLoop
        let connection = Connection(id: connectionID, channel: context.channel, limits: limits, metrics: services.metrics,
                                    frameLimit: frameLimit, onPeerListener: peerListener,
                                    resumeReads: { eventLoop.execute { loopBound.value.resumeIfAllowed() } })
        guard services.registry.add(connection, limit: limits.maxConnections) else {
            logger.debug("refusing connection", metadata: ["tw.close.reason": "maxConnections"])
            services.metrics.serverClosed(reason: .maxConnections)
            connection.close(code: .resourceExhausted, message: "the server has max_connections (\(limits.maxConnections)) connections open; try again later", reason: .maxConnections)
            context.fireChannelActive()
            return
        }
        self.connection = connection
        connection.attach(context)
        tickFlusher = services.tickFlushers.flusher(for: context.eventLoop)
        flowControl.gate = connection
        services.metrics.connectionsOpen.increment()
        logger.debug("connection opened", metadata: ["tw.peer": "\(context.remoteAddress.map { "\($0)" } ?? "?")"])
        let (stream, continuation) = AsyncStream<QueuedRequest>.makeStream()
        requests = continuation
        let services = self.services
        let logger = self.logger
        let dispatcher = self.dispatcher
        // On this loop as a task executor: see `EventLoopTaskExecutor` (the
        // requests' child tasks inherit it).
        services.tasks.spawn(on: EventLoopTaskExecutor.current()) { await dispatcher.serve(stream, connection: connection) }
        if limits.idleTimeoutMs > 0 {
            armIdleTimer(context: context, at: .now() + .milliseconds(Int64(limits.idleTimeoutMs)))
        }
        handshakeTimer = context.eventLoop.scheduleTask(in: .milliseconds(Int64(limits.handshakeTimeoutMs))) {
            guard case let .close(_, _, reason) = connection.handshakeDeadlinePassed() else { return }
            logger.debug("closed connection that did not initialize", metadata: ["tw.close.reason": "\(reason)"])
            services.metrics.serverClosed(reason: reason)
        }
        context.fireChannelActive()
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        // Its context is no way into the pipeline any longer.
        connection?.attach(nil)
    }

    func channelInactive(context: ChannelHandlerContext) {
        handshakeTimer?.cancel()
        handshakeTimer = nil
        requests?.finish()
        requests = nil
        if let connection {
            // Not inline: channelInactive can fire inside a write made on this
            // event loop by code holding the connection's or a publisher's lock
            // (a notification flushed to a peer that is gone closes the channel
            // at once), and `closed()` takes those locks again. The next tick
            // runs with none held.
            let services = services
            let id = connectionID
            let logger = logger
            context.eventLoop.execute {
                connection.closed()
                services.registry.remove(id)
                services.metrics.connectionsOpen.decrement()
                let engine = services.engine
                services.tasks.spawn { await engine.connectionClosed(id) }
                logger.debug("connection closed")
            }
        }
        context.fireChannelInactive()
    }

    /// Read-idle for `idle_timeout_ms`: closed if nothing is in flight and it
    /// holds no subscription (subscribers wait for notifications by design).
    /// One timer per connection, re-armed lazily from the last read, rather
    /// than a handler that stamps the clock on every event.
    private func armIdleTimer(context: ChannelHandlerContext, at deadline: NIODeadline) {
        let loopBound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
        context.eventLoop.scheduleTask(deadline: deadline) {
            let (handler, context) = loopBound.value
            handler.idleTimerFired(context: context)
        }
    }

    private func idleTimerFired(context: ChannelHandlerContext) {
        guard let connection, context.channel.isActive else { return }
        let timeout = TimeAmount.milliseconds(Int64(services.info.limits.idleTimeoutMs))
        let due = lastRead + .nanoseconds(timeout.nanoseconds)
        let now = ContinuousClock.now
        if now < due {
            armIdleTimer(context: context, at: .now() + .nanoseconds(now.duration(to: due).wholeNanoseconds))
            return
        }
        if case let .close(_, _, reason) = connection.idleTimeoutPassed(subscribed: services.engine.isSubscribed(connectionID)) {
            logger.debug("closed idle connection", metadata: ["tw.close.reason": "\(reason)"])
            services.metrics.serverClosed(reason: reason)
            return
        }
        armIdleTimer(context: context, at: .now() + timeout)
    }

    func channelReadComplete(context: ChannelHandlerContext) {
        // Once per socket read, not per frame: the counters, before the
        // answers go out, so a client that has its answer and then scrapes
        // /metrics finds its frames counted.
        if pendingFrames > 0 {
            services.metrics.framesIn.increment(by: Int64(pendingFrames))
            services.metrics.bytesIn.increment(by: Int64(pendingBytes))
            pendingFrames = 0
            pendingBytes = 0
        }
        if flushPending {
            flushPending = false
            if let tickFlusher {
                tickFlusher.flushAtEndOfTick(context)
            } else {
                context.flush()
            }
        }
        // Not passed on: this is the pipeline's last handler, and the tail
        // does nothing with it (one hop less per read).
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard let connection else { return }
        if let lookup = certificatePrincipal, !connection.isInitialized, connection.certificatePrincipal == nil {
            // A request means the handshake is done: the certificate is known.
            connection.setCertificatePrincipal(lookup(context.channel))
        }
        let payload = unwrapInboundIn(data)
        let size = payload.readableBytes
        // Read before the decode: the idle clock counts any frame, and a
        // request's time to answer starts here.
        let received = ContinuousClock.now
        lastRead = received
        pendingFrames += 1
        pendingBytes += size + Framing.headerSize
        let request: Wire.Request
        do {
            // Decoded from the inbound buffer's bytes: no copy into an array.
            switch try payload.withUnsafeReadableBytes({ try Wire.Envelope.inbound(serializedBytes: $0) }) {
            case let .request(decoded):
                record(decoded, payload: payload)
                request = decoded
            case let .other(envelope):
                record(nil, payload: payload)
                if case let .serverRequestAnswer(answer)? = envelope.kind {
                    dispatcher.answer(answer, connection: connection)
                    return
                }
                connection.send(Wire.Response(code: StatusCode.invalidArgument.rawValue,
                                              message: "expected an Envelope carrying a request or a server request's answer"))
                return
            }
        } catch {
            if let recorder = services.recorder {
                // Before initialize, a frame that does not decode may be an
                // initialize all the same, token and all: only its length is kept.
                if connection.isInitialized {
                    recorder.record(connection: connectionID, payload: Array(payload.readableBytesView))
                } else {
                    recorder.recordWithheld(connection: connectionID, length: size)
                }
            }
            // The frame boundary is intact, so the connection stays usable.
            connection.send(Wire.Response(code: StatusCode.invalidArgument.rawValue, message: "malformed request: \(error)"))
            return
        }
        var admitted: AdmittedCall?
        // Nothing queued and the client takes its answers: a request that
        // needs no suspension is answered here, flushed with the read batch.
        if !connection.hasRequestsInFlight, context.channel.isWritable {
            switch dispatcher.answerNow(request, received: received, connection: connection) {
            case .answered:
                flushPending = true
                return
            case let .suspend(call):
                admitted = call
            }
        }
        // A full queue stops reads (FlowControlHandler) instead of failing
        // requests: the client's own TCP window pushes back on it.
        _ = connection.admit(bytes: size)
        requests?.yield(QueuedRequest(request: request, admitted: admitted, bytes: size, received: received))
    }

    /// Captures never hold a bearer token or the cluster's secret: an
    /// initialize that carries either (a client's `auth_token`, a relaying
    /// peer's `peer.token`) is recorded without it (a replay supplies its own).
    /// `request`: the frame's request, nil for any other envelope.
    private func record(_ request: Wire.Request?, payload: ByteBuffer) {
        guard let recorder = services.recorder else { return }
        if var request, case var .initialize(params)? = request.params,
           params.authToken != nil || params.peer?.token != nil {
            params.authToken = nil
            params.peer?.token = nil
            request.params = .initialize(params)
            recorder.record(connection: connectionID, payload: Wire.Envelope(kind: .request(request)).serializedBytes())
            return
        }
        recorder.record(connection: connectionID, payload: Array(payload.readableBytesView))
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        let code: StatusCode
        switch error {
        case FrameError.frameTooLarge, FrameError.partialFramesOverBudget: code = .resourceExhausted
        case is FrameError: code = .invalidArgument
        default:
            logger.debug("connection error", metadata: ["tw.error": "\(error)"])
            context.close(promise: nil)
            return
        }
        let reason: CloseReason
        if case FrameError.partialFramesOverBudget = error { reason = .partialFrames } else { reason = .frameError }
        logger.debug("protocol violation", metadata: ["tw.close.reason": "\(reason.rawValue)", "tw.error": "\(error)"])
        guard let connection, case .close = connection.close(code: code, message: "\(error); closing the connection", reason: reason) else {
            // Closing already (its last frame is on its way): the framing is broken, stop now.
            context.close(promise: nil)
            return
        }
        services.metrics.serverClosed(reason: reason)
    }
}
