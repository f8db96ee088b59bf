import Foundation
import Synchronization

/// Ownership across instances (docs/concurrency.md, "Several instances"):
/// an agent tree is changed only by the instance holding its lease, and
/// every commit of that instance carries the lease's fence. Without a
/// coordinator none of this runs and every fence is nil.
extension ThreadEngine {
    /// Claims an existing thread's tree for a load (the tree's gate makes
    /// the threads of one tree share one grant).
    func claimTree(_ tree: ThreadID, thread: ThreadID) async throws -> LeaseFence? {
        guard let coordinator else { return nil }
        return try await withTreeGate(tree) {
            if let fence = heldTrees.join(tree, thread) { return fence }
            let asked = ContinuousClock.now
            switch try await acquire(tree, coordinator) {
            case let .held(fence):
                heldTrees.granted(fence, thread: thread, asked: asked, validFor: leaseValidity(coordinator))
                return fence
            case let .elsewhere(address):
                knownOwners.remember(thread, at: address)
                throw OwnedElsewhere(threadID: thread, address: address)
            }
        }
    }

    /// A thread not loaded here whose owner was found elsewhere moments ago.
    func throwIfKnownElsewhere(_ id: ThreadID) throws {
        guard coordinator != nil, directory.existing(id) == nil, let address = knownOwners.address(id) else { return }
        throw OwnedElsewhere(threadID: id, address: address, remembered: true)
    }

    /// Whether a thread not loaded here was found at another instance moments
    /// ago: its command goes there, and that instance, which the relay
    /// reaches as the client's principal, checks the principal.
    public func isKnownElsewhere(_ id: ThreadID) -> Bool {
        coordinator != nil && directory.existing(id) == nil && knownOwners.address(id) != nil
    }

    /// The relay to a remembered owner failed: the next lookup asks the store.
    public func forgetOwner(of id: ThreadID) { knownOwners.forget(id) }

    /// A new root thread is a new tree: nobody else can hold it.
    func claimNewTree(_ id: ThreadID) async throws -> LeaseFence? {
        guard let coordinator else { return nil }
        do {
            let asked = ContinuousClock.now
            switch try await acquire(id, coordinator) {
            case let .held(fence):
                heldTrees.granted(fence, thread: id, asked: asked, validFor: leaseValidity(coordinator))
                return fence
            case let .elsewhere(address):
                throw DomainError.internal("a new thread id \(id) is already leased to \(address)")
            }
        } catch let error as DomainError {
            throw error
        } catch {
            throw DomainError.unavailable("the store could not grant the new thread's lease: \(error)")
        }
    }

    /// Before a read of a thread not loaded here: if another live instance
    /// has it loaded, its snapshot (status, running turn) is the truth and
    /// the read goes there; if nobody does but a turn is stored as running,
    /// its instance died: the thread is taken over (recovering the turn)
    /// first. True when the thread is now loaded here.
    @discardableResult
    func readFromOwnerIfElsewhere(_ id: ThreadID) async throws -> Bool {
        try throwIfKnownElsewhere(id)
        try throwIfCutOff()
        guard let coordinator, let record = try await store.threadRecord(id) else { return false }
        if let address = try await coordinator.holder(record.sessionID) {
            knownOwners.remember(id, at: address)
            throw OwnedElsewhere(threadID: id, address: address)
        }
        guard try await store.turnsPage(id, afterSequence: nil, limit: 1, descending: true)?.first?.status == .inProgress else {
            return false
        }
        try await withOwner(id) { owner in scheduleUnloadIfIdle(owner) }
        return true
    }

    func abandonNewTree(_ fence: LeaseFence?) {
        guard let fence, let coordinator else { return }
        if let released = heldTrees.leave(fence, fence.tree) {
            tasks.spawn { await coordinator.release([released]) }
        }
    }

    /// The tree's lease moved to another instance: its threads are unloaded
    /// here (subscribers hear thread/closed and resume through any
    /// instance), and their running turns stop; what they would still
    /// commit is refused by the fence.
    func treeLost(_ fence: LeaseFence) async {
        await unload(heldTrees.lost(fence), of: fence)
    }

