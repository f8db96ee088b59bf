import Logging
import Metrics
import NIOCore
import ThreadwireCore
import ThreadwireNIO
import ThreadwireWire

/// Turns decoded frame payloads into requests for the connection's request
/// loop, and protocol violations into one error frame followed by a close.
final class ConnectionHandler: ChannelInboundHandler, @unchecked Sendable {
    typealias InboundIn = ByteBuffer
    typealias OutboundOut = [UInt8]

    private let connectionID: ConnectionID
    private let services: ServerServices
    private var connection: Connection?
    private var requests: AsyncStream<Wire.Request>.Continuation?
    private var logger: Logger

    init(connectionID: ConnectionID, services: ServerServices) {
        self.connectionID = connectionID
        self.services = services
        var logger = services.logger
        logger[metadataKey: "tw.connection.id"] = "\(connectionID)"
        self.logger = logger
    }

    func channelActive(context: ChannelHandlerContext) {
        let connection = Connection(id: connectionID, channel: context.channel)
        self.connection = connection
        services.registry.add(connection)
        services.connectionsGauge.increment()
        logger.debug("connection opened", metadata: ["tw.peer": "\(context.remoteAddress.map { "\($0)" } ?? "?")"])
        let (stream, continuation) = AsyncStream<Wire.Request>.makeStream()
        requests = continuation
        let services = self.services
        let logger = self.logger
        Task { await RequestLoop.run(stream, connection: connection, services: services, logger: logger) }
        let timeout = services.info.handshakeTimeoutMs
        context.eventLoop.scheduleTask(in: .milliseconds(Int64(timeout))) { [weak connection] in
            guard let connection, !connection.isInitialized else { return }
            logger.debug("closing connection that did not initialize", metadata: ["tw.close.reason": "handshakeTimeout"])
            connection.channel.close(promise: nil)
        }
        context.fireChannelActive()
    }

    func channelInactive(context: ChannelHandlerContext) {
        requests?.finish()
        requests = nil
        services.registry.remove(connectionID)
        services.connectionsGauge.decrement()
        let engine = services.engine
        let id = connectionID
        Task { await engine.connectionClosed(id) }
        logger.debug("connection closed")
        context.fireChannelInactive()
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard let connection else { return }
        var payload = unwrapInboundIn(data)
        let bytes = payload.readBytes(length: payload.readableBytes) ?? []
        services.recorder?.record(connection: connectionID, payload: bytes)
        let request: Wire.Request
        do {
            let envelope = try Wire.Envelope(serializedBytes: bytes)
            guard case let .request(decoded)? = envelope.kind else {
                connection.send(Wire.Response(code: StatusCode.invalidArgument.rawValue,
                                              message: "expected an Envelope carrying a request"))
                return
            }
            request = decoded
        } catch {
            // The frame boundary is intact, so the connection stays usable.
            connection.send(Wire.Response(code: StatusCode.invalidArgument.rawValue, message: "malformed request: \(error)"))
            return
        }
        guard connection.admit(limit: services.info.maxQueuedRequests) else {
            connection.send(Wire.Response(id: request.id, code: StatusCode.resourceExhausted.rawValue,
                                          message: "too many queued requests on this connection (limit \(services.info.maxQueuedRequests))"))
            return
        }
        requests?.yield(request)
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        let code: StatusCode
        switch error {
        case FrameError.frameTooLarge: code = .resourceExhausted
        case is FrameError: code = .invalidArgument
        default:
            logger.debug("connection error", metadata: ["tw.error": "\(error)"])
            context.close(promise: nil)
            return
        }
        logger.debug("protocol violation", metadata: ["tw.close.reason": "frameError", "tw.error": "\(error)"])
        let response = Wire.Response(code: code.rawValue, message: "\(error); closing the connection")
        let channel = context.channel
        context.writeAndFlush(wrapOutboundOut(Wire.Envelope(kind: .response(response)).serializedBytes()))
            .whenComplete { _ in channel.close(promise: nil) }
    }
}

/// Handles one connection's requests one at a time, in arrival order.
enum RequestLoop {
    static func run(_ requests: AsyncStream<Wire.Request>, connection: Connection, services: ServerServices, logger: Logger) async {
        for await request in requests {
            await handle(request, connection: connection, services: services, logger: logger)
            connection.finished()
        }
    }

    static func handle(_ request: Wire.Request, connection: Connection, services: ServerServices, logger: Logger) async {
        let id = request.id
        guard let params = request.params else {
            respond(connection, id: id, error: RequestError(.unimplemented, "the request names no method this server implements"), method: "unknown", services: services)
            return
        }
        let method = MethodTable.name(of: params)
        guard let spec = MethodTable.methods[method] else {
            respond(connection, id: id, error: RequestError(.unimplemented, "method \(method) is not implemented"), method: method, services: services)
            return
        }
        if spec.requiresHandshake, !connection.isInitialized {
            respond(connection, id: id, error: RequestError(.failedPrecondition, "call initialize before \(method)"), method: method, services: services)
            return
        }
        if services.info.draining(), spec.requiresHandshake {
            respond(connection, id: id, error: RequestError(.unavailable, "the server is shutting down"), method: method, services: services)
            return
        }
        let context = RequestContext(connection: connection, engine: services.engine, server: services.info)
        let outcome: Outcome<Wire.Response.Result>
        do {
            if let timeout = request.timeoutMs {
                // Only a deadline needs the handler in a task of its own.
                let work = Task { try await spec.handler(params, context) }
                guard let result = try await firstOf(work, timeoutMs: timeout) else {
                    respond(connection, id: id, error: RequestError(.deadlineExceeded, "\(method) did not finish within \(timeout) ms"), method: method, services: services)
                    // The change may still complete; its events and follow-up still happen.
                    Task { if let late = try? await work.value { await finish(late, services: services) } }
                    return
                }
                outcome = result
            } else {
                outcome = try await spec.handler(params, context)
            }
        } catch {
            let mapped = RequestError(error)
            if mapped.code == .internal {
                logger.error("request failed", metadata: ["tw.request.id": "\(id ?? 0)", "tw.command": "\(method)", "tw.error": "\(error)"])
            }
            respond(connection, id: id, error: mapped, method: method, services: services)
            return
        }
        connection.send(Wire.Response(id: id, code: StatusCode.ok.rawValue, result: outcome.value))
        services.count(method: method, code: .ok)
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

    static func finish(_ outcome: Outcome<Wire.Response.Result>, services: ServerServices) async {
        outcome.publish()
    }

    static func respond(_ connection: Connection, id: UInt64?, error: RequestError, method: String, services: ServerServices) {
        connection.send(Wire.Response(id: id, code: error.code.rawValue, message: error.message))
        services.count(method: method, code: error.code)
    }

    /// The task's value, or nil if the timeout passes first.
    static func firstOf<T: Sendable>(_ task: Task<T, any Error>, timeoutMs: UInt32) async throws -> T? {
        try await withThrowingTaskGroup(of: T?.self) { group in
            group.addTask { try await task.value }
            group.addTask {
                try? await Task.sleep(for: .milliseconds(Int(timeoutMs)))
                return nil
            }
            let first = try await group.next()!
            group.cancelAll()
            return first
        }
    }
}
