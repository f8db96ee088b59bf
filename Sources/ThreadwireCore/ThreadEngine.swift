import Foundation

/// Owns the loaded threads and every change to them. Each change is applied in
/// memory (so concurrent requests see it, e.g. one active turn per thread),
/// committed to the store, and only then acknowledged.
public actor ThreadEngine {
    let store: any ThreadStore
    let backend: any ModelBackend
    let settings: ServerSettings
    let sink: any EventSink
    let idleUnloadAfter: Duration

    final class LoadedThread {
        var record: ThreadRecord
        var history: [ContextItem]
        var turns: [TurnRecord]
        var config: ThreadConfig
        var subscribers: Set<ConnectionID> = []
        /// Connections that unsubscribed; they hear thread/closed.
        var formerSubscribers: Set<ConnectionID> = []
        var runner: Task<Void, Never>?
        var unloadTimer: Task<Void, Never>?

        init(stored: StoredThread, config: ThreadConfig) {
            record = stored.record
            history = stored.history
            turns = stored.turns
            self.config = config
        }

        var activeTurnIndex: Int? {
            turns.lastIndex { $0.status == .inProgress }
        }

        var status: ThreadStatus {
            if let index = activeTurnIndex { return .active(turns[index].id) }
            return .idle
        }
    }

    var loaded: [ThreadID: LoadedThread] = [:]
    /// Open (not closed) child agents per agent tree, keyed by the root's id.
    var openChildren: [ThreadID: Set<ThreadID>] = [:]
    var children: [ThreadID: [ThreadID]] = [:]

    public init(
        store: any ThreadStore, backend: any ModelBackend, settings: ServerSettings, sink: any EventSink,
        idleUnloadAfter: Duration = .seconds(1800)
    ) {
        self.store = store
        self.backend = backend
        self.settings = settings
        self.sink = sink
        self.idleUnloadAfter = idleUnloadAfter
    }

    // MARK: - Requests

    public struct StartRequest: Sendable {
        public var model: String?
        public var cwd: String?
        public var config: [KeyValuePair] = []
        public var mode: MultiAgentMode?
        public var name: String?
        public var review = false
        public var baseInstructions: String?
        public init() {}
    }

    public func startThread(_ request: StartRequest, connection: ConnectionID) async throws -> Outcome<ThreadView> {
        let config = try threadConfig(overrides: request.config)
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
        try await commit([.putThread(record)])
        let thread = LoadedThread(stored: StoredThread(record: record, history: [], turns: []), config: config)
        thread.subscribers.insert(connection)
        loaded[id] = thread
        let view = self.view(of: thread, includeTurns: false)
        return Outcome(view, deliveries: [Delivery(event: .threadStarted(view), recipients: [connection])])
    }

    public func resumeThread(_ id: ThreadID, model: String?, excludeTurns: Bool, connection: ConnectionID) async throws -> Outcome<ThreadView> {
        let thread = try await load(id)
        thread.subscribers.insert(connection)
        thread.formerSubscribers.remove(connection)
        cancelUnload(thread)
        var deliveries: [Delivery] = []
        if let model = try nonEmpty(model, field: "model"), model != thread.record.model {
            thread.record.model = model
            try await commit([.putThread(thread.record)])
            deliveries.append(Delivery(event: .settingsUpdated(id, settingsView(thread)), recipients: Array(thread.subscribers)))
        }
        return Outcome(view(of: thread, includeTurns: !excludeTurns), deliveries: deliveries)
    }

    public func forkThread(_ sourceID: ThreadID, model: String?, excludeTurns: Bool, connection: ConnectionID) async throws -> Outcome<ThreadView> {
        let source: StoredThread
        if let live = loaded[sourceID] {
            source = StoredThread(record: live.record, history: live.history, turns: live.turns)
        } else if let stored = try await store.loadThread(sourceID) {
            source = stored
        } else {
            throw DomainError.notFound("thread \(sourceID) not found")
        }
        let id = newID()
        let now = nowMillis()
        var record = source.record
        record.id = id
        record.sessionID = source.record.parentID == nil ? id : source.record.sessionID
        record.forkedFromID = sourceID
        record.createdAt = now
        record.updatedAt = now
        record.archived = false
        record.name = nil
        record.legacy = false
        record.runtime = RuntimeResolver.resolveAtLoad(
            inherited: nil, recorded: Self.recordedRuntime(source),
            origin: source.record.legacy || !source.turns.isEmpty ? .forked : .new)
        if let model = try nonEmpty(model, field: "model") { record.model = model }

        var history = source.history
        var turns = source.turns.map { turn -> TurnRecord in
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
        }
        var operations: [StoreOperation] = [.putThread(record), .appendHistory(id, firstSequence: 0, items: history)]
        operations += turns.map { .putTurn($0) }
        try await commit(operations)
        let thread = LoadedThread(
            stored: StoredThread(record: record, history: history, turns: turns),
            config: try threadConfig(overrides: record.configOverrides))
        thread.subscribers.insert(connection)
        loaded[id] = thread
        let started = view(of: thread, includeTurns: false)
        return Outcome(view(of: thread, includeTurns: !excludeTurns),
                       deliveries: [Delivery(event: .threadStarted(started), recipients: [connection])])
    }

    public func readThread(_ id: ThreadID, includeTurns: Bool, includeModelRequests: Bool) async throws -> ThreadView {
        if let thread = loaded[id] {
            return view(of: thread, includeTurns: includeTurns, includeHistory: includeModelRequests)
        }
        if includeTurns {
            guard let stored = try await store.loadThread(id) else { throw DomainError.notFound("thread \(id) not found") }
            return ThreadView(record: stored.record, status: .notLoaded, turns: stored.turns,
                              history: includeModelRequests ? stored.history : nil)
        }
        guard let record = try await store.threadRecord(id) else { throw DomainError.notFound("thread \(id) not found") }
        return ThreadView(record: record, status: .notLoaded, turns: nil, history: nil)
    }

    public func listThreads(_ query: ThreadListQuery) async throws -> (threads: [ThreadView], nextCursor: String?) {
        let page = try await store.listThreads(query)
        let views = page.records.map { record in
            ThreadView(record: loaded[record.id]?.record ?? record, status: loaded[record.id]?.status ?? .notLoaded,
                       turns: nil, history: nil)
        }
        return (views, page.nextCursor)
    }

    public func setArchived(_ id: ThreadID, archived: Bool) async throws -> Outcome<ThreadView> {
        // Through the loaded copy, like every mutation, so a concurrent cold
        // load can never hold a copy older than an acknowledged change.
        let thread = try await load(id)
        defer { scheduleUnloadIfIdle(thread) }
        if archived, thread.activeTurnIndex != nil {
            throw DomainError.failedPrecondition("thread \(id) has an active turn; interrupt it before archiving")
        }
        var deliveries: [Delivery] = []
        if thread.record.archived != archived {
            var record = thread.record
            record.archived = archived
            try await commit([.putThread(record)])
            thread.record = record
            deliveries.append(Delivery(event: archived ? .archived(id) : .unarchived(id), recipients: Array(thread.subscribers)))
        }
        return Outcome(view(of: thread, includeTurns: false), deliveries: deliveries)
    }

    public func unsubscribe(_ id: ThreadID, connection: ConnectionID) async throws -> Bool {
        guard let thread = loaded[id] else {
            guard try await store.threadRecord(id) != nil else { throw DomainError.notFound("thread \(id) not found") }
            return false
        }
        let was = thread.subscribers.remove(connection) != nil
        if was { thread.formerSubscribers.insert(connection) }
        scheduleUnloadIfIdle(thread)
        return was
    }

    /// A closed connection unsubscribes from everything.
    public func connectionClosed(_ connection: ConnectionID) {
        for thread in loaded.values where thread.subscribers.contains(connection) || thread.formerSubscribers.contains(connection) {
            thread.subscribers.remove(connection)
            thread.formerSubscribers.remove(connection)
            scheduleUnloadIfIdle(thread)
        }
    }

    public struct SettingsUpdate: Sendable {
        public var model: String?
        public var cwd: String?
        public var mode: ModeUpdate = .keep
        public init() {}
    }

    /// Changes next-turn settings: no turn, no transcript items, no model call.
    /// Works on unloaded threads too (loading them), so a selection made before
    /// any turn is durable across unloads and restarts.
    public func updateSettings(_ id: ThreadID, _ update: SettingsUpdate) async throws -> Outcome<(ThreadSettingsView, Bool)> {
        let thread = try await load(id)
        defer { scheduleUnloadIfIdle(thread) }
        var record = thread.record
        if let model = try nonEmpty(update.model, field: "model") { record.model = model }
        if let cwd = try nonEmpty(update.cwd, field: "cwd") { record.cwd = cwd }
        record.selectedMode = update.mode.applied(to: record.selectedMode)
        let changed = record != thread.record
        var deliveries: [Delivery] = []
        if changed {
            try await commit([.putThread(record)])
            thread.record = record
            deliveries.append(Delivery(event: .settingsUpdated(id, settingsView(thread)), recipients: Array(thread.subscribers)))
        }
        return Outcome((settingsView(thread), changed), deliveries: deliveries)
    }

    public struct TurnRequest: Sendable {
        public var input: [String]
        public var model: String?
        public var mode: ModeUpdate = .keep
        public init(input: [String]) { self.input = input }
    }

    public func startTurn(_ id: ThreadID, _ request: TurnRequest, connection: ConnectionID?) async throws -> Outcome<TurnRecord> {
        let thread = try await load(id)
        if let connection {
            thread.subscribers.insert(connection)
            thread.formerSubscribers.remove(connection)
        }
        cancelUnload(thread)
        return try await beginTurn(thread, request)
    }

    public func interruptTurn(_ id: ThreadID, turnID: TurnID) async throws -> Outcome<Void> {
        guard let thread = loaded[id] else {
            guard try await store.threadRecord(id) != nil else { throw DomainError.notFound("thread \(id) not found") }
            throw DomainError.failedPrecondition("thread \(id) has no active turn")
        }
        guard let index = thread.activeTurnIndex else {
            throw DomainError.failedPrecondition("thread \(id) has no active turn")
        }
        guard thread.turns[index].id == turnID else {
            throw DomainError.failedPrecondition("turn \(turnID) is not the active turn of thread \(id) (active: \(thread.turns[index].id))")
        }
        thread.runner?.cancel()
        thread.runner = nil
        let deliveries = try await finishTurn(thread, index: index, status: .interrupted, error: nil)
        return Outcome((), deliveries: deliveries)
    }

    public struct SpawnRequest: Sendable {
        public var message: String?
        public var model: String?
        public var taskName: String?
        public var review = false
        public init() {}
    }

    public func spawnAgent(parentID: ThreadID, _ request: SpawnRequest, connection: ConnectionID) async throws -> Outcome<ThreadView> {
        let parent = try await load(parentID)
        let (child, deliveries, afterward) = try await spawnChild(
            of: parent, request, spawningMode: parent.turns.last?.context.effectiveMode, extraSubscriber: connection)
        return Outcome(view(of: child, includeTurns: false), deliveries: deliveries, afterward: afterward)
    }

    // MARK: - Loading

    /// The loaded thread, loading it from the store on first use ("cold
    /// resume"). A legacy thread is pinned here, once, by a set-if-unset that
    /// rewrites neither its history nor its timestamps.
    func load(_ id: ThreadID) async throws -> LoadedThread {
        if let thread = loaded[id] { return thread }
        guard var stored = try await store.loadThread(id) else { throw DomainError.notFound("thread \(id) not found") }
        if stored.record.runtime == nil {
            let origin: HistoryOrigin = stored.record.legacy || !stored.turns.isEmpty ? .resumed : .new
            if let pinned = RuntimeResolver.resolveAtLoad(inherited: nil, recorded: Self.recordedRuntime(stored), origin: origin) {
                try await commit([.setRuntimeIfUnset(id, pinned)])
                stored.record.runtime = pinned
            }
        }
        if let raced = loaded[id] { return raced }  // loaded by another request while we awaited
        let thread = LoadedThread(stored: stored, config: try threadConfig(overrides: stored.record.configOverrides))
        loaded[id] = thread
        return thread
    }

    static func recordedRuntime(_ stored: StoredThread) -> MultiAgentRuntime? {
        stored.record.runtime ?? stored.turns.last(where: { $0.context.runtime != nil })?.context.runtime
    }

    func threadConfig(overrides: [KeyValuePair]) throws -> ThreadConfig {
        try settings.threadDefaults.applying(overrides.map { (key: $0.key, value: $0.value) })
    }

    func nonEmpty(_ value: String?, field: String) throws -> String? {
        guard let value else { return nil }
        guard !value.trimmingCharacters(in: .whitespacesAndNewlines).isEmpty else {
            throw DomainError.invalidArgument("\(field) must not be empty")
        }
        return value
    }

    func commit(_ operations: [StoreOperation]) async throws {
        do {
            try await store.commit(operations)
        } catch let error as DomainError {
            throw error
        } catch {
            throw DomainError.unavailable("the store could not commit the change: \(error)")
        }
    }

    // MARK: - Unloading

    func cancelUnload(_ thread: LoadedThread) {
        thread.unloadTimer?.cancel()
        thread.unloadTimer = nil
    }

    func scheduleUnloadIfIdle(_ thread: LoadedThread) {
        guard thread.subscribers.isEmpty, thread.activeTurnIndex == nil, thread.unloadTimer == nil else { return }
        let id = thread.record.id
        let delay = idleUnloadAfter
        thread.unloadTimer = Task { [weak self] in
            try? await Task.sleep(for: delay)
            guard !Task.isCancelled else { return }
            await self?.unloadIfStillIdle(id)
        }
    }

    func unloadIfStillIdle(_ id: ThreadID) {
        guard let thread = loaded[id], thread.subscribers.isEmpty, thread.activeTurnIndex == nil else { return }
        loaded[id] = nil
        let recipients = Array(thread.formerSubscribers)
        sink.deliver([
            Delivery(event: .statusChanged(id, .notLoaded), recipients: recipients),
            Delivery(event: .closed(id), recipients: recipients),
        ])
    }

    // MARK: - Views

    func view(of thread: LoadedThread, includeTurns: Bool, includeHistory: Bool = false) -> ThreadView {
        ThreadView(record: thread.record, status: thread.status, turns: includeTurns ? thread.turns : nil,
                   history: includeHistory ? thread.history : nil)
    }

    func settingsView(_ thread: LoadedThread) -> ThreadSettingsView {
        view(of: thread, includeTurns: false).settings
    }

    func baseInstructions(for record: ThreadRecord) -> String {
        settings.baseInstructions(for: record)
    }

    static func interruptionMarker(runtime: MultiAgentRuntime?) -> ContextItem {
        if runtime == .v2 {
            return ContextItem(role: .developer, kind: .interruptionMarker,
                               text: "The previous turn was interrupted by the user before it finished.")
        }
        return ContextItem(role: .user, kind: .interruptionMarker,
                           text: "<turn_aborted>The user interrupted the previous turn.</turn_aborted>")
    }
}
