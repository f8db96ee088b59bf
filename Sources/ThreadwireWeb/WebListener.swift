import HTTPTypes
import Hummingbird
import HummingbirdCore
public import Logging
public import NIOCore
public import ServiceLifecycle
public import ThreadwireNIO

/// The web listener (`--web-listen`): path /ws upgrades to a WebSocket that
/// carries one frame-protocol session, each binary message one Envelope (no
/// 5-byte header: WebSocket delimits messages). The socket's channel is
/// handed to the call layer like a TCP connection's, so every rule of a connection holds
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
    private let carry: WebChildChannel.Carry
    private let waitUntilServing: @Sendable () async -> Void
    private let logger: Logger
    private let onListening: @Sendable (String, Int) -> Void

    /// - Parameter carry: serves a session on an upgraded WebSocket's
    ///   channel, on its event loop (`ThreadwireServer.carrySessionSynchronously`).
    public init(_ settings: Settings,
                carry: @escaping @Sendable (any Channel, (FrameSizeLimit, PartialFrameBudget) throws -> any ChannelHandler) throws -> Void,
                waitUntilServing: @escaping @Sendable () async -> Void, logger: Logger,
                onListening: @escaping @Sendable (String, Int) -> Void = { _, _ in }) {
        self.settings = settings
        self.carry = carry
        self.waitUntilServing = waitUntilServing
        self.logger = logger
        self.onListening = onListening
    }

    public func run() async throws {
        await waitUntilServing()
        let settings = self.settings
        let carry = self.carry
        let router = Router()
        router.get("/ws") { _, _ -> Response in
            // Reached only by a request that asked for no upgrade.
            throw HTTPError(.badRequest, message: "/ws takes a WebSocket upgrade")
        }
        router.get("/") { request, _ in ConsoleFiles.response(to: request) }
        router.get("**") { request, _ in ConsoleFiles.response(to: request) }
        let app = Application(
            router: router,
            server: HTTPServerBuilder { responder in WebChildChannel(responder: responder, settings: settings, carry: carry) },
            configuration: .init(address: .hostname(settings.host, port: settings.port), serverName: "threadwire"),
            onServerRunning: { [onListening] channel in
                onListening(channel.localAddress?.ipAddress ?? settings.host, channel.localAddress?.port ?? settings.port)
            },
            logger: logger)
        try await app.run()
    }

    /// No Origin, or a ws:// or wss:// one (not a browser page: browsers
    /// send a page's http(s) origin, or "null"), this listener's own
    /// origin (the request's Host), or one allowed.
    static func originAllowed(origin: String?, host: String?, _ settings: Settings) -> Bool {
        guard let origin else { return true }
        if origin.hasPrefix("ws://") || origin.hasPrefix("wss://") { return true }
        if settings.allowedOrigins.contains(origin) { return true }
        guard let host else { return false }
        return origin == "http://\(host)" || origin == "https://\(host)"
    }
}
