import Foundation
import Synchronization

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
    func publish(_ stored: StoredThread, fence: LeaseFence?) {
        let published = PublishedThread(stored: stored, memo: SnapshotMemo(), fence: fence)
        snapshots.withLock { table in
            let wasRunning = table[stored.record.id]?.stored.activeTurnIndex != nil
            table[stored.record.id] = published
            runningTurns.changed(stored.record.principal, wasRunning: wasRunning, isRunning: stored.activeTurnIndex != nil)
        }
        wakeIdleWaitersIfIdle()
    }
    func drop(_ id: ThreadID) {
        snapshots.withLock { table in
            if let dropped = table.removeValue(forKey: id), dropped.stored.activeTurnIndex != nil {
                runningTurns.changed(dropped.stored.record.principal, wasRunning: true, isRunning: false)
            }
        }
        wakeIdleWaitersIfIdle()
    }

    // Shutdown waits for running turns to end without polling: every publish
    // (a turn ends by committing) wakes the waiters once no turn is active.
    private let idleWaiters = Mutex<[UInt64: CheckedContinuation<Void, Never>]>([:])
    private let idleWaiterCount = Atomic<Int>(0)
    private let nextIdleWaiter = Atomic<UInt64>(0)

    /// Returns once no loaded thread has a turn at work, or at `deadline`.
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
                    if !self.hasWorkingTurns { self.resumeIdleWaiter(id) }
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
        guard idleWaiterCount.load(ordering: .sequentiallyConsistent) > 0, !hasWorkingTurns else { return }
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

    /// The loaded threads and their principals.
    var loaded: [(id: ThreadID, principal: Principal)] {
        snapshots.withLock { table in table.map { ($0.key, $0.value.stored.record.principal) } }
    }

    var counts: (loaded: Int, running: Int) {
        snapshots.withLock { table in (table.count, table.values.reduce(0) { $0 + ($1.stored.activeTurnIndex == nil ? 0 : 1) }) }
    }

    /// Whether a loaded thread's turn is at work (a turn that only waits for
    /// a client is not: it is stored as waiting and survives a restart).
    var hasWorkingTurns: Bool { snapshots.withLock { $0.values.contains { $0.stored.hasWorkingTurn } } }
}

extension StoredThread {
    /// A turn starts only when none is in progress, and load recovery ends
    /// every other one (`ThreadEngine+Ownership`), so the active turn is the
    /// last: no scan of a long thread under the directory's lock.
    // By index, not `turns.last`, which copies the whole turn to read its status.
    var activeTurnIndex: Int? { !turns.isEmpty && turns[turns.endIndex - 1].status == .inProgress ? turns.endIndex - 1 : nil }
    var activeTurn: TurnRecord? { activeTurnIndex.map { turns[$0] } }

    /// A turn runs and is not only waiting for a client.
    var hasWorkingTurn: Bool { activeTurn.map { !$0.waitsOnClient } ?? false }

    /// The active turn waits for a client's answer or turn/continue (nothing
    /// else runs for it): stored as it is at shutdown, kept waiting at load.
    var isWaitingOnClient: Bool { activeTurn?.waitsOnClient ?? false }

    var status: ThreadStatus {
        if let turn = activeTurn {
            return .active(turn.id, waitingOn: turn.pausedAfterTools ? .continueAfterTools : turn.pendingRequests.first?.kind.waitingReason)
        }
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
        self.init(record: stored.record, status: stored.status, turns: includeTurns ? stored.turns.array : nil,
                  history: includeHistory ? stored.history.array : nil)
    }
}

extension TurnRecord {
    /// Waiting for a client: an answer to a server request, or turn/continue.
    var waitsOnClient: Bool { !pendingRequests.isEmpty || pausedAfterTools }
}
