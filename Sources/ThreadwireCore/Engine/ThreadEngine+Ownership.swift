import Foundation
import Synchronization

/// Who holds a loaded thread, how it is loaded, committed, recovered after a crash, and unloaded.
extension ThreadEngine {
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
            if owner.state != nil, coordinator != nil, let fence = owner.fence, !heldTrees.holds(fence) {
                // Its lease is gone (a step-down, a takeover) and the unload
                // that follows has not reached it yet: its state may be stale.
                drop(owner, retiring: false)
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
        directory.publish(stored, fence: fence)
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
        let bucket = principalLimits.current.threadStartBucket
        do {
            try await storedBytes.check(principal, limit: principalLimits.current.storedBytes, store: store, tasks: tasks)
            if let bucket {
                let grant = try await quotaLedger.take(1, from: bucket, of: principal)
                guard grant.granted == 1 else {
                    throw DomainError.resourceExhausted(
                        "principal \(principal) reached limits.max_threads_started_per_minute (\(principalLimits.current.threadsPerMinute) threads per minute); retry in \(retrySeconds(bucket.secondsUntilOne(available: grant.available))) s")
                }
            }
        } catch {
            if newTree { abandonNewTree(fence) }
            throw error
        }
        do {
            try await commit(operations, fence: fence)
        } catch {
            if let bucket { await quotaLedger.giveBack(1, to: bucket, of: principal) }
            if newTree { abandonNewTree(fence) }
            if let untrusted = error as? UntrustedCommit {
                // A parent's state in the same tree may be stale now.
                if !newTree, let fence { abandonTree(fence) }
                throw untrusted.domainError
            }
            throw error
        }
    }

    /// Runs `start` (the commit of a turn's start) while the store that
    /// instances share holds a slot for it among the principal's running
    /// turns on every instance; this instance's own turns were counted already.
    func withSharedTurnSlot(on thread: ThreadID, of principal: Principal, _ start: () async throws -> Void) async throws {
        let limit = principalLimits.current.runningTurns
        guard let sharedQuotas, limit > 0 else { return try await start() }
        let reservation = try await sharedQuotas.reserveTurn(on: thread, of: principal, limit: limit)
        if case let .refused(running) = reservation {
            throw RunningTurnCounts.refusal(principal, running: running, limit: limit)
        }
        do {
            try await start()
        } catch {
            await sharedQuotas.end(reservation)
            throw error
        }
        await sharedQuotas.end(reservation)
    }

    /// `events` are the change's notifications: those about this thread that
    /// are kept are numbered and stored in the same commit (`numberEvents`);
    /// they come back numbered, for the caller's publication.
    @discardableResult
    func install(_ owner: ThreadOwner, _ next: StoredThread, _ operations: [StoreOperation],
                 events: [Delivery] = []) async throws -> [Delivery] {
        var next = next
        var operations = operations
        if !operations.contains(where: { if case let .putThread(record) = $0 { record.id == owner.id } else { false } }) {
            operations.insert(.putThread(next.record.bumped()), at: 0)
        }
        for case let .putThread(record) in operations where record.id == owner.id { next.record.version = record.version }
        let (numbered, kept) = numberEvents(events, record: &next.record)
        if !kept.isEmpty {
            // In place: a copy of every operation cost a settings change about 1 µs.
            for index in operations.indices {
                guard case var .putThread(record) = operations[index], record.id == owner.id else { continue }
                record.eventSequence = next.record.eventSequence
                operations[index] = .putThread(record)
            }
            operations += kept
        }
        do {
            try await commit(operations, fence: owner.fence)
        } catch let untrusted as UntrustedCommit {
            // The store may hold a state this owner never installed: the
            // thread is unloaded, and the next command loads it as stored
            // under a new claim of its tree (`abandonTree`).
            drop(owner, retiring: true)
            if let fence = owner.fence { abandonTree(fence) }
            throw untrusted.domainError
        }
        owner.state = next
        directory.publish(next, fence: owner.fence)
        return numbered
    }