    /// A commit under `fence` went unconfirmed, or was refused for stale
    /// state (`UntrustedCommit`): an unconfirmed one may still land under
    /// that very fence. So nothing of the tree is served or committed under
    /// it any more: its threads here are unloaded and its lease given up.
    /// The next command claims the tree anew, which raises the epoch and
    /// waits for that commit (it holds the lease row FOR SHARE until it is
    /// durable) or makes it fail its fence check, and then loads what is
    /// stored. Rejoining the old fence instead (another thread of the tree
    /// still loaded keeps it held) read the store before such a commit
    /// landed, and served that stale state under a valid lease.
    func abandonTree(_ fence: LeaseFence) {
        guard let coordinator else { return }
        unloadSoon(heldTrees.lost(fence), of: fence)
        tasks.spawn { await coordinator.release([fence]) }
    }

    /// `unload` without waiting: it waits for each thread's running command,
    /// which may wait on a slow store, and lease maintenance must not wait
    /// with it (the other trees' renewals would come late). Meanwhile
    /// nothing is served from those threads' state: it is no longer under a
    /// held lease (`liveSnapshot`, `withOwner`).
    func unloadSoon(_ threads: Set<ThreadID>, of fence: LeaseFence) {
        tasks.spawn { [self] in await unload(threads, of: fence) }
    }

    /// Drops the loaded threads of a tree no longer held under `fence`.
    private func unload(_ threads: Set<ThreadID>, of fence: LeaseFence) async {
        for id in threads {
            guard let owner = directory.existing(id) else { continue }
            await owner.gate.lock()
            defer { owner.gate.unlock() }
            guard !owner.retired, owner.fence == fence else { continue }
            drop(owner, retiring: false)  // the lease is gone already: nothing to release
        }
    }

    /// A grant, or UNAVAILABLE once a lease's time passed without an answer
    /// (the store unreachable: a partition stalls the call for minutes).
    /// A grant proves the store reachable again.
    private func acquire(_ tree: ThreadID, _ coordinator: any OwnershipCoordinator) async throws -> LeaseClaim {
        do {
            let claim = try await withDeadline(coordinator.leaseDuration, timeoutError: { [self] in
                DomainError.unavailable("the store did not grant the lease of agent tree \(tree) within \(coordinator.leaseDuration)"
                    + (ownershipTrouble.map { " (\($0))" } ?? "") + "; retry")
            }) { try await coordinator.acquire(tree) }
            leaseTrouble.withLock { $0 = nil }
            return claim
        } catch {
            noteTrouble("\(error)")
            throw error
        }
    }

    /// The store did not answer the coordinator: in trouble from now (or since earlier).
    private func noteTrouble(_ error: String, since: ContinuousClock.Instant = .now) {
        leaseTrouble.withLock { state in state = LeaseTrouble(since: state?.since ?? since, error: error) }
    }

    /// How long a lease is surely this instance's after the moment it asked
    /// for it: the lease less a quarter (at least 100 ms), which covers
    /// clocks running at different rates and leaves renewals two chances.
    func leaseValidity(_ coordinator: any OwnershipCoordinator) -> Duration {
        coordinator.leaseDuration - max(coordinator.leaseDuration / 4, .milliseconds(100))
    }

    /// Refuses a commit under leases that may have lapsed: the instance
    /// stopped acting for its trees (another may own them by now). Fencing
    /// refuses such a commit in the store too; this refuses it before it
    /// is sent, and names the cause.
    func ensureLeasesValid(_ fence: LeaseFence?) throws {
        guard fence != nil, coordinator != nil, !heldTrees.surelyValid else { return }
        throw DomainError.unavailable(steppedDownMessage)
    }

    /// While lease renewals fail (the store is out of reach), a thread
    /// that is not loaded is not looked for in the store (that waits for
    /// the store's timeout): the command is refused at once, so its client,
    /// or the instance that relayed it, turns to the thread's next owner.
    public func throwIfCutOff() throws {
        guard coordinator != nil, leaseTrouble.withLock({ $0 != nil }) else { return }
        throw DomainError.unavailable(steppedDownMessage)
    }

