import Logging
import NIOConcurrencyHelpers
import Metrics
import NIOCore
import ThreadwireCore
import ThreadwireNIO
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
    private var connection: Connection?
    private var lastRead = NIODeadline.now()
    private var pendingFrames = 0
    private var pendingBytes = 0
    /// Inline answers written in this read batch, flushed at its end.
    private var flushPending = false
    private var requests: AsyncStream<QueuedRequest>.Continuation?
    private var logger: Logger

    init(connectionID: ConnectionID, services: ServerServices, flowControl: FlowControlHandler,
         frameLimit: FrameSizeLimit, certificatePrincipal: (@Sendable (any Channel) -> Principal?)? = nil) {
        self.connectionID = connectionID
        self.services = services
        self.flowControl = flowControl
        self.frameLimit = frameLimit
        self.certificatePrincipal = certificatePrincipal
        var logger = services.logger
        logger[metadataKey: "tw.connection.id"] = "\(connectionID)"
        self.logger = logger
    }

    func channelActive(context: ChannelHandlerContext) {
        let limits = services.info.limits
        let loopBound = NIOLoopBound(flowControl, eventLoop: context.eventLoop)
        let eventLoop = context.eventLoop
        let connection = Connection(id: connectionID, channel: context.channel, limits: limits, metrics: services.metrics,
                                    frameLimit: frameLimit,
                                    resumeReads: { eventLoop.execute { loopBound.value.resumeIfAllowed() } })
        guard services.registry.add(connection, limit: limits.maxConnections) else {
            logger.debug("refusing connection", metadata: ["tw.close.reason": "maxConnections"])
            services.metrics.serverClosed(reason: "maxConnections")
            connection.close(code: .resourceExhausted, message: "the server has max_connections (\(limits.maxConnections)) connections open; try again later")
            context.fireChannelActive()
            return
        }
        self.connection = connection
        flowControl.connection = connection
        services.metrics.connectionsOpen.increment()
        logger.debug("connection opened", metadata: ["tw.peer": "\(context.remoteAddress.map { "\($0)" } ?? "?")"])
        let (stream, continuation) = AsyncStream<QueuedRequest>.makeStream()
        requests = continuation
        let services = self.services
        let logger = self.logger
        services.tasks.spawn { await RequestLoop.run(stream, connection: connection, services: services, logger: logger) }
        if limits.idleTimeoutMs > 0 {
            armIdleTimer(context: context, at: .now() + .milliseconds(Int64(limits.idleTimeoutMs)))
        }
        context.eventLoop.scheduleTask(in: .milliseconds(Int64(limits.handshakeTimeoutMs))) { [weak connection] in
            guard let connection, !connection.isInitialized else { return }
            logger.debug("closing connection that did not initialize", metadata: ["tw.close.reason": "handshakeTimeout"])
            services.metrics.serverClosed(reason: "handshakeTimeout")
            connection.close(code: .deadlineExceeded, message: "initialize did not complete within handshake_timeout_ms (\(limits.handshakeTimeoutMs)); closing")
        }
        context.fireChannelActive()
    }

    func channelInactive(context: ChannelHandlerContext) {
        requests?.finish()
        requests = nil
        if let connection {
            connection.closed()
            services.registry.remove(connectionID)
            services.metrics.connectionsOpen.decrement()
            let engine = services.engine
            let id = connectionID
            services.tasks.spawn { await engine.connectionClosed(id) }
            logger.debug("connection closed")
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
        let due = lastRead + timeout
        if NIODeadline.now() < due {
            armIdleTimer(context: context, at: due)
            return
        }
        if connection.isInitialized, !connection.hasRequestsInFlight, !services.engine.isSubscribed(connectionID) {
            logger.debug("closing idle connection", metadata: ["tw.close.reason": "idle"])
            services.metrics.serverClosed(reason: "idle")
            connection.close(code: .unavailable, message:
                "no request for idle_timeout_ms (\(services.info.limits.idleTimeoutMs)) with none in flight and no subscription; closing")
            return
        }
        armIdleTimer(context: context, at: .now() + timeout)
    }

    func channelReadComplete(context: ChannelHandlerContext) {
        // Once per socket read, not per frame: the idle clock and the counters,
        // before the answers go out, so a client that has its answer and then
        // scrapes /metrics finds its frames counted.
        if pendingFrames > 0 {
            services.metrics.framesIn.increment(by: Int64(pendingFrames))
            services.metrics.bytesIn.increment(by: Int64(pendingBytes))
            pendingFrames = 0
            pendingBytes = 0
            lastRead = .now()
        }
        if flushPending {
            flushPending = false
            context.flush()
        }
        context.fireChannelReadComplete()
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard let connection else { return }
        if let lookup = certificatePrincipal, !connection.isInitialized, connection.certificatePrincipal == nil {
            // A request means the handshake is done: the certificate is known.
            connection.setCertificatePrincipal(lookup(context.channel))
        }
        let payload = unwrapInboundIn(data)
        let size = payload.readableBytes
        pendingFrames += 1
        pendingBytes += size + Framing.headerSize
        let request: Wire.Request
        do {
            // Decoded from the inbound buffer's bytes: no copy into an array.
            let envelope = try payload.withUnsafeReadableBytes { try Wire.Envelope(serializedBytes: $0) }
            record(envelope, payload: payload)
            guard case let .request(decoded)? = envelope.kind else {
                connection.send(Wire.Response(code: StatusCode.invalidArgument.rawValue,
                                              message: "expected an Envelope carrying a request"))
                return
            }
            request = decoded
        } catch {
            if let recorder = services.recorder { recorder.record(connection: connectionID, payload: Array(payload.readableBytesView)) }
            // The frame boundary is intact, so the connection stays usable.
            connection.send(Wire.Response(code: StatusCode.invalidArgument.rawValue, message: "malformed request: \(error)"))
            return
        }
        let received = ContinuousClock.now
        // Nothing queued and the client takes its answers: a request that
        // needs no suspension is answered here, flushed with the read batch.
        if !connection.hasRequestsInFlight, context.channel.isWritable,
           RequestLoop.answerInline(request, received: received, connection: connection, services: services, logger: logger) {
            flushPending = true
            return
        }
        // A full queue stops reads (FlowControlHandler) instead of failing
        // requests: the client's own TCP window pushes back on it.
        _ = connection.admit(bytes: size)
        requests?.yield(QueuedRequest(request: request, bytes: size, received: received))
    }

    /// Captures never hold a bearer token: an initialize that carries one is
    /// recorded without it (a replay supplies its own).
    private func record(_ envelope: Wire.Envelope, payload: ByteBuffer) {
        guard let recorder = services.recorder else { return }
        if case var .request(request)? = envelope.kind, case var .initialize(params)? = request.params, params.authToken != nil {
            params.authToken = nil
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
        logger.debug("protocol violation", metadata: ["tw.close.reason": "frameError", "tw.error": "\(error)"])
        if case FrameError.partialFramesOverBudget = error {
            services.metrics.serverClosed(reason: "partialFrames")
        } else {
            services.metrics.serverClosed(reason: "frameError")
        }
        let response = Wire.Response(code: code.rawValue, message: "\(error); closing the connection")
        let channel = context.channel
        context.writeAndFlush(wrapOutboundOut(Wire.Envelope(kind: .response(response)).framed(allocator: context.channel.allocator)))
            .whenComplete { _ in channel.close(promise: nil) }
        channel.eventLoop.scheduleTask(in: .seconds(1)) { channel.close(promise: nil) }
    }
}

struct QueuedRequest: Sendable {
    var request: Wire.Request
    var bytes: Int
    var received: ContinuousClock.Instant
}

/// Handles one connection's requests one at a time, in arrival order.
enum RequestLoop {
    static func run(_ requests: AsyncStream<QueuedRequest>, connection: Connection, services: ServerServices, logger: Logger) async {
        for await queued in requests {
            // A client that does not read its answers stops here: no request
            // of it starts until the answers already written are taken.
            await connection.waitUntilWritable()
            await handle(queued.request, received: queued.received, connection: connection, services: services, logger: logger)
            // Counted out on the event loop, behind this request's writes
            // (writes from another thread are tasks on that loop, run in
            // order): a request answered inline after it cannot overtake them.
            let eventLoop = connection.channel.eventLoop
            if eventLoop.inEventLoop {
                connection.finished(bytes: queued.bytes)
            } else {
                eventLoop.execute { connection.finished(bytes: queued.bytes) }
            }
        }
    }

    static func handle(_ request: Wire.Request, received: ContinuousClock.Instant = .now, connection: Connection,
                       services: ServerServices, logger: Logger) async {
        let id = request.id
        let spec: MethodSpec
        let params: Wire.Request.Params
        switch admission(request, connection: connection, services: services) {
        case let .refused(error, method):
            respond(connection, id: id, error: error, method: method, received: received, services: services)
            return
        case let .admitted(admittedSpec, admittedParams):
            (spec, params) = (admittedSpec, admittedParams)
        }
        let method = spec.name
        let context = RequestContext(connection: connection, engine: services.engine, server: services.info)
        let outcome: Outcome<Wire.Response.Result>
        let handler = services.info.relays ? Forwarding.relaying(spec.handler, request, connection: connection, services: services) : spec.handler
        do {
            if let timeout = request.timeoutMs {
                // Only a deadline needs the handler in a task of its own.
                let work = Task { try await handler(params, context) }
                guard let result = try await firstOf(work, timeoutMs: timeout) else {
                    respond(connection, id: id, error: RequestError(.deadlineExceeded, "\(method) did not finish within \(timeout) ms"), method: method, received: received, services: services)
                    // The change may still complete; its events and follow-up still happen.
                    services.tasks.spawn { if let late = try? await work.value { await finish(late, services: services) } }
                    return
                }
                outcome = result
            } else {
                outcome = try await handler(params, context)
            }
        } catch let relayed as RelayedAnswer {
            var response = relayed.response
            response.id = id
            let code = response.code.flatMap(StatusCode.init(rawValue:)) ?? .unknown
            services.metrics.request(method: method, code: code, duration: .now - received)
            services.metrics.forwarded(method: method, code: code, duration: .now - received)
            connection.send(response)
            return
        } catch {
            let mapped = RequestError(error)
            if mapped.code == .internal {
                logger.error("request failed", metadata: ["tw.request.id": "\(id ?? 0)", "tw.command": "\(method)", "tw.error": "\(error)"])
            }
            respond(connection, id: id, error: mapped, method: method, received: received, services: services)
            return
        }
        // Counted before it is sent: a client holding its answer finds it in /metrics.
        services.metrics.request(method: method, code: .ok, duration: .now - received)
        connection.send(Wire.Response(id: id, code: StatusCode.ok.rawValue, result: outcome.value))
        if let recorder = services.recorder, let id {
            switch outcome.value {
            case let .threadStart(created), let .threadFork(created), let .agentSpawn(created):
                if let thread = created.thread?.id { recorder.recordCreated(connection: connection.id, requestID: id, createdID: thread) }
            case let .turnStart(started):
                if let turn = started.turn?.id { recorder.recordCreated(connection: connection.id, requestID: id, createdID: turn) }
            default: break
            }
        }
        await finish(outcome, services: services)
    }

    enum Admission {
        case admitted(MethodSpec, Wire.Request.Params)
        case refused(RequestError, method: String)
    }

    /// The checks every request passes before its handler runs.
    static func admission(_ request: Wire.Request, connection: Connection, services: ServerServices) -> Admission {
        guard let params = request.params else {
            return .refused(RequestError(.unimplemented, "the request names no method this server implements"), method: "unknown")
        }
        let method = MethodTable.name(of: params)
        guard let spec = MethodTable.methods[method] else {
            return .refused(RequestError(.unimplemented, "method \(method) is not implemented"), method: method)
        }
        if spec.requiresHandshake, !connection.isInitialized {
            return .refused(RequestError(.failedPrecondition, "call initialize before \(method)"), method: method)
        }
        if services.info.draining(), spec.requiresHandshake {
            return .refused(RequestError(.unavailable, "the server is shutting down"), method: method)
        }
        return .admitted(spec, params)
    }

    /// Answers a request on the event loop that read it when that needs no
    /// suspension (health/check, initialize, a loaded thread's thread/read,
    /// any refusal). Only called when nothing of the connection is queued,
    /// so answers keep the order of requests. False: take the async path.
    static func answerInline(_ request: Wire.Request, received: ContinuousClock.Instant, connection: Connection,
                             services: ServerServices, logger: Logger) -> Bool {
        guard request.timeoutMs == nil else { return false }
        let id = request.id
        switch admission(request, connection: connection, services: services) {
        case let .refused(error, method):
            respond(connection, id: id, error: error, method: method, received: received, services: services, flush: false)
            return true
        case let .admitted(spec, params):
            guard let inline = spec.inline else { return false }
            let context = RequestContext(connection: connection, engine: services.engine, server: services.info)
            do {
                switch try inline(params, context) {
                case nil:
                    return false
                case let .result(result)?:
                    connection.send(Wire.Response(id: id, code: StatusCode.ok.rawValue, result: result), flush: false)
                case let .encoded(encoded)?:
                    connection.send(id: id, encoded: encoded, flush: false)
                }
                services.metrics.request(method: spec.name, code: .ok, duration: .now - received)
            } catch {
                let mapped = RequestError(error)
                if mapped.code == .internal {
                    logger.error("request failed", metadata: ["tw.request.id": "\(id ?? 0)", "tw.command": "\(spec.name)", "tw.error": "\(error)"])
                }
                respond(connection, id: id, error: mapped, method: spec.name, received: received, services: services, flush: false)
            }
            return true
        }
    }

    static func finish(_ outcome: Outcome<Wire.Response.Result>, services: ServerServices) async {
        outcome.publish()
    }

    static func respond(_ connection: Connection, id: UInt64?, error: RequestError, method: String,
                        received: ContinuousClock.Instant, services: ServerServices, flush: Bool = true) {
        services.metrics.request(method: method, code: error.code, duration: .now - received)
        let response = Wire.Response(id: id, code: error.code.rawValue, message: error.message)
        guard error.code != .unauthenticated else {
            // A failed authentication ends the connection: no second guess on it.
            services.metrics.serverClosed(reason: "unauthenticated")
            services.logger.notice("authentication failed; closing", metadata: [
                "tw.connection.id": "\(connection.id)", "tw.peer": "\(connection.channel.remoteAddress.map { "\($0)" } ?? "?")"])
            connection.sendThenClose(response)
            return
        }
        connection.send(response, flush: flush)
    }

    /// The task's value, or nil if the timeout passes first. Returns at the
    /// timeout even if the task never ends (a task group would wait for it:
    /// awaiting a task's value ignores cancellation).
    static func firstOf<T: Sendable>(_ task: Task<T, any Error>, timeoutMs: UInt32) async throws -> T? {
        let outcome = FirstOutcome<T?>()
        return try await withCheckedThrowingContinuation { continuation in
            outcome.arm(continuation)
            Task {
                do { outcome.finish(.success(try await task.value)) } catch { outcome.finish(.failure(error)) }
            }
            Task {
                try? await Task.sleep(for: .milliseconds(Int(timeoutMs)))
                outcome.finish(.success(nil))
            }
        }
    }
}
