// Over 400 lines: every flag of threadwire-server with its help, and their
// composition into one ServiceGroup; the config file is ConfigFile.swift.
public import ArgumentParser
import Foundation
import ThreadwireWire
public import Logging
import Metrics
public import NIOCore
import NIOPosix
public import Prometheus
public import ServiceLifecycle
import ThreadwireAdmin
import ThreadwireClient
import ThreadwireNIO
import ThreadwireCore
import ThreadwireMCP
import ThreadwireModels
public import ThreadwireServer
import ThreadwireGRPC
import ThreadwireWeb
public import ThreadwireTransport
import ThreadwireSQLite
import ThreadwirePostgres

#if canImport(Glibc)
import Glibc
#endif

/// `threadwire-server`: its flags, and the server they compose. The
/// executable runs it as the process (`run`); tests compose the same server
/// in their own process (`compose`) on an `InProcessTransport`.
public struct ServerCommand: AsyncParsableCommand {
    public init() {}

    public static let configuration = CommandConfiguration(
        commandName: "threadwire-server",
        abstract: "Serve threadwire threads over framed protobuf on TCP.",
        discussion: """
            Every flag may also come from its THREADWIRE_* environment variable or its key in the --config file \
            (see --print-environment); a flag given wins over its variable, which wins over the file.
            """,
        version: ThreadwireRelease.version,
        subcommands: [ConfigCommand.self])

    @Option(help: "HOST:PORT to listen on; port 0 picks a free port.")
    var listen = "127.0.0.1:7420"

    @Option(help: "Directory of the embedded store (created if missing).")
    var dataDir = "./data"

    @Option(help: "The store: postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE for PostgreSQL (default: $THREADWIRE_STORE, else SQLite in --data-dir). The password may also come from PGPASSWORD.")
    var store: String?

    @Option(help: "With a PostgreSQL store: HOST:PORT where the other instances reach this one (default: --peer-listen, else --listen, when its host and port are concrete). Requests for threads another instance owns are relayed there.")
    var advertise: String?

    @Option(help: "With a PostgreSQL store: HOST:PORT of a listener for the other instances only. Relays then come only there, and the client listener answers a peer hello as it answers a bad token, so the cluster's secret never works where clients connect.")
    var peerListen: String?

    @Option(help: "With a PostgreSQL store: seconds a thread's ownership lease lasts without renewal; an instance that dies is replaced after at most this long.")
    var leaseSeconds = 10.0

    @Option(help: "With a PostgreSQL store and authentication: the cluster's shared secret (at least 16 bytes) instances present when relaying requests to each other (default: $THREADWIRE_PEER_TOKEN). Several, comma-separated, to roll a new one out: the first is presented, every one is accepted.")
    var peerToken: String?

    @Option(help: "With a PostgreSQL store and TLS: PEM CA certificate(s) that verify the other instances (default: --tls-client-ca, else the system's roots).")
    var peerTlsCa: String?

    @Option(help: "JSON config file (feature flags, agent limits, model catalog).")
    var config: String?

    @Option(help: "HOST:PORT of the admin HTTP endpoint (/livez, /readyz, /metrics, /leases); port 0 picks one. Off when absent. A non-loopback address needs --admin-token-file (or THREADWIRE_ADMIN_TOKEN) or --allow-unauthenticated.")
    var adminListen: String?

    @Option(help: "HOST:PORT of the gRPC listener (HTTP/2 cleartext): service threadwire.v1.Threadwire (every method as a unary call, and the streams Subscribe and Connect; proto/threadwire/v1/service.proto), grpc.health.v1.Health and gRPC reflection; port 0 picks one. Off when absent. With --tls-cert it serves TLS with the same certificate, and with --tls-client-ca mutual TLS (a verified certificate names the principal). A non-loopback address needs authentication (tokens or client certificates) or --allow-unauthenticated.")
    var grpcListen: String?

    @Option(help: "HOST:PORT of the web listener (HTTP/1.1 cleartext): /ws upgrades to a WebSocket carrying one frame session, each binary message one Envelope; port 0 picks one. Off when absent. Same exposure rules as --grpc-listen.")
    var webListen: String?

    @Option(help: "An origin (scheme://host[:port]) whose pages may open /ws; repeat for several. Without it only pages of the listener's own origin and non-browser clients (no Origin header) may.")
    var webAllowedOrigin: [String] = []

    @Option(help: "File holding the admin endpoint's bearer token (at least 16 bytes; THREADWIRE_ADMIN_TOKEN gives it instead): every path but /livez then needs 'Authorization: Bearer TOKEN'.")
    var adminTokenFile: String?

    // Limits: each flag overrides the config file's "limits" key of the same name.
    @Option(help: "Largest frame payload accepted and sent, in bytes (limits.max_frame_bytes; default 4194304).")
    var maxFrameBytes: Int?

