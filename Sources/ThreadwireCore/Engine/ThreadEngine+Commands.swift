import Foundation
import Synchronization

/// The commands that create and change threads (each under its thread's gate).
extension ThreadEngine {
    // MARK: - Requests

    public struct StartRequest: Sendable {
        public var model: String?
        public var cwd: String?
        public var config: [KeyValuePair] = []
        public var mode: MultiAgentMode?
        public var name: String?
        public var review = false
        public var baseInstructions: String?
        /// The principal the new thread belongs to.
        public var principal: Principal = .standalone
        /// Checked by `ClientToolRules`.
        public var clientTools: [ToolSpec] = []
        public var approvalPolicy: ApprovalPolicy?
        public var userInput = false
        /// MCP tool servers by name; nil: the configured defaults.
        public var mcpServers: [String]?
        /// As on the wire: nil keeps, "" clears, a value sets (checked against the model).
        public var reasoningEffort: String?
        public var reasoningSummary: String?
        public var pauseAfterTools = false
        public init() {}
    }

    public func startThread(_ request: StartRequest, connection: ConnectionID) async throws -> Outcome<ThreadView> {
        let config = try threadConfig(overrides: request.config, ceilings: .enforce)
        let clientTools = try ClientToolRules.validated(request.clientTools)
        let id = newID()
        var record = ThreadRecord(
            id: id, sessionID: id, source: request.review ? .review : .appServer, createdAt: nowMillis(),
            model: try nonEmpty(request.model, field: "model") ?? settings.defaultModel,
            cwd: try nonEmpty(request.cwd, field: "cwd") ?? "/")
        record.name = request.name
        record.baseInstructions = request.baseInstructions
        record.configOverrides = request.config
        record.selectedMode = request.mode ?? settings.defaultMultiAgentMode
        // Review threads never see collaboration tools: pinned disabled from birth.
        record.runtime = request.review ? .disabled : RuntimeResolver.resolveAtLoad(inherited: nil, recorded: nil, origin: .new)
        record.principal = request.principal
        record.clientTools = clientTools
        record.approvalPolicy = request.approvalPolicy ?? .never
        record.userInputEnabled = request.userInput
        record.mcpServers = try chosenToolServers(request.mcpServers, principal: request.principal)
        record.reasoning = try Reasoning().updated(effort: request.reasoningEffort, summary: request.reasoningSummary,
                                                   model: record.model, catalog: settings.catalog)
        record.pauseAfterTools = request.pauseAfterTools
        let fence = try await claimNewTree(id)
        let (started, kept) = numberEvents([Delivery(event: .threadStarted(ThreadView(stored: StoredThread(record: record, history: [], turns: []), includeTurns: false)),
                                                     recipients: Subscriber.only(connection))], record: &record)
        try await commitCreation(record.principal, [.putThread(record)] + kept, fence: fence, newTree: true)
        let owner = adopt(StoredThread(record: record, history: [], turns: []), config: config, subscriber: connection, fence: fence)
        let view = ThreadView(stored: owner.current, includeTurns: false)
        return Outcome(view, publications: [owner.publisher.ticket(started)])
    }

    /// The MCP servers a new thread uses: the named ones (each configured),
    /// else the configured defaults.
    func chosenToolServers(_ names: [String]?, principal: Principal) throws -> [String] {
        let configured = toolServers?.serverNames ?? []
        guard let names else { return toolServers?.defaultServers.filter { toolServers?.allows($0, principal: principal) == true } ?? [] }
        var seen = Set<String>()
        for (index, name) in names.enumerated() {
            guard configured.contains(name) else {
                let known = configured.isEmpty ? "none is configured" : "configured: \(configured.joined(separator: ", "))"
                throw DomainError.invalidArgument("mcp_servers[\(index)] '\(name)' is not a configured MCP server (\(known))")
            }
            guard seen.insert(name).inserted else {
                throw DomainError.invalidArgument("mcp_servers[\(index)] '\(name)' appears twice")
            }
            guard toolServers?.allows(name, principal: principal) == true else {
                throw DomainError.invalidArgument("mcp_servers[\(index)] '\(name)' is not available to this principal")
            }
        }
        return names
    }

