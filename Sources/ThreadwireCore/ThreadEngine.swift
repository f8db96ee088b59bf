import Foundation
import Synchronization

/// Owns the loaded threads and every change to them.
///
/// Ownership (docs/concurrency.md): each loaded thread has exactly one
/// `ThreadOwner`, found through the `ThreadDirectory`. A command on a thread
/// holds that owner's gate from its checks to its publication
/// (check → apply → commit → publish), so commands on one thread run one at a
/// time, each to its end, while commands on different threads run in
/// parallel. Changes are built on a copy of the state, committed with a
/// version the store checks, and only then installed and published; a commit
/// that fails leaves memory as it was. Reads never take a gate: they use the
/// immutable snapshot published after each commit.
public final class ThreadEngine: Sendable {
    let store: any ThreadStore
    let backend: any ModelBackend
    let settings: ServerSettings
    let sink: any EventSink
    let idleUnloadAfter: Duration
    let directory = ThreadDirectory()
    let changes = ChangeBoard()
    /// One gate per agent tree (keyed by the root's session id): a child slot
    /// is reserved under it, so caps hold across API and tool spawns alike.
    let treeGates = Mutex<[ThreadID: TreeGateEntry]>([:])
    let stopping = Atomic<Bool>(false)
    /// Turn runners and mailbox deliveries; shutdown awaits them.
    let tasks = TaskTracker()
    /// Per-principal limits (settings.principalLimits).
    let threadStarts = ThreadStartWindow()
    /// With several instances on one store: who may change which agent tree
    /// (nil: this process owns every thread).
    let coordinator: (any OwnershipCoordinator)?
    let heldTrees = HeldTrees()
    let knownOwners: KnownOwners

    public init(
        store: any ThreadStore, backend: any ModelBackend, settings: ServerSettings, sink: any EventSink,
        idleUnloadAfter: Duration = .seconds(1800), coordinator: (any OwnershipCoordinator)? = nil
    ) {
        self.store = store
        self.backend = backend
        self.settings = settings
        self.sink = sink
        self.idleUnloadAfter = idleUnloadAfter
        self.coordinator = coordinator
        knownOwners = KnownOwners(ttl: (coordinator?.leaseDuration ?? .seconds(10)) / 2)
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
        /// The principal the new thread belongs to.
        public var owner: Principal = .standalone
        public init() {}
    }

    public func startThread(_ request: StartRequest, connection: ConnectionID) async throws -> Outcome<ThreadView> {
        let config = try threadConfig(overrides: request.config, ceilings: .enforce)
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
        record.owner = request.owner
        let fence = try await claimNewTree(id)
        try await commitCreation(record.owner, [.putThread(record)], fence: fence, newTree: true)
        let owner = adopt(StoredThread(record: record, history: [], turns: []), config: config, subscriber: connection, fence: fence)
        let view = ThreadView(stored: owner.state!, includeTurns: false)
        return Outcome(view, publications: [owner.publisher.ticket([Delivery(event: .threadStarted(view), recipients: [connection])])])
    }

    public func resumeThread(_ id: ThreadID, model: String?, excludeTurns: Bool, connection: ConnectionID) async throws -> Outcome<ThreadView> {
        let model = try nonEmpty(model, field: "model")
        return try await withOwner(id) { owner in
            owner.subscribe(connection)
            owner.cancelUnload()
            var deliveries: [Delivery] = []
            if let model, model != owner.state!.record.model {
                var next = owner.state!
                next.record.model = model
                try await install(owner, next, [.putThread(next.record.bumped())])
                deliveries.append(Delivery(event: .settingsUpdated(id, owner.settingsView), recipients: owner.subscribers))
            }
            return Outcome(ThreadView(stored: owner.state!, includeTurns: !excludeTurns),
                           publications: [owner.publisher.ticket(deliveries)])
        }
    }

