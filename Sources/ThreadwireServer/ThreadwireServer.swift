import Foundation
public import Logging
import Metrics
import Synchronization
import NIOConcurrencyHelpers
public import NIOCore
public import ServiceLifecycle
public import ThreadwireCore
import ThreadwireNIO
public import ThreadwireTransport
import ThreadwireWire

public struct ServerConfiguration: Sendable {
    public var host = "127.0.0.1"
    public var port = 7420
    public var limits = ServerLimits()
    public var idleUnloadSeconds = 1800.0
    /// How long connections get for a last flush after in-flight requests end.
    public var finalFlush: Duration = .milliseconds(500)
    /// Write every inbound frame to this capture file.
    public var recordPath: String?
    /// Bearer tokens (see `Authenticator`); disabled by default.
    public var authenticator: Authenticator = .disabled
    /// Serve a non-loopback address without authentication anyway.
    public var allowUnauthenticated = false
    /// The operator's MCP tool servers (nil: none).
    public var toolServers: (any ToolServerHost)?
    /// TLS (and mutual TLS) for every connection; plain TCP when nil.
    public var tls: ServerTLS?
    /// How clients reach the server; nil: TCP on `host`:`port` (with `tls`).
    /// An `InProcessTransport` serves connections made inside the process.
    public var transport: (any ServerTransport)?
    /// Several instances on one store: who owns which agent tree (nil: this
    /// process owns everything), and how requests reach the owner.
    public var coordinator: (any OwnershipCoordinator)?
    public var peers = PeerSettings()
    /// A listener of the instances' own (`--peer-listen`): relays come only
    /// there, and the client listener refuses a peer hello as it refuses a
    /// bad token, so the cluster's secret never works where clients connect.
    public var peerListen: (host: String, port: Int)?
    /// How long idempotency keys (and the answers stored with them) are kept at least.
    public var idempotencyRetention: Duration = .seconds(24 * 3600)
    public init() {}

    /// A server reachable from other machines must authenticate, unless the
    /// operator says otherwise on purpose.
    public func validateExposure() throws {
        guard !Self.isLoopback(host), !authenticator.isEnabled, tls?.clientCAFile == nil, !allowUnauthenticated else { return }
        throw ExposureError(description: """
            refusing to listen on \(host):\(port) without authentication: any client that reaches it could read and change every thread. \
            Configure tokens (--auth-tokens FILE or THREADWIRE_AUTH_TOKEN) or client certificates (--tls-client-ca), or pass --allow-unauthenticated if the network is trusted \
            (for example inside a service mesh that authenticates).
            """)
    }

    public static func isLoopback(_ host: String) -> Bool {
        host == "localhost" || host == "::1" || host == "[::1]" || host.hasPrefix("127.")
    }
}

public struct ExposureError: Error, CustomStringConvertible {
    public let description: String
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
    private let services: ServerServices
    private let transport: any ServerTransport
    private let peerTransport: (any ServerTransport)?
    private let draining = OnceFlag()
    public let storeHealth: StoreHealth
    /// Renews this instance's leases (several instances on one store); a
    /// service of its own, shut down after the frame server has drained.
    public let leaseMaintenance: LeaseMaintenance
    /// Forgets idempotency keys past their retention.
    public let idempotencyKeeper: IdempotencyKeeper
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
        services = ServerServices(engine: engine, registry: registry, info: info, logger: logger, recorder: recorder, metrics: ServerMetrics(),
                                  peers: configuration.peers, idempotency: idempotency)
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

