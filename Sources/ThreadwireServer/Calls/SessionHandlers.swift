import ThreadwireContract
import ThreadwireCore
import ThreadwireWire

/// The methods of the connection itself: initialize (the handshake and
/// authentication) and health/check. Both answer without suspending.
enum SessionHandlers {
    @Sendable static func initialize(_ p: Wire.InitializeParams, _ call: Call) throws -> InlineAnswer? {
        if let version = p.protocolVersion, version != call.server.protocolVersion {
            throw RequestError(.failedPrecondition, "protocol_version \(version) is not supported; this server speaks \(call.server.protocolVersion)")
        }
        guard let name = p.clientInfo?.name, !name.isEmpty else {
            throw RequestError(.invalidArgument, "client_info.name is required")
        }
        if call.connection.isInitialized {
            throw RequestError(.failedPrecondition, "initialize was already called on this connection")
        }
        if call.server.hasPeerListener, (p.peer != nil) != call.connection.onPeerListener {
            // A peer hello where clients connect (or a client on the peers'
            // listener) gets exactly the answer of a bad token: nothing says
            // that a cluster secret would work here.
            throw RequestError(.unauthenticated, "auth_token is not valid for this server; closing")
        }
        let (principal, credential) = try p.peer.map { try authenticatePeer($0, call) } ?? authenticate(p.authToken, call)
        var capabilities: Set<ClientCapability> = []
        if p.capabilities?.clientTools == true { capabilities.insert(.clientTools) }
        if p.capabilities?.approvals == true { capabilities.insert(.approvals) }
        if p.capabilities?.userInput == true { capabilities.insert(.userInput) }
        guard call.connection.markInitialized(optOut: p.capabilities?.optOutNotificationMethods ?? [],
                                              principal: principal, credential: credential, peer: p.peer != nil,
                                              capabilities: capabilities) else {
            throw RequestError(.failedPrecondition, "initialize was already called on this connection")
        }
        let info = call.server
        let limits = info.limits
        let principalLimits = call.engine.principalLimits.current
        return .result(.initialize(Wire.InitializeResult(
            serverInfo: Wire.ServerInfo(name: info.name, version: info.version),
            protocolVersion: info.protocolVersion,
            limits: Wire.ServerLimits(
                maxFrameBytes: UInt32(limits.maxFrameBytes), maxQueuedRequests: UInt32(limits.maxQueuedRequests),
                handshakeTimeoutMs: UInt32(limits.handshakeTimeoutMs),
                maxQueuedRequestBytes: UInt32(clamping: limits.maxQueuedRequestBytes),
                maxNotificationBacklogBytes: UInt32(clamping: limits.maxNotificationBacklogBytes),
                idleTimeoutMs: UInt32(clamping: limits.idleTimeoutMs),
                maxThreadsStartedPerMinute: UInt32(clamping: principalLimits.threadsPerMinute),
                maxRunningTurns: UInt32(clamping: principalLimits.runningTurns),
                maxRequestsPerSecond: UInt32(clamping: principalLimits.requestsPerSecond),
                requestBurst: UInt32(clamping: principalLimits.requestsPerSecond > 0 ? principalLimits.burst : 0),
                maxStoredBytes: UInt64(clamping: principalLimits.storedBytes)),
            principal: principal,
            isOperator: info.authenticates && info.authenticator.isOperator(principal) ? true : nil)))
    }

    /// The principal of a connection: its bearer token's, else its verified
    /// client certificate's; on a server without authentication, the one
    /// principal. UNAUTHENTICATED ends the connection (see `CallDispatcher`).
    static func authenticate(_ token: String?, _ call: Call) throws -> (Principal, [UInt8]?) {
        let server = call.server
        guard server.authenticates else { return (.standalone, nil) }
        if let token, !token.isEmpty {
            let presented = Array(token.utf8)
            guard let principal = server.authenticator.principal(presenting: presented) else {
                throw RequestError(.unauthenticated, "auth_token is not valid for this server; closing")
            }
            if let certified = call.connection.certificatePrincipal, certified != principal {
                throw RequestError(.unauthenticated, "auth_token names another principal than the client certificate; closing")
            }
            return (principal, presented)
        }
        if let certified = call.connection.certificatePrincipal { return (certified, nil) }
        throw RequestError(.unauthenticated, server.clientCertificatesName
            ? "this server authenticates clients: present a client certificate or set auth_token in initialize; closing"
            : "this server authenticates clients: set auth_token in initialize; closing")
    }

    /// Another instance relaying for a client: it must know the cluster's
    /// secret when this server authenticates (or was given one), and then
    /// acts for the principal it names.
    static func authenticatePeer(_ hello: Wire.PeerHello, _ call: Call) throws -> (Principal, [UInt8]?) {
        let server = call.server
        if !server.peerTokens.isEmpty {
            // Every accepted secret is compared (no early stop): the time
            // says nothing of which one, if any, matched.
            let presented = Array((hello.token ?? "").utf8)
            var matched = false
            for secret in server.peerTokens where ConstantTime.equal(secret, presented) { matched = true }
            guard hello.token != nil, matched else {
                throw RequestError(.unauthenticated, "peer.token is not this cluster's peer token; closing")
            }
        } else if server.authenticates {
            throw RequestError(.unauthenticated, "this server takes no relayed requests: it authenticates clients and has no --peer-token; closing")
        }
        guard server.authenticates else { return (.standalone, nil) }
        guard let principal = hello.principal, !principal.isEmpty else {
            throw RequestError(.invalidArgument, "peer.principal is required on a server that authenticates")
        }
        return (principal, nil)
    }