    /// A fork copies the committed state of its source (its snapshot when
    /// loaded), so it never waits for the source's commands. A fork is a new
    /// root: it keeps the runtime, settings and history, not the source's
    /// place in an agent tree (it would hold a child slot nobody reserved).
    public func forkThread(_ sourceID: ThreadID, model: String?, excludeTurns: Bool, connection: ConnectionID) async throws -> Outcome<ThreadView> {
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
        // The fork keeps the source's owner (only the owner reaches the source).
        let fence = try await claimNewTree(id)
        try await commitCreation(record.owner, operations, fence: fence, newTree: true)
        let owner = adopt(StoredThread(record: record, history: history, turns: turns),
                          config: try threadConfig(overrides: record.configOverrides, ceilings: .clamp), subscriber: connection,
                          fence: fence)
        let started = ThreadView(stored: owner.state!, includeTurns: false)
        return Outcome(ThreadView(stored: owner.state!, includeTurns: !excludeTurns),
                       publications: [owner.publisher.ticket([Delivery(event: .threadStarted(started), recipients: [connection])])])
    }

    /// From the snapshot of a loaded thread (no gate, no actor hop), else the
    /// store. With turns: the newest `turnsLimit` of them, oldest first.
    public func readThread(_ id: ThreadID, includeTurns: Bool, includeModelRequests: Bool, turnsLimit: Int = .max) async throws -> ThreadView {
        if let view = snapshotView(id, includeTurns: includeTurns, includeModelRequests: includeModelRequests, turnsLimit: turnsLimit) {
            return view
        }
        if try await readFromOwnerIfElsewhere(id),
           let view = snapshotView(id, includeTurns: includeTurns, includeModelRequests: includeModelRequests, turnsLimit: turnsLimit) {
            return view
        }
        if includeModelRequests {
            guard let stored = try await store.loadThread(id) else { throw DomainError.notFound("thread \(id) not found") }
            var view = ThreadView(record: stored.record, status: .notLoaded, turns: nil, history: stored.history)
            if includeTurns { view.setNewestTurns(stored.turns, limit: turnsLimit) }
            return view
        }
        guard let record = try await store.threadRecord(id) else { throw DomainError.notFound("thread \(id) not found") }
        var view = ThreadView(record: record, status: .notLoaded, turns: nil, history: nil)
        if includeTurns {
            // One more than asked tells whether older turns were left out.
            let newest = try await store.turnsPage(id, afterSequence: nil, limit: turnsLimit == .max ? .max : turnsLimit + 1, descending: true) ?? []
            view.setNewestTurns(newest.reversed(), limit: turnsLimit)
        }
        return view
    }

    /// A loaded thread's view from its published snapshot, without
    /// suspending; nil when the thread is not loaded.
    public func snapshotView(_ id: ThreadID, includeTurns: Bool, includeModelRequests: Bool, turnsLimit: Int = .max) -> ThreadView? {
        liveSnapshot(id)?.view(includeTurns: includeTurns, includeModelRequests: includeModelRequests, turnsLimit: turnsLimit)
    }

    /// A loaded thread's committed state as last published, with a memo for
    /// what readers derive from it; nil when the thread is not loaded.
    public func published(_ id: ThreadID) -> PublishedThread? { liveSnapshot(id) }

    /// A loaded thread's snapshot, unless this instance may have lost its
    /// lease unnoticed (paused past its expiry): the store answers then.
    func liveSnapshot(_ id: ThreadID) -> PublishedThread? {
        guard coordinator == nil || heldTrees.surelyValid else { return nil }
        return directory.published(id)
    }

    /// The principal a thread belongs to (nil if there is no such thread):
    /// from its snapshot when loaded, else the store. It never changes, so a
    /// check against it cannot go stale.
    public func threadOwner(_ id: ThreadID) async throws -> Principal? {
        if let published = directory.published(id) { return published.owner }
        return try await store.threadRecord(id)?.owner
    }

    /// Turns in progress across `principal`'s loaded threads.
    public func runningTurns(of principal: Principal) -> Int { directory.runningTurns.running(principal) }

    /// One page of a thread's turns, loaded or not, in the asked order; `more`
    /// tells whether turns remain past the page.
    public func listTurns(_ id: ThreadID, cursor: String?, limit: Int, descending: Bool) async throws -> (turns: [TurnRecord], more: Bool) {
        let after = try cursor.map(TurnCursor.decode)
        let turns: [TurnRecord]
        if let snapshot = liveSnapshot(id)?.stored {
            turns = snapshot.turns.page(afterSequence: after, limit: limit + 1, descending: descending)
        } else {
            try await readFromOwnerIfElsewhere(id)
            guard let stored = try await store.turnsPage(id, afterSequence: after, limit: limit + 1, descending: descending) else {
                throw DomainError.notFound("thread \(id) not found")
            }
            turns = stored
        }
        return (Array(turns.prefix(limit)), turns.count > limit)
    }

