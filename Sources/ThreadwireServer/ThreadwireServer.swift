import Foundation
public import Logging
import Metrics
import Synchronization
import NIOConcurrencyHelpers
public import NIOCore
public import ServiceLifecycle
public import ThreadwireCore
public import ThreadwireNIO
public import ThreadwireTransport
import ThreadwireWire

/// The principal the opener of an in-process connection verified.
struct VouchedPrincipal: Sendable {
    let principal: Principal
}

/// What every connection shares.
final class ServerServices: Sendable {
    let engine: ThreadEngine
    let registry: ConnectionRegistry
    let info: ServerInfo
    let logger: Logger
    let recorder: FrameRecorder?
    let metrics: ServerMetrics
    let tasks = TaskTracker()
    let peers: PeerSettings
    let connectionIDs = ConnectionIDs()
    let idempotency: IdempotentCalls
    /// Each principal's requests per second (limits.max_requests_per_second).
    let requestGate: RequestGate
    /// Each event loop's flusher of inline answers (ConnectionHandler).
    let tickFlushers = TickFlushers()

    init(engine: ThreadEngine, registry: ConnectionRegistry, info: ServerInfo, logger: Logger, recorder: FrameRecorder?, metrics: ServerMetrics,
         peers: PeerSettings = PeerSettings(), idempotency: IdempotentCalls) {
        self.peers = peers
        self.idempotency = idempotency
        self.engine = engine
        self.registry = registry
        self.info = info
        self.logger = logger
        self.recorder = recorder
        self.metrics = metrics
        requestGate = RequestGate(limits: info.settings.principalLimits, ledger: engine.sharedQuotas)
    }
}

/// The frame server as a service of the process's ServiceGroup: it binds,
/// accepts, and on graceful shutdown drains (see `run`).
public final class ThreadwireServer: Service, Sendable {
    private let configuration: ServerConfiguration
    let services: ServerServices
    private let transport: any ServerTransport
    private let peerTransport: (any ServerTransport)?
    /// Frame connections made inside the process for other transports'
    /// streams (a gRPC stream is one such connection): the same pipeline,
    /// limits and drain as any client's.
    private let bridge = InProcessTransport()
    /// Listening, with the turns a dead process left running recovered.
    private let serving = OnceEvent()
    private let draining = OnceFlag()
    public let storeHealth: StoreHealth
    /// Renews this instance's leases (several instances on one store); a
    /// service of its own, shut down after the frame server has drained.
    public let leaseMaintenance: LeaseMaintenance
    /// Forgets idempotency keys past their retention.
    public let idempotencyKeeper: IdempotencyKeeper
    public let eventKeeper: EventKeeper
    /// The capture file's writer, when recording; a service shut down after
    /// the frame server, so every frame it read is written.
    public var recorder: (any Service)? { services.recorder }
    private let onListening: @Sendable (SocketAddress?) -> Void
    /// Finished once the frame server listens (lease maintenance waits for it).
    private let listened: AsyncStream<Void>.Continuation