    /// The configured models (and the default one, served offline when no
    /// provider is configured for it), for a client's picker.
    @Sendable static func modelList(_ p: Wire.ModelListParams, _ call: Call) throws -> InlineAnswer? {
        let (entries, defaultModel) = call.engine.modelCatalog
        var models = entries.map { entry in
            Wire.ModelInfo(slug: entry.slug, provider: entry.provider, contextWindow: entry.contextWindow.map(UInt64.init),
                           streams: entry.provider != nil, offline: entry.provider == nil, multiAgentVersion: entry.multiAgentVersion,
                           reasoningEfforts: entry.reasoningEfforts ?? Reasoning.standardEfforts)
        }
        if !entries.contains(where: { $0.slug == defaultModel }) {
            models.insert(Wire.ModelInfo(slug: defaultModel, streams: false, offline: true, reasoningEfforts: Reasoning.standardEfforts), at: 0)
        }
        return .result(.modelList(Wire.ModelListResult(models: models, defaultModel: defaultModel)))
    }

    /// The operator's MCP servers: names, states and tools (no thread data).
    @Sendable static func mcpServerList(_ p: Wire.McpServerListParams, _ call: Call) throws -> InlineAnswer? {
        .result(.mcpServerList(Wire.McpServerListResult(servers: call.engine.toolServerStatuses(for: call.principal).map(\.wire))))
    }

    /// cluster/status: the store's instances and leases, this instance's
    /// requests; an operator's view (on a server without principals, the
    /// one user's).
    @Sendable static func clusterStatus(_ p: Wire.ClusterStatusParams, _ call: Call) async throws -> Outcome<Wire.Response.Result> {
        guard !call.server.authenticates || call.isOperator else {
            throw RequestError(.permissionDenied, "cluster/status is for operators (a tokens file line 'PRINCIPAL TOKEN operator')")
        }
        let limit = try TurnPaging.limit(p.leaseLimit, field: "lease_limit", default: 200)
        var result = Wire.ClusterStatusResult(version: call.server.version, sharedStore: false, draining: call.server.draining())
        if let (instanceID, table) = try await call.engine.leaseTable(limit: limit) {
            result.instanceId = instanceID
            result.sharedStore = true
            result.leases = table.leases.map {
                Wire.TreeLease(tree: $0.tree, instanceId: $0.instanceID, address: $0.address, epoch: UInt64(max(0, $0.epoch)),
                               expiresInMs: UInt64(max(0, $0.expiresInMs)))
            }
            result.instances = table.holders.map {
                Wire.ClusterInstance(instanceId: $0.instanceID, address: $0.address, liveLeases: UInt32(clamping: $0.liveLeases),
                                     thisInstance: $0.instanceID == instanceID)
            }
            if !table.holders.contains(where: { $0.instanceID == instanceID }) {
                result.instances.append(Wire.ClusterInstance(instanceId: instanceID, liveLeases: 0, thisInstance: true))
            }
        } else {
            result.instances = [Wire.ClusterInstance(liveLeases: 0, thisInstance: true)]
        }
        result.methods = call.server.requestLoad().map { Wire.MethodLoad(method: $0.method, requests: $0.requests, p99Ms: $0.p99Ms) }
        return Outcome(.clusterStatus(result))
    }

    /// The compiled contract, so generic tools need no .proto files. Built
    /// once: it is the same for every caller.
    @Sendable static func reflectionDescriptors(_ p: Wire.ReflectionDescriptorsParams, _ call: Call) throws -> InlineAnswer? {
        var schema = reflectedSchema
        schema.protocolVersion = call.server.protocolVersion
        return .result(.reflectionDescriptors(schema))
    }

    private static let reflectedSchema: Wire.ReflectionDescriptorsResult = {
        func reflected(_ methods: [WireSchema.Method]) -> [Wire.ReflectedMethod] {
            methods.map { Wire.ReflectedMethod(name: $0.name, field: $0.field, paramsType: $0.paramsType, resultType: $0.resultType) }
        }
        // Clients learn from the table which methods need a key to be retried.
        let methods = reflected(WireSchema.methods).map { method -> Wire.ReflectedMethod in
            var method = method
            method.mutates = method.name.flatMap { MethodTable.methods[$0]?.mutates } ?? false
            return method
        }
        return Wire.ReflectionDescriptorsResult(
            fileDescriptorSet: WireSchema.fileDescriptorSet, envelopeType: WireSchema.envelopeType,
            methods: methods,
            notifications: reflected(WireSchema.notifications), serverRequests: reflected(WireSchema.serverRequests))
    }()

    /// Inline (the common case): one of two results encoded once.
    @Sendable static func healthCheck(_ p: Wire.HealthCheckParams, _ call: Call) throws -> InlineAnswer? {
        .encoded(try serving(p, call) ? encodedServing : encodedNotServing)
    }

    /// Behind other requests of its connection.
    @Sendable static func healthCheckQueued(_ p: Wire.HealthCheckParams, _ call: Call) async throws -> Outcome<Wire.Response.Result> {
        Outcome(healthResult(serving: try serving(p, call)))
    }

    private static func serving(_ p: Wire.HealthCheckParams, _ call: Call) throws -> Bool {
        if let service = p.service, !service.isEmpty {
            throw RequestError(.notFound, "unknown service '\(service)'; use an empty service name for the whole server")
        }
        return !call.server.draining() && call.server.storeHealthy()
    }

    private static func healthResult(serving: Bool) -> Wire.Response.Result {
        .healthCheck(Wire.HealthCheckResult(status: serving ? .serving : .notServing))
    }

    private static let encodedServing = Wire.EncodedResult(healthResult(serving: true))
    private static let encodedNotServing = Wire.EncodedResult(healthResult(serving: false))
}
