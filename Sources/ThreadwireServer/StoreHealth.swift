public import Logging
import NIOConcurrencyHelpers
import Synchronization
public import ServiceLifecycle
public import ThreadwireCore

/// Whether the store can commit. A failed commit marks it unhealthy at once;
/// only a successful probe (see `ThreadStore.probe`) marks it healthy again,
/// so health does not flap while small commits squeeze into a full disk.
/// As a service it probes periodically, so a disk that fills while nobody
/// writes is noticed too.
public final class StoreHealth: Service, Sendable {
    private let store: any ThreadStore
    private let logger: Logger
    private let state = NIOLockedValueBox<String?>(nil)
    /// `state == nil`, stored under its lock and read without it: every
    /// health/check asks.
    private let healthy = Atomic(true)
    public let healthyInterval: Duration
    public let unhealthyInterval: Duration

    public init(store: any ThreadStore, logger: Logger,
                healthyInterval: Duration = .seconds(5), unhealthyInterval: Duration = .seconds(1)) {
        self.store = store
        self.logger = logger
        self.healthyInterval = healthyInterval
        self.unhealthyInterval = unhealthyInterval
    }

    public var isHealthy: Bool { healthy.load(ordering: .acquiring) }
    /// Why the store cannot commit, nil while it can.
    public var failure: String? { state.withLockedValue { $0 } }

    func commitFailed(_ error: any Error) {
        let wasHealthy = state.withLockedValue { current in
            defer {
                current = "\(error)"
                healthy.store(false, ordering: .releasing)
            }
            return current == nil
        }
        if wasHealthy { logger.error("store cannot commit; health is NOT_SERVING", metadata: ["tw.error": "\(error)"]) }
    }

    /// Probes once and records the result.
    public func check() async {
        do {
            try await store.probe()
            let wasUnhealthy = state.withLockedValue { current in
                defer {
                    current = nil
                    healthy.store(true, ordering: .releasing)
                }
                return current != nil
            }
            if wasUnhealthy { logger.notice("store commits again; health is SERVING") }
        } catch {
            // A probe cut short by shutdown, or out of descriptors, says
            // nothing about the store.
            if error is CancellationError || Task.isCancelled { return }
            if let inconclusive = error as? ProbeInconclusive {
                logger.debug("store probe inconclusive", metadata: ["tw.error": "\(inconclusive)"])
                return
            }
            commitFailed(error)
        }
    }

    public func run() async throws {
        await cancelWhenGracefulShutdown {
            while !Task.isCancelled {
                await self.check()
                try? await Task.sleep(for: self.isHealthy ? self.healthyInterval : self.unhealthyInterval)
            }
        }
    }
}

/// The store as the engine sees it: commit failures feed `StoreHealth`, and
/// reach the client as UNAVAILABLE naming the cause (the change was not made).
struct MonitoredStore: ThreadStore {
    let base: any ThreadStore
    let health: StoreHealth

    func commit(_ operations: [StoreOperation]) async throws {
        try await commit(operations, fence: nil)
    }

    func commit(_ operations: [StoreOperation], fence: LeaseFence?) async throws {
        do {
            try await base.commit(operations, fence: fence)
        } catch {
            switch StoreError.wrapping(error) {
            case .conflict, .leaseLost, .idempotencyKeyTaken, .historySequenceTaken:
                throw error  // the store works: a stale write, this instance lost the thread, or a repeat lost its race
            case let .unavailable(reason), let .misconfigured(reason):
                health.commitFailed(error)
                throw StoreError.unavailable("the store cannot commit (\(reason)); the change was not made")
            case .outcomeUnknown:
                health.commitFailed(error)
                throw error
            }
        }
    }

    func loadThread(_ id: ThreadID) async throws -> StoredThread? { try await base.loadThread(id) }
    func threadRecord(_ id: ThreadID) async throws -> ThreadRecord? { try await base.threadRecord(id) }
    func listThreads(_ query: ThreadListQuery) async throws -> (records: [ThreadRecord], nextCursor: String?) {
        try await base.listThreads(query)
    }
    func turnsPage(_ id: ThreadID, afterSequence: Int?, limit: Int, descending: Bool) async throws -> [TurnRecord]? {
        try await base.turnsPage(id, afterSequence: afterSequence, limit: limit, descending: descending)
    }
    func agentTree(_ sessionID: ThreadID) async throws -> [ThreadRecord] { try await base.agentTree(sessionID) }
    func pendingMailbox(_ recipient: ThreadID) async throws -> [(sequence: Int64, item: ContextItem)] {
        try await base.pendingMailbox(recipient)
    }
    func threadsWithRunningTurns() async throws -> [ThreadID] { try await base.threadsWithRunningTurns() }
    func threadsWithQueuedTurns() async throws -> [ThreadID] { try await base.threadsWithQueuedTurns() }
    func deleteTree(_ root: ThreadID, fence: LeaseFence?) async throws -> [ThreadID] { try await base.deleteTree(root, fence: fence) }
    func events(_ thread: ThreadID, after: Int64, limit: Int) async throws -> [StoredEvent] {
        try await base.events(thread, after: after, limit: limit)
    }
    func trimEvents(keep: Int64, createdBefore: Millis) async throws -> Int {
        try await base.trimEvents(keep: keep, createdBefore: createdBefore)
    }
    func probe() async throws { try await base.probe() }
    func storedBytes(of principal: Principal) async throws -> Int64 { try await base.storedBytes(of: principal) }
    func idempotencyRecord(_ key: IdempotencyKey) async throws -> IdempotencyRecord? { try await base.idempotencyRecord(key) }
    func importRecord(_ thread: ThreadID) async throws -> ImportRecord? { try await base.importRecord(thread) }
    func purgeIdempotencyRecords(createdBefore millis: Int64) async throws -> Int {
        try await base.purgeIdempotencyRecords(createdBefore: millis)
    }
}