    /// Numbers the kept events about `record`'s thread among `deliveries`
    /// after its newest, advancing `record.eventSequence`, and returns the
    /// operation that stores them with the change (retention trims later,
    /// apart: `trimEvents`). The thread's row carries the newest number, so
    /// the row's compare-and-set and the events' primary key keep the
    /// numbers from ever repeating, whichever instance commits. Each
    /// delivery keeps its encoding, which live subscribers are sent too.
    func numberEvents(_ deliveries: [Delivery], record: inout ThreadRecord) -> (deliveries: [Delivery], operations: [StoreOperation]) {
        var numbered = deliveries
        var kept: [StoredEvent] = []
        let now = nowMillis()
        for index in numbered.indices where numbered[index].event.isKept && numbered[index].event.threadID == record.id {
            record.eventSequence += 1
            let bytes = sink.keptEncoding(numbered[index].event, threadSequence: record.eventSequence)
            numbered[index].threadSequence = record.eventSequence
            numbered[index].encoded = bytes.isEmpty ? nil : bytes
            kept.append(StoredEvent(sequence: record.eventSequence, createdAt: now, bytes: bytes))
        }
        guard !kept.isEmpty else { return (deliveries, []) }
        return (numbered, [.appendEvents(record.id, kept)])
    }

    /// Retention (`EventRetention`): forgets what every thread keeps beyond
    /// its count or age, never a thread's newest event.
    public func trimEvents() async throws -> Int {
        let retention = settings.eventRetention
        return try await store.trimEvents(keep: retention.count, createdBefore: nowMillis() - retention.ageMillis)
    }

    /// Unloads a thread whose in-memory state can no longer be trusted (its
    /// tree's lease moved on, or a commit went unconfirmed), with its gate
    /// held: its turn stops, no delta follows, and its subscribers hear
    /// thread/closed (they resume through any instance).
    func drop(_ owner: ThreadOwner, retiring: Bool) {
        owner.runner?.cancel()  // a turn runner between its steps stops here
        _ = owner.messageStream?.close()
        owner.messageStream = nil
        owner.cancelUnload()
        if retiring {
            retire(owner)
        } else {
            owner.retired = true
            directory.remove(owner)
        }
        directory.drop(owner.id)
        let recipients = owner.subscribers + owner.formerSubscribers
        owner.publisher.ticket([
            Delivery(event: .statusChanged(owner.id, .notLoaded), recipients: recipients),
            Delivery(event: .closed(owner.id), recipients: recipients),
        ]).publish()
    }

    // MARK: - Loading and crash recovery

    /// Loads a thread from the store ("cold resume"). A legacy thread is
    /// pinned here, once, rewriting neither its history nor its timestamps. A
    /// turn stored as in progress was left by a process that died: it is
    /// interrupted with the runtime's marker and the reason, and a child's
    /// parent hears of it through the runtime's channel. Undelivered mailbox
    /// items move into the history.
    func load(_ owner: ThreadOwner) async throws {
        // Recovery at load is not the change of the request that loads.
        try await IdempotentCommand.detached { try await loadState(owner) }
    }

