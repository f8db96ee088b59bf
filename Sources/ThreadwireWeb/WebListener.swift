import HTTPTypes
import Hummingbird
import HummingbirdWebSocket
public import Logging
import NIOCore
public import ServiceLifecycle
import ThreadwireTransport

/// The web listener (`--web-listen`): path /ws upgrades to a WebSocket that
/// carries one frame-protocol session, each binary message one Envelope (no
/// 5-byte header: WebSocket delimits messages). The session is a frame
/// connection made in process, so every rule of a connection holds
/// (initialize and its token, limits, ordering, a client that does not read
/// is pushed back and then cut off, the drain). Browsers may connect only
/// from an allowed origin. Every other path serves the operator's console
/// (ConsoleFiles), which speaks to /ws like any client.
public final class WebListener: Service, Sendable {
    public struct Settings: Sendable {
        public var host: String
        public var port: Int
        /// The largest message taken or sent (the frame limit).
        public var maxMessageBytes: Int
        /// Origins (scheme://host[:port]) whose pages may open /ws. A request
        /// without Origin (not a browser) is let through to initialize, like
        /// a TCP client; a page of this listener's own origin always is.
        public var allowedOrigins: Set<String>

        public init(host: String, port: Int, maxMessageBytes: Int, allowedOrigins: Set<String> = []) {
            self.host = host
            self.port = port
            self.maxMessageBytes = maxMessageBytes
            self.allowedOrigins = allowedOrigins
        }
    }

    private let settings: Settings
    private let connectInProcess: @Sendable () async throws -> Int32
    private let waitUntilServing: @Sendable () async -> Void
    private let logger: Logger
    private let onListening: @Sendable (String, Int) -> Void

    public init(_ settings: Settings, connectInProcess: @escaping @Sendable () async throws -> Int32,
                waitUntilServing: @escaping @Sendable () async -> Void, logger: Logger,
                onListening: @escaping @Sendable (String, Int) -> Void = { _, _ in }) {
        self.settings = settings
        self.connectInProcess = connectInProcess
        self.waitUntilServing = waitUntilServing
        self.logger = logger
        self.onListening = onListening
    }

    public func run() async throws {
        await waitUntilServing()
        let settings = self.settings
        let connect = connectInProcess
        let router = Router()
        router.get("/ws") { _, _ -> Response in
            // Reached only by a request that asked for no upgrade.
            throw HTTPError(.badRequest, message: "/ws takes a WebSocket upgrade")
        }
        router.get("/") { request, _ in ConsoleFiles.response(to: request) }
        router.get("**") { request, _ in ConsoleFiles.response(to: request) }
        let app = Application(
            router: router,
            server: .http1WebSocketUpgrade(configuration: .init(ws: .init(maxFrameSize: settings.maxMessageBytes, autoPing: .disabled))) {
                request, _, logger in
                guard request.path == "/ws" else { return .dontUpgrade }
                guard Self.originAllowed(request, settings) else {
                    // Upgraded only to say why (a refused upgrade is an empty 400): no session is opened.
                    let origin = request.headerFields[.origin] ?? ""
                    return .upgrade([:]) { _, outbound, _ in
                        try await outbound.close(.policyViolation, reason: "pages of \(origin.prefix(60)) may not open /ws (--web-allowed-origin)")
                    }
                }
                return .upgrade([:]) { inbound, outbound, _ in
                    try await WebSession.run(inbound: inbound, outbound: outbound, connect: connect,
                                             maxMessageBytes: settings.maxMessageBytes, logger: logger)
                }
            },
            configuration: .init(address: .hostname(settings.host, port: settings.port), serverName: "threadwire"),
            onServerRunning: { [onListening] channel in
                onListening(channel.localAddress?.ipAddress ?? settings.host, channel.localAddress?.port ?? settings.port)
            },
            logger: logger)
        try await app.run()
    }

    /// No Origin, or a ws:// or wss:// one (not a browser page: browsers
    /// send a page's http(s) origin, or "null"), this listener's own
    /// origin, or one allowed.
    static func originAllowed(_ request: HTTPRequest, _ settings: Settings) -> Bool {
        guard let origin = request.headerFields[.origin] else { return true }
        if origin.hasPrefix("ws://") || origin.hasPrefix("wss://") { return true }
        if settings.allowedOrigins.contains(origin) { return true }
        guard let authority = request.authority else { return false }
        return origin == "http://\(authority)" || origin == "https://\(authority)"
    }
}

/// One WebSocket's session: its binary messages to the frame connection,
/// the connection's frames back as binary messages.
enum WebSession {
    static func run(inbound: WebSocketInboundStream, outbound: WebSocketOutboundWriter,
                    connect: @Sendable () async throws -> Int32, maxMessageBytes: Int, logger: Logger) async throws {
        let session: FrameSession.Channel
        do {
            session = try await FrameSession.open(socket: try await connect(), maxFrameBytes: maxMessageBytes)
        } catch {
            try await outbound.close(.unexpectedServerError, reason: "the server takes no new sessions now")
            return
        }
        try await session.executeThenClose { frames, envelopes in
            try await withThrowingTaskGroup(of: Void.self) { group in
                group.addTask {
                    for try await message in inbound.messages(maxSize: maxMessageBytes) {
                        switch message {
                        case let .binary(buffer):
                            try await envelopes.write(Array(buffer.readableBytesView))
                        case .text:
                            try await outbound.close(.unacceptableData, reason: "send binary messages, each one serialized threadwire.v1.Envelope")
                            return
                        }
                    }
                }
                for try await frame in frames {
                    try await outbound.write(.binary(frame))
                }
                // The server ended the session (drain, idle, a failed
                // initialize, a backlog past its limit): its last frame said why.
                try? await outbound.close(.goingAway, reason: "the server ended this session")
                group.cancelAll()
            }
        }
    }
}