    var steppedDownMessage: String {
        let trouble = leaseTrouble.withLock { $0 }
        let since = trouble.map { " for \(Self.seconds(ContinuousClock.now - $0.since)) s (\($0.error))" } ?? ""
        return "this instance could not renew its ownership leases with the store\(since); it stopped acting for its agent trees so "
            + "that another instance can take them over safely: retry, the request then reaches the owner"
    }

    /// Why this instance is not ready: it could not renew its leases in
    /// time and stepped down (nil once a renewal works again).
    public var ownershipTrouble: String? {
        guard coordinator != nil, let trouble = leaseTrouble.withLock({ $0 }) else { return nil }
        return "ownership leases not renewed for \(Self.seconds(ContinuousClock.now - trouble.since)) s: \(trouble.error)"
    }

    private static func seconds(_ duration: Duration) -> String {
        let (whole, attoseconds) = duration.components
        return String(format: "%.1f", Double(whole) + Double(attoseconds) / 1e18)
    }

    /// Renews this instance's leases every third of their duration until
    /// cancelled, unloads trees taken over meanwhile, and recovers turns
    /// that dead instances left running once their leases expired. A
    /// renewal that cannot be answered before the leases may lapse (the
    /// store unreachable, a partition) makes the instance step down first.
    /// The loop runs on a thread of its own, so that tasks blocking the
    /// shared pool cannot hold a renewal back past the lease.
    public func maintainLeases(logger: @escaping @Sendable (String) -> Void = { _ in }) async {
        guard let coordinator else { return }
        await withTaskExecutorPreference(DedicatedThreadExecutor.leases) {
            await maintainLeases(coordinator, logger: logger)
        }
    }

    private func maintainLeases(_ coordinator: any OwnershipCoordinator, logger: @escaping @Sendable (String) -> Void) async {
        let period = coordinator.leaseDuration / 3
        var lastSweep = ContinuousClock.now
        let sweeping = SweepFlag()
        while !Task.isCancelled, !stopping.load(ordering: .acquiring) {
            // Awake by the moment the leases may lapse, whatever the period.
            try? await Task.sleep(for: min(period, heldTrees.timeUntilLapse.map { $0 + .milliseconds(1) } ?? period))
            if Task.isCancelled || stopping.load(ordering: .acquiring) { break }
            var steppedDown = false
            if !heldTrees.surelyValid {
                await stepDown(logger: logger)
                steppedDown = true
            }
            let held = heldTrees.all
            if !held.isEmpty {
                await renew(held, coordinator, logger: logger)
            } else if steppedDown || leaseTrouble.withLock({ $0 != nil }) {
                // Holding nothing after a step-down or trouble: does the store answer?
                do {
                    try await withDeadline(coordinator.leaseDuration / 3, on: DedicatedThreadExecutor.leases, timeoutError: {
                        StoreError.unavailable("the store did not answer within \(coordinator.leaseDuration / 3)")
                    }) { try await coordinator.probe() }
                    if leaseTrouble.withLock({ state in defer { state = nil }; return state }) != nil {
                        logger("the store answers again; serving threads again")
                    }
                } catch {
                    noteTrouble("\(error)")
                }
            }
            // The sweep runs beside the loop, one at a time: it reads the
            // store and waits for threads' commands, either of which a
            // troubled store can hold up for as long as it likes, and the
            // renewals (or the step-down) must go on meanwhile. Inline, one
            // slow sweep held them back past the lease: the instance neither
            // renewed nor stepped down, and its threads answered nobody.
            if ContinuousClock.now - lastSweep >= coordinator.leaseDuration, sweeping.start() {
                lastSweep = .now
                tasks.spawn { [self] in
                    defer { sweeping.end() }
                    if let recovered = try? await recoverInterruptedTurns(), recovered > 0 {
                        logger("recovered \(recovered) thread(s) whose turns a dead instance left running")
                    }
                }
            }
        }
    }