    public func listThreads(_ query: ThreadListQuery) async throws -> (threads: [ThreadView], nextCursor: String?) {
        let page = try await store.listThreads(query)
        let statuses = directory.statuses(page.records.map(\.id))
        let views = page.records.map { record in
            ThreadView(record: record, status: statuses[record.id] ?? .notLoaded, turns: nil, history: nil)
        }
        return (views, page.nextCursor)
    }

    public func setArchived(_ id: ThreadID, archived: Bool) async throws -> Outcome<ThreadView> {
        try await withOwner(id) { owner in
            defer { scheduleUnloadIfIdle(owner) }
            if archived, let active = owner.state!.activeTurnIndex {
                throw DomainError.failedPrecondition(
                    "thread \(id) has an active turn (\(owner.state!.turns[active].id)); interrupt it before archiving")
            }
            var deliveries: [Delivery] = []
            if owner.state!.record.archived != archived {
                var next = owner.state!
                next.record.archived = archived
                try await install(owner, next, [.putThread(next.record.bumped())])
                deliveries.append(Delivery(event: archived ? .archived(id) : .unarchived(id), recipients: owner.subscribers))
            }
            return Outcome(ThreadView(stored: owner.state!, includeTurns: false), publications: [owner.publisher.ticket(deliveries)])
        }
    }

    public func unsubscribe(_ id: ThreadID, connection: ConnectionID) async throws -> Bool {
        guard directory.existing(id) != nil else {
            guard try await store.threadRecord(id) != nil else { throw DomainError.notFound("thread \(id) not found") }
            return false
        }
        return try await withOwner(id) { owner in
            let was = owner.unsubscribe(connection)
            scheduleUnloadIfIdle(owner)
            return was
        }
    }

    /// Whether the connection is subscribed to any loaded thread (the idle
    /// timeout spares subscribers: they wait for notifications by design).
    public func isSubscribed(_ connection: ConnectionID) -> Bool {
        directory.all.contains { $0.isSubscribed(connection) }
    }

    /// Loaded threads and threads with a running turn, for metrics.
    public var loadCounts: (loaded: Int, running: Int) { directory.counts }

    /// A closed connection unsubscribes from everything.
    public func connectionClosed(_ connection: ConnectionID) async {
        for owner in directory.all where owner.forget(connection) {
            await owner.gate.withLock {
                if !owner.retired, owner.state != nil { scheduleUnloadIfIdle(owner) }
            }
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
        let model = try nonEmpty(update.model, field: "model")
        let cwd = try nonEmpty(update.cwd, field: "cwd")
        return try await withOwner(id) { owner in
            defer { scheduleUnloadIfIdle(owner) }
            var next = owner.state!
            if let model { next.record.model = model }
            if let cwd { next.record.cwd = cwd }
            next.record.selectedMode = update.mode.applied(to: next.record.selectedMode)
            let changed = next.record != owner.state!.record
            var deliveries: [Delivery] = []
            if changed {
                try await install(owner, next, [.putThread(next.record.bumped())])
                deliveries.append(Delivery(event: .settingsUpdated(id, owner.settingsView), recipients: owner.subscribers))
            }
            return Outcome((owner.settingsView, changed), publications: [owner.publisher.ticket(deliveries)])
        }
    }

    public struct TurnRequest: Sendable {
        public var input: [String]
        public var model: String?
        public var mode: ModeUpdate = .keep
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
            guard let index = owner.state!.activeTurnIndex else {
                throw DomainError.failedPrecondition("thread \(id) has no active turn")
            }
            guard owner.state!.turns[index].id == turnID else {
                throw DomainError.failedPrecondition(
                    "turn \(turnID) is not the active turn of thread \(id) (active: \(owner.state!.turns[index].id))")
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
                of: parent, parent.state!, request, spawningMode: parent.state!.turns.last?.context.effectiveMode,
                extraSubscriber: connection)
            return Outcome(spawned.view, publications: spawned.publications)
        }
    }

