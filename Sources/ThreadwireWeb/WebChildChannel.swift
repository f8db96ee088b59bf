import HTTPTypes
import Hummingbird
import HummingbirdCore
import Logging
import NIOCore
import NIOHTTP1
import NIOHTTPTypes
import NIOHTTPTypesHTTP1
import NIOWebSocket
import ThreadwireNIO

/// One connection to the web listener: HTTP/1.1 for the console's files, or
/// an upgrade on /ws to a WebSocket whose channel then carries a session
/// straight to the call layer (`WebSocketEnvelopes`): no socket pair, no
/// task between the socket and the requests, and the socket's own
/// writability pushes back on a client that does not read, as on TCP.
/// (hummingbird-websocket would hand each message to an async handler, a
/// task hop each way; its shape is followed here otherwise.)
struct WebChildChannel: ServerChildChannel, HTTPChannelHandler {
    /// Starts a session on an upgraded channel, on its event loop; throws
    /// when the server takes no new sessions.
    typealias Carry = @Sendable (any Channel, (FrameSizeLimit, PartialFrameBudget) throws -> any ChannelHandler) throws -> Void

    enum Upgrade: Sendable {
        /// The channel serves a session (or was told why not) until it closes.
        case webSocket(any Channel)
        case http(NIOAsyncChannel<HTTPRequestPart, HTTPResponsePart>)
        case refusedUpgrade(NIOAsyncChannel<HTTPRequestPart, HTTPResponsePart>)
    }

    struct Value: ServerChildChannelValue {
        let upgrade: EventLoopFuture<Upgrade>
        let channel: any Channel
    }

    let responder: Responder
    private let settings: WebListener.Settings
    private let carry: Carry

    init(responder: @escaping Responder, settings: WebListener.Settings, carry: @escaping Carry) {
        self.responder = Self.redirectingLateUpgrades(responder)
        self.settings = settings
        self.carry = carry
    }

    func setup(channel: any Channel, logger: Logger) -> EventLoopFuture<Value> {
        channel.eventLoop.makeCompletedFuture {
            let unclaimed = CloseUnclaimedOnQuiesce()
            try channel.pipeline.syncOperations.addHandler(unclaimed)
            let attempted = NIOLoopBoundBox(false, eventLoop: channel.eventLoop)
            let settings = self.settings
            let carry = self.carry
            let upgrader = NIOTypedWebSocketServerUpgrader<Upgrade>(
                maxFrameSize: settings.maxMessageBytes,
                shouldUpgrade: { channel, head in
                    attempted.value = true
                    let path = head.uri.split(separator: "?", maxSplits: 1).first ?? ""
                    return channel.eventLoop.makeSucceededFuture(path == "/ws" ? HTTPHeaders() : nil)
                },
                upgradePipelineHandler: { channel, head in
                    channel.eventLoop.makeCompletedFuture {
                        // The session is the call layer's now: its drain closes it.
                        channel.pipeline.syncOperations.removeHandler(unclaimed, promise: nil)
                        Self.startSession(on: channel, head: head, settings: settings, carry: carry, logger: logger)
                        return .webSocket(channel)
                    }
                })
            let upgrades = NIOTypedHTTPServerUpgradeConfiguration<Upgrade>(
                upgraders: [upgrader],
                notUpgradingCompletionHandler: { channel in
                    channel.eventLoop.makeCompletedFuture {
                        // HTTPConnectionStateHandler closes it on quiesce once its response is written.
                        channel.pipeline.syncOperations.removeHandler(unclaimed, promise: nil)
                        try channel.pipeline.syncOperations.addHandler(HTTP1ToHTTPServerCodec(secure: false))
                        try channel.pipeline.syncOperations.addHandler(HTTPConnectionStateHandler(idleTimeout: nil, logger: logger))
                        let http = try NIOAsyncChannel<HTTPRequestPart, HTTPResponsePart>(
                            wrappingChannelSynchronously: channel, configuration: .init(isOutboundHalfClosureEnabled: true))
                        return attempted.value ? .refusedUpgrade(http) : .http(http)
                    }
                })
            var configuration = NIOUpgradableHTTPServerPipelineConfiguration<Upgrade>(upgradeConfiguration: upgrades)
            configuration.enablePipelining = false  // NIOAsyncChannel takes one request at a time
            configuration.enableErrorHandling = false  // Hummingbird answers HTTP errors
            configuration.enableResponseHeaderValidation = false  // swift-http-types validated them
            let upgrade = try channel.pipeline.syncOperations.configureUpgradableHTTPServerPipeline(configuration: configuration)
            return Value(upgrade: upgrade, channel: channel)
        }
    }