    private func loadState(_ owner: ThreadOwner) async throws {
        try throwIfCutOff()
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
            // An imported child that recorded none takes its parent's, as a spawned child does.
            var inherited: MultiAgentRuntime?
            if stored.record.source == .threadSpawn, let parentID = stored.record.parentID {
                inherited = try await store.threadRecord(parentID).flatMap { $0.principal == stored.record.principal ? $0.runtime : nil }
            }
            stored.record.runtime = RuntimeResolver.resolveAtLoad(inherited: inherited, recorded: Self.recordedRuntime(stored), origin: origin)
        }
        var recovered = false
        // A turn that was only waiting for a client goes on waiting: its
        // request is stored, and is offered again to whoever subscribes; a
        // turn paused after its tools waits for turn/continue as before.
        let waiting = stored.isWaitingOnClient ? stored.activeTurnIndex.map { stored.turns[$0].id } : nil
        while let index = stored.turns.lastIndex(where: { $0.status == .inProgress && $0.id != waiting }) {
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
        if !operations.isEmpty {
            do {
                try await commit(operations, fence: owner.fence)
            } catch let untrusted as UntrustedCommit {
                // Not loaded: the next command claims the tree anew and loads again.
                if let fence = owner.fence { abandonTree(fence) }
                throw untrusted.domainError
            }
        }
        owner.config = try threadConfig(overrides: stored.record.configOverrides, ceilings: .clamp)
        owner.state = stored
        directory.publish(stored, fence: owner.fence)
        if recovered {
            changes.changed(id)
            if let parentID = stored.record.parentID { scheduleMailboxDelivery(parentID) }
        }
        if let waiting, stored.activeTurn?.pausedAfterTools != true, !stopping.load(ordering: .acquiring) {
            for request in pendingRequests(stored) { TurnRunner(engine: self).expect(request) }
            owner.runner = tasks.spawn { [self] in await TurnRunner(engine: self).runTurn(owner, turnID: waiting, resuming: true) }
        }
        // An idle thread with queued turns (the process died between a
        // turn's end and the next one's start) goes on with them.
        if stored.activeTurnIndex == nil, !stored.record.queue.isEmpty { startQueuedTurn(id) }
    }

    /// Recovers every turn a dead process left running, so no thread reports
    /// ACTIVE for a turn nobody runs. Run once at startup, before serving.
    /// With several instances, only threads no live instance owns.
    public func recoverInterruptedTurns() async throws -> Int {
        var ids: [ThreadID]
        if let coordinator {
            ids = try await coordinator.orphanedRunningThreads()
        } else {
            ids = try await store.threadsWithRunningTurns()
        }
        // Threads with queued turns are loaded too: loading one starts its next turn.
        ids += try await store.threadsWithQueuedTurns().filter { !ids.contains($0) }
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
                var next = owner.current
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
        // Stops at the first scalar that is not white space (Unicode's
        // White_Space, the set .whitespacesAndNewlines names) instead of
        // building a trimmed copy through Foundation on every command.
        guard !value.unicodeScalars.allSatisfy(\.properties.isWhitespace) else {
            throw DomainError.invalidArgument("\(field) must not be empty")
        }
        return value
    }

    /// Every commit of the engine. The first commit of a keyed request's
    /// change carries its key (`IdempotentCommand`).
    func commit(_ operations: [StoreOperation], fence: LeaseFence?) async throws {
        try ensureLeasesValid(fence)
        let command = IdempotentCommand.current
        let claim = command?.claim(for: operations, nowMillis: nowMillis())
        do {
            try await store.commit(claim.map { [.claimIdempotencyKey($0.claim, response: $0.answer)] + operations } ?? operations,
                                   fence: fence)
            if let claim { command?.claimed(claim.claim, answer: claim.answer) }
        } catch let error as DomainError {
            throw error
        } catch {
            let failure = StoreError.wrapping(error)
            if case let .leaseLost(fence) = failure { tasks.spawn { [self] in await treeLost(fence) } }
            if case let .idempotencyKeyTaken(key) = failure { throw IdempotencyKeyTaken(key: key) }
            switch failure {
            case .outcomeUnknown, .historySequenceTaken: throw UntrustedCommit(failure)
            case let .conflict(_, expected) where expected > 0: throw UntrustedCommit(failure)
            default: throw failure.domainError
            }
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
}

/// A commit after which the committer's state cannot be trusted: its
/// outcome is unknown (it may still land, later, under the same fence), or
/// the store refused it for a version or history it did not build on (the
/// state it was built from is stale). Whoever made it unloads what it
/// changed and gives up the tree's claim (`abandonTree`).
struct UntrustedCommit: Error, CustomStringConvertible {
    let failure: StoreError
    init(_ failure: StoreError) { self.failure = failure }
    var description: String { failure.description }
    /// What the client is told.
    var domainError: DomainError {
        if case .outcomeUnknown = failure { return .unavailable(failure.description) }
        return failure.domainError
    }
}