    // MARK: - Ownership

    /// Runs `body` as the thread's only command, loading the thread first if
    /// needed. The owner's state is non-nil inside `body`.
    func withOwner<T>(_ id: ThreadID, _ body: (ThreadOwner) async throws -> T) async throws -> T {
        try throwIfKnownElsewhere(id)
        while true {
            let owner = directory.owner(id) { ThreadOwner(id: id, sink: sink) }
            await owner.gate.lock()
            if owner.retired {  // unloaded while we queued: find the current owner
                owner.gate.unlock()
                continue
            }
            do {
                if owner.state == nil { try await load(owner) }
                let result = try await body(owner)
                owner.gate.unlock()
                return result
            } catch {
                if owner.state == nil { retire(owner) }
                owner.gate.unlock()
                throw error
            }
        }
    }

    /// Registers a thread this engine just created and committed.
    func adopt(_ stored: StoredThread, config: ThreadConfig, subscriber: ConnectionID?, fence: LeaseFence?) -> ThreadOwner {
        let owner = ThreadOwner(id: stored.record.id, sink: sink)
        owner.fence = fence
        owner.state = stored
        owner.config = config
        if let subscriber { owner.subscribe(subscriber) }
        directory.insert(owner)
        directory.publish(stored)
        return owner
    }

    func retire(_ owner: ThreadOwner) {
        owner.retired = true
        directory.remove(owner)
        if let fence = owner.fence, let coordinator, let released = heldTrees.leave(fence, owner.id) {
            tasks.spawn { await coordinator.release([released]) }
        }
    }

    /// Commits `operations` and installs `next` as the owner's state and
    /// snapshot. On failure nothing changes in memory. Every commit of an
    /// owner carries its thread's next version (compare-and-set), so a stale
    /// owner (one that lost the thread, e.g. to another process after a crash
    /// or a partition) fails loudly instead of overwriting turns or history.
    /// Commits the creation of a thread within its principal's
    /// threads-per-minute limit; a failed commit gives the slot back.
    /// With `newTree`, a failed commit also gives the new tree's lease back.
    func commitCreation(_ principal: Principal, _ operations: [StoreOperation], fence: LeaseFence?, newTree: Bool = false) async throws {
        let reservation: ContinuousClock.Instant?
        do {
            reservation = try threadStarts.reserve(principal, limit: settings.principalLimits.maxThreadsStartedPerMinute)
        } catch {
            if newTree { abandonNewTree(fence) }
            throw error
        }
        do {
            try await commit(operations, fence: fence)
        } catch {
            threadStarts.refund(principal, reservation)
            if newTree { abandonNewTree(fence) }
            throw error
        }
    }

    func install(_ owner: ThreadOwner, _ next: StoredThread, _ operations: [StoreOperation]) async throws {
        var next = next
        var operations = operations
        if !operations.contains(where: { if case let .putThread(record) = $0 { record.id == owner.id } else { false } }) {
            operations.insert(.putThread(next.record.bumped()), at: 0)
        }
        for case let .putThread(record) in operations where record.id == owner.id { next.record.version = record.version }
        try await commit(operations, fence: owner.fence)
        owner.state = next
        directory.publish(next)
    }

    // MARK: - Loading and crash recovery