    @Option(help: "Requests read but not answered per connection before reads stop (limits.max_queued_requests; default 1024).")
    var maxQueuedRequests: Int?

    @Option(help: "Payload bytes of such requests before reads stop (limits.max_queued_request_bytes; default 8388608).")
    var maxQueuedRequestBytes: Int?

    @Option(help: "Unsent outbound bytes per connection at which its reads and requests pause (limits.outbound_high_water_bytes; default 1048576).")
    var outboundHighWaterBytes: Int?

    @Option(help: "Notification bytes a connection may leave unread before it is closed (limits.max_notification_backlog_bytes; default 8388608).")
    var maxNotificationBacklogBytes: Int?

    @Option(help: "Open connections; more get an error frame and are closed (limits.max_connections; default 4096).")
    var maxConnections: Int?

    @Option(help: "Milliseconds an initialized connection with nothing in flight and no subscription may stay silent; 0 never closes (limits.idle_timeout_ms; default 300000).")
    var idleTimeoutMs: Int?

    @Option(help: "Milliseconds without a packet from a client before the kernel probes it (TCP keepalive), closing a half-open connection after three unanswered probes; 0 turns it off (limits.tcp_keepalive_ms; default 60000).")
    var tcpKeepaliveMs: Int?

    @Option(help: "Bytes of incomplete frames held across all connections (limits.max_partial_frame_bytes; default 67108864).")
    var maxPartialFrameBytes: Int?

    @Option(help: "Milliseconds a connection may stay open without initialize (limits.handshake_timeout_ms; default 10000).")
    var handshakeTimeoutMs: Int?

    @Option(help: "Threads one principal may create per minute, all instances together: a bucket of this many refilled at this many a minute; 0 for no limit (limits.max_threads_started_per_minute; default 600 when clients authenticate, else none).")
    var maxThreadsStartedPerMinute: Int?

    @Option(help: "Turns one principal may have running at once, all instances together; 0 for no limit (limits.max_running_turns; default 64 when clients authenticate, else none).")
    var maxRunningTurns: Int?

    @Option(help: "Requests one principal may send per second after initialize, all instances together; 0 for no limit (limits.max_requests_per_second; default 1000 when clients authenticate, else none).")
    var maxRequestsPerSecond: Int?

    @Option(help: "Requests of such a burst above the rate (limits.request_burst; default twice the rate).")
    var requestBurst: Int?

    @Option(help: "Bytes of turns and history one principal may store; 0 for no limit (limits.max_stored_bytes; default 10737418240 when clients authenticate, else none).")
    var maxStoredBytes: Int64?

    @Option(help: "File of bearer tokens, one 'principal token' per line (# comments). Re-read on SIGHUP; revoked tokens' connections are closed. THREADWIRE_AUTH_TOKEN adds one token for the principal 'default'.")
    var authTokens: String?

    @Flag(help: "Serve a non-loopback address without authentication (logs a warning). Without it the server refuses to start there.")
    var allowUnauthenticated = false

    @Option(help: "TLS: PEM certificate chain (the server's certificate first). With --tls-key, every connection speaks TLS.")
    var tlsCert: String?

    @Option(help: "TLS: PEM private key of --tls-cert.")
    var tlsKey: String?

    @Option(help: "Mutual TLS: PEM CA certificate(s); clients must present a certificate it signed, whose subject common name (or see --tls-client-principal) names their principal.")
    var tlsClientCa: String?

    @Option(help: "Mutual TLS: which name of the client certificate is the principal: cn (the subject's common name, the default), uri (the first URI SAN), spiffe (NAMESPACE/ACCOUNT of a SPIFFE ID spiffe://DOMAIN/ns/NAMESPACE/sa/ACCOUNT, as Istio and Linkerd issue), dns (the first DNS SAN).")
    var tlsClientPrincipal: String?

    @Option(help: "Seconds an unsubscribed idle thread stays loaded.")
    var idleUnloadSeconds = 1800.0

    @Option(help: "Hours an idempotency key (Request.idempotency_key) and the answer stored with it are kept: a repeat within them is answered, not carried out again.")
    var idempotencyRetentionHours = 24.0

    @Option(help: "Seconds graceful shutdown lets running turns finish before interrupting them.")
    var turnGraceSeconds = 5.0

    @Option(help: "Record every inbound frame to this capture file.")
    var record: String?

    @Option(help: "Event loop threads (they also run the server's tasks); default: one per core. Fewer than the cores leaves room for other processes on the machine (a load generator, PostgreSQL), which shortens the latency tail.")
    var eventLoops: Int?

    @Option(help: "Log level: trace, debug, info, notice, warning, error, critical. A SIGHUP re-reads it from the config file when neither the flag nor THREADWIRE_LOG_LEVEL set it.")
    var logLevel: Logger.Level = .info

