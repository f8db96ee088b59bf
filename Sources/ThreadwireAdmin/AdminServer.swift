import Hummingbird
import NIOPosix
public import Logging
public import Prometheus
public import ServiceLifecycle

/// The operator's HTTP endpoint (Hummingbird):
///   GET /livez    200 while the process serves at all
///   GET /readyz   200 when new work is welcome; 503 with the reason while
///                 draining or while the store cannot commit
///   GET /metrics  Prometheus text format (swift-prometheus is the
///                 swift-metrics backend)
///   GET /leases   JSON: the agent trees this instance holds with their
///                 lease epochs, and whether it is sure of them now
///                 (several instances on PostgreSQL; empty otherwise)
/// With `authorize`, every path but /livez (which probes reach) needs an
/// `Authorization` header it accepts; otherwise 401.
/// It knows nothing of threads: the frame server hands it closures.
public struct AdminServer: Service {
    public struct Readiness: Sendable {
        public var ready: Bool
        public var reason: String
        public init(ready: Bool, reason: String) {
            self.ready = ready
            self.reason = reason
        }
    }

    private let host: String
    private let port: Int
    private let registry: PrometheusCollectorRegistry
    private let authorize: (@Sendable (String?) -> Bool)?
    private let readiness: @Sendable () -> Readiness
    private let beforeScrape: @Sendable () -> Void
    /// Metrics kept outside the registry, in the text format, added to its text.
    private let exposition: @Sendable () -> String
    private let leases: @Sendable () -> String
    private let onListening: @Sendable (String, Int) -> Void
    private let logger: Logger
    /// For threadwire_build_info.
    private let version: String

    /// `authorize`: whether an `Authorization` header value (nil: none) may
    /// see the endpoint (nil: no check).
    public init(host: String, port: Int, registry: PrometheusCollectorRegistry, authorize: (@Sendable (String?) -> Bool)? = nil,
                readiness: @escaping @Sendable () -> Readiness,
                beforeScrape: @escaping @Sendable () -> Void = {},
                exposition: @escaping @Sendable () -> String = { "" },
                leases: @escaping @Sendable () -> String = { #"{"held":[],"surely_valid":true}"# },
                onListening: @escaping @Sendable (String, Int) -> Void = { _, _ in },
                version: String = "unknown", logger: Logger) {
        self.host = host
        self.port = port
        self.registry = registry
        self.authorize = authorize
        self.readiness = readiness
        self.beforeScrape = beforeScrape
        self.exposition = exposition
        self.leases = leases
        self.onListening = onListening
        self.version = version
        self.logger = logger
    }

    public func run() async throws {
        let router = Router()
        let readiness = self.readiness
        let registry = self.registry
        let beforeScrape = self.beforeScrape
        let exposition = self.exposition
        // Before the routes: a router's middleware covers the routes added after it.
        if let authorize { router.add(middleware: Authorization(authorize: authorize)) }
        router.get("livez") { _, _ in
            Self.text(.ok, "ok\n")
        }
        router.get("readyz") { _, _ in
            let state = readiness()
            return Self.text(state.ready ? .ok : .serviceUnavailable, state.reason + "\n")
        }
        let leases = self.leases
        router.get("leases") { _, _ in
            Response(status: .ok, headers: [.contentType: "application/json"],
                     body: .init(byteBuffer: ByteBuffer(string: leases() + "\n")))
        }
        let version = self.version
        router.get("metrics") { _, _ in
            beforeScrape()
            var registered = String(decoding: registry.emitToBuffer(), as: UTF8.self)
            if !registered.isEmpty, !registered.hasSuffix("\n") { registered += "\n" }
            let text = Exposition.withHelp(registered + exposition())
                + Exposition.process() + Exposition.build(version: version)
            let buffer = ByteBuffer(string: text)
            return Response(status: .ok, headers: [.contentType: "text/plain; version=0.0.4; charset=utf-8"],
                            body: .init(byteBuffer: buffer))
        }
        let onListening = self.onListening
        let host = self.host
        let app = Application(
            router: router,
            configuration: .init(address: .hostname(host, port: port), serverName: "threadwire-admin"),
            onServerRunning: { channel in
                onListening(channel.localAddress?.ipAddress ?? host, channel.localAddress?.port ?? 0)
            },
            // Its own event loop: a scrape's I/O does not queue behind frame
            // traffic on the busy loops.
            eventLoopGroupProvider: .shared(Self.eventLoop),
            logger: logger)
        // run(), not runService(): the process's one ServiceGroup owns signals.
        try await app.run()
    }

    static let eventLoop = MultiThreadedEventLoopGroup(numberOfThreads: 1)

    static func text(_ status: HTTPResponse.Status, _ body: String) -> Response {
        Response(status: status, headers: [.contentType: "text/plain; charset=utf-8"],
                 body: .init(byteBuffer: ByteBuffer(string: body)))
    }
}

/// Every request but /livez must carry an `Authorization` header that
/// `authorize` accepts.
struct Authorization<Context: RequestContext>: RouterMiddleware {
    let authorize: @Sendable (String?) -> Bool

    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        if request.uri.path == "/livez" { return try await next(request, context) }
        guard authorize(request.headers[.authorization]) else {
            return Response(status: .unauthorized, headers: [.wwwAuthenticate: "Bearer", .contentType: "text/plain; charset=utf-8"],
                            body: .init(byteBuffer: ByteBuffer(string: "this endpoint needs 'Authorization: Bearer TOKEN' (--admin-token-file)\n")))
        }
        return try await next(request, context)
    }
}