    /// Loads a thread from the store ("cold resume"). A legacy thread is
    /// pinned here, once, rewriting neither its history nor its timestamps. A
    /// turn stored as in progress was left by a process that died: it is
    /// interrupted with the runtime's marker and the reason, and a child's
    /// parent hears of it through the runtime's channel. Undelivered mailbox
    /// items move into the history.
    func load(_ owner: ThreadOwner) async throws {
        let id = owner.id
        if coordinator != nil, owner.fence == nil {
            // The tree is claimed before the thread is read, so the read sees
            // every commit of the previous owner.
            guard let head = try await store.threadRecord(id) else { throw DomainError.notFound("thread \(id) not found") }
            owner.fence = try await claimTree(head.sessionID, thread: id)
        }
        guard var stored = try await store.loadThread(id) else { throw DomainError.notFound("thread \(id) not found") }
        let before = stored.record
        var operations: [StoreOperation] = []
        if stored.record.runtime == nil {
            let origin: HistoryOrigin = stored.record.legacy || !stored.turns.isEmpty ? .resumed : .new
            stored.record.runtime = RuntimeResolver.resolveAtLoad(inherited: nil, recorded: Self.recordedRuntime(stored), origin: origin)
        }
        var recovered = false
        while let index = stored.turns.lastIndex(where: { $0.status == .inProgress }) {
            operations += finish(&stored, index: index, status: .interrupted,
                                 error: "interrupted: the server stopped while this turn was running (recovered at load)")
            recovered = true
        }
        let mailbox = try await store.pendingMailbox(id)
        if let last = mailbox.last {
            let items = mailbox.map(\.item)
            operations.append(.appendHistory(id, firstSequence: stored.history.count, items: items))
            operations.append(.removeMailbox(recipient: id, throughSequence: last.sequence))
            stored.history += items
        }
        if stored.record != before {
            stored.record.version = before.version + 1
            operations.insert(.putThread(stored.record), at: 0)
        }
        if !operations.isEmpty { try await commit(operations, fence: owner.fence) }
        owner.config = try threadConfig(overrides: stored.record.configOverrides, ceilings: .clamp)
        owner.state = stored
        directory.publish(stored)
        if recovered {
            changes.changed(id)
            if let parentID = stored.record.parentID { scheduleMailboxDelivery(parentID) }
        }
    }

    /// Recovers every turn a dead process left running, so no thread reports
    /// ACTIVE for a turn nobody runs. Run once at startup, before serving.
    /// With several instances, only threads no live instance owns.
    public func recoverInterruptedTurns() async throws -> Int {
        let ids: [ThreadID]
        if let coordinator {
            ids = try await coordinator.orphanedRunningThreads()
        } else {
            ids = try await store.threadsWithRunningTurns()
        }
        var recovered = 0
        for id in ids {
            do {
                try await withOwner(id) { owner in scheduleUnloadIfIdle(owner) }
                recovered += 1
            } catch is OwnedElsewhere {
                continue  // another instance took it meanwhile and recovers it
            }
        }
        return recovered
    }

    /// Moves a thread's undelivered mailbox items into its history (a
    /// separate command on that thread, so a child never waits for its parent).
    func scheduleMailboxDelivery(_ recipient: ThreadID) {
        tasks.spawn { [self] in
            _ = try? await withOwner(recipient) { owner in
                defer { scheduleUnloadIfIdle(owner) }
                let mailbox = try await store.pendingMailbox(recipient)
                guard let last = mailbox.last else { return }
                var next = owner.state!
                let items = mailbox.map(\.item)
                let first = next.history.count
                next.history += items
                try await install(owner, next, [
                    .appendHistory(recipient, firstSequence: first, items: items),
                    .removeMailbox(recipient: recipient, throughSequence: last.sequence),
                ])
            }
        }
    }

    static func recordedRuntime(_ stored: StoredThread) -> MultiAgentRuntime? {
        stored.record.runtime ?? stored.turns.last(where: { $0.context.runtime != nil })?.context.runtime
    }

    func threadConfig(overrides: [KeyValuePair], ceilings: ThreadConfig.Ceilings) throws -> ThreadConfig {
        try settings.threadDefaults.applying(overrides.map { (key: $0.key, value: $0.value) }, ceilings: ceilings)
    }

    func nonEmpty(_ value: String?, field: String) throws -> String? {
        guard let value else { return nil }
        guard !value.trimmingCharacters(in: .whitespacesAndNewlines).isEmpty else {
            throw DomainError.invalidArgument("\(field) must not be empty")
        }
        return value
    }

    func commit(_ operations: [StoreOperation], fence: LeaseFence?) async throws {
        do {
            try await store.commit(operations, fence: fence)
        } catch let error as DomainError {
            throw error
        } catch let lost as LeaseLost {
            tasks.spawn { [self] in await treeLost(lost.fence) }
            throw DomainError.unavailable(lost.description + "; retry, the request then reaches the new owner")
        } catch let conflict as StoreConflict {
            throw conflict.expectedVersion == 0
                ? DomainError.alreadyExists(conflict.description)
                : DomainError.aborted(conflict.description + "; retry the request")
        } catch {
            throw DomainError.unavailable("the store could not commit the change: \(error)")
        }
    }