    @Flag(help: "Print the THREADWIRE_* variable and the config file key of every flag as a Markdown table (docs/configuration.md holds it) and exit.")
    var printEnvironment = false

    @Flag(help: "Print the effective configuration (flags, THREADWIRE_* variables and the config file resolved, defaults filled in, secrets redacted) as a config file and exit.")
    var printConfig = false

    @Option(help: "Log lines on standard error: text, or json (one object per line with request, thread, trace and span ids).")
    var logFormat: LogFormat = .text

    public func run() async throws {
        if printEnvironment {
            print(SettingSources.markdownTable(), terminator: "")
            return
        }
        if printConfig {
            print(try effectiveConfigurationJSON())
            return
        }
        // Run Swift Concurrency on NIO's event loops: requests then avoid a
        // thread switch between the concurrency pool and the loop doing I/O
        // (profiling showed context switches as the largest cost).
        if let eventLoops {
            guard eventLoops >= 1, eventLoops <= 512 else { throw ValidationError("--event-loops must be from 1 to 512, got \(eventLoops)") }
            NIOSingletons.groupLoopCountSuggestion = eventLoops
        }
        _ = NIOSingletons.unsafeTryInstallSingletonPosixEventLoopGroupAsConcurrencyGlobalExecutor()
        LoggingSystem.bootstrapServer(format: logFormat, level: logLevel)
        let logger = Logger(label: "threadwire")
        // As Go programs do: the soft file limit is often 1,024 where the
        // hard one allows far more, and clients should not be refused for a
        // default nobody chose (connections get what it leaves: DescriptorBudget).
        let files = DescriptorBudget.raiseSoftLimit()
        if files.after > files.before {
            logger.debug("raised the soft file limit to the hard one", metadata: ["tw.fd.before": "\(files.before)", "tw.fd.after": "\(files.after)"])
        }
        let registry = PrometheusCollectorRegistry()
        MetricsSystem.bootstrap(Self.metricsFactory(registry))
        let composed = try await compose(logger: logger, metricsRegistry: registry) { [listen] address in
            // Written straight to fd 1 (unbuffered) so a supervisor reading a pipe sees it at once.
            let shown = address.map { "\($0.ipAddress ?? "?"):\($0.port ?? 0)" } ?? listen
            FileHandle.standardOutput.write(Data("threadwire listening on \(shown)\n".utf8))
        } onAdminListening: { boundHost, boundPort in
            FileHandle.standardOutput.write(Data("threadwire admin on http://\(boundHost):\(boundPort)\n".utf8))
        } onGRPCListening: { boundHost, boundPort in
            FileHandle.standardOutput.write(Data("threadwire grpc on \(boundHost):\(boundPort)\n".utf8))
        } onWebListening: { boundHost, boundPort in
            FileHandle.standardOutput.write(Data("threadwire web on http://\(boundHost):\(boundPort)\n".utf8))
        }
        let server = composed.server
        let reloadsCredentials = composed.reloadsCredentials
        let multiPrincipal = composed.multiPrincipal
        let flagLimits = PrincipalLimits(maxThreadsStartedPerMinute: maxThreadsStartedPerMinute, maxRunningTurns: maxRunningTurns,
                                         maxRequestsPerSecond: maxRequestsPerSecond, requestBurst: requestBurst, maxStoredBytes: maxStoredBytes)
        // The log level follows the file only where no flag or variable fixed it.
        let fileLogLevel = config != nil && !CommandLine.arguments.contains(where: { $0 == "--log-level" || $0.hasPrefix("--log-level=") })
            && ProcessInfo.processInfo.environment["THREADWIRE_LOG_LEVEL"] == nil
        // What the running server was built from: a reload names the keys
        // changed since that only a restart puts in force.
        let startedFrom = ConfigReload.flattened(config.flatMap { try? ConfigFile.checkedObject($0) } ?? [:])
        let reloads = Self.onSIGHUP { [config, flagLimits] in
            if reloadsCredentials {
                do { try server.reloadCredentials() } catch {
                    logger.error("auth tokens not reloaded; the previous tokens stay in use", metadata: ["tw.error": "\(error)"])
                }
            }
            guard let config else { return }
            do {
                try Self.reloadLogLevel(from: config, followsFile: fileLogLevel, logger: logger)
                let limits = try Self.reloadedPrincipalLimits(from: config, flags: flagLimits, multiPrincipal: multiPrincipal)
                let changes = server.reloadPrincipalLimits(limits)
                logger.notice(changes.isEmpty ? "config reloaded; per-principal limits unchanged"
                    : "config reloaded; \(changes.joined(separator: ", "))", metadata: ["tw.config": "\(config)"])
                let waiting = ConfigReload.restartOnlyChanges(from: startedFrom, to: ConfigReload.flattened(try ConfigFile.checkedObject(config)))
                if !waiting.isEmpty {
                    logger.warning("config file changes that take effect only at a restart: \(waiting.joined(separator: ", "))",
                                   metadata: ["tw.config": "\(config)"])
                }
            } catch {
                logger.error("config file not reloaded; the previous settings stay in use", metadata: ["tw.error": "\(error)"])
            }
        }
        defer { reloads.cancel() }
        let group = ServiceGroup(configuration: .init(
            services: composed.services, gracefulShutdownSignals: [.sigterm, .sigint], cancellationSignals: [], logger: logger))
        try await group.run()
        logger.info("stopped")
    }

