import Synchronization
import Testing
@testable import ThreadwireCore
import ThreadwireModels
import ThreadwireTesting

/// Leases granted by a coordinator whose store can be cut off: renewals then
/// hang (as a call over a partitioned network does) until it is healed.
final class CuttableCoordinator: OwnershipCoordinator, Sendable {
    let leaseDuration: Duration
    private let state = Mutex<(epochs: [ThreadID: Int64], cut: Bool)>(([:], false))

    init(leaseDuration: Duration) { self.leaseDuration = leaseDuration }

    func cut(_ cut: Bool) { state.withLock { $0.cut = cut } }

    private func reachable() async throws {
        while state.withLock({ $0.cut }) { try await Task.sleep(for: .milliseconds(10)) }
    }

    func bound(port: Int) {}
    func acquire(_ tree: ThreadID) async throws -> LeaseClaim {
        try await reachable()
        return .held(state.withLock { state in
            state.epochs[tree, default: 0] += 1
            return LeaseFence(tree: tree, epoch: state.epochs[tree]!)
        })
    }
    func renew(_ fences: [LeaseFence]) async throws -> Set<LeaseFence> {
        try await reachable()
        return Set(fences)
    }
    func release(_ fences: [LeaseFence]) async {}
    func holder(_ tree: ThreadID) async throws -> String? { nil }
    func orphanedRunningThreads() async throws -> [ThreadID] { [] }
    func probe() async throws { try await reachable() }
}

/// The in-memory store, taking fences as given (the coordinator above is the test's).
struct UnfencedStore: ThreadStore {
    let inner = InMemoryThreadStore()
    func commit(_ operations: [StoreOperation]) async throws { try await inner.commit(operations) }
    func commit(_ operations: [StoreOperation], fence: LeaseFence?) async throws { try await inner.commit(operations) }
    func loadThread(_ id: ThreadID) async throws -> StoredThread? { try await inner.loadThread(id) }
    func threadRecord(_ id: ThreadID) async throws -> ThreadRecord? { try await inner.threadRecord(id) }
    func listThreads(_ query: ThreadListQuery) async throws -> (records: [ThreadRecord], nextCursor: String?) { try await inner.listThreads(query) }
    func turnsPage(_ id: ThreadID, afterSequence: Int?, limit: Int, descending: Bool) async throws -> [TurnRecord]? {
        try await inner.turnsPage(id, afterSequence: afterSequence, limit: limit, descending: descending)
    }
    func agentTree(_ sessionID: ThreadID) async throws -> [ThreadRecord] { try await inner.agentTree(sessionID) }
    func pendingMailbox(_ recipient: ThreadID) async throws -> [(sequence: Int64, item: ContextItem)] { try await inner.pendingMailbox(recipient) }
    func threadsWithRunningTurns() async throws -> [ThreadID] { try await inner.threadsWithRunningTurns() }
    func idempotencyRecord(_ key: IdempotencyKey) async throws -> IdempotencyRecord? { try await inner.idempotencyRecord(key) }
    func purgeIdempotencyRecords(createdBefore millis: Int64) async throws -> Int { try await inner.purgeIdempotencyRecords(createdBefore: millis) }
    func importRecord(_ thread: ThreadID) async throws -> ImportRecord? { try await inner.importRecord(thread) }
}

@Suite("a partitioned owner steps down in time (in memory)")
struct LeaseStepDownTests {
    /// An engine with a coordinator granting `lease`, and a new thread (and
    /// `then` done on it) under a lease granted just now. These tests share
    /// the process's two pool threads with CPU-bound tests; when those hold
    /// both for longer than the lease's validity (seen at the start of a
    /// full run on 2 cores), the start is refused for the very reason tested
    /// here, so the setup is done again, with a fresh engine.
    private func freshlyLeasedThread(lease: Duration, maintained: Bool, then: (ThreadEngine, ThreadID) async throws -> Void = { _, _ in })
        async throws -> (engine: ThreadEngine, coordinator: CuttableCoordinator, maintenance: Task<Void, Never>?, id: ThreadID) {
        var attempt = 1
        while true {
            let coordinator = CuttableCoordinator(leaseDuration: lease)
            let engine = ThreadEngine(store: UnfencedStore(), backend: ScriptedEchoBackend(), settings: ServerSettings(),
                                      sink: RecordingSink(), coordinator: coordinator)
            let maintenance = maintained ? Task { await engine.maintainLeases() } : nil
            do {
                let id = try await engine.startThread(.init(), connection: 1).value.record.id
                try await then(engine, id)
                return (engine, coordinator, maintenance, id)
            } catch DomainError.unavailable where attempt < 5 {
                maintenance?.cancel()
                attempt += 1
            }
        }
    }