    // MARK: - Unloading

    /// With the gate held.
    func scheduleUnloadIfIdle(_ owner: ThreadOwner) {
        guard let state = owner.state, !owner.retired, owner.subscribers.isEmpty, state.activeTurnIndex == nil,
              owner.unloadTimer == nil else { return }
        let delay = idleUnloadAfter
        owner.unloadTimer = Task { [weak self, weak owner] in
            try? await Task.sleep(for: delay)
            guard !Task.isCancelled, let self, let owner else { return }
            await self.unloadIfStillIdle(owner)
        }
    }

    func unloadIfStillIdle(_ owner: ThreadOwner) async {
        await owner.gate.lock()
        defer { owner.gate.unlock() }
        owner.unloadTimer = nil
        guard !owner.retired, let state = owner.state, owner.subscribers.isEmpty, state.activeTurnIndex == nil else { return }
        retire(owner)
        directory.drop(owner.id)
        let recipients = owner.formerSubscribers
        owner.publisher.ticket([
            Delivery(event: .statusChanged(owner.id, .notLoaded), recipients: recipients),
            Delivery(event: .closed(owner.id), recipients: recipients),
        ]).publish()
    }

    // MARK: - Shutdown

    /// Graceful shutdown: running turns get `shutdownTurnGraceMs` to finish;
    /// then each is interrupted and recorded like any interruption, so the
    /// next process finds nothing to recover.
    public func shutdown() async {
        stopping.store(true, ordering: .releasing)
        await directory.waitUntilNoActiveTurns(until: .now + .milliseconds(settings.shutdownTurnGraceMs))
        for owner in directory.all where directory.snapshot(owner.id)?.activeTurnIndex != nil {
            _ = try? await withOwner(owner.id) { owner in
                guard owner.state!.activeTurnIndex != nil else { return }
                try await endActiveTurn(owner, status: .interrupted,
                                        error: "interrupted: the server shut down while this turn was running").publish()
            }
        }
        // Runners of interrupted turns were cancelled; they and any mailbox
        // delivery end here rather than being abandoned at exit.
        await tasks.waitForAll(timeout: .seconds(5))
        await releaseAllLeases()
    }

    // MARK: - Views

    static func interruptionMarker(runtime: MultiAgentRuntime?) -> ContextItem {
        if runtime == .v2 {
            return ContextItem(role: .developer, kind: .interruptionMarker,
                               text: "The previous turn was interrupted by the user before it finished.")
        }
        return ContextItem(role: .user, kind: .interruptionMarker,
                           text: "<turn_aborted>The user interrupted the previous turn.</turn_aborted>")
    }
}

/// The one owner of a loaded thread. Everything but the subscriptions is
/// read and written only with `gate` held (hence unchecked Sendable).
final class ThreadOwner: @unchecked Sendable {
    let id: ThreadID
    let gate = AsyncGate()
    let publisher: OrderedPublisher
    var state: StoredThread?
    var config = ThreadConfig()
    /// Set when unloaded; a command that queued on a retired owner looks again.
    var retired = false
    /// The lease of its agent tree this owner commits under (several
    /// instances on one store), nil otherwise.
    var fence: LeaseFence?
    var runner: Task<Void, Never>?
    var unloadTimer: Task<Void, Never>?
    /// The running model call's streamed message, if any.
    var messageStream: MessageStream?

    private struct Subscriptions {
        var current: Set<ConnectionID> = []
        /// Connections that unsubscribed; they hear thread/closed.
        var former: Set<ConnectionID> = []
    }
    private let subscriptions = Mutex(Subscriptions())

    init(id: ThreadID, sink: any EventSink) {
        self.id = id
        publisher = OrderedPublisher(sink: sink)
    }

    var subscribers: [ConnectionID] { subscriptions.withLock { Array($0.current) } }
    var formerSubscribers: [ConnectionID] { subscriptions.withLock { Array($0.former) } }

    func subscribe(_ connection: ConnectionID) {
        subscriptions.withLock {
            $0.current.insert(connection)
            $0.former.remove(connection)
        }
    }

    func isSubscribed(_ connection: ConnectionID) -> Bool {
        subscriptions.withLock { $0.current.contains(connection) }
    }