    /// - Parameter onListening: called once the transport accepts, with the
    ///   address bound (port 0 picks one; nil in process).
    public init(configuration: ServerConfiguration, settings: ServerSettings, store: any ThreadStore,
                backend: any ModelBackend, logger: Logger,
                onListening: @escaping @Sendable (SocketAddress?) -> Void = { _ in }) throws {
        try configuration.limits.validate()
        try configuration.validateExposure()
        self.configuration = configuration
        self.onListening = onListening
        let flag = draining
        let health = StoreHealth(store: store, logger: logger)
        storeHealth = health
        var info = ServerInfo(limits: configuration.limits, draining: { flag.value }, storeHealthy: { health.isHealthy },
                              defaultModel: settings.defaultModel)
        info.settings = settings
        info.authenticator = configuration.authenticator
        info.clientCertificatesName = configuration.tls?.clientCAFile != nil
        info.peerTokens = (configuration.peers.acceptedTokens.isEmpty ? configuration.peers.token.map { [$0] } ?? [] : configuration.peers.acceptedTokens)
            .map { Array($0.utf8) }
        info.relays = configuration.coordinator != nil
        let metrics = ServerMetrics()
        let readLoad = configuration.requestLoad
        info.requestLoad = { readLoad(metrics.requestLatencyExposition()) }
        if let transport = configuration.transport {
            self.transport = transport
        } else {
            transport = TCPServerTransport(host: configuration.host, port: configuration.port, tls: try configuration.tls?.makeContext())
        }
        peerTransport = try configuration.peerListen.map {
            TCPServerTransport(host: $0.host, port: $0.port, tls: try configuration.tls?.makeContext())
        }
        info.hasPeerListener = peerTransport != nil
        let registry = ConnectionRegistry(baseInstructions: { [settings] in settings.baseInstructions(for: $0) })
        let engine = ThreadEngine(store: MonitoredStore(base: store, health: health), backend: backend, settings: settings, sink: registry,
                                  idleUnloadAfter: .milliseconds(Int(configuration.idleUnloadSeconds * 1000)),
                                  coordinator: configuration.coordinator, toolServers: configuration.toolServers)
        let (listening, listened) = AsyncStream<Void>.makeStream()
        self.listened = listened
        leaseMaintenance = LeaseMaintenance(engine: engine, listening: listening, logger: logger)
        let recorder = try configuration.recordPath.map { try FrameRecorder(path: $0) }
        var keys = IdempotentCalls.Settings()
        keys.retention = configuration.idempotencyRetention
        // With several instances, a claim without its answer may be another
        // instance's, about to record it: wait as long as its lease can last.
        keys.answerWait = configuration.coordinator?.leaseDuration ?? .zero
        let idempotency = IdempotentCalls(store: MonitoredStore(base: store, health: health), settings: keys, logger: logger)
        idempotencyKeeper = IdempotencyKeeper(calls: idempotency)
        eventKeeper = EventKeeper(engine: engine, period: settings.eventRetention.trimEvery, logger: logger)
        services = ServerServices(engine: engine, registry: registry, info: info, logger: logger, recorder: recorder, metrics: metrics,
                                  peers: configuration.peers, idempotency: idempotency)
    }

    /// A frame connection to this server made inside the process: the
    /// client's end of a socket pair (the caller owns and closes it). Other
    /// transports carry their streams over it; UNAVAILABLE-like
    /// `InProcessTransportError.notAccepting` before the server listens and
    /// once it drains.
    ///
    /// - Parameter certifiedAs: the principal of a client certificate the
    ///   other transport verified (mutual TLS): the session acts as it, as a
    ///   TLS connection with that certificate would.
    public func connectInProcess(certifiedAs principal: Principal? = nil) async throws -> Int32 {
        try await bridge.connect(attachment: principal.map(VouchedPrincipal.init))
    }

    /// Serves a session on a channel another listener opened and carries
    /// in its own messages (a WebSocket after its upgrade), on the
    /// channel's event loop: the call layer reads from that channel itself
    /// (`InProcessTransport.adoptSynchronously`). Throws
    /// `InProcessTransportError.notAccepting` before the server listens and
    /// once it drains.
    public func carrySessionSynchronously(on channel: any Channel,
                                          framing: (FrameSizeLimit, PartialFrameBudget) throws -> any ChannelHandler) throws {
        try bridge.adoptSynchronously(channel, framing: framing)
    }

    /// Returns once the server listens, after recovering the turns a dead
    /// process left running (another transport starts serving then).
    public func waitUntilServing() async {
        await serving.wait()
    }

    /// Ready for new work: not draining and the store commits.
    public var readiness: (ready: Bool, reason: String) {
        if draining.value { return (false, "draining: the server is shutting down") }
        if let failure = storeHealth.failure { return (false, "the store cannot commit: \(failure)") }
        if let trouble = services.engine.ownershipTrouble { return (false, trouble) }
        return (true, "ready")
    }

    /// The agent trees this instance holds (admin endpoint /leases).
    public var leaseView: LeaseView { services.engine.leaseView }

    /// Re-reads the tokens file (SIGHUP) and closes every connection whose
    /// token no longer names its principal, with UNAUTHENTICATED. On an
    /// error the tokens in use stay as they were.
    @discardableResult
    public func reloadCredentials() throws -> (tokens: Int, closed: Int) {
        let authenticator = services.info.authenticator
        let count = try authenticator.reload()
        var closed = 0
        for connection in services.registry.all where !connection.credentialStillValid(authenticator) {
            closed += 1
            services.metrics.serverClosed(reason: .tokenRevoked)
            connection.close(code: .unauthenticated, message: "the token this connection authenticated with was revoked; closing", reason: .tokenRevoked)
        }
        services.logger.notice("reloaded auth tokens", metadata: ["tw.tokens": "\(count)", "tw.connections.closed": "\(closed)"])
        return (count, closed)
    }

