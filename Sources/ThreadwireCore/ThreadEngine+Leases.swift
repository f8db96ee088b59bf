import Foundation

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
            switch try await coordinator.acquire(tree) {
            case let .held(fence):
                heldTrees.granted(fence, thread: thread, leaseDuration: coordinator.leaseDuration)
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
            switch try await coordinator.acquire(id) {
            case let .held(fence):
                heldTrees.granted(fence, thread: id, leaseDuration: coordinator.leaseDuration)
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
        let threads = heldTrees.lost(fence)
        for id in threads {
            guard let owner = directory.existing(id) else { continue }
            await owner.gate.lock()
            defer { owner.gate.unlock() }
            guard !owner.retired, owner.fence == fence else { continue }
            owner.runner?.cancel()  // a turn runner between its steps stops here
            _ = owner.messageStream?.close()  // and no delta follows thread/closed
            owner.messageStream = nil
            owner.retired = true
            owner.cancelUnload()
            directory.remove(owner)
            directory.drop(id)
            let recipients = owner.subscribers + owner.formerSubscribers
            owner.publisher.ticket([
                Delivery(event: .statusChanged(id, .notLoaded), recipients: recipients),
                Delivery(event: .closed(id), recipients: recipients),
            ]).publish()
        }
    }

    /// Renews this instance's leases every third of their duration until
    /// cancelled, unloads trees taken over meanwhile, and recovers turns
    /// that dead instances left running once their leases expired.
    public func maintainLeases(logger: @escaping @Sendable (String) -> Void = { _ in }) async {
        guard let coordinator else { return }
        let period = coordinator.leaseDuration / 3
        var lastSweep = ContinuousClock.now
        while !Task.isCancelled, !stopping.load(ordering: .acquiring) {
            try? await Task.sleep(for: period)
            if Task.isCancelled || stopping.load(ordering: .acquiring) { break }
            let started = ContinuousClock.now
            let held = heldTrees.all
            do {
                let renewed = try await coordinator.renew(held.map(\.fence))
                heldTrees.extendValidity(from: started, by: coordinator.leaseDuration)
                for entry in held where !renewed.contains(entry.fence) && entry.grantedAt < started {
                    logger("lease of agent tree \(entry.fence.tree) was taken over; unloading its threads here")
                    await treeLost(entry.fence)
                }
            } catch {
                logger("lease renewal failed: \(error)")
            }
            if ContinuousClock.now - lastSweep >= coordinator.leaseDuration {
                lastSweep = .now
                if let recovered = try? await recoverInterruptedTurns(), recovered > 0 {
                    logger("recovered \(recovered) thread(s) whose turns a dead instance left running")
                }
            }
        }
    }

    /// Gives every held tree up (graceful shutdown), so other instances take
    /// them over at once rather than after the lease expires.
    func releaseAllLeases() async {
        guard let coordinator else { return }
        let fences = heldTrees.removeAll()
        if !fences.isEmpty { await coordinator.release(fences) }
    }
}