    func subscribe(all connections: [ConnectionID]) {
        subscriptions.withLock { $0.current.formUnion(connections) }
    }

    func unsubscribe(_ connection: ConnectionID) -> Bool {
        subscriptions.withLock {
            guard $0.current.remove(connection) != nil else { return false }
            $0.former.insert(connection)
            return true
        }
    }

    /// True if the connection was subscribed (now or formerly).
    func forget(_ connection: ConnectionID) -> Bool {
        subscriptions.withLock {
            let was = $0.current.remove(connection) != nil
            return $0.former.remove(connection) != nil || was
        }
    }

    func cancelUnload() {
        unloadTimer?.cancel()
        unloadTimer = nil
    }

    var settingsView: ThreadSettingsView { ThreadView(stored: state!, includeTurns: false).settings }
}

/// An agent tree's gate and how many commands hold it or wait for it.
struct TreeGateEntry {
    let gate: AsyncGate
    let users: Int
}

/// One published snapshot of a loaded thread and its memo. A class, so a
/// reader takes it out of the directory with one retain rather than one per
/// string of the record: readers on every event loop share the same objects,
/// and each atomic reference count they touch moves a cache line between cores.
public final class PublishedThread: Sendable {
    let stored: StoredThread
    public let memo: SnapshotMemo

    init(stored: StoredThread, memo: SnapshotMemo) {
        self.stored = stored
        self.memo = memo
    }

    /// The principal the thread belongs to.
    public var owner: Principal { stored.record.owner }

    public func view(includeTurns: Bool, includeModelRequests: Bool, turnsLimit: Int = .max) -> ThreadView {
        var view = ThreadView(stored: stored, includeTurns: false, includeHistory: includeModelRequests)
        if includeTurns { view.setNewestTurns(stored.turns, limit: turnsLimit) }
        return view
    }
}

/// Keeps one value derived from one published snapshot (the server keeps a
/// thread/read answer's encoding here), so readers of an unchanged thread
/// derive it once. Made anew with every publish, so it cannot go stale.
public final class SnapshotMemo: Sendable {
    private let slot = Mutex<(any Sendable)?>(nil)

    public init() {}

    /// The kept value if it is a `T`, else `make()`, kept for next time.
    /// Two readers racing may both make it; either result is the same.
    public func value<T: Sendable>(_ make: () throws -> T) rethrows -> T {
        if let kept = slot.withLock({ $0 }) as? T { return kept }
        let made = try make()
        slot.withLock { $0 = made }
        return made
    }
}

/// Loaded threads by id, and their published snapshots. A snapshot is the
/// committed state; readers take it under a short lock and never wait for a
/// thread's commands.
final class ThreadDirectory: Sendable {
    private let owners = Mutex<[ThreadID: ThreadOwner]>([:])
    private let snapshots = Mutex<[ThreadID: PublishedThread]>([:])
    /// Turns running per principal, kept with every publish and drop.
    let runningTurns = RunningTurnCounts()

    func owner(_ id: ThreadID, orMake make: () -> ThreadOwner) -> ThreadOwner {
        owners.withLock { table in
            if let existing = table[id] { return existing }
            let made = make()
            table[id] = made
            return made
        }
    }

    func existing(_ id: ThreadID) -> ThreadOwner? { owners.withLock { $0[id] } }

    func insert(_ owner: ThreadOwner) { owners.withLock { $0[owner.id] = owner } }

    func remove(_ owner: ThreadOwner) {
        owners.withLock { table in
            if table[owner.id] === owner { table[owner.id] = nil }
        }
    }

    var all: [ThreadOwner] { owners.withLock { Array($0.values) } }

    /// Every publish starts a new memo, so nothing derived from an older
    /// snapshot is served after a commit.
    func publish(_ stored: StoredThread) {
        let published = PublishedThread(stored: stored, memo: SnapshotMemo())
        snapshots.withLock { table in
            let wasRunning = table[stored.record.id]?.stored.activeTurnIndex != nil
            table[stored.record.id] = published
            runningTurns.changed(stored.record.owner, wasRunning: wasRunning, isRunning: stored.activeTurnIndex != nil)
        }
        wakeIdleWaitersIfIdle()
    }
    func drop(_ id: ThreadID) {
        snapshots.withLock { table in
            if let dropped = table.removeValue(forKey: id), dropped.stored.activeTurnIndex != nil {
                runningTurns.changed(dropped.stored.record.owner, wasRunning: true, isRunning: false)
            }
        }
        wakeIdleWaitersIfIdle()
    }