    private func renew(_ held: [HeldTrees.Entry], _ coordinator: any OwnershipCoordinator, logger: @Sendable (String) -> Void) async {
        let started = ContinuousClock.now
        do {
            // Not waited for past a period (a partition stalls the call for
            // minutes): unanswered, the instance is in trouble at once (it
            // takes on nothing new) and tries again; at the lapse it steps down.
            let wait = min(coordinator.leaseDuration / 3, heldTrees.timeUntilLapse ?? coordinator.leaseDuration)
            let renewed = try await withDeadline(wait, on: DedicatedThreadExecutor.leases, timeoutError: {
                StoreError.unavailable("the store did not answer a lease renewal within \(wait)")
            }) { try await coordinator.renew(held.map(\.fence)) }
            // Trees taken over leave the table before the renewal extends the
            // validity: not for a moment are they this instance's and valid.
            let lost = held.filter { !renewed.contains($0.fence) && $0.grantedAt < started }
                .map { (fence: $0.fence, threads: heldTrees.lost($0.fence)) }
            heldTrees.renewed(from: started, validFor: leaseValidity(coordinator))
            if leaseTrouble.withLock({ state in defer { state = nil }; return state }) != nil {
                logger("lease renewals work again")
            }
            for (fence, threads) in lost {
                logger("lease of agent tree \(fence.tree) was taken over; unloading its threads here")
                unloadSoon(threads, of: fence)
            }
        } catch {
            noteTrouble("\(error)", since: heldTrees.lastConfirmed ?? started)
            logger("lease renewal failed: \(error)")
            if !heldTrees.surelyValid { await stepDown(logger: logger) }
        }
    }

    /// The leases may have lapsed unrenewed: every held tree's threads are
    /// unloaded here (running turns stop; subscribers hear thread/closed and
    /// resume through any instance). The leases are not released (the store
    /// cannot be reached); they lapse, and any instance, this one too once
    /// it reaches the store again, takes the trees over and recovers their turns.
    /// Without renewal trouble (renewals did not fail: the process was
    /// paused past its validity, as by SIGSTOP), the store is not suspected:
    /// the instance goes on serving, loading its threads afresh.
    func stepDown(logger: @Sendable (String) -> Void) async {
        let held = heldTrees.all
        guard !held.isEmpty else { return }
        let cause = leaseTrouble.withLock { $0 }.map { "could not renew its ownership leases (\($0.error))" }
            ?? "did not renew its ownership leases in time (the process was held up)"
        logger("stepping down: this instance \(cause); unloading the threads of \(held.count) agent tree(s), which any instance takes over")
        for entry in held { unloadSoon(heldTrees.lost(entry.fence), of: entry.fence) }
    }

    /// Gives every held tree up (graceful shutdown), so other instances take
    /// them over at once rather than after the lease expires.
    func releaseAllLeases() async {
        guard let coordinator else { return }
        let fences = heldTrees.removeAll()
        if !fences.isEmpty { await coordinator.release(fences) }
    }
}

/// The agent trees this instance holds, as it sees them: what an operator
/// (or a fault test) compares across instances to see who serves a tree.
public struct LeaseView: Sendable {
    /// Held trees and the epoch of each.
    public var fences: [LeaseFence]
    /// Whether this instance is sure, right now, that every one is still its
    /// own (false once renewals have failed past the lease's validity: it
    /// then serves none of them).
    public var surelyValid: Bool
}

extension ThreadEngine {
    public var leaseView: LeaseView {
        // Validity read on both sides of the table: a lapse in between counts.
        let before = heldTrees.surelyValid
        let fences = heldTrees.all.map(\.fence).sorted { $0.tree < $1.tree }
        return LeaseView(fences: fences, surelyValid: before && heldTrees.surelyValid)
    }
}

/// Whether a sweep for orphaned turns runs (at most one at a time).
private final class SweepFlag: Sendable {
    private let running = Mutex(false)
    /// True if none ran and this one may.
    func start() -> Bool {
        running.withLock { running in
            guard !running else { return false }
            running = true
            return true
        }
    }
    func end() { running.withLock { $0 = false } }
}

extension ThreadEngine {
    /// The store's live leases and their holders for an operator; nil with a
    /// store of one instance (no leases).
    public func leaseTable(limit: Int) async throws -> (instanceID: String, table: LeaseTable)? {
        guard let coordinator else { return nil }
        return (coordinator.instanceID, try await coordinator.liveLeases(limit: limit))
    }
}
