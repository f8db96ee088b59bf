import Foundation
import ThreadwireContract
public import ThreadwireCore
import ThreadwireWire

/// What a handler gets besides its params.
struct RequestContext: Sendable {
    let connection: Connection
    let engine: ThreadEngine
    let server: ServerInfo

    /// A thread's base instructions, without a hop through the engine actor.
    func baseInstructions(_ record: ThreadRecord) -> String {
        server.settings.baseInstructions(for: record)
    }

    /// The principal this request acts for.
    var principal: Principal { connection.principal }

    /// Tenant isolation: a thread of another principal is NOT_FOUND, with the
    /// very message a missing thread gets, so ids cannot be probed. Owners
    /// never change, so the check cannot go stale before the command runs.
    func authorize(_ id: ThreadID) async throws {
        guard server.authenticates else { return }
        guard try await engine.threadOwner(id) == principal else { throw DomainError.notFound("thread \(id) not found") }
    }

    /// `authorize` for a loaded thread's snapshot, without suspending.
    func authorize(_ published: PublishedThread, id: ThreadID) throws {
        guard server.authenticates, published.owner != principal else { return }
        throw DomainError.notFound("thread \(id) not found")
    }
}

/// Facts about the server that initialize and health/check report.
public struct ServerInfo: Sendable {
    public var name = "threadwire"
    public var version = "0.1.0"
    public var protocolVersion: UInt32 = 1
    public var limits: ServerLimits
    public var draining: @Sendable () -> Bool
    public var storeHealthy: @Sendable () -> Bool
    public var settings = ServerSettings()
    public var authenticator: Authenticator = .disabled
    /// Mutual TLS: a verified client certificate names the principal.
    public var clientCertificatesName = false
    /// Until initialize succeeds on a server that authenticates, frames are
    /// capped at this size, so an unauthenticated client cannot make the
    /// server buffer much.
    public var unauthenticatedMaxFrameBytes = 65_536
    /// The cluster's shared secret other instances present when they relay
    /// requests (several instances on one store).
    public var peerToken: [UInt8]?
    /// Several instances share the store: requests for threads another
    /// instance owns are relayed there.
    public var relays = false

    /// Whether connections act as distinct principals (tokens or client
    /// certificates); otherwise everything belongs to one principal.
    public var authenticates: Bool { authenticator.isEnabled || clientCertificatesName }

    public init(limits: ServerLimits, draining: @escaping @Sendable () -> Bool, storeHealthy: @escaping @Sendable () -> Bool = { true }) {
        self.limits = limits
        self.draining = draining
        self.storeHealthy = storeHealthy
    }
}

typealias Handler = @Sendable (Wire.Request.Params, RequestContext) async throws -> Outcome<Wire.Response.Result>
/// Answers without suspending, on the event loop that read the request, or
/// returns nil when it cannot (the request then takes the async path).
typealias InlineHandler = @Sendable (Wire.Request.Params, RequestContext) throws -> InlineAnswer?

/// An inline handler's OK answer: a result to encode, or one encoded before
/// (a thread/read of an unchanged snapshot is encoded once, see
/// `EncodedResult`).
enum InlineAnswer {
    case result(Wire.Response.Result)
    case encoded(EncodedResult)
}

/// One entry of the method table: checks that apply before the handler runs.
struct MethodSpec: Sendable {
    let name: String
    let requiresHandshake: Bool
    let handler: Handler
    var inline: InlineHandler? = nil
}

/// The method table: every method, keyed by its name ("thread/start").
enum MethodTable {
    static func name(of params: Wire.Request.Params) -> String {
        params.methodName
    }

    static let methods: [String: MethodSpec] = {
        let specs: [MethodSpec] = [
            MethodSpec(name: "initialize", requiresHandshake: false, handler: queued(initializeInline), inline: initializeInline),
            MethodSpec(name: "health/check", requiresHandshake: false, handler: queued(healthCheckInline), inline: healthCheckInline),
            MethodSpec(name: "thread/start", requiresHandshake: true, handler: threadStart),
            MethodSpec(name: "thread/resume", requiresHandshake: true, handler: threadResume),
            MethodSpec(name: "thread/fork", requiresHandshake: true, handler: threadFork),
            MethodSpec(name: "thread/read", requiresHandshake: true, handler: threadRead, inline: threadReadInline),
            MethodSpec(name: "thread/list", requiresHandshake: true, handler: threadList),
            MethodSpec(name: "thread/turns/list", requiresHandshake: true, handler: threadTurnsList),
            MethodSpec(name: "thread/archive", requiresHandshake: true, handler: threadArchive),
            MethodSpec(name: "thread/unarchive", requiresHandshake: true, handler: threadUnarchive),
            MethodSpec(name: "thread/unsubscribe", requiresHandshake: true, handler: threadUnsubscribe),
            MethodSpec(name: "thread/settings/update", requiresHandshake: true, handler: settingsUpdate),
            MethodSpec(name: "agent/spawn", requiresHandshake: true, handler: agentSpawn),
            MethodSpec(name: "turn/start", requiresHandshake: true, handler: turnStart),
            MethodSpec(name: "turn/interrupt", requiresHandshake: true, handler: turnInterrupt),
        ]
        return Dictionary(uniqueKeysWithValues: specs.map { ($0.name, $0) })
    }()

