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
    /// Per-principal budgets (settings.principalLimits): this process's, or
    /// the store's when instances share it.
    public let quotaLedger: any QuotaLedger
    public let sharedQuotas: (any SharedQuotaLedger)?
    /// settings.principalLimits as in force now: a reload replaces them.
    public let principalLimits: LivePrincipalLimits
    let storedBytes = StoredBytesMeter()
    /// With several instances on one store: who may change which agent tree
    /// (nil: this process owns every thread).
    let coordinator: (any OwnershipCoordinator)?
    let heldTrees = HeldTrees()
    /// Set while lease renewals fail (see `maintainLeases`).
    let leaseTrouble = Mutex<LeaseTrouble?>(nil)
    let knownOwners: KnownOwners
    /// Answers of server requests (client tools), by request id.
    let pendingAnswers = PendingAnswers()
    /// Pending requests by agent tree root, offered to a root's new subscriber.
    let treeRequests = TreeRequests()
    /// MCP tool servers (nil: none configured).
    let toolServers: (any ToolServerHost)?

    public init(
        store: any ThreadStore, backend: any ModelBackend, settings: ServerSettings, sink: any EventSink,
        idleUnloadAfter: Duration = .seconds(1800), coordinator: (any OwnershipCoordinator)? = nil,
        toolServers: (any ToolServerHost)? = nil
    ) {
        self.toolServers = toolServers
        self.store = store
        self.backend = backend
        self.settings = settings
        principalLimits = LivePrincipalLimits(settings.principalLimits)
        self.sink = sink
        self.idleUnloadAfter = idleUnloadAfter
        self.coordinator = coordinator
        sharedQuotas = coordinator?.sharedQuotas
        quotaLedger = coordinator?.sharedQuotas ?? LocalQuotaLedger()
        knownOwners = KnownOwners(ttl: (coordinator?.leaseDuration ?? .seconds(10)) / 2)
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
            var view = ThreadView(record: stored.record, status: .notLoaded, turns: nil, history: stored.history.array)
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
    /// lease unnoticed (paused past its expiry) or has let it go (a
    /// step-down, a takeover) while the thread's unload waits behind a
    /// running command: the owner or the store answers then.
    func liveSnapshot(_ id: ThreadID) -> PublishedThread? {
        guard let published = directory.published(id) else { return nil }
        guard coordinator != nil else { return published }
        guard heldTrees.surelyValid, let fence = published.fence, heldTrees.holds(fence) else { return nil }
        return published
    }

    /// The principal a thread belongs to (nil if there is no such thread):
    /// from its snapshot when loaded, else the store. It never changes, so a
    /// check against it cannot go stale.
    public func principal(of id: ThreadID) async throws -> Principal? {
        if let published = directory.published(id) { return published.principal }
        return try await store.threadRecord(id)?.principal
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

    /// thread/loaded/list: the ids of threads loaded here, of `principal`
    /// (nil: every principal's), in id order after `after`.
    public func loadedThreads(principal: Principal?, after: ThreadID?, limit: Int) -> (ids: [ThreadID], more: Bool) {
        let ids = directory.loaded.filter { principal == nil || $0.principal == principal }.map(\.id)
            .filter { after == nil || $0 > after! }.sorted()
        return (Array(ids.prefix(limit)), ids.count > limit)
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
            if archived, let active = owner.current.activeTurnIndex {
                throw DomainError.failedPrecondition(
                    "thread \(id) has an active turn (\(owner.current.turns[active].id)); interrupt it before archiving")
            }
            var deliveries: [Delivery] = []
            if owner.current.record.archived != archived {
                var next = owner.current
                next.record.archived = archived
                deliveries = try await install(owner, next, [.putThread(next.record.bumped())], events: [
                    Delivery(event: archived ? .archived(id) : .unarchived(id), recipients: owner.subscribers)])
            }
            return Outcome(ThreadView(stored: owner.current, includeTurns: false), publications: [owner.publisher.ticket(deliveries)])
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


    // MARK: - Shutdown

    /// Graceful shutdown: running turns get `shutdownTurnGraceMs` to finish;
    /// then each is interrupted and recorded like any interruption, so the
    /// next process finds nothing to recover.
    public func shutdown() async {
        stopping.store(true, ordering: .releasing)
        await directory.waitUntilNoActiveTurns(until: .now + .milliseconds(settings.shutdownTurnGraceMs))
        for owner in directory.all where directory.snapshot(owner.id)?.activeTurnIndex != nil {
            _ = try? await withOwner(owner.id) { owner in
                guard owner.current.activeTurnIndex != nil else { return }
                // Only waiting for a client: stored as it is, for the next process.
                if owner.current.isWaitingOnClient {
                    owner.runner?.cancel()
                    owner.runner = nil
                    return
                }
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
