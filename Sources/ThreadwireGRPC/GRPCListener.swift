import GRPCCore
import GRPCNIOTransportHTTP2
public import Logging
public import ServiceLifecycle
import Synchronization
public import ThreadwireServer
public import ThreadwireCore
public import ThreadwireTransport
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
    private let connectInProcess: @Sendable (Principal?) async throws -> Int32
    private let tls: ServerTLS?
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
    ///   `tls`: the frame listener's certificate, key and client CA (mutual
    ///   TLS: a verified certificate names the caller's principal).
    public init(host: String, port: Int, calls: UnaryCalls, tls: ServerTLS? = nil,
                connectInProcess: @escaping @Sendable (Principal?) async throws -> Int32,
                waitUntilServing: @escaping @Sendable () async -> Void,
                maxMessageBytes: Int, logger: Logger,
                onListening: @escaping @Sendable (String, Int) -> Void = { _, _ in }) {
        self.host = host
        self.port = port
        self.calls = calls
        self.connectInProcess = connectInProcess
        self.tls = tls
        self.waitUntilServing = waitUntilServing
        self.maxMessageBytes = maxMessageBytes
        self.logger = logger
        self.onListening = onListening
    }

    static func security(_ tls: ServerTLS) -> HTTP2ServerTransport.Posix.TransportSecurity {
        .tls(.defaults(certificateChain: [.file(path: tls.certificateChainFile, format: .pem)],
                       privateKey: .file(path: tls.privateKeyFile, format: .pem)) { config in
            if let ca = tls.clientCAFile {
                // A client without a certificate from this CA fails the handshake.
                config.clientCertificateVerification = .noHostnameVerification
                config.trustRoots = .certificates([.file(path: ca, format: .pem)])
            }
        })
    }

    public func run() async throws {
        var router = RPCRouter<HTTP2ServerTransport.Posix>()
        let identify = CallMetadata.Identify(source: tls?.clientCAFile == nil ? nil : tls?.clientPrincipal)
        ThreadwireGRPCService.register(in: &router, calls: calls, identify: identify)
        HealthService(serving: { [self] in !stopping.load(ordering: .relaxed) && calls.serving },
                      stopping: { [self] in stopping.load(ordering: .relaxed) }).register(in: &router)
        ReflectionService.register(in: &router)
        StreamServices(connect: connectInProcess, maxFrameBytes: maxMessageBytes, identify: identify).register(in: &router)
        let limit = maxMessageBytes
        let transport = HTTP2ServerTransport.Posix(
            address: host.contains(":") ? .ipv6(host: host, port: port) : .ipv4(host: host == "localhost" ? "127.0.0.1" : host, port: port),
            transportSecurity: tls.map(Self.security) ?? .plaintext,
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