    func handle(value: Value, logger: Logger) async {
        do {
            switch try await value.upgrade.get() {
            case let .webSocket(channel):
                try? await channel.closeFuture.get()
            case let .http(http):
                await handleHTTP(asyncChannel: http, logger: logger)
            case let .refusedUpgrade(http):
                // A WebSocket upgrade of another path: an empty 400, as hummingbird-websocket answers.
                try await http.executeThenClose { _, outbound in
                    try await outbound.write(contentsOf: [
                        .head(HTTPResponse(status: .badRequest, headerFields: [.connection: "close", .contentLength: "0"])), .end(nil),
                    ])
                }
            }
        } catch {
            logger.debug("web connection ended", metadata: ["tw.error": "\(error)"])
        }
    }

    /// On the upgraded channel's event loop: a page of a foreign origin, or a
    /// server that takes no new sessions, gets a close frame saying why;
    /// otherwise the session starts.
    private static func startSession(on channel: any Channel, head: HTTPRequestHead, settings: WebListener.Settings,
                                     carry: Carry, logger: Logger) {
        guard WebListener.originAllowed(origin: head.headers.first(name: "origin"), host: head.headers.first(name: "host"), settings) else {
            let origin = head.headers.first(name: "origin") ?? ""
            closeSaying(channel, .policyViolation, "pages of \(origin.prefix(60)) may not open /ws (--web-allowed-origin)")
            return
        }
        do {
            try carry(channel) { limit, budget in
                try BudgetedWebSocketDecoder.replaceUpgradersDecoder(on: channel, maxFrameSize: settings.maxMessageBytes, budget: budget)
                return WebSocketEnvelopes(limit: limit)
            }
        } catch {
            logger.debug("WebSocket session refused", metadata: ["tw.error": "\(error)"])
            closeSaying(channel, .unexpectedServerError, "the server takes no new sessions now")
        }
    }

    private static func closeSaying(_ channel: any Channel, _ code: WebSocketErrorCode, _ reason: String) {
        let frame = WebSocketEnvelopes.closeFrame(code, reason, allocator: channel.allocator)
        channel.writeAndFlush(frame).whenComplete { _ in channel.close(promise: nil) }
    }

    /// NIO upgrades only a connection's first request: an upgrade asked for
    /// after a plain request on a kept-alive connection is redirected to the
    /// same path with the connection closed, so the client retries it on a
    /// new one (as hummingbird-websocket does).
    private static func redirectingLateUpgrades(_ responder: @escaping Responder) -> Responder {
        struct ClosingAfterRedirect: Error {}
        return { request, writer, channel in
            guard request.headers[.upgrade]?.lowercased() == "websocket" else {
                return try await responder(request, writer, channel)
            }
            let location = request.uri.query.map { "\(request.uri.path)?\($0)" } ?? request.uri.path
            try await writer.writeResponse(HTTPResponse(status: .temporaryRedirect, headerFields: [.connection: "close", .location: location]))
            throw ClosingAfterRedirect()
        }
    }
}

/// Closes the connection when the server quiesces (graceful shutdown) before
/// a whole request has arrived on it. Until then neither HTTP's connection
/// state handler nor a session owns the connection, and Hummingbird waits for
/// every connection to close: a socket a browser opened ahead of need and never
/// used held the server's exit until the browser dropped it. Hummingbird closes
/// a connection with no request in progress the same way.
final class CloseUnclaimedOnQuiesce: ChannelInboundHandler, RemovableChannelHandler, Sendable {
    typealias InboundIn = NIOAny

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if event is ChannelShouldQuiesceEvent {
            context.close(promise: nil)
            return
        }
        context.fireUserInboundEventTriggered(event)
    }
}
