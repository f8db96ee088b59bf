import GRPCCore
import GRPCNIOTransportHTTP2
public import Logging
public import ServiceLifecycle
import Synchronization
public import ThreadwireServer
import ThreadwireWire

/// The gRPC listener (`--grpc-listen`, HTTP/2 cleartext): threadwire.v1.Threadwire,
/// grpc.health.v1.Health and gRPC reflection, beside the frame listener and
/// on the same call layer. A service of the process's group, shut down after
/// the frame server: when the drain begins (SIGTERM) health turns
/// NOT_SERVING and new calls get UNAVAILABLE; the frame server's drain ends
/// the streams (each is a frame connection); then GOAWAY, and unary calls in
/// flight finish.
public final class GRPCListener: Service, Sendable {
    private let host: String
    private let port: Int
    private let calls: UnaryCalls
    private let connectInProcess: @Sendable () async throws -> Int32
    private let waitUntilServing: @Sendable () async -> Void
    private let maxMessageBytes: Int
    private let onListening: @Sendable (String, Int) -> Void
    private let logger: Logger
    private let stopping = Atomic<Bool>(false)

    /// - Parameter maxMessageBytes: the largest request message taken (the
    ///   frame limit, so a client cannot make the server hold more here).
    /// - Parameter connectInProcess: a frame connection to the server for a
    ///   stream (`ThreadwireServer.connectInProcess`).
    ///   `waitUntilServing` returns once the frame server serves (turns left
    ///   running by a dead process recovered): gRPC listens only then.
    public init(host: String, port: Int, calls: UnaryCalls, connectInProcess: @escaping @Sendable () async throws -> Int32,
                waitUntilServing: @escaping @Sendable () async -> Void,
                maxMessageBytes: Int, logger: Logger,
                onListening: @escaping @Sendable (String, Int) -> Void = { _, _ in }) {
        self.host = host
        self.port = port
        self.calls = calls
        self.connectInProcess = connectInProcess
        self.waitUntilServing = waitUntilServing
        self.maxMessageBytes = maxMessageBytes
        self.logger = logger
        self.onListening = onListening
    }

    public func run() async throws {
        var router = RPCRouter<HTTP2ServerTransport.Posix>()
        ThreadwireGRPCService.register(in: &router, calls: calls)
        HealthService(serving: { [self] in !stopping.load(ordering: .relaxed) && calls.serving },
                      stopping: { [self] in stopping.load(ordering: .relaxed) }).register(in: &router)
        ReflectionService.register(in: &router)
        StreamServices(connect: connectInProcess, maxFrameBytes: maxMessageBytes).register(in: &router)
        let limit = maxMessageBytes
        let transport = HTTP2ServerTransport.Posix(
            address: host.contains(":") ? .ipv6(host: host, port: port) : .ipv4(host: host == "localhost" ? "127.0.0.1" : host, port: port),
            transportSecurity: .plaintext,
            config: .defaults { $0.rpc.maxRequestPayloadSize = limit })
        let server = GRPCServer(transport: transport, router: router)
        try await withGracefulShutdownHandler {
            await waitUntilServing()
            try await withThrowingDiscardingTaskGroup { group in
                group.addTask { try await server.serve() }
                let address = try await transport.listeningAddress
                if let ipv4 = address.ipv4 {
                    onListening(ipv4.host, ipv4.port)
                } else if let ipv6 = address.ipv6 {
                    onListening(ipv6.host, ipv6.port)
                }
            }
        } onGracefulShutdown: { [self] in
            stopping.store(true, ordering: .relaxed)
            logger.info("gRPC listener draining")
            server.beginGracefulShutdown()
        }
    }
}