    /// With `after`, the kept events numbered above it come first: a client
    /// far behind is caught up outside the thread's gate (`catchUp`), and
    /// the rest is read and ticketed under it, so every event of a later
    /// change is published after them and to this connection too, and every
    /// earlier change's was published to the subscribers it had.
    public func resumeThread(_ id: ThreadID, model: String?, excludeTurns: Bool, after: Int64? = nil,
                             connection: ConnectionID) async throws -> Outcome<ThreadView> {
        let model = try nonEmpty(model, field: "model")
        return try await join(id, after: after, connection: connection, watching: false) { owner in
            guard let model, model != owner.current.record.model else { return [] }
            var next = owner.current
            next.record.model = model
            return try await install(owner, next, [.putThread(next.record.bumped())], events: [
                Delivery(event: .settingsUpdated(id, ThreadSettingsView(record: next.record)), recipients: owner.subscribers)])
        } view: { ThreadView(stored: $0, includeTurns: !excludeTurns) }
    }

    /// thread/subscribe: the events of a resume and nothing else, so a
    /// watcher neither changes the thread nor is offered what only a
    /// participant answers.
    public func subscribeThread(_ id: ThreadID, after: Int64? = nil, connection: ConnectionID) async throws -> Outcome<ThreadView> {
        try await join(id, after: after, connection: connection, watching: true) { _ in [] }
            view: { ThreadView(stored: $0, includeTurns: false) }
    }

    private func join(_ id: ThreadID, after: Int64?, connection: ConnectionID, watching: Bool,
                      change: (ThreadOwner) async throws -> [Delivery],
                      view: (StoredThread) -> ThreadView) async throws -> Outcome<ThreadView> {
        var after = after
        if let position = after { after = try await catchUp(id, after: position, connection: connection) }
        return try await withOwner(id) { owner in
            var publications: [Publication] = []
            if let after {
                let kept: [StoredEvent]
                do {
                    kept = try await keptEvents(of: owner.current.record, after: after)
                } catch {
                    scheduleUnloadIfIdle(owner)  // loaded for this resume, which subscribed nobody
                    throw error
                }
                publications.append(owner.publisher.ticket(kept.map {
                    Delivery(event: .replayed(id, $0), recipients: Subscriber.only(connection), threadSequence: $0.sequence)
                }))
            }
            // A message streaming now: its text so far, then live.
            if let stream = owner.messageStream {
                publications.append(stream.join(connection, watching: watching))
            } else if watching {
                owner.watch(connection)
            } else {
                owner.subscribe(connection)
            }
            owner.cancelUnload()
            var deliveries: [Delivery] = []
            // What the turn waits for is offered to the new subscriber too,
            // and at a root, what its children wait for.
            var offered = Set<String>()
            for request in pendingRequests(owner.current) + treeRequests.requests(root: id)
            where !watching && offered.insert(request.id).inserted {
                deliveries.append(Delivery(event: .serverRequest(request), recipients: Subscriber.only(connection)))
            }
            deliveries += try await change(owner)
            return Outcome(view(owner.current), publications: publications + [owner.publisher.ticket(deliveries)])
        }
    }

    /// A resume far behind first catches up outside the thread's command
    /// order, page by page from the store, each event sent once the
    /// connection has room for it: a long absence neither holds the thread
    /// nor passes the connection's backlog limit. What commits meanwhile
    /// goes under the thread's order (`resumeThread`). Returns the position
    /// it reached. Should the thread move to another instance mid-way, the
    /// resume is relayed from its first position and events repeat: clients
    /// drop numbers they have handled.
    func catchUp(_ id: ThreadID, after: Int64, connection: ConnectionID) async throws -> Int64 {
        // Only the thread's owner replays: it is loaded here (claimed) first,
        // so an instance that relays the resume sends nothing itself.
        try await withOwner(id) { owner in scheduleUnloadIfIdle(owner) }
        var position = after
        while true {
            // Loaded here under a lease still held, or the ordered step relays.
            guard let head = liveSnapshot(id)?.stored.record.eventSequence, head > position else { return position }
            let page = try await store.events(id, after: position, limit: Int(Self.catchUpPage))
            // Trimmed meanwhile: the ordered step answers OUT_OF_RANGE.
            guard page.first?.sequence == position + 1 else { return position }
            for event in page {
                guard await sink.waitForReplayRoom(connection, bytes: event.bytes.count) else {
                    throw DomainError.unavailable("the connection closed while thread \(id)'s events were replayed")
                }
                sink.deliver([Delivery(event: .replayed(id, event), recipients: Subscriber.only(connection), threadSequence: event.sequence)])
                position = event.sequence
            }
        }
    }

    static let catchUpPage: Int64 = 256