    // Shutdown waits for running turns to end without polling: every publish
    // (a turn ends by committing) wakes the waiters once no turn is active.
    private let idleWaiters = Mutex<[UInt64: CheckedContinuation<Void, Never>]>([:])
    private let idleWaiterCount = Atomic<Int>(0)
    private let nextIdleWaiter = Atomic<UInt64>(0)

    /// Returns once no loaded thread has a running turn, or at `deadline`.
    func waitUntilNoActiveTurns(until deadline: ContinuousClock.Instant) async {
        let id = nextIdleWaiter.add(1, ordering: .relaxed).newValue
        await withTaskGroup(of: Void.self) { group in
            group.addTask {
                await withCheckedContinuation { continuation in
                    self.idleWaiters.withLock { waiters in
                        waiters[id] = continuation
                        self.idleWaiterCount.add(1, ordering: .sequentiallyConsistent)
                    }
                    // A turn that ended before the registration woke nobody.
                    if !self.hasActiveTurns { self.resumeIdleWaiter(id) }
                }
            }
            group.addTask { try? await Task.sleep(until: deadline) }
            await group.next()
            group.cancelAll()
            resumeIdleWaiter(id)
        }
    }

    /// Whether shutdown is waiting for running turns (tests wait for this).
    var isWaitingForTurns: Bool { idleWaiterCount.load(ordering: .sequentiallyConsistent) > 0 }

    private func resumeIdleWaiter(_ id: UInt64) {
        let waiter = idleWaiters.withLock { waiters -> CheckedContinuation<Void, Never>? in
            guard let waiter = waiters.removeValue(forKey: id) else { return nil }
            idleWaiterCount.subtract(1, ordering: .sequentiallyConsistent)
            return waiter
        }
        waiter?.resume()
    }

    private func wakeIdleWaitersIfIdle() {
        guard idleWaiterCount.load(ordering: .sequentiallyConsistent) > 0, !hasActiveTurns else { return }
        let waiters = idleWaiters.withLock { waiters -> [CheckedContinuation<Void, Never>] in
            defer {
                idleWaiterCount.subtract(waiters.count, ordering: .sequentiallyConsistent)
                waiters.removeAll()
            }
            return Array(waiters.values)
        }
        for waiter in waiters { waiter.resume() }
    }
    func snapshot(_ id: ThreadID) -> StoredThread? { snapshots.withLock { $0[id]?.stored } }
    func published(_ id: ThreadID) -> PublishedThread? { snapshots.withLock { $0[id] } }

    func statuses(_ ids: [ThreadID]) -> [ThreadID: ThreadStatus] {
        snapshots.withLock { table in
            var result: [ThreadID: ThreadStatus] = [:]
            for id in ids { if let published = table[id] { result[id] = published.stored.status } }
            return result
        }
    }

    var counts: (loaded: Int, running: Int) {
        snapshots.withLock { table in (table.count, table.values.reduce(0) { $0 + ($1.stored.activeTurnIndex == nil ? 0 : 1) }) }
    }

    var hasActiveTurns: Bool { snapshots.withLock { $0.values.contains { $0.stored.activeTurnIndex != nil } } }
}

extension StoredThread {
    var activeTurnIndex: Int? { turns.lastIndex { $0.status == .inProgress } }

    var status: ThreadStatus {
        if let index = activeTurnIndex { return .active(turns[index].id) }
        return .idle
    }
}

extension ThreadRecord {
    /// The record as the next version, for a compare-and-set commit.
    func bumped() -> ThreadRecord {
        var next = self
        next.version += 1
        return next
    }
}

extension ThreadView {
    init(stored: StoredThread, includeTurns: Bool, includeHistory: Bool = false) {
        self.init(record: stored.record, status: stored.status, turns: includeTurns ? stored.turns : nil,
                  history: includeHistory ? stored.history : nil)
    }
}