    @Test("renewals that hang past the lease's validity: commands are refused with UNAVAILABLE naming the cause, the threads are unloaded, readiness names the trouble; healed, the instance takes its thread back")
    func stepsDownBeforeTheLeaseCanExpire() async throws {
        let lease = Duration.seconds(8)
        let (engine, coordinator, maintenance, id) = try await freshlyLeasedThread(lease: lease, maintained: true) { engine, id in
            _ = try await engine.updateSettings(id, { var u = ThreadEngine.SettingsUpdate(); u.model = "before"; return u }())
        }
        defer { maintenance?.cancel() }
        #expect(engine.published(id) != nil)

        coordinator.cut(true)
        let cutAt = ContinuousClock.now
        // By the time the lease could have expired (it was last renewed before
        // the cut), nothing is served from memory any more: that is decided by
        // the monotonic clock, not by when the step-down gets to run.
        try await Task.sleep(until: cutAt + lease)
        #expect(engine.published(id) == nil, "the thread is still served from memory when its lease may have expired")
        // And the instance steps down: the threads are unloaded.
        while engine.ownershipTrouble == nil || engine.loadCounts.loaded > 0, ContinuousClock.now - cutAt < lease * 5 {
            try await Task.sleep(for: .milliseconds(5))
        }
        #expect(engine.loadCounts.loaded == 0, "the thread is still loaded")
        let trouble = try #require(engine.ownershipTrouble)
        #expect(trouble.contains("not renewed"), "\(trouble)")
        // A command is refused at once (not after the store's timeout), naming
        // why, so its client or relaying instance turns to the next owner.
        let asked = ContinuousClock.now
        do {
            _ = try await engine.updateSettings(id, { var u = ThreadEngine.SettingsUpdate(); u.model = "during"; return u }())
            Issue.record("a command was carried out while the store was cut off")
        } catch let DomainError.unavailable(message) {
            #expect(message.contains("could not renew its ownership leases"), "\(message)")
        }
        #expect(ContinuousClock.now - asked < lease / 2, "the refusal waited for the store")
        coordinator.cut(false)
        // Healed: the instance sees the store answer again, then takes the tree back.
        let healedAt = ContinuousClock.now
        while engine.ownershipTrouble != nil, ContinuousClock.now - healedAt < lease * 5 { try await Task.sleep(for: .milliseconds(10)) }
        #expect(engine.ownershipTrouble == nil)
        _ = try await engine.updateSettings(id, { var u = ThreadEngine.SettingsUpdate(); u.model = "after"; return u }())
        #expect(try await engine.readThread(id, includeTurns: false, includeModelRequests: false).record.model == "after")
    }

    @Test("a commit attempted after the leases may have lapsed, before any step-down ran, is refused UNAVAILABLE saying the leases were not renewed")
    func commitRefusedOnceLapsed() async throws {
        let lease = Duration.seconds(8)
        // No lease maintenance: nothing renews and nothing steps down.
        let (engine, _, _, id) = try await freshlyLeasedThread(lease: lease, maintained: false)
        try await Task.sleep(for: lease)
        do {
            _ = try await engine.updateSettings(id, { var u = ThreadEngine.SettingsUpdate(); u.model = "late"; return u }())
            Issue.record("a commit under a lapsed lease was accepted")
        } catch let DomainError.unavailable(message) {
            #expect(message.contains("could not renew its ownership leases"), "\(message)")
        }
        #expect(engine.published(id) == nil, "a snapshot under a lapsed lease is still served")
    }
}