    /// The server these flags describe, as the services of one group, in the
    /// order they start (they shut down in reverse): the store, its health
    /// probe, lease maintenance, the capture writer, the admin endpoint and
    /// last the frame server, so the frame server drains while the admin
    /// endpoint still answers (readiness 503), leases are held and the store
    /// runs; the frame server ending (its drain done) ends the group.
    public struct Composed: Sendable {
        public let server: ThreadwireServer
        public let services: [ServiceGroupConfiguration.ServiceConfiguration]
        /// Whether tokens can be reloaded (SIGHUP).
        public let reloadsCredentials: Bool
        /// Several principals share it: unset per-principal limits take the multi-principal defaults.
        public var multiPrincipal = false
    }

    /// Builds the server from the flags and the config file.
    /// - Parameter transport: how clients reach it (nil: TCP on `--listen`).
    public func compose(logger: Logger, metricsRegistry: PrometheusCollectorRegistry, transport: (any ServerTransport)? = nil,
                        onListening: @escaping @Sendable (SocketAddress?) -> Void = { _ in },
                        onAdminListening: @escaping @Sendable (String, Int) -> Void = { _, _ in },
                        onGRPCListening: @escaping @Sendable (String, Int) -> Void = { _, _ in },
                        onWebListening: @escaping @Sendable (String, Int) -> Void = { _, _ in }) async throws -> Composed {
        let (host, port) = try Self.hostPort(listen, flag: "--listen")
        let file = try config.map(ConfigFile.load) ?? ConfigFile.Loaded()
        // In process (tests) the process's tracer is the test's business.
        let tracing = transport == nil ? try Observability.startTracing(file.tracing, logger: logger) : nil
        var settings = file.settings
        settings.shutdownTurnGraceMs = Int(turnGraceSeconds * 1000)
        for (flag, value) in [("--max-threads-started-per-minute", maxThreadsStartedPerMinute), ("--max-running-turns", maxRunningTurns),
                              ("--max-requests-per-second", maxRequestsPerSecond), ("--request-burst", requestBurst),
                              ("--max-stored-bytes", maxStoredBytes.map { Int(clamping: $0) })] {
            if let value, value < 0 { throw ValidationError("\(flag) must not be negative (0: no limit)") }
        }
        if let maxThreadsStartedPerMinute { settings.principalLimits.maxThreadsStartedPerMinute = maxThreadsStartedPerMinute }
        if let maxRunningTurns { settings.principalLimits.maxRunningTurns = maxRunningTurns }
        if let maxRequestsPerSecond { settings.principalLimits.maxRequestsPerSecond = maxRequestsPerSecond }
        if let requestBurst { settings.principalLimits.requestBurst = requestBurst }
        if let maxStoredBytes { settings.principalLimits.maxStoredBytes = maxStoredBytes }
        var configuration = ServerConfiguration()
        configuration.host = host
        configuration.port = port
        configuration.transport = transport
        configuration.limits = try limits(over: file.limits)
        configuration.idleUnloadSeconds = idleUnloadSeconds
        guard idempotencyRetentionHours > 0, idempotencyRetentionHours <= 24 * 365 else {
            throw ValidationError("--idempotency-retention-hours must be more than 0 and at most a year, got \(idempotencyRetentionHours)")
        }
        configuration.idempotencyRetention = .milliseconds(Int64(idempotencyRetentionHours * 3_600_000))
        configuration.recordPath = record
        do {
            configuration.authenticator = try Authenticator(
                tokensFile: authTokens, environmentToken: ProcessInfo.processInfo.environment["THREADWIRE_AUTH_TOKEN"])
        } catch {
            throw ValidationError("authentication: \(error)")
        }
        configuration.allowUnauthenticated = allowUnauthenticated
        let toolServers = file.mcpServers.isEmpty ? nil : MCPToolServers(configs: file.mcpServers, logger: logger)
        configuration.toolServers = toolServers
        configuration.requestLoad = { latencies in
            RequestLoadReading.read(String(decoding: metricsRegistry.emitToBuffer(), as: UTF8.self) + "\n" + latencies)
        }
        switch (tlsCert, tlsKey) {
        case let (cert?, key?):
            configuration.tls = ServerTLS(certificateChainFile: cert, privateKeyFile: key, clientCAFile: tlsClientCa)
            if let tlsClientPrincipal {
                guard tlsClientCa != nil else { throw ValidationError("--tls-client-principal needs --tls-client-ca") }
                guard let source = ClientCertificate.PrincipalSource(rawValue: tlsClientPrincipal) else {
                    throw ValidationError("--tls-client-principal must be one of cn, uri, spiffe, dns; got '\(tlsClientPrincipal)'")
                }
                configuration.tls?.clientPrincipal = source
            }
        case (nil, nil): if tlsClientCa != nil { throw ValidationError("--tls-client-ca needs --tls-cert and --tls-key") }
        default: throw ValidationError("--tls-cert and --tls-key go together")
        }
        try configuration.validateExposure()
        if configuration.authenticator.isEnabled || configuration.tls?.clientCAFile != nil {
            // Several principals share this server: none may use it all up.
            settings.principalLimits = settings.principalLimits.filled(from: .multiPrincipalDefaults)
        }
        if !configuration.authenticator.isEnabled, configuration.tls?.clientCAFile == nil, !ServerConfiguration.isLoopback(host) {
            logger.warning("serving \(host):\(port) WITHOUT authentication (--allow-unauthenticated): any client that reaches it can read and change every thread")
        }
        if let authTokens { Self.warnIfReadableByOthers(authTokens, logger: logger) }

        let store: any ThreadStore
        let storeService: StoreLifecycle
        if let url = self.store ?? ProcessInfo.processInfo.environment["THREADWIRE_STORE"], !url.isEmpty {
            let stalled = Duration.milliseconds(Int(min(5, leaseSeconds / 2) * 1000))
            let postgres = try await PostgresThreadStore.connect(
                url: url, logger: logger, stalledTransactionTimeout: stalled,
                operationTimeout: max(stalled * 2, .milliseconds(Int(min(5, leaseSeconds) * 1000))))
            logger.info("store: PostgreSQL", metadata: ["tw.store": "\(postgres.location)"])
            store = postgres
            storeService = StoreLifecycle { postgres.close() }
            do {
                configuration.coordinator = try await clustering(postgres, host: host, port: port, configuration: &configuration, logger: logger)
            } catch {
                postgres.close()
                throw error
            }
        } else {
            if peerListen != nil { throw ValidationError("--peer-listen is for several instances on one PostgreSQL store (--store postgres://…)") }
            store = try SQLiteThreadStore(directory: dataDir, logger: logger)
            // GRDB closes the database when the last reference goes.
            storeService = StoreLifecycle {}
        }
        var backends: [String: any ModelBackend] = [:]
        for (slug, provider) in file.modelProviders {
            do {
                backends[slug] = try OpenAICompatibleBackend(provider: provider, logger: logger)
            } catch {
                throw ValidationError("\(error)")
            }
            logger.info("model served by a provider", metadata: ["tw.model": "\(slug)", "tw.provider": "\(provider.name)"])
        }
        let backend = ModelRouter(backends: backends, fallback: ScriptedEchoBackend(),
                                  providers: file.modelProviders.mapValues(\.name))
        let served: any ThreadStore = tracing == nil ? store
            : TracedThreadStore(store, backend: store is PostgresThreadStore ? "postgresql" : "sqlite")
        let server = try ThreadwireServer(configuration: configuration, settings: settings, store: served, backend: backend,
                                          logger: logger, onListening: onListening)
        var services: [ServiceGroupConfiguration.ServiceConfiguration] = []
        if let tracing { services.append(.init(service: tracing, serviceName: "tracing")) }
        services += [
            .init(service: storeService, serviceName: "store"),
            .init(service: server.storeHealth, serviceName: "store-health"),
            .init(service: server.leaseMaintenance, serviceName: "leases"),
            .init(service: server.idempotencyKeeper, serviceName: "idempotency-keys"),
            .init(service: server.eventKeeper, serviceName: "thread-events"),
        ]
        if let recorder = server.recorder { services.append(.init(service: recorder, serviceName: "recorder")) }
        if let adminListen {
            let (adminHost, adminPort) = try Self.hostPort(adminListen, flag: "--admin-listen")
            let adminToken = try Self.adminToken(file: adminTokenFile, environment: ProcessInfo.processInfo.environment["THREADWIRE_ADMIN_TOKEN"])
            if adminToken == nil, !ServerConfiguration.isLoopback(adminHost) {
                guard allowUnauthenticated else {
                    throw ValidationError("""
                        refusing to serve the admin endpoint on \(adminHost):\(adminPort) without a token: anyone who reaches it could read \
                        /metrics and /leases. Give one with --admin-token-file FILE (or THREADWIRE_ADMIN_TOKEN), listen on a loopback address, \
                        or pass --allow-unauthenticated if the network is trusted
                        """)
                }
                logger.warning("serving the admin endpoint on \(adminHost):\(adminPort) WITHOUT a token (--allow-unauthenticated)")
            }
            let admin = AdminServer(
                host: adminHost, port: adminPort, registry: metricsRegistry,
                authorize: adminToken.map { token in
                    let expected = Array("Bearer \(token)".utf8)
                    return { header in ConstantTime.equal(expected, Array((header ?? "").utf8)) }
                },
                readiness: { let state = server.readiness; return .init(ready: state.ready, reason: state.reason) },
                beforeScrape: { server.refreshGauges() },
                exposition: { server.metricsExposition() },
                leases: { Self.leasesJSON(server.leaseView) },
                onListening: onAdminListening,
                version: ThreadwireRelease.version,
                logger: logger)
            services.append(.init(service: admin, serviceName: "admin"))
        }
        if let toolServers {
            // Before the frames service: stopped after it, so turns finishing in the grace period can still call tools.
            services.append(.init(service: MCPService(servers: toolServers), serviceName: "mcp-servers"))
        }
        if let grpcListen {
            // Before the frame server: shut down after it, so its drain
            // (health NOT_SERVING at once) ends the streams, which are frame connections.
            let (grpcHost, grpcPort) = try Self.hostPort(grpcListen, flag: "--grpc-listen")
            try checkExposure(grpcHost, grpcPort, flag: "--grpc-listen", serves: "gRPC", configuration: configuration, tlsServed: true)
            let grpc = GRPCListener(host: grpcHost, port: grpcPort, calls: server.unaryCalls, tls: configuration.tls,
                                    connectInProcess: { try await server.connectInProcess(certifiedAs: $0) },
                                    waitUntilServing: { await server.waitUntilServing() },
                                    maxMessageBytes: configuration.limits.maxFrameBytes, logger: logger, onListening: onGRPCListening)
            services.append(.init(service: grpc, serviceName: "grpc"))
        }
        if let webListen {
            let (webHost, webPort) = try Self.hostPort(webListen, flag: "--web-listen")
            try checkExposure(webHost, webPort, flag: "--web-listen", serves: "WebSocket sessions", configuration: configuration)
            for origin in webAllowedOrigin where !(origin.hasPrefix("http://") || origin.hasPrefix("https://")) || origin.hasSuffix("/") {
                throw ValidationError("--web-allowed-origin must be scheme://host[:port] as a browser sends it (no path), got '\(origin)'")
            }
            let web = WebListener(.init(host: webHost, port: webPort, maxMessageBytes: configuration.limits.maxFrameBytes,
                                        allowedOrigins: Set(webAllowedOrigin)),
                                  carry: { channel, framing in try server.carrySessionSynchronously(on: channel, framing: framing) },
                                  waitUntilServing: { await server.waitUntilServing() }, logger: logger, onListening: onWebListening)
            services.append(.init(service: web, serviceName: "web"))
        }
        services.append(.init(service: server, successTerminationBehavior: .gracefullyShutdownGroup, serviceName: "frames"))
        if transport == nil, let notifier = SystemdNotifier(environment: ProcessInfo.processInfo.environment, describe: "on \(listen)",
                                                            logger: logger, waitUntilServing: { await server.waitUntilServing() }) {
            services.append(.init(service: notifier, serviceName: "systemd-notify"))
        }
        return Composed(server: server, services: services, reloadsCredentials: configuration.authenticator.isEnabled,
                        multiPrincipal: configuration.authenticator.isEnabled || configuration.tls?.clientCAFile != nil)
    }