    // MARK: Validation helpers

    static func required(_ value: String?, _ field: String) throws -> String {
        guard let value, !value.isEmpty else { throw RequestError(.invalidArgument, "\(field) is required") }
        return value
    }

    static func modeUpdate(_ update: Wire.TurnStartParams.MultiAgentModeUpdate?, field: String) throws -> ModeUpdate {
        switch update {
        case nil: return .keep
        case let .multiAgentMode(mode)?:
            guard let mode = MultiAgentMode(wire: mode) else {
                throw RequestError(.invalidArgument, "\(field).multi_agent_mode must be EXPLICIT_REQUEST_ONLY or PROACTIVE (omit it to keep the selection, or set clear_multi_agent_mode)")
            }
            return .set(mode)
        case let .clearMultiAgentMode(clear)?:
            guard clear else { throw RequestError(.invalidArgument, "\(field).clear_multi_agent_mode must be true when present") }
            return .clear
        }
    }

    /// The same answer on the async path, for a request that arrives while
    /// others of its connection are queued; for handlers that always answer.
    static func queued(_ inline: @escaping InlineHandler) -> Handler {
        { params, context in
            guard case let .result(result)? = try inline(params, context) else {
                throw RequestError(.internal, "an inline handler without an async path did not answer")
            }
            return Outcome(result)
        }
    }

    static func mismatch(_ method: String) -> RequestError {
        RequestError(.internal, "method table entry \(method) received other params")
    }

    // MARK: Handlers

    static let initializeInline: InlineHandler = { params, context in
        guard case let .initialize(p) = params else { throw mismatch("initialize") }
        if let version = p.protocolVersion, version != context.server.protocolVersion {
            throw RequestError(.failedPrecondition, "protocol_version \(version) is not supported; this server speaks \(context.server.protocolVersion)")
        }
        guard let name = p.clientInfo?.name, !name.isEmpty else {
            throw RequestError(.invalidArgument, "client_info.name is required")
        }
        if context.connection.isInitialized {
            throw RequestError(.failedPrecondition, "initialize was already called on this connection")
        }
        let (principal, credential) = try p.peer.map { try authenticatePeer($0, context) } ?? authenticate(p.authToken, context)
        guard context.connection.markInitialized(optOut: p.capabilities?.optOutNotificationMethods ?? [],
                                                  principal: principal, credential: credential, peer: p.peer != nil) else {
            throw RequestError(.failedPrecondition, "initialize was already called on this connection")
        }
        let info = context.server
        let limits = info.limits
        let principalLimits = info.settings.principalLimits
        return .result(.initialize(Wire.InitializeResult(
            serverInfo: Wire.ServerInfo(name: info.name, version: info.version),
            protocolVersion: info.protocolVersion,
            limits: Wire.ServerLimits(
                maxFrameBytes: UInt32(limits.maxFrameBytes), maxQueuedRequests: UInt32(limits.maxQueuedRequests),
                handshakeTimeoutMs: UInt32(limits.handshakeTimeoutMs),
                maxQueuedRequestBytes: UInt32(clamping: limits.maxQueuedRequestBytes),
                maxNotificationBacklogBytes: UInt32(clamping: limits.maxNotificationBacklogBytes),
                idleTimeoutMs: UInt32(clamping: limits.idleTimeoutMs),
                maxThreadsStartedPerMinute: UInt32(clamping: principalLimits.maxThreadsStartedPerMinute),
                maxRunningTurns: UInt32(clamping: principalLimits.maxRunningTurns)),
            principal: principal)))
    }