    /// The thread's kept events numbered above `after`, every one of them:
    /// OUT_OF_RANGE when retention let the next one go, INVALID_ARGUMENT
    /// for a position the thread has not reached.
    func keptEvents(of record: ThreadRecord, after: Int64) async throws -> [StoredEvent] {
        let head = record.eventSequence
        guard after >= 0, after <= head else {
            throw DomainError.invalidArgument(
                "after_thread_sequence \(after) is ahead of thread \(record.id), whose newest event is \(head)")
        }
        guard after < head else { return [] }
        let events = try await store.events(record.id, after: after, limit: Int(head - after))
        guard events.first?.sequence == after + 1, events.last?.sequence == head, events.count == Int(head - after) else {
            let oldest = events.first?.sequence ?? head
            throw DomainError.outOfRange(
                "thread \(record.id) keeps events from \(oldest) on (through \(head)); event \(after + 1) is no longer kept: "
                    + "read the thread and resume after its thread_sequence")
        }
        return events
    }

    /// A fork copies the committed state of its source (its snapshot when
    /// loaded), so it never waits for the source's commands. A fork is a new
    /// root: it keeps the runtime, settings and history, not the source's
    /// place in an agent tree (it would hold a child slot nobody reserved).
    /// Where thread/fork branches: after this turn, or before it.
    public enum ForkPosition: Sendable {
        case at(TurnID)
        case before(TurnID)
    }

    public func forkThread(_ sourceID: ThreadID, model: String?, excludeTurns: Bool, position: ForkPosition? = nil,
                           connection: ConnectionID) async throws -> Outcome<ThreadView> {
        let model = try nonEmpty(model, field: "model")
        let source: StoredThread
        if let live = liveSnapshot(sourceID)?.stored {
            source = live
        } else if let stored = try await store.loadThread(sourceID) {
            source = stored
        } else {
            throw DomainError.notFound("thread \(sourceID) not found")
        }
        let id = newID()
        let now = nowMillis()
        var record = source.record
        record.id = id
        record.sessionID = id
        record.forkedFromID = sourceID
        record.createdAt = now
        record.updatedAt = now
        record.archived = false
        record.name = nil
        record.legacy = false
        record.version = 1
        if record.source == .threadSpawn || record.source == .imported { record.source = .appServer }
        record.parentID = nil
        record.depth = 0
        record.taskName = nil
        record.nickname = nil
        record.agentStatus = nil
        record.agentFinalMessage = nil
        record.agentClosed = false
        record.runtime = RuntimeResolver.resolveAtLoad(
            inherited: nil, recorded: Self.recordedRuntime(source),
            origin: source.record.legacy || !source.turns.isEmpty ? .forked : .new)
        if let model { record.model = model }

        var history = source.history
        var branch = Array(source.turns)
        if let position {
            // The branch holds the turns up to the position and the model
            // context as it stood when the first later turn began.
            let (turnID, included) = switch position {
            case let .at(turn): (turn, true)
            case let .before(turn): (turn, false)
            }
            guard let index = branch.firstIndex(where: { $0.id == turnID }) else {
                throw DomainError.notFound("turn \(turnID) is not a turn of thread \(sourceID)")
            }
            let end = included ? index + 1 : index
            if end < branch.count {
                guard let cut = branch[end].historyStart else {
                    throw DomainError.failedPrecondition(
                        "turn \(branch[end].id) was stored before its place in the history was recorded; fork at a later turn or at the end")
                }
                history = ChunkedArray(history.prefix(cut))
                branch = Array(branch.prefix(end))
            }
        }
        record.forkedAtTurnID = branch.last?.id
        // The source's queued turns are its clients' next inputs, not the fork's.
        record.queue = []
        var turns = branch.map { turn -> TurnRecord in
            var copy = turn
            copy.threadID = id
            return copy
        }
        // A mid-turn source is copied with that turn interrupted and its marker
        // recorded, never as a partial unmarked turn.
        if let index = turns.lastIndex(where: { $0.status == .inProgress }) {
            history.append(Self.interruptionMarker(runtime: record.runtime))
            turns[index].status = .interrupted
            turns[index].completedAt = now
            turns[index].pausedAfterTools = false
            _ = Self.abandonPendingRequests(&turns[index], reason: "the turn was copied by thread/fork before a client answered")
        }
        // A fork's events start from 1: the source's are the source's.
        record.eventSequence = 0
        let (started, kept) = numberEvents([Delivery(event: .threadStarted(ThreadView(stored: StoredThread(record: record, history: history, turns: turns), includeTurns: false)),
                                                     recipients: Subscriber.only(connection))], record: &record)
        var operations: [StoreOperation] = [.putThread(record), .appendHistory(id, firstSequence: 0, items: Array(history))]
        operations += turns.map { .putTurn($0) }
        operations += kept
        // The fork keeps the source's owner (only the owner reaches the source).
        let fence = try await claimNewTree(id)
        try await commitCreation(record.principal, operations, fence: fence, newTree: true)
        let owner = adopt(StoredThread(record: record, history: history, turns: turns),
                          config: try threadConfig(overrides: record.configOverrides, ceilings: .clamp), subscriber: connection,
                          fence: fence)
        return Outcome(ThreadView(stored: owner.current, includeTurns: !excludeTurns),
                       publications: [owner.publisher.ticket(started)])
    }
    public struct SettingsUpdate: Sendable {
        public var model: String?
        public var cwd: String?
        public var mode: ModeUpdate = .keep
        public var approvalPolicy: ApprovalPolicy?
        public var userInput: Bool?
        public var reasoningEffort: String?
        public var reasoningSummary: String?
        public var pauseAfterTools: Bool?
        public init() {}
    }