    /// The per-principal limits in force (limits.max_requests_per_second and the rest).
    public var principalLimits: PrincipalLimits { services.engine.principalLimits.current }

    /// Puts new per-principal limits in force for the requests, turns and
    /// threads that come next (SIGHUP re-reads them); returns what changed,
    /// as "limits.KEY: OLD -> NEW" (0: no limit).
    @discardableResult
    public func reloadPrincipalLimits(_ limits: PrincipalLimits) -> [String] {
        let before = services.engine.principalLimits.current
        services.engine.principalLimits.replace(limits)
        services.requestGate.update(limits)
        return PrincipalLimits.settings.compactMap { setting in
            let (old, new) = (setting.inForce(before), setting.inForce(limits))
            return old == new ? nil : "limits.\(setting.key): \(old) -> \(new)"
        }
    }

    /// Gauges that are read rather than counted, refreshed before a scrape.
    /// The bounds of every duration histogram /metrics shows: the request
    /// latencies the server keeps and the registry's (store commits).
    public static var durationBuckets: [Duration] { LatencyHistogram.bounds.map { .nanoseconds($0) } }

    /// What /metrics adds to the registry's text: the request latency
    /// histograms, which the server keeps itself (`LatencyHistogram`).
    public func metricsExposition() -> String {
        services.metrics.requestLatencyExposition()
    }

    public func refreshGauges() {
        let counts = services.engine.loadCounts
        services.metrics.loadedThreads.record(counts.loaded)
        services.metrics.runningTurns.record(counts.running)
        services.metrics.storeHealthy.record(storeHealth.isHealthy ? 1 : 0)
    }

    /// Serves until graceful shutdown (SIGTERM/SIGINT through the
    /// ServiceGroup), then: health and readiness fail, the transport stops
    /// accepting, in-flight requests finish, running turns get their grace
    /// and are then interrupted with markers recorded, connections get a
    /// last flush and close, and every task the server started is awaited.
    public func run() async throws {
        await RuntimeTimers.prepare()
        // Listening first: with several instances the advertised address (a
        // port 0 resolved) must be known before any lease is taken.
        let source = configuration.tls?.clientPrincipal ?? .commonName
        let certificateLookup: @Sendable (any Channel) -> Principal? = { ClientCertificate.principal(of: $0, from: source) }
        func accept(peerListener: Bool) -> @Sendable (AcceptedConnection) throws -> Void {
            { [services] accepted in
                let info = services.info
                let id = services.connectionIDs.next()
                try accepted.channel.pipeline.syncOperations.addHandler(
                    ConnectionHandler(connectionID: id, services: services, flowControl: accepted.flowControl, frameLimit: accepted.frameLimit,
                                      certificatePrincipal: info.clientCertificatesName ? certificateLookup : nil, peerListener: peerListener))
            }
        }
        let descriptors = measureDescriptorBudget()
        let address = try await transport.listen(connectionSettings(descriptors), accept: accept(peerListener: false))
        // A bridged connection is certified by its opener: the principal of
        // the client certificate its transport verified, if any.
        let acceptBridged: @Sendable (AcceptedConnection) throws -> Void = { [services] accepted in
            let id = services.connectionIDs.next()
            var lookup: (@Sendable (any Channel) -> Principal?)?
            if let vouched = accepted.attachment as? VouchedPrincipal {
                let principal = vouched.principal
                lookup = { _ in principal }
            }
            try accepted.channel.pipeline.syncOperations.addHandler(
                ConnectionHandler(connectionID: id, services: services, flowControl: accepted.flowControl, frameLimit: accepted.frameLimit,
                                  certificatePrincipal: lookup))
        }
        _ = try await bridge.listen(connectionSettings(descriptors), accept: acceptBridged)
        if let peerTransport {
            // Other instances reach this one here: its port is the one advertised.
            let peerAddress = try await peerTransport.listen(connectionSettings(descriptors), accept: accept(peerListener: true))
            configuration.coordinator?.bound(port: peerAddress?.port ?? configuration.peerListen?.port ?? 0)
        } else {
            configuration.coordinator?.bound(port: address?.port ?? configuration.port)
        }
        // Turns that a dead process left running are recovered before the
        // server says it listens, so no client of a supervisor that waits for
        // that line sees a thread ACTIVE with a turn nobody runs.
        let recovered: Int
        do {
            recovered = try await services.engine.recoverInterruptedTurns()
        } catch {
            transport.stopAccepting()
            peerTransport?.stopAccepting()
            bridge.stopAccepting()
            throw error
        }
        if recovered > 0 {
            services.logger.notice("recovered threads whose turns were left running", metadata: ["tw.threads": "\(recovered)"])
        }
        onListening(address)
        listened.finish()
        serving.happen()
        await withGracefulShutdownHandler {
            await transport.waitUntilStopped()
        } onGracefulShutdown: { [draining, transport, peerTransport, bridge] in
            draining.set()
            transport.stopAccepting()
            peerTransport?.stopAccepting()
            bridge.stopAccepting()
        }
        peerTransport?.stopAccepting()
        bridge.stopAccepting()
        draining.set()
        for connection in services.registry.all { connection.serverDraining() }
        await drain()
    }