    /// Gauges that are read rather than counted, refreshed before a scrape.
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
        let address = try await transport.listen(connectionSettings(), accept: accept(peerListener: false))
        if let peerTransport {
            // Other instances reach this one here: its port is the one advertised.
            let peerAddress = try await peerTransport.listen(connectionSettings(), accept: accept(peerListener: true))
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
            throw error
        }
        if recovered > 0 {
            services.logger.notice("recovered threads whose turns were left running", metadata: ["tw.threads": "\(recovered)"])
        }
        onListening(address)
        listened.finish()
        await withGracefulShutdownHandler {
            await transport.waitUntilStopped()
        } onGracefulShutdown: { [draining, transport, peerTransport] in
            draining.set()
            transport.stopAccepting()
            peerTransport?.stopAccepting()
        }
        peerTransport?.stopAccepting()
        draining.set()
        for connection in services.registry.all { connection.serverDraining() }
        await drain()
    }

    /// What the call layer decides of every connection's transport half.
    private func connectionSettings() -> ConnectionSettings {
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

/// Renews the leases this instance holds and sweeps for turns a dead
/// instance left running, until graceful shutdown.
public final class LeaseMaintenance: Service, Sendable {
    private let engine: ThreadEngine
    private let listening: AsyncStream<Void>
    private let logger: Logger

    init(engine: ThreadEngine, listening: AsyncStream<Void>, logger: Logger) {
        self.engine = engine
        self.listening = listening
        self.logger = logger
    }

    public func run() async throws {
        let logger = self.logger
        // Not before the frame server listens: its sweep may take leases,
        // and a lease names the address bound (a port 0 resolved). Ends at
        // once if the group is cancelled first.
        for await _ in listening {}
        await cancelWhenGracefulShutdown {
            await self.engine.maintainLeases { logger.notice("\($0)") }
            // One instance alone holds no leases: nothing to do until the end.
            try? await gracefulShutdown()
        }
    }
}

/// Forgets idempotency keys older than the retention window until shutdown.
public final class IdempotencyKeeper: Service, Sendable {
    private let calls: IdempotentCalls
    init(calls: IdempotentCalls) { self.calls = calls }

    public func run() async throws {
        await cancelWhenGracefulShutdown { await self.calls.purgeOldKeys() }
    }
}

/// A flag set once (the drain began), read from any thread.
final class OnceFlag: Sendable {
    private let flag = Atomic<Bool>(false)
    var value: Bool { flag.load(ordering: .acquiring) }
    func set() { flag.store(true, ordering: .releasing) }
}

/// Connection ids, 1, 2, 3, … for the process's life.
final class ConnectionIDs: Sendable {
    private let last = Atomic<UInt64>(0)
    func next() -> UInt64 { last.wrappingAdd(1, ordering: .relaxed).newValue }
}

/// Writes inbound frames to a capture file (format: docs/protocol.md "Capture files").
/// Event loops only append to a memory buffer; a background thread writes it
/// out, so recording adds no file I/O to request handling.
final class FrameRecorder: Service, Sendable {
    static let magic = Array("TWCAP1\n".utf8)
    private struct State {
        var pending: [UInt8] = []
        var closed = false
    }
    private let state = NIOLockedValueBox(State())
    private let wake = ConditionLock(value: 0)
    private let handle: FileHandle
    private let finished = ConditionLock(value: 0)

    init(path: String) throws {
        guard FileManager.default.createFile(atPath: path, contents: Data(Self.magic)),
              let handle = FileHandle(forWritingAtPath: path) else {
            throw DomainError.invalidArgument("cannot create capture file \(path)")
        }
        handle.seekToEndOfFile()
        self.handle = handle
        Thread.detachNewThread { [self] in self.writerLoop() }
    }

    private func writerLoop() {
        while true {
            // Wake when a buffer fills or every 20 ms; the lock is held only on success.
            if wake.lock(whenValue: 1, timeoutSeconds: 0.02) { wake.unlock(withValue: 0) }
            let (bytes, closed) = state.withLockedValue { state -> ([UInt8], Bool) in
                defer { state.pending.removeAll(keepingCapacity: true) }
                return (state.pending, state.closed)
            }
            if !bytes.isEmpty { handle.write(Data(bytes)) }
            if closed {
                handle.closeFile()
                finished.lock()
                finished.unlock(withValue: 1)
                return
            }
        }
    }

    /// Kind 1: an inbound frame exactly as received (header + payload).
    func record(connection: UInt64, payload: [UInt8]) {
        write(kind: 1, connection: connection, body: Framing.frame(payload))
    }

    /// Kind 3: a frame of `length` payload bytes whose content is withheld
    /// (it did not decode before initialize, so it may hold a token).
    func recordWithheld(connection: UInt64, length: Int) {
        write(kind: 3, connection: connection, body: [UInt8(truncatingIfNeeded: length >> 24), UInt8(truncatingIfNeeded: length >> 16),
                                                       UInt8(truncatingIfNeeded: length >> 8), UInt8(truncatingIfNeeded: length)])
    }

    /// Kind 2: request `requestID` of this connection created `createdID` (a
    /// thread or turn id), so a replay can map later references to its own.
    func recordCreated(connection: UInt64, requestID: UInt64, createdID: String) {
        var body: [UInt8] = []
        Self.append(requestID, to: &body)
        let id = Array(createdID.utf8)
        body += [UInt8(id.count >> 8), UInt8(id.count & 0xff)] + id
        write(kind: 2, connection: connection, body: body)
    }

    private func write(kind: UInt8, connection: UInt64, body: [UInt8]) {
        var bytes: [UInt8] = [kind]
        Self.append(UInt64(Date().timeIntervalSince1970 * 1_000_000), to: &bytes)
        Self.append(connection, to: &bytes)
        bytes += body
        let full = state.withLockedValue { state -> Bool in
            state.pending += bytes
            return state.pending.count >= 256 * 1024
        }
        if full {
            wake.lock()
            wake.unlock(withValue: 1)
        }
    }

    static func append(_ value: UInt64, to bytes: inout [UInt8]) {
        for shift in stride(from: 56, through: 0, by: -8) { bytes.append(UInt8((value >> UInt64(shift)) & 0xff)) }
    }

    /// Records until graceful shutdown (the frame server, registered after
    /// it, has drained by then), then writes what is buffered and closes.
    func run() async throws {
        try? await gracefulShutdown()
        // Closing waits for the writer thread: not on the concurrency pool.
        await withCheckedContinuation { (done: CheckedContinuation<Void, Never>) in
            Thread.detachNewThread {
                self.close()
                done.resume()
            }
        }
    }

    /// Writes what is buffered and closes the file.
    func close() {
        state.withLockedValue { $0.closed = true }
        wake.lock()
        wake.unlock(withValue: 1)
        if finished.lock(whenValue: 1, timeoutSeconds: 5) { finished.unlock() }
    }
}