    /// The principal of a connection: its bearer token's, else its verified
    /// client certificate's; on a server without authentication, the one
    /// principal. UNAUTHENTICATED ends the connection (see `respond`).
    static func authenticate(_ token: String?, _ context: RequestContext) throws -> (Principal, [UInt8]?) {
        let server = context.server
        guard server.authenticates else { return (.standalone, nil) }
        if let token, !token.isEmpty {
            let presented = Array(token.utf8)
            guard let principal = server.authenticator.principal(presenting: presented) else {
                throw RequestError(.unauthenticated, "auth_token is not valid for this server; closing")
            }
            if let certified = context.connection.certificatePrincipal, certified != principal {
                throw RequestError(.unauthenticated, "auth_token names another principal than the client certificate; closing")
            }
            return (principal, presented)
        }
        if let certified = context.connection.certificatePrincipal { return (certified, nil) }
        throw RequestError(.unauthenticated, server.clientCertificatesName
            ? "this server authenticates clients: present a client certificate or set auth_token in initialize; closing"
            : "this server authenticates clients: set auth_token in initialize; closing")
    }

    /// Another instance relaying for a client: it must know the cluster's
    /// secret when this server authenticates (or was given one), and then
    /// acts for the principal it names.
    static func authenticatePeer(_ hello: Wire.PeerHello, _ context: RequestContext) throws -> (Principal, [UInt8]?) {
        let server = context.server
        if let secret = server.peerToken {
            guard let token = hello.token, ConstantTime.equal(secret, Array(token.utf8)) else {
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

    static let healthCheckInline: InlineHandler = { params, context in
        guard case let .healthCheck(p) = params else { throw mismatch("health/check") }
        if let service = p.service, !service.isEmpty {
            throw RequestError(.notFound, "unknown service '\(service)'; use an empty service name for the whole server")
        }
        let serving = !context.server.draining() && context.server.storeHealthy()
        return .result(.healthCheck(Wire.HealthCheckResult(status: serving ? .serving : .notServing)))
    }

    static let threadStart: Handler = { params, context in
        guard case let .threadStart(p) = params else { throw mismatch("thread/start") }
        var request = ThreadEngine.StartRequest()
        request.model = p.model
        request.cwd = p.cwd
        request.name = p.name
        request.baseInstructions = p.baseInstructions
        request.config = try p.config.enumerated().map { index, entry in
            KeyValuePair(key: try required(entry.key, "config[\(index)].key"), value: entry.value ?? "")
        }
        if let mode = p.multiAgentMode {
            guard let selected = MultiAgentMode(wire: mode) else {
                throw RequestError(.invalidArgument, "multi_agent_mode must be EXPLICIT_REQUEST_ONLY or PROACTIVE (omit it for no selection)")
            }
            request.mode = selected
        }
        switch p.source {
        case nil, .unspecified?, .appServer?: break
        case .review?: request.review = true
        case let other?:
            throw RequestError(.invalidArgument, "source must be APP_SERVER or REVIEW, got \(other.protoValueName)")
        }
        request.owner = context.principal
        let outcome = try await context.engine.startThread(request, connection: context.connection.id)
        let base = context.baseInstructions(outcome.value.record)
        return Outcome(.threadStart(outcome.value.lifecycleResult(baseInstructions: base)), carrying: outcome)
    }

    static let threadResume: Handler = { params, context in
        guard case let .threadResume(p) = params else { throw mismatch("thread/resume") }
        let threadID = try required(p.threadId, "thread_id")
        try await context.authorize(threadID)
        let outcome = try await context.engine.resumeThread(
            threadID, model: p.model, excludeTurns: p.excludeTurns ?? false,
            connection: context.connection.id)
        let base = context.baseInstructions(outcome.value.record)
        let result = TurnPaging.fitLifecycle(outcome.value, baseInstructions: base, limits: context.server.limits) { .threadResume($0) }
        return Outcome(result, carrying: outcome)
    }

    static let threadFork: Handler = { params, context in
        guard case let .threadFork(p) = params else { throw mismatch("thread/fork") }
        let sourceID = try required(p.threadId, "thread_id")
        try await context.authorize(sourceID)
        let outcome = try await context.engine.forkThread(
            sourceID, model: p.model, excludeTurns: p.excludeTurns ?? false,
            connection: context.connection.id)
        let base = context.baseInstructions(outcome.value.record)
        let result = TurnPaging.fitLifecycle(outcome.value, baseInstructions: base, limits: context.server.limits) { .threadFork($0) }
        return Outcome(result, carrying: outcome)
    }

    static let threadRead: Handler = { params, context in
        guard case let .threadRead(p) = params else { throw mismatch("thread/read") }
        let includeTurns = p.includeTurns ?? false
        let threadID = try required(p.threadId, "thread_id")
        try await context.authorize(threadID)
        let view = try await context.engine.readThread(
            threadID, includeTurns: includeTurns,
            includeModelRequests: includeTurns && (p.includeModelRequests ?? false),
            turnsLimit: try TurnPaging.limit(p.turnsLimit, field: "turns_limit", default: 100))
        return Outcome(threadReadResult(view, includeTurns: includeTurns, context))
    }

    /// A loaded thread's snapshot needs no suspension.
    static let threadReadInline: InlineHandler = { params, context in
        guard case let .threadRead(p) = params else { throw mismatch("thread/read") }
        let includeTurns = p.includeTurns ?? false
        let threadID = try required(p.threadId, "thread_id")
        let turnsLimit = try TurnPaging.limit(p.turnsLimit, field: "turns_limit", default: 100)
        guard let published = context.engine.published(threadID) else { return nil }
        try context.authorize(published, id: threadID)
        guard includeTurns else {
            // The common read depends only on the snapshot: encoded once per commit.
            return .encoded(published.memo.value {
                EncodedResult(threadReadResult(published.view(includeTurns: false, includeModelRequests: false),
                                               includeTurns: false, context))
            })
        }
        let view = published.view(includeTurns: true, includeModelRequests: p.includeModelRequests ?? false, turnsLimit: turnsLimit)
        return .result(threadReadResult(view, includeTurns: true, context))
    }

    static func threadReadResult(_ view: ThreadView, includeTurns: Bool, _ context: RequestContext) -> Wire.Response.Result {
        let base = context.baseInstructions(view.record)
        var thread = view.wire(baseInstructions: base)
        guard includeTurns else {
            // Nothing to page: the common read stays one encoding.
            return .threadRead(Wire.ThreadReadResult(thread: thread, settings: view.settings.wire))
        }
        let turns = thread.turns
        thread.turns = []
        var result = Wire.ThreadReadResult(thread: thread, settings: view.settings.wire)
        let page = TurnPaging.newestThatFit(turns, records: view.turns ?? [], olderLeftOut: view.hasOlderTurns,
                                            around: .threadRead(result), limits: context.server.limits)
        result.thread?.turns = page.turns
        result.turnsNextCursor = page.nextCursor
        return .threadRead(result)
    }

    static let threadTurnsList: Handler = { params, context in
        guard case let .threadTurnsList(p) = params else { throw mismatch("thread/turns/list") }
        let descending = p.sortDirection != .ascending
        let limit = try TurnPaging.limit(p.limit, field: "limit", default: 25)
        let threadID = try required(p.threadId, "thread_id")
        try await context.authorize(threadID)
        let page = try await context.engine.listTurns(
            threadID, cursor: p.cursor, limit: limit, descending: descending)
        let fitted = try TurnPaging.inOrderThatFit(page.turns, more: page.more, limits: context.server.limits)
        return Outcome(.threadTurnsList(Wire.ThreadTurnsListResult(data: fitted.turns, nextCursor: fitted.nextCursor)))
    }

    static let threadList: Handler = { params, context in
        guard case let .threadList(p) = params else { throw mismatch("thread/list") }
        var query = ThreadListQuery()
        if let limit = p.limit {
            guard (1...1000).contains(limit) else { throw RequestError(.invalidArgument, "limit must be from 1 to 1000, got \(limit)") }
            query.limit = Int(limit)
        }
        query.sortKey = p.sortKey == .updatedAt ? .updatedAt : .createdAt
        query.ascending = p.sortDirection == .ascending
        query.cursor = p.cursor
        query.parentID = p.parentThreadId
        query.archived = p.archived ?? false
        if context.server.authenticates { query.owner = context.principal }
        let page = try await context.engine.listThreads(query)
        let threads = page.threads.map { $0.wire(baseInstructions: "") }
        // A page of large threads is cut where the frame would overflow.
        let room = TurnPaging.budget(around: .threadList(Wire.ThreadListResult(nextCursor: TurnPaging.cursorRoom)), limits: context.server.limits)
        let fitted = TurnPaging.prefixThatFits(threads, room: room)
        guard fitted < threads.count else {
            return Outcome(.threadList(Wire.ThreadListResult(data: threads, nextCursor: page.nextCursor)))
        }
        guard fitted > 0 else {
            throw RequestError(.resourceExhausted, "thread \(page.threads[0].record.id) is over max_frame_bytes (\(context.server.limits.maxFrameBytes)) even alone")
        }
        return Outcome(.threadList(Wire.ThreadListResult(
            data: Array(threads.prefix(fitted)), nextCursor: query.cursor(after: page.threads[fitted - 1].record))))
    }

    static let threadArchive: Handler = { params, context in
        guard case let .threadArchive(p) = params else { throw mismatch("thread/archive") }
        let threadID = try required(p.threadId, "thread_id")
        try await context.authorize(threadID)
        let outcome = try await context.engine.setArchived(threadID, archived: true)
        return Outcome(.threadArchive(Wire.ThreadArchiveResult()), carrying: outcome)
    }

    static let threadUnarchive: Handler = { params, context in
        guard case let .threadUnarchive(p) = params else { throw mismatch("thread/unarchive") }
        let threadID = try required(p.threadId, "thread_id")
        try await context.authorize(threadID)
        let outcome = try await context.engine.setArchived(threadID, archived: false)
        return Outcome(.threadUnarchive(Wire.ThreadUnarchiveResult(thread: outcome.value.wire(baseInstructions: ""))), carrying: outcome)
    }

    static let threadUnsubscribe: Handler = { params, context in
        guard case let .threadUnsubscribe(p) = params else { throw mismatch("thread/unsubscribe") }
        let threadID = try required(p.threadId, "thread_id")
        try await context.authorize(threadID)
        let was = try await context.engine.unsubscribe(threadID, connection: context.connection.id)
        return Outcome(.threadUnsubscribe(Wire.ThreadUnsubscribeResult(wasSubscribed: was)))
    }

    static let settingsUpdate: Handler = { params, context in
        guard case let .threadSettingsUpdate(p) = params else { throw mismatch("thread/settings/update") }
        var update = ThreadEngine.SettingsUpdate()
        update.model = p.model
        update.cwd = p.cwd
        switch p.multiAgentModeUpdate {
        case nil: update.mode = .keep
        case let .multiAgentMode(mode)?: update.mode = try modeUpdate(.multiAgentMode(mode), field: "thread/settings/update")
        case let .clearMultiAgentMode(clear)?: update.mode = try modeUpdate(.clearMultiAgentMode(clear), field: "thread/settings/update")
        }
        let threadID = try required(p.threadId, "thread_id")
        try await context.authorize(threadID)
        let outcome = try await context.engine.updateSettings(threadID, update)
        return Outcome(.threadSettingsUpdate(Wire.ThreadSettingsUpdateResult(
            settings: outcome.value.0.wire, changed: outcome.value.1)), carrying: outcome)
    }

    static let agentSpawn: Handler = { params, context in
        guard case let .agentSpawn(p) = params else { throw mismatch("agent/spawn") }
        var request = ThreadEngine.SpawnRequest()
        request.message = p.message
        request.model = p.model
        request.taskName = p.taskName
        request.review = p.review ?? false
        let parentID = try required(p.parentThreadId, "parent_thread_id")
        try await context.authorize(parentID)
        let outcome = try await context.engine.spawnAgent(parentID: parentID, request, connection: context.connection.id)
        let base = context.baseInstructions(outcome.value.record)
        return Outcome(.agentSpawn(outcome.value.lifecycleResult(baseInstructions: base)), carrying: outcome)
    }

    static let turnStart: Handler = { params, context in
        guard case let .turnStart(p) = params else { throw mismatch("turn/start") }
        var request = ThreadEngine.TurnRequest(input: try p.input.enumerated().map { index, input in
            switch input.content {
            case let .text(text)?: return text
            case let .imageUrl(url)?: return "[image: \(url)]"
            case nil: throw RequestError(.invalidArgument, "input[\(index)] has no content (set text or image_url)")
            }
        })
        request.model = p.model
        request.mode = try modeUpdate(p.multiAgentModeUpdate, field: "turn/start")
        let threadID = try required(p.threadId, "thread_id")
        try await context.authorize(threadID)
        let outcome = try await context.engine.startTurn(threadID, request, connection: context.connection.id)
        return Outcome(.turnStart(Wire.TurnStartResult(turn: outcome.value.wire())), carrying: outcome)
    }

    static let turnInterrupt: Handler = { params, context in
        guard case let .turnInterrupt(p) = params else { throw mismatch("turn/interrupt") }
        let threadID = try required(p.threadId, "thread_id")
        let turnID = try required(p.turnId, "turn_id")
        try await context.authorize(threadID)
        let outcome = try await context.engine.interruptTurn(threadID, turnID: turnID)
        return Outcome(.turnInterrupt(Wire.TurnInterruptResult()), carrying: outcome)
    }
}