    /// What the call layer decides of every connection's transport half.
    /// What the file limit leaves connections, said once at startup (with a
    /// warning when it admits fewer connections than max_connections).
    private func measureDescriptorBudget() -> DescriptorBudget {
        let budget = DescriptorBudget.measure()
        let logger = services.logger
        let metadata: Logger.Metadata = ["tw.fd.limit": "\(budget.fileLimit)", "tw.fd.connections": "\(budget.capacity)",
                                         "tw.fd.reserved": "\(budget.reserved)"]
        if budget.capacity < configuration.limits.maxConnections {
            logger.warning("the file limit (ulimit -n, LimitNOFILE=) admits fewer connections than max_connections: at most \(budget.capacity) of \(configuration.limits.maxConnections)",
                           metadata: metadata)
        } else {
            logger.info("file descriptors", metadata: metadata)
        }
        services.metrics.connectionDescriptorCapacity.record(budget.capacity)
        return budget
    }

    private func connectionSettings(_ descriptors: DescriptorBudget) -> ConnectionSettings {
        let limits = configuration.limits
        let info = services.info
        let metrics = services.metrics
        let logger = services.logger
        return ConnectionSettings(
            // Small frames until initialize authenticates the client.
            initialMaxFrameBytes: info.authenticates ? min(info.unauthenticatedMaxFrameBytes, limits.maxFrameBytes) : limits.maxFrameBytes,
            maxPartialFrameBytes: limits.maxPartialFrameBytes,
            outboundHighWaterBytes: limits.outboundHighWaterBytes,
            outOfDescriptorsRefusal: Wire.Envelope(kind: .response(Wire.Response(
                code: StatusCode.unavailable.rawValue, message: "the server is out of file descriptors; try again later")))
                .framed(allocator: ByteBufferAllocator()).readableBytesView.map { $0 },
            tcpKeepaliveSeconds: (limits.tcpKeepaliveMs + 999) / 1000,
            descriptors: descriptors,
            events: TransportEvents(
                readsPaused: { metrics.backpressurePauses.increment() },
                acceptBackedOff: { metrics.acceptBackoffs.increment() },
                refusedOutOfDescriptors: { error, first in
                    if first { logger.warning("out of file descriptors; refused a pending connection", metadata: ["tw.error": "\(error)"]) }
                    metrics.serverClosed(reason: .outOfDescriptors)
                }))
    }

    private func drain() async {
        services.logger.info("draining", metadata: ["tw.connections": "\(services.registry.count)"])
        // In-flight requests finish: each connection's queue empties (new
        // requests are answered UNAVAILABLE while draining). A connection
        // whose client does not take its answers (not writable) cannot
        // finish its queue: it is not waited for.
        let connections = services.registry.all
        let drained = Task<Void, any Error> { for connection in connections { await connection.waitUntilRequestsDone() } }
        _ = try? await firstOf(drained, timeoutMs: 10_000)
        // Running turns get their grace, then are interrupted and recorded.
        await services.engine.shutdown()
        try? await Task.sleep(for: configuration.finalFlush)
        for connection in services.registry.all { try? await connection.channel.close() }
        await services.tasks.waitForAll()
        await services.idempotency.waitForWrites()
    }
}