    /// The admin endpoint's token: from the file (trailing newline ignored)
    /// or the environment, never both; at least 16 bytes, no whitespace.
    static func adminToken(file: String?, environment: String?) throws -> String? {
        var token: String?
        if let file {
            guard environment == nil else { throw ValidationError("give the admin token once: --admin-token-file or THREADWIRE_ADMIN_TOKEN") }
            guard let data = FileManager.default.contents(atPath: file) else { throw ValidationError("cannot read --admin-token-file \(file)") }
            token = String(decoding: data, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
        } else if let environment, !environment.isEmpty {
            token = environment
        }
        if let token {
            guard token.utf8.count >= 16, !token.contains(where: \.isWhitespace) else {
                throw ValidationError("the admin token must be at least 16 bytes with no whitespace")
            }
        }
        return token
    }

    /// /leases: {"held": [{"tree": …, "epoch": …}], "surely_valid": …}.
    static func leasesJSON(_ view: LeaseView) -> String {
        struct Held: Encodable { var tree: String; var epoch: Int64 }
        struct Body: Encodable { var held: [Held]; var surely_valid: Bool }
        let body = Body(held: view.fences.map { Held(tree: $0.tree, epoch: $0.epoch) }, surely_valid: view.surelyValid)
        let encoder = JSONEncoder()
        encoder.outputFormatting = .sortedKeys
        return (try? encoder.encode(body)).map { String(decoding: $0, as: UTF8.self) } ?? "{}"
    }

    /// Several instances on one PostgreSQL store: leases, the address others
    /// relay to, and how this instance authenticates to them.
    func clustering(_ store: PostgresThreadStore, host: String, port: Int, configuration: inout ServerConfiguration,
                    logger: Logger) async throws -> PostgresLeaseCoordinator {
        guard leaseSeconds >= 1, leaseSeconds <= 300 else { throw ValidationError("--lease-seconds must be from 1 to 300, got \(leaseSeconds)") }
        let address: String
        if let peerListen {
            let (peerHost, peerPort) = try Self.hostPort(peerListen, flag: "--peer-listen")
            configuration.peerListen = (peerHost, peerPort)
        }
        let reachable = peerListen ?? listen
        if let advertise {
            let (advertisedHost, advertisedPort) = try Self.hostPort(advertise, flag: "--advertise")
            guard !advertisedHost.isEmpty, advertisedPort != 0, !["0.0.0.0", "::", "[::]"].contains(advertisedHost) else {
                throw ValidationError("--advertise must name a host and port other instances can reach, got '\(advertise)'")
            }
            address = advertise
        } else {
            // Port 0 is advertised as the port bound.
            let reachableHost = try Self.hostPort(reachable, flag: peerListen == nil ? "--listen" : "--peer-listen").0
            guard !["0.0.0.0", "::", "[::]", ""].contains(reachableHost) else {
                throw ValidationError("with a PostgreSQL store, give --advertise HOST:PORT (where other instances reach this one): \(peerListen == nil ? "--listen" : "--peer-listen") \(reachable) names no host they can reach")
            }
            address = reachable
        }
        let tokens = (peerToken ?? ProcessInfo.processInfo.environment["THREADWIRE_PEER_TOKEN"])
            .map { $0.split(separator: ",", omittingEmptySubsequences: false).map { String($0) } } ?? []
        if tokens.contains(where: { $0.utf8.count < 16 || $0.contains(where: \.isWhitespace) }) {
            throw ValidationError("every peer token must be at least 16 bytes with no whitespace (several are separated by commas)")
        }
        let token = tokens.first
        let authenticates = configuration.authenticator.isEnabled || configuration.tls?.clientCAFile != nil
        if authenticates, token == nil {
            throw ValidationError("""
                this server authenticates clients and shares a PostgreSQL store: give every instance the same --peer-token \
                (or THREADWIRE_PEER_TOKEN), so they can relay requests for threads another instance owns
                """)
        }
        configuration.peers.token = token
        configuration.peers.acceptedTokens = tokens
        configuration.peers.requestTimeout = .seconds(max(5, leaseSeconds * 1.5))
        configuration.peers.takeoverWait = .seconds(leaseSeconds + 1)
        if let tls = configuration.tls {
            configuration.peers.tls = ClientTLS(caFile: peerTlsCa ?? tls.clientCAFile, certificateFile: tls.certificateChainFile,
                                                keyFile: tls.privateKeyFile)
        }
        let leases = PostgresLeaseCoordinator(store: store, address: address, leaseDuration: .milliseconds(Int(leaseSeconds * 1000)))
        let expired = try await leases.start()
        logger.info("sharing the store with other instances", metadata: [
            "tw.advertise": "\(address)", "tw.lease.seconds": "\(leaseSeconds)", "tw.instance": "\(leases.instanceID)",
            "tw.leases.reclaimed": "\(expired)"])
        return leases
    }

    /// SIGHUP: the config file's per-principal limits, except those a flag
    /// or a THREADWIRE_* variable set (they keep their value: one precedence).
    static func reloadedPrincipalLimits(from path: String, flags: PrincipalLimits, multiPrincipal: Bool,
                                 arguments: [String] = CommandLine.arguments,
                                 environment: [String: String] = ProcessInfo.processInfo.environment) throws -> PrincipalLimits {
        var limits = try ConfigFile.load(path).settings.principalLimits
        func fixed(_ flag: String) -> Bool {
            let variable = "THREADWIRE_" + flag.dropFirst(2).uppercased().replacingOccurrences(of: "-", with: "_")
            return arguments.contains { $0 == flag || $0.hasPrefix(flag + "=") } || environment[variable] != nil
        }
        for setting in PrincipalLimits.settings where fixed(setting.flag) { setting.copy(&limits, flags) }
        return multiPrincipal ? limits.filled(from: .multiPrincipalDefaults) : limits
    }

    /// SIGHUP: the config file's server.log_level, when nothing above the file set it.
    static func reloadLogLevel(from path: String, followsFile: Bool, logger: Logger) throws {
        let object = try ConfigFile.checkedObject(path)
        let before = LiveLogLevel.current
        var after = Logger.Level.info
        if let named = SettingSources.lookup("server.log_level", in: object) {
            guard let text = named as? String, let level = Logger.Level(rawValue: text) else {
                throw ConfigFile.ConfigError(description: "config file \(path): server.log_level must be one of "
                    + Logger.Level.allCases.map(\.rawValue).joined(separator: ", ") + "; got '\(named)'")
            }
            after = level
        }
        guard followsFile else {
            if after != before {
                logger.notice("config reloaded; log level stays \(before.rawValue): --log-level or THREADWIRE_LOG_LEVEL set it")
            }
            return
        }
        LiveLogLevel.set(after)
        // At a level the new setting shows, so the line announcing it is never filtered.
        logger.log(level: max(.notice, after), after == before ? "config reloaded; log level unchanged (\(after.rawValue))"
            : "config reloaded; log level changed from \(before.rawValue) to \(after.rawValue)",
            metadata: ["tw.config": "\(path)"])
    }

    /// Runs `reload` on every SIGHUP, off the signal handler.
    static func onSIGHUP(_ reload: @escaping @Sendable () -> Void) -> any DispatchSourceSignal {
        signal(SIGHUP, SIG_IGN)
        let source = DispatchSource.makeSignalSource(signal: SIGHUP, queue: .global())
        source.setEventHandler(handler: reload)
        source.resume()
        return source
    }

    static func warnIfReadableByOthers(_ path: String, logger: Logger) {
        var info = stat()
        guard stat(path, &info) == 0, info.st_mode & 0o077 != 0 else { return }
        logger.warning("the tokens file can be read by other users; chmod 600 it", metadata: ["tw.file": "\(path)"])
    }

    /// Flags win over the config file's "limits", which win over defaults.
    func limits(over file: ServerLimits) throws -> ServerLimits {
        var limits = file
        if let maxFrameBytes { limits.maxFrameBytes = maxFrameBytes }
        if let maxQueuedRequests { limits.maxQueuedRequests = maxQueuedRequests }
        if let maxQueuedRequestBytes { limits.maxQueuedRequestBytes = maxQueuedRequestBytes }
        if let outboundHighWaterBytes { limits.outboundHighWaterBytes = outboundHighWaterBytes }
        if let maxNotificationBacklogBytes { limits.maxNotificationBacklogBytes = maxNotificationBacklogBytes }
        if let maxConnections { limits.maxConnections = maxConnections }
        if let idleTimeoutMs { limits.idleTimeoutMs = idleTimeoutMs }
        if let tcpKeepaliveMs { limits.tcpKeepaliveMs = tcpKeepaliveMs }
        if let maxPartialFrameBytes { limits.maxPartialFrameBytes = maxPartialFrameBytes }
        if let handshakeTimeoutMs { limits.handshakeTimeoutMs = handshakeTimeoutMs }
        do { try limits.validate() } catch { throw ValidationError("limit \(error)") }
        return limits
    }

    /// A cleartext listener beside the frame listener: off loopback only with
    /// authentication (or --allow-unauthenticated), and never beside TLS.
    private func checkExposure(_ host: String, _ port: Int, flag: String, serves: String, configuration: ServerConfiguration,
                               tlsServed: Bool = false) throws {
        guard !ServerConfiguration.isLoopback(host) else { return }
        if configuration.tls != nil, !tlsServed {
            throw ValidationError("\(flag) serves cleartext: beside --tls-cert it must be a loopback address (put a TLS-terminating proxy such as Envoy in front)")
        }
        if !configuration.authenticator.isEnabled, configuration.tls?.clientCAFile == nil, !allowUnauthenticated {
            throw ValidationError("""
                refusing to serve \(serves) on \(host):\(port) without authentication: any client that reaches it could read and change every thread. \
                Configure tokens (--auth-tokens FILE or THREADWIRE_AUTH_TOKEN), listen on a loopback address, or pass --allow-unauthenticated if the network is trusted
                """)
        }
    }

    public static func hostPort(_ value: String, flag: String) throws -> (String, Int) {
        guard let address = HostPort(value) else { throw ValidationError("\(flag) must be HOST:PORT, got '\(value)'") }
        return (address.host, address.port)
    }

    static func metricsFactory(_ registry: PrometheusCollectorRegistry) -> PrometheusMetricsFactory {
        var factory = PrometheusMetricsFactory(registry: registry)
        // The request latencies' bounds (the server keeps those histograms itself).
        factory.defaultDurationHistogramBuckets = ThreadwireServer.durationBuckets
        factory.defaultValueHistogramBuckets = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
        return factory
    }
}

/// The store's life as a service: open before the others start, closed
/// after every other service (the frame server's drain commits) has ended.
struct StoreLifecycle: Service {
    let close: @Sendable () -> Void

    func run() async throws {
        try? await gracefulShutdown()
        close()
    }
}

/// The MCP servers' processes live as long as the server does.
struct MCPService: Service {
    let servers: MCPToolServers
    func run() async throws {
        await cancelWhenGracefulShutdown { await servers.run() }
    }
}

extension LogFormat: ExpressibleByArgument {}