    /// Changes next-turn settings: no turn, no transcript items, no model call.
    /// Works on unloaded threads too (loading them), so a selection made before
    /// any turn is durable across unloads and restarts.
    public func updateSettings(_ id: ThreadID, _ update: SettingsUpdate) async throws -> Outcome<(ThreadSettingsView, Bool)> {
        let model = try nonEmpty(update.model, field: "model")
        let cwd = try nonEmpty(update.cwd, field: "cwd")
        return try await withOwner(id) { owner in
            defer { scheduleUnloadIfIdle(owner) }
            var next = owner.current
            if let model { next.record.model = model }
            if let cwd { next.record.cwd = cwd }
            next.record.selectedMode = update.mode.applied(to: next.record.selectedMode)
            if let policy = update.approvalPolicy { next.record.approvalPolicy = policy }
            if let userInput = update.userInput { next.record.userInputEnabled = userInput }
            if let pause = update.pauseAfterTools { next.record.pauseAfterTools = pause }
            next.record.reasoning = try next.record.reasoning.updated(effort: update.reasoningEffort, summary: update.reasoningSummary,
                                                                      model: next.record.model, catalog: settings.catalog)
            let changed = next.record != owner.current.record
            var deliveries: [Delivery] = []
            if changed {
                deliveries = try await install(owner, next, [.putThread(next.record.bumped())], events: [
                    Delivery(event: .settingsUpdated(id, ThreadSettingsView(record: next.record)), recipients: owner.subscribers)])
            }
            return Outcome((owner.settingsView, changed), publications: [owner.publisher.ticket(deliveries)])
        }
    }

    public struct TurnRequest: Sendable {
        public var input: [String]
        public var model: String?
        public var mode: ModeUpdate = .keep
        /// Sticky, like `model`.
        public var approvalPolicy: ApprovalPolicy?
        /// Sticky, like `model`: nil keeps, "" clears, a value sets.
        public var reasoningEffort: String?
        public var reasoningSummary: String?
        /// A queued turn starting: it leaves the queue in the turn's commit.
        var dequeue: String?
        public init(input: [String]) { self.input = input }
    }

    public func startTurn(_ id: ThreadID, _ request: TurnRequest, connection: ConnectionID?) async throws -> Outcome<TurnRecord> {
        try await withOwner(id) { owner in
            if let connection { owner.subscribe(connection) }
            owner.cancelUnload()
            defer { scheduleUnloadIfIdle(owner) }
            let (turn, publication) = try await beginTurn(owner, request)
            return Outcome(turn, publications: [publication])
        }
    }

    public func interruptTurn(_ id: ThreadID, turnID: TurnID) async throws -> Outcome<Void> {
        try await withOwner(id) { owner in
            guard let index = owner.current.activeTurnIndex else {
                throw DomainError.failedPrecondition("thread \(id) has no active turn")
            }
            guard owner.current.turns[index].id == turnID else {
                throw DomainError.failedPrecondition(
                    "turn \(turnID) is not the active turn of thread \(id) (active: \(owner.current.turns[index].id))")
            }
            let publication = try await endActiveTurn(owner, status: .interrupted, error: nil)
            return Outcome((), publications: [publication])
        }
    }

    public struct SpawnRequest: Sendable {
        public var message: String?
        public var model: String?
        public var taskName: String?
        public var review = false
        public init() {}
    }

    public func spawnAgent(parentID: ThreadID, _ request: SpawnRequest, connection: ConnectionID) async throws -> Outcome<ThreadView> {
        try await withOwner(parentID) { parent in
            let spawned = try await spawnChild(
                of: parent, parent.current, request, spawningMode: parent.current.turns.last?.context.effectiveMode,
                extraSubscriber: connection)
            return Outcome(spawned.view, publications: spawned.publications)
        }
    }

}
